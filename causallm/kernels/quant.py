"""Q8_0 and Q4_0 weights in row tiles, multiplied by int8-quantized activations.

ggml's Q8_0 / Q4_0 cut each row into blocks of 32 values with one scale ``d`` per block. Here a
matrix of R rows is held as tiles of 16 rows: tile (g, b) holds block b of rows 16g .. 16g + 15,
interleaved four bytes at a time so that one 64-byte vector holds four bytes of each of the 16
rows (the role of ggml's and NNTrainer's q4_0x8 repack, for 16 rows)::

    scales  uint16 (G, nb, 16)   fp16 bits of d for rows 16g + r, r < 16
    Q8_0    data uint8 (G, nb, 512): byte 64c + 4r + j = qs[16g + r, 32b + 4c + j] + 128  (c < 8)
    Q4_0    data uint8 (G, nb, 256): byte 64c + 4r + j = qs[16g + r, 16b + 4c + j]         (c < 4)
            (a Q4_0 byte holds two values: low nibble 32b + 4c + j, high nibble 32b + 16 + 4c + j)

G = ceil(R / 16), nb = C / 32; rows past R are zeros with d = 0. A Q8_0 value is stored plus
128 so that every weight byte is unsigned.

``tiles_linear`` computes y = x @ W + bias for W the logical (K, N) of rows (N, K), as ggml's
``vec_dot_q4_0_q8_0`` / ``vec_dot_q8_0_q8_0`` do: each row of x is first quantized to Q8_0
blocks (``quantize_activations``: dx = max|x| / 127 in float32, qx = round(x / dx)), then for
every block one exact integer dot product of bytes, scaled::

    y[t, n] = sum_b d[n, b] * dx[t, b] * (sum_k u[n, 32b + k] * qx[t, 32b + k] - o * sx[t, b])

with u the unsigned weight byte (Q4_0: the nibble, o = 8; Q8_0: q + 128, o = 128) and sx[t, b]
the sum of the block's qx. The integer sums run 64 bytes at a time (``simd.dpbusd_bcast``): the
16 lanes of one vector are the 16 rows of a tile, so a tile's partial sums never leave a
register and a lane ends as one output. Prefill multiplies a tile by four activation rows at a
time, reusing its unpacked weights. The activations' rounding is the only difference from a
float product of the dequantized weights, and is the same as llama.cpp's.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from causallm.kernels.simd import (
    dpbusd_bcast,
    f16_to_f32,
    fma_scaled,
    lane,
    load_u8x64,
    nibbles_hi,
    nibbles_lo,
    splat_i32x16,
    zero_f32x16,
)

BLOCK = 32  # values per block
ROWS = 16   # rows per tile
TILE_BYTES = {"Q8_0": 512, "Q4_0": 256}
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


# -- layout ------------------------------------------------------------------------------------

def _chunks(fmt: str) -> int:
    return 8 if fmt == "Q8_0" else 4


def tile_blocks(fmt: str, qs: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Plain block rows (qs (R, C) int8 or (R, C/2) uint8, d (R, C/32) fp16 values) as tiles
    (data, scales) of the module docstring."""
    R, nb = d.shape
    G = (R + ROWS - 1) // ROWS
    q = np.zeros((G * ROWS, qs.shape[1]), dtype=np.uint8)
    q[:R] = qs.view(np.uint8)
    if fmt == "Q8_0":
        q[:R] ^= 0x80                     # q + 128 as an unsigned byte
    s = np.zeros((G * ROWS, nb), dtype=np.float16)
    s[:R] = d
    data = q.reshape(G, ROWS, nb, _chunks(fmt), 4).transpose(0, 2, 3, 1, 4)
    return (np.ascontiguousarray(data).reshape(G, nb, TILE_BYTES[fmt]),
            np.ascontiguousarray(s.reshape(G, ROWS, nb).transpose(0, 2, 1)).view(np.uint16))


def untile_blocks(fmt: str, data: np.ndarray, scales: np.ndarray, r0: int, r1: int):
    """Rows [r0, r1) of tiles back to plain block rows (qs, d float32)."""
    G, nb = scales.shape[:2]
    g0, g1 = r0 // ROWS, (r1 + ROWS - 1) // ROWS
    q = data[g0:g1].reshape(g1 - g0, nb, _chunks(fmt), ROWS, 4).transpose(0, 3, 1, 2, 4)
    q = q.reshape((g1 - g0) * ROWS, -1)[r0 - g0 * ROWS:r1 - g0 * ROWS]
    d = scales[g0:g1].view(np.float16).transpose(0, 2, 1).reshape((g1 - g0) * ROWS, nb)
    d = d[r0 - g0 * ROWS:r1 - g0 * ROWS].astype(np.float32)
    if fmt == "Q8_0":
        return (q ^ np.uint8(0x80)).view(np.int8), d
    return np.ascontiguousarray(q), d


@njit(cache=True)
def _gather(data, scales, q4, index, out):
    """out[i] = row index[i] of the tiles, dequantized."""
    nb = scales.shape[1]
    for i in range(index.shape[0]):
        g, r = index[i] // ROWS, index[i] % ROWS
        for b in range(nb):
            d = f16_to_f32(scales[g, b, r])
            o = out[i, b * BLOCK:(b + 1) * BLOCK]
            if q4:
                for c in range(4):
                    for j in range(4):
                        v = np.int32(data[g, b, 64 * c + 4 * r + j])
                        o[4 * c + j] = d * np.float32((v & 15) - 8)
                        o[16 + 4 * c + j] = d * np.float32((v >> 4) - 8)
            else:
                for c in range(8):
                    for j in range(4):
                        o[4 * c + j] = d * np.float32(np.int32(data[g, b, 64 * c + 4 * r + j]) - 128)


def gather_rows(fmt: str, data, scales, index: np.ndarray, out: np.ndarray) -> None:
    """Rows ``index`` of the tiles as float32 into ``out`` (len(index), C)."""
    _gather(data, scales, fmt == "Q4_0", np.asarray(index, dtype=np.int64), out)


# -- activations ---------------------------------------------------------------------------------

@njit(cache=True)
def _quantize_row(x, qx, dx, sx):
    """One row as Q8_0 blocks: dx = max|x| / 127, qx = roundf(x / dx) (half away from zero, 0
    when dx is 0), sx = the block's sum of qx."""
    for b in range(x.shape[0] // BLOCK):
        amax = np.float32(0.0)
        for j in range(b * BLOCK, b * BLOCK + BLOCK):
            amax = max(amax, abs(x[j]))
        db = amax / np.float32(127.0)
        inv = np.float32(1.0) / db if db != 0 else np.float32(0.0)
        s = 0
        for j in range(b * BLOCK, b * BLOCK + BLOCK):
            v = x[j] * inv
            q = np.int32(np.trunc(v + (np.float32(0.5) if v >= 0 else np.float32(-0.5))))
            qx[j] = q
            s += q
        dx[b] = db
        sx[b] = s


@njit(cache=True)
def _quantize_serial(x, x_row, nrows, qx, dx, sx):
    for t in range(x.shape[0] * nrows):
        _quantize_row(x[t // nrows, x_row + t % nrows], qx[t], dx[t], sx[t])


@njit(cache=True, parallel=True)
def _quantize_parallel(x, x_row, nrows, qx, dx, sx):
    for t in prange(x.shape[0] * nrows):
        _quantize_row(x[t // nrows, x_row + t % nrows], qx[t], dx[t], sx[t])


def quantize_activations(x, x_row, nrows, qx, dx, sx) -> None:
    """Rows [x_row, x_row + nrows) of every batch of x (B, H, K) as Q8_0 blocks, batch-major into
    qx int8 (B * nrows, K), dx float32 and sx int32 (B * nrows, K / 32) (``_quantize_row``)."""
    if x.shape[0] * nrows >= 8:
        _quantize_parallel(x, x_row, nrows, qx, dx, sx)
    else:
        _quantize_serial(x, x_row, nrows, qx, dx, sx)


# -- the product ---------------------------------------------------------------------------------

@njit(cache=True, inline="always")
def _unpacked(data, o, q4):
    """The eight unsigned 64-byte vectors of a tile's block at flat offset ``o``: vector c meets
    activation bytes 4c .. 4c + 3 of the block in every lane."""
    if q4:
        v0 = load_u8x64(data, o)
        v1 = load_u8x64(data, o + 64)
        v2 = load_u8x64(data, o + 128)
        v3 = load_u8x64(data, o + 192)
        return (nibbles_lo(v0), nibbles_lo(v1), nibbles_lo(v2), nibbles_lo(v3),
                nibbles_hi(v0), nibbles_hi(v1), nibbles_hi(v2), nibbles_hi(v3))
    return (load_u8x64(data, o), load_u8x64(data, o + 64), load_u8x64(data, o + 128),
            load_u8x64(data, o + 192), load_u8x64(data, o + 256), load_u8x64(data, o + 320),
            load_u8x64(data, o + 384), load_u8x64(data, o + 448))


@njit(cache=True, inline="always")
def _dot(w, qx, xo, start):
    """start + the block's integer dot products, a lane per row."""
    acc = dpbusd_bcast(start, w[0], qx, xo)
    acc = dpbusd_bcast(acc, w[1], qx, xo + 4)
    acc = dpbusd_bcast(acc, w[2], qx, xo + 8)
    acc = dpbusd_bcast(acc, w[3], qx, xo + 12)
    acc = dpbusd_bcast(acc, w[4], qx, xo + 16)
    acc = dpbusd_bcast(acc, w[5], qx, xo + 20)
    acc = dpbusd_bcast(acc, w[6], qx, xo + 24)
    return dpbusd_bcast(acc, w[7], qx, xo + 28)


@njit(cache=True, inline="always")
def _store(acc, y, t, nrows, y_row, bias, n0, N):
    b, i = t // nrows, y_row + t % nrows
    for r in range(min(ROWS, N - n0)):
        v = lane(acc, r)
        y[b, i, n0 + r] = v + bias[n0 + r] if bias.shape[0] > 0 else v


@njit(cache=True, fastmath=_FASTMATH)
def _tiles(data, scales, q4, N, qx, dx, sx, bias, y, y_row, nrows, g0, g1):
    """Tiles [g0, g1) of y = x @ W + bias (module docstring), for the T = B * nrows quantized
    activation rows: four rows at a time, then the rest one by one."""
    nb = scales.shape[1]
    T, K = qx.shape
    step = data.shape[2]
    off = np.int32(8 if q4 else 128)
    T4 = T - T % 4
    for g in range(g0, g1):
        for t in range(0, T4, 4):
            a0 = zero_f32x16()
            a1 = zero_f32x16()
            a2 = zero_f32x16()
            a3 = zero_f32x16()
            for b in range(nb):
                w = _unpacked(data, (g * nb + b) * step, q4)
                so = (g * nb + b) * ROWS
                xo = t * K + b * BLOCK
                a0 = fma_scaled(a0, _dot(w, qx, xo, splat_i32x16(-off * sx[t, b])),
                                scales, so, dx[t, b])
                a1 = fma_scaled(a1, _dot(w, qx, xo + K, splat_i32x16(-off * sx[t + 1, b])),
                                scales, so, dx[t + 1, b])
                a2 = fma_scaled(a2, _dot(w, qx, xo + 2 * K, splat_i32x16(-off * sx[t + 2, b])),
                                scales, so, dx[t + 2, b])
                a3 = fma_scaled(a3, _dot(w, qx, xo + 3 * K, splat_i32x16(-off * sx[t + 3, b])),
                                scales, so, dx[t + 3, b])
            _store(a0, y, t, nrows, y_row, bias, g * ROWS, N)
            _store(a1, y, t + 1, nrows, y_row, bias, g * ROWS, N)
            _store(a2, y, t + 2, nrows, y_row, bias, g * ROWS, N)
            _store(a3, y, t + 3, nrows, y_row, bias, g * ROWS, N)
        for t in range(T4, T):
            acc = zero_f32x16()
            for b in range(nb):
                w = _unpacked(data, (g * nb + b) * step, q4)
                acc = fma_scaled(acc, _dot(w, qx, t * K + b * BLOCK,
                                           splat_i32x16(-off * sx[t, b])),
                                 scales, (g * nb + b) * ROWS, dx[t, b])
            _store(acc, y, t, nrows, y_row, bias, g * ROWS, N)


@njit(cache=True, parallel=True)
def _tiles_parallel(data, scales, q4, N, qx, dx, sx, bias, y, y_row, nrows):
    for g in prange(data.shape[0]):
        _tiles(data, scales, q4, N, qx, dx, sx, bias, y, y_row, nrows, g, g + 1)


# Weights (K * N) below which one thread multiplies: a parallel region costs ~10-50 us.
PARALLEL_MIN_WEIGHTS = 1 << 19

_buffers: dict[str, np.ndarray] = {}


def _scratch(name: str, n: int, dtype) -> np.ndarray:
    """A reused buffer of at least n elements (the quantized activations of a call)."""
    a = _buffers.get(name)
    if a is None or a.size < n:
        a = _buffers[name] = np.empty(max(n, 1), dtype=dtype)
    return a[:n]


def tiles_linear(fmt, data, scales, N, x, bias, y, x_row, y_row, nrows) -> None:
    """y[b, y_row + i] = x[b, x_row + i] @ W + bias for W the logical (K, N) whose N rows are
    the tiles (module docstring), every batch b and i < nrows."""
    B, K = x.shape[0], x.shape[2]
    T, nb = B * nrows, K // BLOCK
    qx = _scratch("qx", T * K, np.int8).reshape(T, K)
    dx = _scratch("dx", T * nb, np.float32).reshape(T, nb)
    sx = _scratch("sx", T * nb, np.int32).reshape(T, nb)
    quantize_activations(x, x_row, nrows, qx, dx, sx)
    q4 = fmt == "Q4_0"
    if N * K * max(1, T // 4) >= PARALLEL_MIN_WEIGHTS:
        _tiles_parallel(data, scales, q4, N, qx, dx, sx, bias, y, y_row, nrows)
    else:
        _tiles(data, scales, q4, N, qx, dx, sx, bias, y, y_row, nrows, 0, data.shape[0])
