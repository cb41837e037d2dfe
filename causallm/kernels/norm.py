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
def rms_segment(xs, gamma, ys, eps, size):
    """ys = rms_norm(xs) * gamma for one segment of ``size`` values (float32 eps and size)."""
    ss = np.float32(0.0)
    for j in range(xs.shape[0]):
        ss += xs[j] * xs[j]
    inv = np.float32(1.0) / np.sqrt(ss / size + eps)
    for j in range(xs.shape[0]):
        ys[j] = xs[j] * inv * gamma[j]


@njit(cache=True)
def rms_norm(x, gamma, y, nrows, eps, feature_size):
    """y[b, r] = rms_norm(x[b, r]) per feature_size segment, rows r < nrows; y may be x.

    x, y (B, H, W) float32 with W % feature_size == 0; gamma (feature_size,) float32.
    """
    eps32 = np.float32(eps)
    size32 = np.float32(feature_size)
    for b in range(x.shape[0]):
        for r in range(nrows):
            for s0 in range(0, x.shape[2], feature_size):
                rms_segment(x[b, r, s0:s0 + feature_size], gamma, y[b, r, s0:s0 + feature_size],
                            eps32, size32)
