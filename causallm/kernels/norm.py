"""RMS normalisation (Zhang & Sennrich 2019, arXiv:1910.07467), as HF LlamaRMSNorm.

For each feature_size-long segment s of a row (W = n * feature_size)::

    y = s * (1 / sqrt(mean(s * s) + eps)) * gamma          # [fs] -> [fs], gamma [fs]

feature_size == W is the ``rms_norm`` layer; feature_size == head_dim normalises every head
of a q/k projection on its own (``reshaped_rms_norm``). All in float32.
"""

import numpy as np
from numba import njit

from causallm.kernels.team import address, array1, array3, encode, real, words

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


@njit(cache=True)
def _rms_norm_team(args, k0, k1):
    """Rows [k0, k1) of ``rms_norm`` (row t: batch t // nrows, row t % nrows), a team op."""
    w = words(args, 13)
    x, gamma, y = array3(w, 0, np.float32), array1(w, 4, np.float32), array3(w, 6, np.float32)
    nrows, fs = w[10], w[12]
    eps32 = np.float32(real(args, 11))
    size32 = np.float32(fs)
    for t in range(k0, k1):
        b, r = t // nrows, t % nrows
        for s0 in range(0, x.shape[2], fs):
            rms_segment(x[b, r, s0:s0 + fs], gamma, y[b, r, s0:s0 + fs], eps32, size32)


def rms_norm_op(x, gamma, y, nrows: int, eps: float, feature_size: int):
    """``rms_norm`` as a team op (kernels/team.py): (address, args, tasks), a task a row; None
    for arrays it cannot read (float32, C-contiguous)."""
    if any(a.dtype != np.float32 for a in (x, gamma, y)) or gamma.ndim != 1:
        return None
    args = encode(x, gamma, y, nrows, float(eps), feature_size)
    return None if args is None else (address(_rms_norm_team), args, x.shape[0] * nrows)
