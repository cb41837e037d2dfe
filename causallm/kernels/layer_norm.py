"""Layer normalisation (Ba, Kiros & Hinton 2016, arXiv:1607.06450), as torch.nn.LayerNorm
over the last axis.

For each row x of width W::

    mu  = sum(x) / W
    var = sum((x - mu)^2) / W                            # biased, as torch
    y   = (x - mu) / sqrt(var + eps) * gamma + beta       # [W] -> [W]; gamma, beta [W]

Two passes over the row (the mean, then the centred sum of squares), all in float32.
"""

import numpy as np
from numba import njit

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}  # vectorize the sums; keep NaN/Inf rules


@njit(cache=True, fastmath=_FASTMATH)
def layer_norm(x, gamma, beta, y, nrows, eps):
    """y[b, r] = layer_norm(x[b, r]) * gamma + beta for rows r < nrows; y may be x.

    x, y (B, H, W) float32; gamma, beta (W,) float32.
    """
    W = x.shape[2]
    eps32 = np.float32(eps)
    width = np.float32(W)
    one = np.float32(1.0)
    for b in range(x.shape[0]):
        for r in range(nrows):
            xr = x[b, r]
            yr = y[b, r]
            total = np.float32(0.0)
            for j in range(W):
                total += xr[j]
            mu = total / width
            ss = np.float32(0.0)
            for j in range(W):
                d = xr[j] - mu
                ss += d * d
            inv = one / np.sqrt(ss / width + eps32)
            for j in range(W):
                yr[j] = (xr[j] - mu) * inv * gamma[j] + beta[j]
