"""Token embedding gather: out[b, i] = table[int(ids[b, 0, i])] * scale.

Shapes: ids (B, 1, L) float32 token ids (NNTrainer feeds ids as float32), table (V, D)
float32 [vocab, hidden] (the PyTorch layout), out (B, H, D). The multiply happens only if
scale != 1, as in NNTrainer's EmbeddingLayer.
"""

import numpy as np
from numba import njit


@njit(cache=True)
def embedding(ids, table, out, nrows, scale):
    """out[b, i, :] = table[int(ids[b, 0, i])] * scale for i < nrows.

    Returns -1 on success. If any id is outside [0, V) it writes nothing and returns the
    first such id, floored to an int, so the caller can raise a one-line error. Two ids cannot
    be told exactly: one that floors to -1 (it would read as success) is returned as -2, and
    a NaN or an id beyond +-1e18 as V.
    """
    V = table.shape[0]
    D = table.shape[1]
    for b in range(ids.shape[0]):
        for i in range(nrows):
            v = ids[b, 0, i]
            if not (v >= 0 and v < V):
                if not abs(v) < 1e18:
                    return V
                return min(int(np.floor(v)), -2) if v < 0 else int(v)
    scale32 = np.float32(scale)
    scaled = scale32 != np.float32(1.0)
    for b in range(ids.shape[0]):
        for i in range(nrows):
            row = table[int(ids[b, 0, i])]
            o = out[b, i]
            if scaled:
                for j in range(D):
                    o[j] = row[j] * scale32
            else:
                for j in range(D):
                    o[j] = row[j]
    return -1
