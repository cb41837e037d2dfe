"""Weights kept in their own precision: BF16, F16, and ggml's Q8_0 and Q4_0 blocks, with the
matrix-vector kernels that widen them on the fly.

A packed matrix stores ``rows`` (R, C) along C, as ggml and PyTorch store a Linear weight
[out, in] and an embedding table [vocab, hidden]::

    BF16   bits uint16 (R, C):                          w[r, c] = float32(bits << 16)
    F16    bits uint16 (R, C):                          w[r, c] = IEEE half bits
    Q8_0   qs int8 (R, C), d float32 (R, C/32):         w[r, c] = d[r, c // 32] * qs[r, c]
    Q4_0   qs uint8 (R, C/2), d float32 (R, C/32):      byte qs[r, 16 b + j] holds the elements
                                                        32 b + j (low nibble) and 32 b + 16 + j
                                                        (high nibble) of block b;
                                                        w = d[r, b] * (nibble - 8)

(ggml's ``block_q8_0`` / ``block_q4_0`` values, the fp16 scale kept as the float32 it stands
for.) ``quantize_q8_0`` and ``quantize_q4_0`` round as ggml's reference quantizers do
(``quantize_row_q8_0_ref``, ``quantize_row_q4_0_ref``), so a model quantized here equals one
quantized by llama.cpp.

``PackedMatrix`` holds one and knows its logical shape: a fully connected weight is the logical
(K, N) = [in, out] of rows (N, K) (``transposed``, as the transpose view of a PyTorch weight);
an embedding table is the logical (V, D) of rows (V, D). ``packed_linear`` is ``linear`` for a
transposed packed weight::

    y[b, y_row + i] = x[b, x_row + i] @ W + bias          W = the logical (K, N)

For a few rows (decode, memory bound) a numba kernel per format streams the packed bytes and
widens them in registers, parallel over blocks of output rows; for many rows (prefill, compute
bound) the matrix is widened into a reused float32 buffer and numpy's BLAS multiplies, as for
float32 weights (``linear.BLAS_MIN_ROWS``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from causallm.kernels.linear import BLAS_MIN_ROWS, PARALLEL_MIN_WEIGHTS

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
BLOCK = 32  # values per Q8_0 / Q4_0 block
FORMATS = ("BF16", "F16", "Q8_0", "Q4_0")


@intrinsic
def bf16_to_f32(typingctx, bits):
    """float32 of bfloat16 bits (uint32 holding them in the low half)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.shl(args[0], ir.Constant(ir.IntType(32), 16)),
                               ir.FloatType())
    return types.float32(types.uint32), codegen


@intrinsic
def f16_to_f32(typingctx, bits):
    """float32 of IEEE half bits (uint16)."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


# -- decode kernels: columns [n0, n1) of y = x @ W + bias, W the packed (K, N) ------------------

@njit(cache=True, fastmath=_FASTMATH)
def _bf16_cols(x, bits, bias, y, x_row, y_row, nrows, n0, n1):
    K = bits.shape[1]
    has_bias = bias.shape[0] > 0
    for n in range(n0, n1):
        w = bits[n]
        for b in range(x.shape[0]):
            for i in range(nrows):
                xr = x[b, x_row + i]
                acc = np.float32(0.0)
                for k in range(K):
                    acc += xr[k] * bf16_to_f32(np.uint32(w[k]))
                y[b, y_row + i, n] = acc + bias[n] if has_bias else acc


@njit(cache=True, fastmath=_FASTMATH)
def _f16_cols(x, bits, bias, y, x_row, y_row, nrows, n0, n1):
    K = bits.shape[1]
    has_bias = bias.shape[0] > 0
    for n in range(n0, n1):
        w = bits[n]
        for b in range(x.shape[0]):
            for i in range(nrows):
                xr = x[b, x_row + i]
                acc = np.float32(0.0)
                for k in range(K):
                    acc += xr[k] * f16_to_f32(w[k])
                y[b, y_row + i, n] = acc + bias[n] if has_bias else acc


@njit(cache=True, fastmath=_FASTMATH)
def _q8_cols(x, qs, d, bias, y, x_row, y_row, nrows, n0, n1):
    K = qs.shape[1]
    has_bias = bias.shape[0] > 0
    for n in range(n0, n1):
        q = qs[n]
        s = d[n]
        for b in range(x.shape[0]):
            for i in range(nrows):
                xr = x[b, x_row + i]
                acc = np.float32(0.0)
                for k in range(K):
                    acc += np.float32(q[k]) * xr[k] * s[k >> 5]
                y[b, y_row + i, n] = acc + bias[n] if has_bias else acc


@njit(cache=True, fastmath=_FASTMATH)
def _q4_cols(xs, qs, d, bias, y, y_row, nrows, n0, n1):
    """xs (B, nrows, K): each input row split per block into its first and second 16 values,
    [x_lo | x_hi] (K/2 each), so the low and high nibbles of byte j meet x_lo[j], x_hi[j]."""
    H = qs.shape[1]
    has_bias = bias.shape[0] > 0
    for n in range(n0, n1):
        q = qs[n]
        s = d[n]
        for b in range(xs.shape[0]):
            for i in range(nrows):
                xlo = xs[b, i, :H]
                xhi = xs[b, i, H:]
                acc = np.float32(0.0)
                for j in range(H):
                    v = np.uint32(q[j])
                    lo = np.float32(np.int32(v & np.uint32(15))) - np.float32(8.0)
                    hi = np.float32(np.int32(v >> np.uint32(4))) - np.float32(8.0)
                    acc += (lo * xlo[j] + hi * xhi[j]) * s[j >> 4]
                y[b, y_row + i, n] = acc + bias[n] if has_bias else acc


@njit(cache=True)
def _q4_split(x, x_row, nrows):
    """(B, nrows, K) with each row's blocks split as _q4_cols reads them."""
    B, K = x.shape[0], x.shape[2]
    H = K // 2
    out = np.empty((B, nrows, K), dtype=np.float32)
    for b in range(B):
        for i in range(nrows):
            src = x[b, x_row + i]
            dst = out[b, i]
            for blk in range(K // BLOCK):
                for j in range(16):
                    dst[blk * 16 + j] = src[blk * BLOCK + j]
                    dst[H + blk * 16 + j] = src[blk * BLOCK + 16 + j]
    return out


_COLS = 64  # output rows per parallel task


@njit(cache=True, parallel=True)
def _bf16_parallel(x, bits, bias, y, x_row, y_row, nrows):
    N = bits.shape[0]
    for blk in prange((N + _COLS - 1) // _COLS):
        _bf16_cols(x, bits, bias, y, x_row, y_row, nrows, blk * _COLS,
                   min(blk * _COLS + _COLS, N))


@njit(cache=True, parallel=True)
def _f16_parallel(x, bits, bias, y, x_row, y_row, nrows):
    N = bits.shape[0]
    for blk in prange((N + _COLS - 1) // _COLS):
        _f16_cols(x, bits, bias, y, x_row, y_row, nrows, blk * _COLS,
                  min(blk * _COLS + _COLS, N))


@njit(cache=True, parallel=True)
def _q8_parallel(x, qs, d, bias, y, x_row, y_row, nrows):
    N = qs.shape[0]
    for blk in prange((N + _COLS - 1) // _COLS):
        _q8_cols(x, qs, d, bias, y, x_row, y_row, nrows, blk * _COLS,
                 min(blk * _COLS + _COLS, N))


@njit(cache=True, parallel=True)
def _q4_parallel(xs, qs, d, bias, y, y_row, nrows):
    N = qs.shape[0]
    for blk in prange((N + _COLS - 1) // _COLS):
        _q4_cols(xs, qs, d, bias, y, y_row, nrows, blk * _COLS, min(blk * _COLS + _COLS, N))


# -- widening -----------------------------------------------------------------------------------

def dequantize_rows(fmt: str, a: np.ndarray, d: np.ndarray | None, out: np.ndarray) -> None:
    """The packed rows as float32 into ``out`` (R, C)."""
    if fmt == "BF16":
        out.view(np.uint32)[...] = a.astype(np.uint32) << 16
    elif fmt == "F16":
        out[...] = a.view(np.float16)
    elif fmt == "Q8_0":
        R, C = a.shape
        np.multiply(a.reshape(R, -1, BLOCK), d[:, :, None], out=out.reshape(R, -1, BLOCK))
    else:  # Q4_0
        R, C = out.shape
        q = a.reshape(R, -1, 16)
        o = out.reshape(R, -1, BLOCK)
        o[:, :, :16] = q & 15
        o[:, :, 16:] = q >> 4
        o -= 8
        o *= d[:, :, None]


# -- quantizing, as ggml's reference quantizers -------------------------------------------------

def _f16_round(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


@njit(cache=True, parallel=True)
def _quantize_q8_0(rows, qs, d):
    """Q8_0 blocks of float32 rows (R, C) into qs (R, C) and the unrounded d (R, C/32), in
    float32 as ggml's reference: d = amax / 127, q = roundf(x * (1 / d)) (0 when d is 0)."""
    R, C = rows.shape
    for r in prange(R):
        x = rows[r]
        for b in range(C // BLOCK):
            amax = np.float32(0.0)
            for j in range(b * BLOCK, b * BLOCK + BLOCK):
                amax = max(amax, abs(x[j]))
            db = amax / np.float32(127.0)
            inv = np.float32(1.0) / db if db != 0 else np.float32(0.0)
            for j in range(b * BLOCK, b * BLOCK + BLOCK):
                v = x[j] * inv
                half = np.float32(0.5) if v >= 0 else np.float32(-0.5)
                qs[r, j] = np.int8(np.trunc(v + half))  # roundf: half away from zero
            d[r, b] = db


@njit(cache=True, parallel=True)
def _quantize_q4_0(rows, qs, d):
    """Q4_0 blocks of float32 rows (R, C) into qs (R, C/2) and the unrounded d (R, C/32), as
    ggml's reference: m = the first value of largest magnitude, d = m / -8,
    q = min(15, trunc(x * (1 / d) + 8.5)) (8 when d is 0), nibbles j and j + 16 in byte j."""
    R, C = rows.shape
    for r in prange(R):
        x = rows[r]
        for b in range(C // BLOCK):
            o = b * BLOCK
            amax = np.float32(0.0)
            m = np.float32(0.0)
            for j in range(o, o + BLOCK):
                if abs(x[j]) > amax:
                    amax = abs(x[j])
                    m = x[j]
            db = m / np.float32(-8.0)
            inv = np.float32(1.0) / db if db != 0 else np.float32(0.0)
            for j in range(16):
                lo = min(15, np.int32(x[o + j] * inv + np.float32(8.5)))
                hi = min(15, np.int32(x[o + 16 + j] * inv + np.float32(8.5)))
                qs[r, b * 16 + j] = np.uint8(lo | (hi << 4))
            d[r, b] = db


_PACK_CHUNK = 1024
"""Rows widened and packed at a time: a conversion's float32 copy stays one chunk (4 MiB at
1024 values a row), not the matrix (a 150k-token embedding table is 600 MB in float32)."""


def pack_rows(fmt: str, R: int, C: int, rows_of) -> tuple[np.ndarray, np.ndarray | None]:
    """(data, scales) of ``fmt`` for the rows (R, C) that ``rows_of(r0, r1)`` gives a chunk at
    a time as float32; BF16 rounds to nearest even (as torch), F16 as numpy, Q8_0 / Q4_0 as
    ggml's reference quantizers (C a multiple of 32)."""
    scales = None
    if fmt in ("BF16", "F16"):
        data = np.empty((R, C), dtype=np.uint16)
    else:
        if C % BLOCK:
            raise ValueError(f"{fmt} needs rows of a multiple of {BLOCK} values, got {C}")
        data = np.empty((R, C if fmt == "Q8_0" else C // 2),
                        dtype=np.int8 if fmt == "Q8_0" else np.uint8)
        scales = np.empty((R, C // BLOCK), dtype=np.float32)
    for r0 in range(0, R, _PACK_CHUNK):
        r1 = min(R, r0 + _PACK_CHUNK)
        x = np.ascontiguousarray(rows_of(r0, r1), dtype=np.float32)
        if fmt == "BF16":
            u = x.view(np.uint32)
            data[r0:r1] = (u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16
        elif fmt == "F16":
            data[r0:r1] = x.astype(np.float16).view(np.uint16)
        else:
            quantize = _quantize_q8_0 if fmt == "Q8_0" else _quantize_q4_0
            quantize(x, data[r0:r1], scales[r0:r1])
            scales[r0:r1] = _f16_round(scales[r0:r1])  # ggml stores d as fp16
    return data, scales


def quantize_q8_0(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(qs int8 (R, C), d float32 (R, C/32)) of float rows (R, C): per block d = amax / 127
    (stored as fp16), q = roundf(x / d) (half away from zero)."""
    R, C = rows.shape
    return pack_rows("Q8_0", R, C, lambda r0, r1: rows[r0:r1])


def quantize_q4_0(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(qs uint8 (R, C/2), d float32 (R, C/32)) of float rows (R, C): per block the value of
    largest magnitude m gives d = m / -8 (stored as fp16), q = min(15, int8(x / d + 8.5))."""
    R, C = rows.shape
    return pack_rows("Q4_0", R, C, lambda r0, r1: rows[r0:r1])


# -- ggml's block bytes ------------------------------------------------------------------------

BLOCK_BYTES = {"Q4_0": 18, "Q8_0": 34}
"""Bytes of a ggml block of 32 values: the fp16 scale d, then the quants."""


def rows_to_ggml_blocks(fmt: str, qs: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Rows of (qs, d) as ggml block bytes (R, nb * BLOCK_BYTES) uint8."""
    R, nb = d.shape
    out = np.empty((R, nb, BLOCK_BYTES[fmt]), dtype=np.uint8)
    out[:, :, :2] = d.astype("<f2").view(np.uint8).reshape(R, nb, 2)
    out[:, :, 2:] = qs.view(np.uint8).reshape(R, nb, -1)
    return out.reshape(R, -1)


def ggml_blocks_to_rows(fmt: str, raw: np.ndarray, R: int, C: int):
    """ggml block bytes of R rows of C values back to (qs, d)."""
    nb = C // BLOCK
    b = raw.reshape(R, nb, BLOCK_BYTES[fmt])
    d = np.ascontiguousarray(b[:, :, :2]).view("<f2").reshape(R, nb).astype(np.float32)
    qs = np.ascontiguousarray(b[:, :, 2:]).reshape(R, -1)
    return (qs.view(np.int8) if fmt == "Q8_0" else qs), d


# -- the matrix ---------------------------------------------------------------------------------

_scratch = np.zeros(0, dtype=np.float32)


def _widened(w: "PackedMatrix") -> np.ndarray:
    """The rows as float32 in a buffer reused between calls (the prefill's BLAS operand)."""
    global _scratch
    R, C = w.rows_shape
    if _scratch.size < R * C:
        _scratch = np.empty(R * C, dtype=np.float32)
    out = _scratch[:R * C].reshape(R, C)
    dequantize_rows(w.format, w.data, w.scales, out)
    return out


class PackedMatrix:
    """A matrix in one of FORMATS (module docstring): ``data`` and ``scales`` hold its rows
    (R, C); its logical shape is (C, R) when ``transposed`` (a Linear weight [in, out]), else
    (R, C) (an embedding table)."""

    def __init__(self, fmt: str, data: np.ndarray, scales: np.ndarray | None = None,
                 transposed: bool = True) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown packed format {fmt!r}")
        self.format, self.data, self.scales, self.transposed = fmt, data, scales, transposed
        R = data.shape[0]
        C = data.shape[1] * (2 if fmt == "Q4_0" else 1)
        self.rows_shape = (R, C)
        self.shape = (C, R) if transposed else (R, C)
        self.dtype = fmt

    @classmethod
    def fromFloat(cls, fmt: str, rows: np.ndarray, transposed: bool = True) -> "PackedMatrix":
        """Float rows (R, C) (any strides) packed as ``fmt`` (pack_rows)."""
        R, C = rows.shape
        return cls(fmt, *pack_rows(fmt, R, C, lambda r0, r1: rows[r0:r1]), transposed)

    def to(self, fmt: str) -> "PackedMatrix":
        """The same matrix packed as ``fmt``: its rows widened a chunk at a time."""
        if fmt == self.format:
            return self
        R, C = self.rows_shape
        return PackedMatrix(fmt, *pack_rows(fmt, R, C, self.rowsFloat), self.transposed)

    @property
    def T(self) -> "PackedMatrix":
        return PackedMatrix(self.format, self.data, self.scales, not self.transposed)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.scales is None else self.scales.nbytes)

    def rowsFloat(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        """The rows [r0, r1) (all by default) as a new float32 array."""
        r1 = self.rows_shape[0] if r1 is None else r1
        out = np.empty((r1 - r0, self.rows_shape[1]), dtype=np.float32)
        dequantize_rows(self.format, self.data[r0:r1],
                        None if self.scales is None else self.scales[r0:r1], out)
        return out

    def toFloat(self) -> np.ndarray:
        """The logical matrix as float32 (a transposed view when ``transposed``)."""
        rows = self.rowsFloat()
        return rows.T if self.transposed else rows

    def linear(self, x, bias, y, x_row, y_row, nrows) -> None:
        """``linear`` with this (transposed) matrix as W."""
        if not self.transposed:
            raise ValueError("a packed weight is multiplied as the logical (K, N) of rows "
                             "(N, K): use its .T")
        packed_linear(x, self, bias, y, x_row, y_row, nrows)

    def gather(self, index: np.ndarray, out: np.ndarray) -> None:
        """Rows ``index`` (int array) as float32 into ``out`` (len(index), C)."""
        sel = self.data[index]
        dequantize_rows(self.format, sel, None if self.scales is None else self.scales[index],
                        out)


def packed_linear(x, w: PackedMatrix, bias, y, x_row, y_row, nrows) -> None:
    """``linear`` for a transposed packed weight (module docstring)."""
    N = w.rows_shape[0]
    if nrows >= BLAS_MIN_ROWS:
        W = _widened(w).T
        for b in range(x.shape[0]):
            out = y[b, y_row:y_row + nrows]
            np.matmul(x[b, x_row:x_row + nrows], W, out=out)
            if bias.shape[0]:
                out += bias
        return
    big = w.rows_shape[0] * w.rows_shape[1] >= PARALLEL_MIN_WEIGHTS
    fmt, a, d = w.format, w.data, w.scales
    if fmt == "BF16":
        if big:
            _bf16_parallel(x, a, bias, y, x_row, y_row, nrows)
        else:
            _bf16_cols(x, a, bias, y, x_row, y_row, nrows, 0, N)
    elif fmt == "F16":
        if big:
            _f16_parallel(x, a, bias, y, x_row, y_row, nrows)
        else:
            _f16_cols(x, a, bias, y, x_row, y_row, nrows, 0, N)
    elif fmt == "Q8_0":
        if big:
            _q8_parallel(x, a, d, bias, y, x_row, y_row, nrows)
        else:
            _q8_cols(x, a, d, bias, y, x_row, y_row, nrows, 0, N)
    else:
        xs = _q4_split(x, x_row, nrows)
        if big:
            _q4_parallel(xs, a, d, bias, y, y_row, nrows)
        else:
            _q4_cols(xs, a, d, bias, y, y_row, nrows, 0, N)

