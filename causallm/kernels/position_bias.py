"""T5's relative position buckets and the per-step gather of the bias by relative position.

For a key at position t and a query at p, the relative position is r = t - p. Its bucket
(transformers' ``T5Attention._relative_position_bucket``, N = num_buckets, M = max_distance)::

    bidirectional:  N' = N // 2;  base = N' if r > 0 else 0;  a = |r|
    causal:         N' = N;       base = 0;                   a = max(-r, 0)
    e = N' // 2                                   exact buckets for the nearest distances
    bucket = base + (a                                          if a < e
                     min(e + int(log(a / e) / log(M / e) * (N' - e)), N' - 1)   otherwise)

The logarithm is taken in float32 and truncated, exactly as transformers computes it in torch,
so every boundary lands in the same bucket; distances >= M share the last bucket.
"""

import math

import numpy as np
from numba import njit


def relative_position_buckets(max_timestep: int, num_buckets: int, max_distance: int,
                              bidirectional: bool) -> np.ndarray:
    """Bucket of every relative position r in [-(T - 1), T - 1]: int64 (2T - 1,), entry
    T - 1 + r (T = max_timestep)."""
    r = np.arange(-(max_timestep - 1), max_timestep, dtype=np.int64)
    buckets = np.zeros_like(r)
    n = num_buckets
    if bidirectional:
        n //= 2
        buckets += (r > 0) * n
        a = np.abs(r)
    else:
        a = -np.minimum(r, 0)
    exact = n // 2
    if exact < 1:
        raise ValueError(f"num_buckets {num_buckets} leaves no exact bucket")
    with np.errstate(divide="ignore"):  # a = 0 takes the exact branch
        scaled = (np.log(a.astype(np.float32) / np.float32(exact))
                  / np.float32(math.log(max_distance / exact)) * np.float32(n - exact))
    large = np.minimum(exact + np.where(a < exact, 0, scaled).astype(np.int64), n - 1)
    return buckets + np.where(a < exact, a, large)


@njit(cache=True)
def position_bias(table, buckets, out, lo, hi):
    """out[b, h, j] = table[buckets[j], h] for j in [lo, hi); table (N, H), out (B, H, 2T - 1)."""
    for b in range(out.shape[0]):
        for h in range(out.shape[1]):
            for j in range(lo, hi):
                out[b, h, j] = table[buckets[j], h]
