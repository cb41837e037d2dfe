"""``embedding_normalize``: Applications/CausalLM/layers/embedding_normalize_layer (EmbeddingNormalizeLayer).

    y = x / max(||x||_2, 1e-12)          over the width W, for each row

as sentence-transformers' ``Normalize`` (``torch.nn.functional.normalize(p=2, dim=-1)``).
Input ``(B, 1, H, W)``, usually the pooled ``(B, 1, 1, W)``; output the same dims. Rows
[0, min(step, H)) are normalised. No properties beyond the LayerImpl ones; no weights.
"""

from causallm.kernels.pooling import NORMALIZE_EPS, l2_normalize
from causallm.runtime.layer import Layer


class EmbeddingNormalizeLayer(Layer):
    type = "embedding_normalize"
    layer_impl = True
    properties = {}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        context.setOutputDimensions([dims[0]])

    def incremental_forwarding(self, context, from_, to):
        out = context.outputs[0]
        l2_normalize(context.inputs[0], out, min(to - from_, out.shape[1]), NORMALIZE_EPS)
