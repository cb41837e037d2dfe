"""``special_token_embedding``: a learned vector in place of one token's embedding.

    out[b, i] = e  if ids[b, i] == token_id  else  x[b, i]                 rows [0, step)

Inputs ``[ids (B, 1, 1, L), x (B, 1, L, W)]``; output as x. Weight ``embedding`` (W,), not
scaled (T5Gemma2's ``eoi_embedding`` for the end-of-image token, which its embedding layer
swaps in after scaling the table's rows). Property: ``token_id`` (required).
"""

from causallm.runtime.layer import Layer
from causallm.runtime.properties import uint


class SpecialTokenEmbeddingLayer(Layer):
    type = "special_token_embedding"
    layer_impl = True
    properties = {"token_id": uint(required=True)}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 2:
            raise context.error(f"needs inputs [ids, embeddings], got {len(dims)}")
        ids, x = dims
        if ids.feature_len < x.height:
            raise context.error(f"ids {ids} hold fewer than the {x.height} rows of {x}")
        context.requestWeight("embedding", (x.width,))
        context.setOutputDimensions([x])

    def incremental_forwarding(self, context, from_, to):
        ids, x = context.inputs
        out = context.outputs[0]
        step = min(to - from_, out.shape[1])
        if out is not x:
            out[:, :step] = x[:, :step]
        rows = ids.reshape(ids.shape[0], -1)[:, :step] == self.props["token_id"]
        if rows.any():
            out[:, :step][rows] = context.weights[0]
