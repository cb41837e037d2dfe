"""A grammar's token mask applied to one row of scores.

The mask is a bitset over token ids in 32-bit words (llguidance's layout, little-endian): token
i is allowed when bit ``i % 32`` of word ``i // 32`` is set, i.e. bit ``i % 8`` of byte
``i // 8``. For a (V,) float32 row and the n ids the mask covers:

    scores[i] = -inf    for i < min(n, V) whose bit is clear, and for every n <= i < V

(ids past the mask: rows of a padded embedding that no token stands for); allowed scores are
left as they are. A word of all ones (inside a JSON string most tokens are allowed) or all
zeros (after a '{' only a handful are) is done without looking at its bits; any other word a
byte at a time, ``scores[8j:8j + 8] = min(scores[8j:8j + 8], LIMIT[byte j])`` where
``LIMIT[b][k]`` is +inf when bit k of b is set and -inf when not (one vector minimum per byte).
"""

import numpy as np
from numba import njit

from causallm.kernels.jit_cache import read_only

_BITS = ((np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1).astype(bool)
LIMIT = read_only(np.where(_BITS, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32))
"""(256, 8) float32: LIMIT[b][k] = +inf if bit k of byte b is set, else -inf."""
POPCOUNT = read_only(_BITS.sum(axis=1).astype(np.int64))
"""(256,) int64: the set bits of each byte."""


@njit(cache=True)
def _apply(scores, bits, n, limit, popcount):
    neg = np.float32(-np.inf)
    m = min(n, scores.shape[0])
    b8 = bits.view(np.uint8)
    full = m // 32
    allowed = 0
    for w in range(full):
        word = bits[w]
        base = w * 32
        if word == -1:
            allowed += 32
        elif word == 0:
            for k in range(32):
                scores[base + k] = neg
        else:
            for q in range(4):
                b = b8[4 * w + q]
                allowed += popcount[b]
                row = limit[b]
                for k in range(8):
                    scores[base + 8 * q + k] = min(scores[base + 8 * q + k], row[k])
    for i in range(full * 32, m):
        if (b8[i >> 3] >> (i & 7)) & 1:
            allowed += 1
        else:
            scores[i] = neg
    for i in range(m, scores.shape[0]):
        scores[i] = neg
    return allowed


def apply_token_bitmask(scores: np.ndarray, bits: np.ndarray, n: int) -> int:
    """The mask ``bits`` (int32 words, at least ceil(n / 32), C-contiguous) over the first
    ``n`` ids applied to ``scores`` (V,) float32 in place (module docstring). Returns the
    number of ids below min(n, V) it allows."""
    return int(_apply(scores, bits, n, LIMIT, POPCOUNT))
