"""``embedding_merge``: put another source's rows at the positions of one token (images).

    out[b, i] = source[b, i]  if ids[b, i] == token_id  else  x[b, i]      rows [0, step)

Inputs ``[ids (B, 1, 1, L), x (B, 1, L, W), source (B, 1, L, W)]``: the step's token ids, their
embeddings, and rows the model placed at the token's positions (the image features of Gemma 3
and T5Gemma2, whose placeholder ``image_token_index`` stands for one feature row each;
transformers' ``masked_scatter``). Output as x. Property: ``token_id`` (required).
"""

from causallm.runtime.layer import Layer
from causallm.runtime.properties import uint


class EmbeddingMergeLayer(Layer):
    type = "embedding_merge"
    properties = {"token_id": uint(required=True)}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 3:
            raise context.error(f"needs inputs [ids, embeddings, source], got {len(dims)}")
        ids, x, source = dims
        if source != x:
            raise context.error(f"source dims {source} differ from the embeddings' {x}")
        if ids.feature_len < x.height:
            raise context.error(f"ids {ids} hold fewer than the {x.height} rows of {x}")
        context.setOutputDimensions([x])

    def incremental_forwarding(self, context, from_, to):
        ids, x, source = context.inputs
        out = context.outputs[0]
        step = min(to - from_, out.shape[1])
        out[:, :step] = x[:, :step]
        rows = ids.reshape(ids.shape[0], -1)[:, :step] == self.props["token_id"]
        if rows.any():
            out[:, :step][rows] = source[:, :step][rows]
