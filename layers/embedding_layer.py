"""``embedding_layer``: Applications/CausalLM/layers/embedding_layer (EmbeddingLayer).

    out[b, i] = W[ids[b, i]] * scale            i in [0, step)

Input: token ids as float32, ``(B, 1, 1, L)``; output ``(B, 1, L, out_dim)``.
Weight ``Embedding`` (in_dim, out_dim) = [vocab, hidden], the PyTorch layout (no transpose),
stored in the node's ``weight_dtype`` (``embedding_dtype``), float32 or packed (BF16, F16, Q8_0,
Q4_0 rows widened as they are gathered). An id outside [0, in_dim) is an
error naming the layer. Properties: ``in_dim`` and ``out_dim`` (required), ``scale`` (1.0;
Gemma3 passes sqrt(hidden)).
"""

import numpy as np

from causallm.kernels import embedding
from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import float_, uint


def embedding_lookup(layer, context, table, step):
    """Gather rows of ``table`` (float32, or packed: widened row by row) for the step's ids;
    shared by embedding_layer and the tied layer."""
    ids = context.inputs[0]
    if isinstance(table, np.ndarray):
        if embedding(ids, table, context.outputs[0], step, layer.scale) == -1:
            return
    else:
        rows = ids[:, 0, :step]
        if ((rows >= 0) & (rows < table.shape[0])).all():
            out = context.outputs[0]
            for b in range(rows.shape[0]):
                table.gather(rows[b].astype(np.int64), out[b, :step])
            if layer.scale != 1.0:
                out[:, :step] *= np.float32(layer.scale)
            return
    rows = ids[:, 0, :step]
    bad = rows[~((rows >= 0) & (rows < table.shape[0]))][0]
    raise context.error(f"token id {bad:g} is out of range for in_dim {table.shape[0]}")


def finalize_embedding(layer, context):
    dims = context.getInputDimensions()
    if len(dims) != 1:
        raise context.error(f"needs 1 input (token ids), got {len(dims)}")
    ids = dims[0]
    if ids.channel != 1 or ids.height != 1:
        raise context.error(f"expects token ids of shape B:1:1:L, got {ids}")
    in_dim, out_dim = layer.props["in_dim"], layer.props["out_dim"]
    if not in_dim or not out_dim:
        raise context.error("in_dim and out_dim are required")
    layer.scale = layer.props["scale"]
    context.requestWeight("Embedding", (in_dim, out_dim), packable=True)
    context.setOutputDimensions([TensorDim(ids.batch, 1, ids.width, out_dim)])


class EmbeddingLayer(Layer):
    type = "embedding_layer"
    layer_impl = True
    properties = {"in_dim": uint(required=True), "out_dim": uint(required=True),
                  "scale": float_(1.0)}

    def finalize(self, context):
        finalize_embedding(self, context)

    def incremental_forwarding(self, context, from_, to):
        embedding_lookup(self, context, context.weights[0], to - from_)
