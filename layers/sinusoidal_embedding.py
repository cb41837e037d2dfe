"""``sinusoidal_embedding``: fixed sinusoidal positions, added ("Attention is all you need";
Marian's ``MarianSinusoidalPositionalEmbedding``).

    out[b, i] = x[b, i] + S[p]        i in [0, step), p its position (from_ + i)
    S[p, j]     = sin(p / 10000^(2j / D))          j in [0, ceil(D/2))
    S[p, c + j] = cos(p / 10000^(2j / D))          j in [0, floor(D/2)),  c = ceil(D/2)

the sines in the first half and the cosines in the second (not interleaved as in the paper),
each angle computed in float64 and the table rounded to float32, exactly as transformers builds
Marian's (``create_weight``). The table is computed, not loaded: no weights.

Input ``(B, 1, H, D)``; output the same. Properties: ``max_position_embeddings`` (required: the
table's rows). A position past the table is an error naming the layer.
"""

import numpy as np

from causallm.kernels.embedding_sum import position_add
from causallm.runtime.layer import Layer
from causallm.runtime.properties import uint

NO_TYPE = np.zeros(0, dtype=np.float32)


def sinusoid_table(n_positions: int, dim: int) -> np.ndarray:
    """S of the module docstring, (n_positions, dim) float32."""
    position = np.arange(n_positions, dtype=np.float64)[:, None]
    angle = position / np.power(10000, 2 * (np.arange(dim) // 2) / dim)  # (n, dim), float64
    half = (dim + 1) // 2
    table = np.empty((n_positions, dim), dtype=np.float32)
    table[:, :half] = np.sin(angle[:, 0::2])
    table[:, half:] = np.cos(angle[:, 1::2])
    return table


class SinusoidalEmbeddingLayer(Layer):
    type = "sinusoidal_embedding"
    properties = {"max_position_embeddings": uint(required=True)}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        self.positions = self.props["max_position_embeddings"]
        if self.positions < 1:
            raise context.error("max_position_embeddings must be at least 1")
        self.table = sinusoid_table(self.positions, dims[0].width)
        self.table.flags.writeable = False
        context.setOutputDimensions([dims[0]])

    def incremental_forwarding(self, context, from_, to):
        step = context.step
        if step.end > self.positions:
            raise context.error(f"position {step.end - 1} is past max_position_embeddings "
                                f"{self.positions}")
        position_add(context.inputs[0], self.table, NO_TYPE, context.outputs[0], to - from_,
                     step.positions, 0)
