"""Weights kept in their own precision: BF16, F16, and every ggml block type, with their kernels.

A packed matrix has R rows of C values along C, as ggml and PyTorch store a Linear weight
[out, in] and an embedding table [vocab, hidden]. Its ``data``::

    BF16   bits uint16 (R, C):            w[r, c] = float32(bits << 16)
    F16    bits uint16 (R, C):            w[r, c] = IEEE half bits
    Q4_0, Q8_0, Q4_K, ... (quant.QTYPES)  uint8 (R, C / QK * block bytes): each row's ggml
                                          blocks, exactly as a GGUF file stores them

so a memory-mapped tensor is held without a copy; a type that its kernels read as panels of 16
rows (quant.PANEL_KINDS) is reordered into them when the matrix is first multiplied
(``blocks``), and the file's pages are given back. A float matrix is quantized by ggml's
reference quantizers (kernels/quantize.py), so a model quantized here equals one quantized by
llama.cpp.

``PackedMatrix`` holds one and knows its logical shape: a fully connected weight is the logical
(K, N) = [in, out] of rows (N, K) (``transposed``, as the transpose view of a PyTorch weight);
an embedding table is the logical (V, D) of rows (V, D). ``packed_linear`` is ``linear`` for a
transposed packed weight::

    y[b, y_row + i] = x[b, x_row + i] @ W + bias          W = the logical (K, N)

A block type multiplies activations rounded as ggml rounds them for that type, for any number
of rows (quant.py). BF16 and F16 stream the bits and widen them in registers, a team op a block
of output rows (``linear.rows_ops``): for a few rows (decode, memory bound) each weight row
once against every input row, for many (prefill, compute bound, ``linear.BLAS_MIN_ROWS``) in
tiles of 4 weight rows x 6 input rows where the CPU has AVX-512 (``linear.TILES``). Without it,
numpy's BLAS multiplies many rows, as for float32 weights, the matrix widened into a reused
float32 buffer a column part at a time by the thread that multiplies that part. BF16 on a CPU
with AMX tiles multiplies many rows on them instead: each activation value is split into three
bfloat16 parts, x = h + m + l with h = bf16(x), m = bf16(x - h), l = bf16(x - h - m) (together
every bit of a normal float32), and

    y[t, n] = sum_k h[t, k] w[n, k] + m[t, k] w[n, k] + l[t, k] w[n, k]

on tiles (``tdpbf16ps``: each bf16 product exact in float32, the sums in float32), 16 weight
rows against 16 activation rows at a time (``_bf16_tile_rows``): the float32 product to within
float32 rounding, as BLAS's is, without widening the weights.
"""

from __future__ import annotations

import copy

import numpy as np
from numba import get_thread_id, njit, prange
from numba import config as numba_config

from causallm.io.files import is_file_view, release_pages
from causallm.kernels.jit_cache import read_only

from causallm.kernels import quant
from causallm.kernels.quantize import QUANTIZERS, quantize_rows
from causallm.kernels.linear import BF16, BLAS_MIN_ROWS, F16, TILES, rows_ops, run_ops
from causallm.kernels import amx, simd
from causallm.kernels.simd import bf16_to_f32, f16_to_f32, f32_to_bf16, transpose16
from causallm.kernels.threads import matmul, threads

FORMATS = ("BF16", "F16", *quant.QTYPES)
"""Every format a PackedMatrix holds."""


# -- BF16 prompts on AMX tiles (module docstring) ------------------------------------------------

@njit(cache=True, parallel=True)
def _bf16_parts(x, x_row, nrows, t0, parts):
    """parts[j, r] = part j of activation row t = t0 + r, t = b * nrows + i (x[b, x_row + i]), as
    bfloat16 bits: h, m and l; the columns past x's K zero. A row a task."""
    K = x.shape[2]
    for r in prange(parts.shape[1]):
        b, i = (t0 + r) // nrows, (t0 + r) % nrows
        for k in range(K):
            v = x[b, x_row + i, k]
            h = f32_to_bf16(v)
            v = v - bf16_to_f32(np.uint32(h))
            m = f32_to_bf16(v)
            v = v - bf16_to_f32(np.uint32(m))
            parts[0, r, k], parts[1, r, k], parts[2, r, k] = h, m, f32_to_bf16(v)
        for k in range(K, parts.shape[2]):
            parts[0, r, k], parts[1, r, k], parts[2, r, k] = 0, 0, 0


@njit(cache=True, inline="always")
def _bf16_configure(cfg, R):
    """Tile shapes: C (tiles 0, 1) R rows of 16 float32; A (2) R activation rows of 32
    bfloat16; B (3, 4) 16 rows of 16 columns x 2 bfloat16."""
    cfg[:] = 0
    cfg[0] = 1  # palette 1
    for t in range(5):
        cfg[16 + 2 * t] = 64
        cfg[48 + t] = R if t < 3 else 16
    amx.tile_config(cfg)


@njit(cache=True, inline="always")
def _bf16_panel(rows, N, K, Kp, n0, words, w0):
    """Weight rows [n0, n0 + 16) as the B operand from word w0 of ``words``: word j of row c at
    w0 + 16 j + c (their values 2 j and 2 j + 1), 16 x 16 words at a time transposed in
    registers; zeros past N and K."""
    H = K // 2
    j = 0
    if n0 + 16 <= N:
        flat = rows.reshape(N * H)
        while j + 16 <= H:
            transpose16(flat, n0 * H + j, H, words, w0 + 16 * j)
            j += 16
    for j in range(j, H):
        for c in range(16):
            words[w0 + 16 * j + c] = rows[n0 + c, j] if n0 + c < N else 0
    words[w0 + 16 * H:w0 + 8 * Kp] = 0


@njit(cache=True)
def _bf16_tile_rows(parts, t_base, bits, bias, y, y_row, nrows, p0, p1, room):
    """Outputs [32 p0, 32 p1) of the activation rows t_base + r (their ``parts``, r < rows)
    times the BF16 rows ``bits`` (N, K), K even, on tiles; ``room`` this thread's bytes
    (``bf16_room_bytes``). Two panels of 16 weight rows are laid out as B operands once, then
    met by the activations 16 rows at a time, each activation tile loaded once for both."""
    T, Kp = parts.shape[1], parts.shape[2]
    N, K = bits.shape
    cfg = room[:64]
    panel = room[64:64 + 64 * Kp]
    words = panel.view(np.uint32)
    out = room[64 + 64 * Kp:64 + 64 * Kp + 2048]
    sums = out.view(np.float32)
    flat = parts.reshape(3 * T * Kp).view(np.uint8)
    rows = bits.view(np.uint32)
    has_bias = bias.shape[0] > 0
    R = 0
    for p in range(p0, p1):
        n0 = 32 * p
        _bf16_panel(rows, N, K, Kp, n0, words, 0)
        _bf16_panel(rows, N, K, Kp, n0 + 16, words, 8 * Kp)
        for t0 in range(0, T, 16):
            if min(16, T - t0) != R:
                R = min(16, T - t0)
                _bf16_configure(cfg, R)
            amx.tile_zero(0)
            amx.tile_zero(1)
            for k0 in range(0, Kp, 32):
                amx.tile_load(3, panel, 32 * k0, 64)
                amx.tile_load(4, panel, 32 * Kp + 32 * k0, 64)
                amx.tile_load(2, flat, 2 * (t0 * Kp + k0), 2 * Kp)
                amx.tile_dot_bf16(0, 2, 3)
                amx.tile_dot_bf16(1, 2, 4)
                amx.tile_load(2, flat, 2 * ((T + t0) * Kp + k0), 2 * Kp)
                amx.tile_dot_bf16(0, 2, 3)
                amx.tile_dot_bf16(1, 2, 4)
                amx.tile_load(2, flat, 2 * ((2 * T + t0) * Kp + k0), 2 * Kp)
                amx.tile_dot_bf16(0, 2, 3)
                amx.tile_dot_bf16(1, 2, 4)
            amx.tile_store(0, out, 0, 128)
            amx.tile_store(1, out, 64, 128)
            for i in range(R):
                t = t_base + t0 + i
                yr = y[t // nrows, y_row + t % nrows]
                for c in range(min(32, N - n0)):
                    v = sums[32 * i + c]
                    yr[n0 + c] = v + bias[n0 + c] if has_bias else v


@njit(cache=True, parallel=True)
def _bf16_tiles_parallel(parts, t_base, bits, bias, y, y_row, nrows, rooms):
    for p in prange((bits.shape[0] + 31) // 32):
        q = np.int64(p)  # the signature of the one-thread call: one compile of _bf16_tile_rows
        _bf16_tile_rows(parts, t_base, bits, bias, y, y_row, nrows, q, q + 1,
                        rooms[get_thread_id()])


BF16_TILES = simd.LEVEL == "amx"
"""Whether a BF16 prompt multiplies on AMX tiles (module docstring)."""

BF16_TILE_ROWS = 128
"""Activation rows a pass over the weights multiplies: their three parts (768 KB at 1024
values a row) stay in L2 while each pair of panels meets them."""


def bf16_room_bytes(Kp: int) -> int:
    """Bytes of one thread's room for ``_bf16_tile_rows`` over rows of Kp values (a multiple of
    32): the tile shapes, two panels as B operands, two tiles of sums."""
    return 64 + 64 * Kp + 2048


_bf16_rooms: dict[int, np.ndarray] = {}


def bf16_tile_linear(x, bits, bias, y, x_row, y_row, nrows) -> None:
    """``packed_linear`` of BF16 rows (N, K), K even, on AMX tiles, BF16_TILE_ROWS activation
    rows a pass."""
    T, Kp = x.shape[0] * nrows, -(-x.shape[2] // 32) * 32
    bits = np.ascontiguousarray(bits)  # its rows read as words
    nbytes = bf16_room_bytes(Kp)
    rooms = _bf16_rooms.get(nbytes)
    if rooms is None:
        rooms = _bf16_rooms[nbytes] = np.empty((numba_config.NUMBA_NUM_THREADS, nbytes),
                                               dtype=np.uint8)
    for t0 in range(0, T, BF16_TILE_ROWS):
        parts = np.empty((3, min(BF16_TILE_ROWS, T - t0), Kp), dtype=np.uint16)
        _bf16_parts(x, x_row, nrows, t0, parts)
        if threads() > 1 and bits.shape[0] > 32:
            _bf16_tiles_parallel(parts, t0, bits, bias, y, y_row, nrows, rooms)
        else:
            _bf16_tile_rows(parts, t0, bits, bias, y, y_row, nrows, np.int64(0),
                            np.int64((bits.shape[0] + 31) // 32), rooms[0])


# -- widening -----------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _widen_rows(bits, out, bf16):
    """out = BF16 (``bf16``) or F16 bits (R, C) as float32, in one pass; without the GIL, so
    the threads of a prompt's product widen their parts at once (``packed_linear``)."""
    for r in range(bits.shape[0]):
        b, o = bits[r], out[r]
        if bf16:
            for c in range(b.shape[0]):
                o[c] = bf16_to_f32(np.uint32(b[c]))
        else:
            for c in range(b.shape[0]):
                o[c] = f16_to_f32(b[c])


def _widen_bits(fmt: str, a: np.ndarray, out: np.ndarray) -> None:
    """BF16 / F16 bits (R, C) as float32 into ``out``."""
    _widen_rows(read_only(a), out, fmt == "BF16")


_PACK_CHUNK = 1024
"""Rows widened and packed at a time: a conversion's float32 copy stays one chunk (4 MiB at
1024 values a row), not the matrix (a 150k-token embedding table is 600 MB in float32)."""

QUANTIZABLE = tuple(QUANTIZERS)
"""Block types a float matrix can be quantized to (kernels/quantize.py, ggml's reference
quantizers byte for byte)."""


def pack_rows(fmt: str, R: int, C: int, rows_of) -> np.ndarray:
    """The data a PackedMatrix of ``fmt`` holds for the rows (R, C) that ``rows_of(r0, r1)``
    gives a chunk at a time as float32: BF16 rounds to nearest even (as torch), F16 as numpy, a
    block type as ggml's reference quantizer (C a multiple of its block)."""
    if fmt in ("BF16", "F16"):
        data = np.empty((R, C), dtype=np.uint16)
    elif fmt in QUANTIZABLE:
        qt = quant.QTYPES[fmt]
        if C % qt.qk:
            raise ValueError(f"{fmt} needs rows of a multiple of {qt.qk} values, got {C}")
        data = np.empty((R, qt.row_bytes(C)), dtype=np.uint8)
    else:
        raise ValueError(f"cannot quantize to {fmt} (only to {', '.join(QUANTIZABLE)})")
    for r0 in range(0, R, _PACK_CHUNK):
        r1 = min(R, r0 + _PACK_CHUNK)
        x = np.ascontiguousarray(rows_of(r0, r1), dtype=np.float32)
        if fmt == "BF16":
            u = x.view(np.uint32)
            data[r0:r1] = (u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16
        elif fmt == "F16":
            data[r0:r1] = x.astype(np.float16).view(np.uint16)
        else:
            data[r0:r1] = quantize_rows(fmt, x)
    return data


# -- the matrix ---------------------------------------------------------------------------------

_scratch = np.zeros(0, dtype=np.float32)


def _widened_rows(w: "PackedMatrix") -> np.ndarray:
    """Room for BF16 / F16 rows as float32, a buffer reused between calls (the prefill's BLAS
    operand, widened a part at a time by the threads that multiply it)."""
    global _scratch
    R, C = w.rows_shape
    if _scratch.size < R * C:
        _scratch = np.empty(R * C, dtype=np.float32)
    return _scratch[:R * C].reshape(R, C)


class _Held:
    """A packed matrix's bytes: the rows as a file stores them, and, for a panelled type,
    its panels, made on first use (quant.panels). Once the panels exist the rows are no longer
    held: a view of a read-only mapped file stays a view (its pages given back to the OS), rows
    of our own are dropped and made again from the panels when asked for."""

    def __init__(self, qtype, rows: np.ndarray) -> None:
        self.qtype, self._rows, self._panels, self.R = qtype, rows, None, rows.shape[0]

    @property
    def rows(self) -> np.ndarray:
        if self._rows is not None:
            return self._rows
        return read_only(quant.panels_rows(self.qtype, self._panels, self.R))

    @property
    def blocks(self) -> np.ndarray:
        if self.qtype is None or not self.qtype.panelled:
            return self._rows
        if self._panels is None:
            rows = self._rows
            if is_file_view(rows):
                self._panels = quant.panels(self.qtype, rows,
                                            lambda r0, r1: release_pages(rows[r0:r1]))
            else:
                self._panels = quant.panels(self.qtype, rows)
                self._rows = None
        return self._panels

    def widen(self, index: np.ndarray, out: np.ndarray) -> None:
        """Rows ``index`` as float32 into ``out``: from the panels once they exist, else from
        the rows (a lookup table or a conversion to another format never makes panels)."""
        if self._panels is not None:
            quant.dequantize_rows(self.qtype, self._panels, index, out, in_panels=True)
        else:
            quant.dequantize_rows(self.qtype, self._rows, index, out, in_panels=False)


class PackedMatrix:
    """A matrix of R rows of C values in one of FORMATS (module docstring), its logical shape
    (C, R) when ``transposed`` (a Linear weight [in, out]), else (R, C) (an embedding table).
    ``data`` is read-only: often a view of a memory-mapped file; ``blocks`` is what the
    kernels read (the same, or its panels)."""

    def __init__(self, fmt: str, data: np.ndarray, transposed: bool = True) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown packed format {fmt!r}")
        self.format, self.transposed = fmt, transposed
        self.qtype = quant.QTYPES.get(fmt)
        want = "uint16 bits" if self.qtype is None else "uint8 rows of whole blocks"
        if data.ndim != 2 or data.dtype != (np.uint16 if self.qtype is None else np.uint8) \
                or (self.qtype is not None and data.shape[1] % self.qtype.nbytes):
            raise ValueError(f"{fmt} data must be {want} (R, ...), got {data.dtype} {data.shape}")
        R, C = data.shape
        if self.qtype is not None:
            C = C // self.qtype.nbytes * self.qtype.qk
        # read-only: one compiled kernel for file views and arrays of our own
        self._held = _Held(self.qtype, read_only(data))
        self.rows_shape = (R, C)
        self.shape = (C, R) if transposed else (R, C)
        self.dtype = fmt

    @classmethod
    def fromFloat(cls, fmt: str, rows: np.ndarray, transposed: bool = True) -> "PackedMatrix":
        """Float rows (R, C) (any strides) packed as ``fmt`` (pack_rows)."""
        R, C = rows.shape
        return cls(fmt, pack_rows(fmt, R, C, lambda r0, r1: rows[r0:r1]), transposed)

    def to(self, fmt: str) -> "PackedMatrix":
        """The same matrix packed as ``fmt``: its rows widened a chunk at a time."""
        if fmt == self.format:
            return self
        R, C = self.rows_shape
        return PackedMatrix(fmt, pack_rows(fmt, R, C, self.rowsFloat), self.transposed)

    @property
    def data(self) -> np.ndarray:
        """The rows as a file stores them (module docstring)."""
        return self._held.rows

    @property
    def blocks(self) -> np.ndarray:
        """The bytes the kernels read: a block type's ``quant.held`` layout, else ``data``."""
        return self._held.blocks

    def oriented(self, transposed: bool) -> "PackedMatrix":
        """The same rows read as a Linear weight (``transposed``) or as a table (one held copy
        for both: a tied embedding's head and table)."""
        if transposed == self.transposed:
            return self
        other = copy.copy(self)
        other.transposed = transposed
        other.shape = self.shape[::-1]
        return other

    def takeRows(self, index: np.ndarray) -> "PackedMatrix":
        """A new matrix of rows ``index`` (a copy of their bytes, as stored)."""
        return PackedMatrix(self.format, np.ascontiguousarray(self.data[index]), self.transposed)

    @property
    def T(self) -> "PackedMatrix":
        return self.oriented(not self.transposed)

    @property
    def nbytes(self) -> int:
        """The bytes of the rows as a file stores them."""
        R, C = self.rows_shape
        return R * (C * 2 if self.qtype is None else self.qtype.row_bytes(C))

    def rowsFloat(self, r0: int = 0, r1: int | None = None) -> np.ndarray:
        """The rows [r0, r1) (all by default) as a new float32 array."""
        r1 = self.rows_shape[0] if r1 is None else r1
        out = np.empty((r1 - r0, self.rows_shape[1]), dtype=np.float32)
        if self.qtype is None:
            _widen_bits(self.format, self.data[r0:r1], out)
        else:
            self._held.widen(np.arange(r0, r1), out)
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

    def linear_ops(self, x, bias, y, x_row, y_row, nrows):
        """``linear`` with this (transposed) matrix as W, as team ops (``packed_linear_ops``)."""
        return packed_linear_ops(x, self, bias, y, x_row, y_row, nrows) if self.transposed \
            else None

    def gather(self, index: np.ndarray, out: np.ndarray) -> None:
        """Rows ``index`` (int array) as float32 into ``out`` (len(index), C)."""
        if self.qtype is None:
            _widen_bits(self.format, self.data[index], out)
        else:
            self._held.widen(index, out)


def packed_linear(x, w: PackedMatrix, bias, y, x_row, y_row, nrows) -> None:
    """``linear`` for a transposed packed weight (module docstring)."""
    fmt, a = w.format, w.blocks
    if w.qtype is not None:
        quant.linear(w.qtype, a, x, bias, y, x_row, y_row, nrows)
        return
    if nrows >= BLAS_MIN_ROWS and fmt == "BF16" and BF16_TILES and a.shape[1] % 2 == 0:
        bf16_tile_linear(x, a, bias, y, x_row, y_row, nrows)
        return
    if nrows >= BLAS_MIN_ROWS and not TILES:
        rows, bits, bf16 = _widened_rows(w), read_only(w.data), fmt == "BF16"

        def widen(c0: int, c1: int) -> None:  # rows [c0, c1) of W.T
            _widen_rows(bits[c0:c1], rows[c0:c1], bf16)

        for b in range(x.shape[0]):
            out = y[b, y_row:y_row + nrows]
            matmul(x[b, x_row:x_row + nrows], rows.T, out, widen if b == 0 else None)
            if bias.shape[0]:
                out += bias
        return
    run_ops(rows_ops(BF16 if fmt == "BF16" else F16, x, a, bias, y, x_row, y_row, nrows),
            a.size)


def packed_linear_ops(x, w: PackedMatrix, bias, y, x_row, y_row, nrows):
    """``packed_linear`` as team ops (kernels/team.py) for a step of fewer than BLAS_MIN_ROWS
    rows (a block type: fewer than quant.AMX_MIN_ROWS activation rows): a block type's rows
    rounded, then its product; BF16 / F16 a task a block of output rows of their kernel. None
    when an array is not one the ops read."""
    if x.dtype != np.float32 or y.dtype != np.float32 or x.ndim != 3 or y.ndim != 3:
        return None
    if w.qtype is not None:
        if y_row:  # a table writes its outputs' first rows
            return None
        rounding = quant.quantize_op(w.qtype.act, x, x_row, nrows)
        try:
            table = quant.MatrixTable(w.qtype, [(w.blocks, bias, y)])
        except ValueError:
            return None
        product = table.op(*quant.activation_rows(x.shape[0] * nrows, x.shape[2]), nrows)
        if rounding is None or product is None:
            return None
        return [rounding, (*product, table)]
    if nrows >= BLAS_MIN_ROWS:
        return None
    return rows_ops(BF16 if w.format == "BF16" else F16, x, w.blocks, bias, y, x_row, y_row,
                    nrows)
