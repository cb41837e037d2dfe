"""``tie_word_embeddings``: Applications/CausalLM/layers/tie_word_embedding (TieWordEmbedding).

One layer type, two modes, chosen by ``unit``:

- embedding mode (``unit`` unset): exactly ``embedding_layer``:
  ``out[b, i] = W[ids[b, i]] * scale``, weight ``Embedding`` (in_dim, out_dim) = [vocab, hidden].
- lm-head mode (``unit`` set, used with ``shared_from=embedding0``):
  ``logits[b, j] = (x[b, r_j] * scale) @ W^T (+ bias)``, x (B, 1, H, D) -> (B, 1, L, unit), the
  rows r_j as ``lm_head``'s (the step's last; one per sequence of a step of several)
  (T5 scales the decoder output by d_model^-1/2 before its tied head). The weight request
  ``Embedding`` (unit, D) resolves to the embedding's tensor, so the head adds no bytes to the
  .bin.

Properties: ``in_dim``, ``out_dim``, ``scale`` (1.0), ``unit``, and ``disable_bias``.
"""

from causallm.runtime.layer import Layer
from causallm.runtime.properties import float_, uint
from causallm.layers.embedding_layer import embedding_lookup, finalize_embedding
from causallm.layers.fully_connected import NO_BIAS
from causallm.layers.lm_head import head_dims, project_last, project_last_ops


class TieWordEmbedding(Layer):
    type = "tie_word_embeddings"
    layer_impl = True
    properties = {"in_dim": uint(0), "out_dim": uint(0), "unit": uint(0), "scale": float_(1.0)}

    def finalize(self, context):
        self.lm_head = bool(self.props["unit"])
        if not self.lm_head:
            finalize_embedding(self, context)
            return
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        unit, x = self.props["unit"], dims[0]
        self.scale = self.props["scale"]
        context.requestWeight("Embedding", (unit, x.width), packable=True)
        self.has_bias = not self.props["disable_bias"]
        if self.has_bias:
            context.requestWeight("bias", (unit,), context.activation_dtype)
        context.setOutputDimensions([head_dims(self, context, x, unit)])

    def team_ops(self, context, step):
        if not self.lm_head or self.scale != 1.0:
            return None
        w = context.weights
        return project_last_ops(context, w[0].T, w[1] if self.has_bias else NO_BIAS)

    def incremental_forwarding(self, context, from_, to):
        w = context.weights
        if not self.lm_head:
            embedding_lookup(self, context, w[0], to - from_)
            return
        if self.scale == 1.0:
            project_last(self, context, w[0].T, w[1] if self.has_bias else NO_BIAS)
            return
        out = context.outputs[0]
        project_last(self, context, w[0].T, NO_BIAS)
        out *= self.scale  # (x s) W^T = s (x W^T)
        if self.has_bias:
            out += w[1]
