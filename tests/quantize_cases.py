"""The float32 rows the quantizer tests quantize (tests/test_quantize.py), and that
tools/fixtures_quantize.py hands to ggml's own quantizer to record the expected bytes.

Made from ``SEED`` with integer arithmetic (splitmix64) and correctly rounded float operations
only (no transcendental functions, whose last bit may vary with the platform or numpy), so every
machine makes the same bits; the fixture records their sha256 to prove it.

    edges   32 rows of 512: zeros, -0.0, constants, ramps, ties, one dominant value of either
            sign, offsets, outliers, tiny (fp16-subnormal and vanishing scales, float32
            subnormals), huge (fp16 overflow, squares overflowing float32), a large offset
            beside a tiny spread, sparse rows, dyadic grids, sub-blocks of very different scale
    normal  64 rows of 1024, roughly N(0, s^2) with s from 2^-6 to 2^5 by row
    wide    4 rows of 8192
    bulk    2048 rows of 1024 as normal, some rows shifted (only sha256 of the bytes is kept)
"""

from __future__ import annotations

import hashlib

import numpy as np

SEED = 20250611
CASES = ("edges", "normal", "wide", "bulk")


def _splitmix64(seed: int, n: int) -> np.ndarray:
    """n pseudo-random uint64 of stream ``seed``."""
    with np.errstate(over="ignore"):
        z = (np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
             + np.uint64(seed) * np.uint64(0xD1B54A32D192ED03))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform(seed: int, shape) -> np.ndarray:
    """float64 in [0, 1), multiples of 2^-24."""
    n = int(np.prod(shape))
    return ((_splitmix64(seed, n) >> np.uint64(40)).astype(np.float64) * 2.0 ** -24).reshape(shape)


def normalish(seed: int, shape) -> np.ndarray:
    """float64, sum of four uniforms centred and scaled: mean 0, variance 1 (Irwin-Hall)."""
    u = uniform(seed, (4,) + tuple(shape))
    return (u[0] + u[1] + u[2] + u[3] - 2.0) * 1.7320508075688772


def _edges(seed: int) -> np.ndarray:
    C = 512
    g = normalish(seed, (32, C))
    k = np.arange(C)
    rows = [
        np.zeros(C),                                      # 0 zeros
        -np.zeros(C),                                     # 1 negative zeros
        np.where(k % 3 == 0, g[2], np.where(k % 3 == 1, 0.0, -0.0)),  # 2 mixed zeros
        np.full(C, 0.5),                                  # 3 constants
        np.full(C, -0.5),                                 # 4
        ((k // 32) - 8) / 4.0,                            # 5 a constant per block of 32
        (k - 256).astype(np.float64),                     # 6 integer ramp
        (k % 32 - 16) / 2.0,                              # 7 halves: rounding ties
        np.where(k % 32 == 5, 3.0, np.where(k % 32 == 9, -3.0, g[8] * 0.5)),   # 8 +m before -m
        np.where(k % 32 == 5, -3.0, np.where(k % 32 == 9, 3.0, g[9] * 0.5)),   # 9 -m before +m
        np.where(k % 32 == 17, -10.0, np.abs(g[10])),     # 10 negative-dominant
        np.where(k % 32 == 17, 10.0, -np.abs(g[11])),     # 11 positive-dominant
        np.abs(g[12]) + 3.0,                              # 12 positive offset
        -np.abs(g[13]) - 3.0,                             # 13 negative offset
        np.where(k % 256 == 77, 100.0, g[14] * 0.01),     # 14 outlier
        g[15] * 1e-6,                                     # 15 fp16-subnormal scales
        g[16] * 1e-20,                                    # 16 scales vanishing in fp16
        g[17] * 1e-40,                                    # 17 float32 subnormals
        g[18] * 1e7,                                      # 18 fp16 scale overflow
        g[19] * 1e30,                                     # 19 squares overflow float32
        np.where(k % 256 < 32, -1000.0 + g[20] * 1e-4, g[20] * 1e-4),   # 20 offset beside tiny
        np.where(k % 256 < 32, -1e6 + g[21] * 0.1, g[21] * 1e-6),       # 21
        np.where(uniform(seed + 1, (C,)) < 0.9, 0.0, g[22]),            # 22 sparse
        np.where(k % 7 == 0, 6e4, g[23]),                 # 23 fp16-range spikes
        np.floor(g[24] * 20.0) / 16.0,                    # 24 dyadic grid
        np.where(k % 256 < 16, g[25], 0.0),               # 25 one sub-block of 16
        g[26] * np.ldexp(1.0, k // 32 % 8 * 3 - 12),          # 26 scales 2^-12 .. 2^9 by block
        g[27] * np.ldexp(1.0, k // 16 % 16 - 8),         # 27 by sub-block of 16
        np.where(k % 64 < 32, g[28] + 50.0, g[28] - 50.0),  # 28 offsets of both signs
        np.where(k % 32 == 0, 1e-3, g[29] * 1e-4),        # 29 a positive first value dominant
        g[30] * g[30] * g[30],                                     # 30 heavy tails
        np.where(k % 2 == 0, 1.0, -1.0) * (1.0 + k / 512.0),  # 31 alternating signs
    ]
    return np.array(rows, dtype=np.float64).astype(np.float32)


def _scaled(seed: int, shape, shift: bool) -> np.ndarray:
    g = normalish(seed, shape)
    R = shape[0]
    e = np.arange(R) % 12 - 6                             # 2^-6 .. 2^5
    m = 1.0 + (np.arange(R) % 5) / 8.0
    x = g * (m * np.ldexp(1.0, e))[:, None]
    if shift:
        x[::7] += np.ldexp(1.0, e[::7, None]) * 3.0
    return x.astype(np.float32)


def make(name: str, seed: int = SEED) -> np.ndarray:
    """Case ``name`` (one of CASES) as float32 (R, C)."""
    if name == "edges":
        return _edges(seed)
    if name == "normal":
        return _scaled(seed + 2, (64, 1024), False)
    if name == "wide":
        return _scaled(seed + 3, (4, 8192), False)
    if name == "bulk":
        return _scaled(seed + 4, (2048, 1024), True)
    raise KeyError(name)


def sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def first_difference(ours: np.ndarray, theirs: np.ndarray, block_bytes: int) -> str | None:
    """Where two arrays of block rows (R, row bytes) first differ, or None when equal."""
    a = ours.reshape(ours.shape[0], -1, block_bytes)
    b = theirs.reshape(a.shape)
    bad = np.argwhere((a != b).any(axis=2))
    if not len(bad):
        return None
    r, blk = bad[0]
    return (f"{len(bad)} blocks differ; first row {r} block {blk}:\n"
            f" ours {a[r, blk].tobytes().hex()}\n ggml {b[r, blk].tobytes().hex()}")
