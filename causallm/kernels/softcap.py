"""Logit soft-capping (Gemma 2/3): squash values smoothly into (-cap, cap).

    y = tanh(x / cap) * cap            element-wise, rows [0, nrows) of every batch of (B, H, W)

computed in float32 in that order (divide, tanh, multiply), as transformers does for
``final_logit_softcapping``. ``y`` may be ``x`` (in place).
"""

import numpy as np
from numba import njit


@njit(cache=True)
def softcap(x, y, nrows, cap):
    """y[b, r] = tanh(x[b, r] / cap) * cap for rows r < nrows; x, y (B, H, W) float32, cap > 0."""
    c = np.float32(cap)
    for b in range(x.shape[0]):
        for r in range(nrows):
            xr = x[b, r]
            yr = y[b, r]
            for j in range(xr.shape[0]):
                yr[j] = np.tanh(xr[j] / c) * c
