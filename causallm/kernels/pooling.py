"""Sentence-embedding kernels: pooling token rows into one vector, and L2 normalisation.

    x (B, H, W) float32, rows [0, n) hold the n tokens of one sequence (n >= 1)
    out (B, 1, W * len(modes)): one W-wide segment per mode, in the order given

Pooling modes (sentence-transformers ``Pooling``, every token attended, no padding)::

    POOL_CLS            x[0]
    POOL_MAX            max_i x[i]                                     (per feature)
    POOL_MEAN           sum_i x[i] / n
    POOL_MEAN_SQRT_LEN  sum_i x[i] / sqrt(n)
    POOL_WEIGHTED_MEAN  sum_i (i + 1) x[i] / sum_i (i + 1)            (weights 1..n)
    POOL_LASTTOKEN      x[n - 1]

Sums are accumulated in float64 and rounded once to float32.

    l2_normalize: y = x / max(||x||_2, 1e-12)  over the width, rows [0, nrows)
                  (torch.nn.functional.normalize(p=2, eps=1e-12)); y may be x.
"""

import numpy as np
from numba import njit

POOL_CLS = 0
POOL_MAX = 1
POOL_MEAN = 2
POOL_MEAN_SQRT_LEN = 3
POOL_WEIGHTED_MEAN = 4
POOL_LASTTOKEN = 5

POOLING_MODES = {
    "cls": POOL_CLS,
    "max": POOL_MAX,
    "mean": POOL_MEAN,
    "mean_sqrt_len_tokens": POOL_MEAN_SQRT_LEN,
    "weightedmean": POOL_WEIGHTED_MEAN,
    "lasttoken": POOL_LASTTOKEN,
}
"""sentence-transformers ``pooling_mode`` names -> kernel mode codes."""

NORMALIZE_EPS = 1e-12


@njit(cache=True)
def embedding_pool(x, out, n, modes):
    """out[b, 0, k*W:(k+1)*W] = pool_{modes[k]}(x[b, :n]) for every mode k (module doc).

    modes: int64 array of POOL_* codes; out (B, 1, W * len(modes)); n >= 1 rows.
    """
    B = x.shape[0]
    W = x.shape[2]
    acc = np.empty(W, dtype=np.float64)
    for b in range(B):
        for k in range(modes.shape[0]):
            mode = modes[k]
            o = out[b, 0, k * W:(k + 1) * W]
            if mode == POOL_CLS or mode == POOL_LASTTOKEN:
                row = x[b, 0] if mode == POOL_CLS else x[b, n - 1]
                for j in range(W):
                    o[j] = row[j]
            elif mode == POOL_MAX:
                for j in range(W):
                    o[j] = x[b, 0, j]
                for i in range(1, n):
                    for j in range(W):
                        if x[b, i, j] > o[j]:
                            o[j] = x[b, i, j]
            else:
                for j in range(W):
                    acc[j] = 0.0
                total = 0.0
                for i in range(n):
                    w = float(i + 1) if mode == POOL_WEIGHTED_MEAN else 1.0
                    total += w
                    for j in range(W):
                        acc[j] += w * x[b, i, j]
                if mode == POOL_MEAN_SQRT_LEN:
                    total = np.sqrt(total)
                for j in range(W):
                    o[j] = np.float32(acc[j] / total)


@njit(cache=True)
def l2_normalize(x, y, nrows, eps):
    """y[b, r] = x[b, r] / max(||x[b, r]||_2, eps) for rows r < nrows; y may be x."""
    for b in range(x.shape[0]):
        for r in range(nrows):
            xr = x[b, r]
            yr = y[b, r]
            ss = 0.0
            for j in range(xr.shape[0]):
                ss += float(xr[j]) * float(xr[j])
            norm = max(np.sqrt(ss), eps)
            inv = 1.0 / norm
            for j in range(xr.shape[0]):
                yr[j] = np.float32(xr[j] * inv)
