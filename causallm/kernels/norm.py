"""RMS normalisation (Zhang & Sennrich 2019, arXiv:1910.07467), as HF LlamaRMSNorm.

For each feature_size-long segment s of a row (W = n * feature_size)::

    y = s * (1 / sqrt(mean(s * s) + eps)) * gamma          # [fs] -> [fs], gamma [fs]

feature_size == W is the ``rms_norm`` layer; feature_size == head_dim normalises every head
of a q/k projection on its own (``reshaped_rms_norm``). All in float32.
"""

import numpy as np
from numba import njit

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}  # vectorize the sum of squares; keep NaN/Inf


@njit(cache=True, fastmath=_FASTMATH)
def rms_norm(x, gamma, y, nrows, eps, feature_size):
    """y[b, r] = rms_norm(x[b, r]) per feature_size segment, rows r < nrows; y may be x.

    x, y (B, H, W) float32 with W % feature_size == 0; gamma (feature_size,) float32.
    """
    B = x.shape[0]
    W = x.shape[2]
    eps32 = np.float32(eps)
    size32 = np.float32(feature_size)
    one = np.float32(1.0)
    for b in range(B):
        for r in range(nrows):
            for s0 in range(0, W, feature_size):
                xs = x[b, r, s0:s0 + feature_size]
                ys = y[b, r, s0:s0 + feature_size]
                ss = np.float32(0.0)
                for j in range(feature_size):
                    ss += xs[j] * xs[j]
                inv = one / np.sqrt(ss / size32 + eps32)
                for j in range(feature_size):
                    ys[j] = xs[j] * inv * gamma[j]
