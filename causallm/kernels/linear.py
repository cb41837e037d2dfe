"""Fully connected: y = x @ W + bias on rows of 3-D float32 activations.

Shapes: x (B, Hx, K), y (B, Hy, N), bias (N,) or (0,) for none. A call computes, for every
batch b < B and row i < nrows::

    y[b, y_row + i, :] = x[b, x_row + i, :] @ W + bias          # [K] @ [K, N] -> [N]

W is the logical [in, out] = (K, N) matrix, stored one of two ways:

- w (K, N) C-contiguous, NNTrainer's FC layout [in, out] (``_io_block``);
- the transpose view of wt (N, K) C-contiguous, PyTorch's layout [out, in] (W = wt.T): rows of
  float32, bfloat16 or half values (``_dot_cols``; BF16 / F16 rows come as a PackedMatrix).

``linear`` picks: for a few rows (decode, memory bound) the layout's kernel, as team ops
(kernels/team.py: ``linear_ops``) that a decode step's program runs among its others, or a
program of their own for a call; for many rows (prefill, compute bound) numpy's BLAS sgemm from
Python. Measured crossover: see ``BLAS_MIN_ROWS`` and bench/bench_kernels.py. For decode, the
[out, in] rows are the faster layout. BF16 and F16 rows, which BLAS cannot read, multiply many
rows as tiles of 4 weight rows x 6 input rows (``_tile_rows``) where the CPU has AVX-512's 32
vector registers (``TILES``): the weights widened in registers, the product float32's.

A task is a block of output columns; the kernels write only into ``y`` and never allocate.
``fastmath`` here lets LLVM reorder the dot-product sums (to vectorize them), so results differ
from a sequential sum by float32 rounding; NaN/Inf semantics are kept.
"""

import numpy as np
from numba import njit, types
from numba.extending import overload

from causallm.kernels.jit_cache import read_only
from causallm.kernels.simd import (FLOAT_PREFETCH_BYTES, addf16, bf16_to_f32, bf16x16,
                                   f16_to_f32, fmaf16, fold8, hsum, load16f, prefetch,
                                   store_hsum4, target_features, zerof16)
from causallm.kernels.team import Program, address, array1, array2, array3, encode, words
from causallm.kernels.threads import matmul, threads

# reassociate / contract to FMA / ignore signed zeros / use reciprocals; keep NaN and Inf rules
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
_TILE = 4096  # _io_block: y values (B*nrows rows x block columns) a task keeps in L1: 16 KiB

# Rows per batch (nrows) from which linear() uses numpy BLAS instead of the numba kernels.
# bench/bench_kernels.py on a 2-core AMD EPYC (Zen 4) VM, OpenBLAS 0.3.31, 1024->3072 and
# 3072->1024, 1 and 2 threads: OpenBLAS sgemm costs about as much for 2 rows as for 12 (it
# packs all of W), while the row kernel adds ~0.1-0.2 ms per row, so BLAS wins from 16-32 rows,
# and the count that matters is the rows of each sgemm call (one per batch), not B * nrows:
# B=2 crosses over at the same nrows as B=1. For one row numba streams cold weights at
# ~31-35 GB/s against ~21-33 GB/s for sgemv.
BLAS_MIN_ROWS = 16


# Weights (K * N elements) below which the decode kernels run on one thread: a parallel region
# costs ~10-50 us to start and waits for its slowest thread, more than a small matrix takes.
PARALLEL_MIN_WEIGHTS = 1 << 19


@njit(cache=True)
def _io_blocking(B, nrows, N):
    """Column block width and count for ``_io_block``: as wide as the L1 tile allows (long runs of
    each W row stream better from DRAM) but at least 8 blocks when N >= 2048."""
    max_cols = max(256, _TILE // max(1, B * nrows))
    cols = min(max_cols, max(256, ((N + 7) // 8 + 15) // 16 * 16))
    return cols, (N + cols - 1) // cols


@njit(cache=True, fastmath=_FASTMATH)
def _io_block(x, w, bias, y, x_row, y_row, nrows, n0, n1):
    """Columns [n0, n1) of y = x @ w + bias, w (K, N) C-contiguous: each group of 8 rows of w
    is read once and added into every output row's block (y is the accumulator)."""
    B = x.shape[0]
    K = w.shape[0]
    k8 = K - K % 8
    for b in range(B):
        for i in range(nrows):
            yb = y[b, y_row + i, n0:n1]
            if bias.shape[0] > 0:
                bb = bias[n0:n1]
                for n in range(yb.shape[0]):
                    yb[n] = bb[n]
            else:
                for n in range(yb.shape[0]):
                    yb[n] = 0
    for k in range(0, k8, 8):
        w0 = w[k, n0:n1]
        w1 = w[k + 1, n0:n1]
        w2 = w[k + 2, n0:n1]
        w3 = w[k + 3, n0:n1]
        w4 = w[k + 4, n0:n1]
        w5 = w[k + 5, n0:n1]
        w6 = w[k + 6, n0:n1]
        w7 = w[k + 7, n0:n1]
        for b in range(B):
            for i in range(nrows):
                xr = x[b, x_row + i, k:k + 8]
                x0, x1, x2, x3 = xr[0], xr[1], xr[2], xr[3]
                x4, x5, x6, x7 = xr[4], xr[5], xr[6], xr[7]
                yb = y[b, y_row + i, n0:n1]
                for n in range(yb.shape[0]):
                    yb[n] += ((x0 * w0[n] + x1 * w1[n] + x2 * w2[n] + x3 * w3[n])
                              + (x4 * w4[n] + x5 * w5[n] + x6 * w6[n] + x7 * w7[n]))
    for k in range(k8, K):
        wk = w[k, n0:n1]
        for b in range(B):
            for i in range(nrows):
                xk = x[b, x_row + i, k]
                yb = y[b, y_row + i, n0:n1]
                for n in range(yb.shape[0]):
                    yb[n] += xk * wk[n]


FP32, BF16, F16 = 0, 1, 2
"""How a weight row's values are stored (``_dot_cols``): float32, bfloat16 bits, IEEE half bits."""


def _wide16(form, w, o):
    """16 values of the flat weights w from element o as float32 lanes (``form`` a literal)."""


@overload(_wide16, inline="always")
def _wide16_of(form, w, o):
    if not isinstance(form, types.IntegerLiteral):
        return None  # typed again with the literal the kernels pass
    if form.literal_value == BF16:
        return lambda form, w, o: bf16x16(w, o)
    return lambda form, w, o: load16f(w, o)  # float32, or half bits widened


def _wide1(form, w, o):
    """Value o of the flat weights w as float32 (``form`` a literal)."""


@overload(_wide1, inline="always")
def _wide1_of(form, w, o):
    if not isinstance(form, types.IntegerLiteral):
        return None
    if form.literal_value == BF16:
        return lambda form, w, o: bf16_to_f32(np.uint32(w[o]))
    if form.literal_value == F16:
        return lambda form, w, o: f16_to_f32(w[o])
    return lambda form, w, o: w[o]


@njit(cache=True, inline="always")
def _dot64(form, flat, o, xr, k, a0, a1, a2, a3):
    """The four sums of ``_dot_cols`` plus weights flat[o : o + 64] times xr[k : k + 64]."""
    return (fmaf16(a0, _wide16(form, flat, o), load16f(xr, k)),
            fmaf16(a1, _wide16(form, flat, o + 16), load16f(xr, k + 16)),
            fmaf16(a2, _wide16(form, flat, o + 32), load16f(xr, k + 32)),
            fmaf16(a3, _wide16(form, flat, o + 48), load16f(xr, k + 48)))


@njit(cache=True, fastmath=_FASTMATH)
def _dot_cols(form, x, wt, bias, y, x_row, y_row, nrows, n0, n1, ahead):
    """Columns [n0, n1) of y = x @ wt.T + bias, wt (N, K) C-contiguous rows of ``form``: each
    row read once, in order (one memory stream; its bytes ``ahead`` bytes on asked for unless
    0: simd.FLOAT_PREFETCH_BYTES), and multiplied with every input row while in L1, 64 values a
    step in four independent sums."""
    B = x.shape[0]
    N, K = wt.shape
    K64, K16 = K - K % 64, K - K % 16
    flat = wt.reshape(N * K)
    has_bias = bias.shape[0] > 0
    ahead, line = ahead // wt.itemsize, 64 // wt.itemsize
    for n in range(n0, n1):
        o = n * K
        for b in range(B):
            for i in range(nrows):
                xr = x[b, x_row + i]
                a0, a1, a2, a3 = zerof16(), zerof16(), zerof16(), zerof16()
                if ahead > 0:  # two loops: a test in the loop slowed it by a third
                    for k in range(0, K64, 64):
                        for j in range(0, 64, line):
                            prefetch(flat, o + k + ahead + j)
                        a0, a1, a2, a3 = _dot64(form, flat, o + k, xr, k, a0, a1, a2, a3)
                else:
                    for k in range(0, K64, 64):
                        a0, a1, a2, a3 = _dot64(form, flat, o + k, xr, k, a0, a1, a2, a3)
                for k in range(K64, K16, 16):
                    a0 = fmaf16(a0, _wide16(form, flat, o + k), load16f(xr, k))
                t = np.float32(0.0)
                for k in range(K16, K):
                    t += xr[k] * _wide1(form, flat, o + k)
                v = hsum(fold8(addf16(addf16(a0, a1), addf16(a2, a3)))) + t
                y[b, y_row + i, n] = v + bias[n] if has_bias else v


TILES = "avx512f" in target_features()
"""Whether a float row product of many rows (``nrows`` >= BLAS_MIN_ROWS: a prompt's BF16 / F16
product, packed.py) runs as tiles of 4 weight rows x 6 input rows (``_tile_rows``), which needs
AVX-512's 32 vector registers for its 24 sums; with 16 (AVX2) they spill, and widening the
weights for BLAS is faster (docs/performance.md, "Prompts of BF16 and F16 rows as tiles")."""

_TILE_X_BYTES = 1 << 18
"""Input rows a pass of ``_tile_rows`` multiplies, in bytes of float32 (256 KiB: with a task's
weight rows they stay in L2)."""


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _fma4(s0, s1, s2, s3, w0, w1, w2, w3, v):
    """s_r + w_r * v for the four weight rows' lanes w_r and one input row's lanes v."""
    return fmaf16(s0, w0, v), fmaf16(s1, w1, v), fmaf16(s2, w2, v), fmaf16(s3, w3, v)


@njit(cache=True, fastmath=_FASTMATH, inline="always")
def _tile4x6(form, w, o0, o1, o2, o3, x, p0, p1, p2, p3, p4, p5, K16):
    """The 24 sums of weight rows w[o_r : o_r + K16] times input rows x[p_j : p_j + K16] (flat
    element offsets), 16 lanes each, as (j, r) = (0, 0), (0, 1), ..., (5, 3): per 16 values of
    K, 4 weight loads and 6 input loads for 24 multiply-adds, all in registers."""
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = s20 = s21 = s22 = s23 = zerof16()
    s30 = s31 = s32 = s33 = s40 = s41 = s42 = s43 = s50 = s51 = s52 = s53 = zerof16()
    for k in range(0, K16, 16):
        w0, w1 = _wide16(form, w, o0 + k), _wide16(form, w, o1 + k)
        w2, w3 = _wide16(form, w, o2 + k), _wide16(form, w, o3 + k)
        s00, s01, s02, s03 = _fma4(s00, s01, s02, s03, w0, w1, w2, w3, load16f(x, p0 + k))
        s10, s11, s12, s13 = _fma4(s10, s11, s12, s13, w0, w1, w2, w3, load16f(x, p1 + k))
        s20, s21, s22, s23 = _fma4(s20, s21, s22, s23, w0, w1, w2, w3, load16f(x, p2 + k))
        s30, s31, s32, s33 = _fma4(s30, s31, s32, s33, w0, w1, w2, w3, load16f(x, p3 + k))
        s40, s41, s42, s43 = _fma4(s40, s41, s42, s43, w0, w1, w2, w3, load16f(x, p4 + k))
        s50, s51, s52, s53 = _fma4(s50, s51, s52, s53, w0, w1, w2, w3, load16f(x, p5 + k))
    return (s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23,
            s30, s31, s32, s33, s40, s41, s42, s43, s50, s51, s52, s53)


@njit(cache=True, inline="always")
def _row_of(t, nrows, rows, row0):
    """Flat row index of input (or output) row t = b * nrows + i: (b, row0 + i) of ``rows``."""
    return (t // nrows) * rows + row0 + t % nrows


@njit(cache=True, fastmath=_FASTMATH)
def _tile_rows(form, x, wt, bias, y, x_row, y_row, nrows, n0, n1):
    """Columns [n0, n1) of y = x @ wt.T + bias, wt (N, K) C-contiguous rows of ``form``, for
    many input rows (a prompt): tiles of 4 weight rows x 6 input rows (``_tile4x6``), the
    weights widened in registers, each tile's 24 sums kept in registers over all of K. The input
    rows go in passes of ``_TILE_X_BYTES``; the last tile of a pass, or of wt, repeats its last
    row instead of reading past it (its extra sums are not stored)."""
    B, R, K = x.shape
    N, Ry = wt.shape[0], y.shape[1]
    T, K16 = B * nrows, K - K % 16
    xf, wf, yf = x.reshape(B * R * K), wt.reshape(N * K), y.reshape(B * Ry * N)
    finish = K16 < K or bias.shape[0] > 0
    chunk = max(6, _TILE_X_BYTES // (4 * K) // 6 * 6)
    for c0 in range(0, T, chunk):
        c1 = min(T, c0 + chunk)
        for m in range(n0, n1, 4):
            o0, o1 = m * K, min(m + 1, N - 1) * K
            o2, o3 = min(m + 2, N - 1) * K, min(m + 3, N - 1) * K
            for t0 in range(c0, c1, 6):
                p0 = _row_of(t0, nrows, R, x_row) * K
                p1 = _row_of(min(t0 + 1, c1 - 1), nrows, R, x_row) * K
                p2 = _row_of(min(t0 + 2, c1 - 1), nrows, R, x_row) * K
                p3 = _row_of(min(t0 + 3, c1 - 1), nrows, R, x_row) * K
                p4 = _row_of(min(t0 + 4, c1 - 1), nrows, R, x_row) * K
                p5 = _row_of(min(t0 + 5, c1 - 1), nrows, R, x_row) * K
                s = _tile4x6(form, wf, o0, o1, o2, o3, xf, p0, p1, p2, p3, p4, p5, K16)
                for j in range(min(6, c1 - t0)):
                    yo = _row_of(t0 + j, nrows, Ry, y_row) * N + m
                    if m + 4 <= N:
                        store_hsum4(yf, yo, fold8(s[4 * j]), fold8(s[4 * j + 1]),
                                    fold8(s[4 * j + 2]), fold8(s[4 * j + 3]))
                    else:
                        for r in range(N - m):
                            yf[yo + r] = hsum(fold8(s[4 * j + r]))
                    if finish:
                        xo = _row_of(t0 + j, nrows, R, x_row) * K
                        for r in range(min(4, N - m)):
                            v = yf[yo + r]
                            for k in range(K16, K):
                                v += xf[xo + k] * _wide1(form, wf, (m + r) * K + k)
                            yf[yo + r] = v + bias[m + r] if bias.shape[0] else v


@njit(cache=True, inline="always")
def _rows_block(form, x, wt, bias, y, x_row, y_row, nrows, n0, n1, ahead):
    """Columns [n0, n1) of a float row product: as tiles for a prompt's rows where the CPU has
    the registers for them (TILES), else each weight row once against every input row."""
    if TILES and nrows >= BLAS_MIN_ROWS:
        _tile_rows(form, x, wt, bias, y, x_row, y_row, nrows, n0, n1)
    else:
        _dot_cols(form, x, wt, bias, y, x_row, y_row, nrows, n0, n1, ahead)


ROWS_BLOCK = 64
"""Output columns (rows of wt) a task of the float row products (``_rows_team``): 256 KiB of
float32 weights at K = 1024, kept in L2 while ``_tile_rows`` passes over the input rows."""


def linear(x, w, bias, y, x_row, y_row, nrows):
    """y[b, y_row+i] = x[b, x_row+i] @ w + bias for b < B, i < nrows; w is the logical (K, N).

    w is either C-contiguous (K, N) [in, out], or the transpose view ``wt.T`` of a C-contiguous
    (N, K) [out, in] array, or a transposed ``PackedMatrix`` (its own kernels). Below
    ``BLAS_MIN_ROWS`` rows the layout's team ops run as a program (one pass over W for all
    batches; on one thread below ``PARALLEL_MIN_WEIGHTS``); otherwise numpy's BLAS (sgemm
    accepts both layouts without copying) writes each batch straight into y, and the bias is
    added afterwards.
    """
    bias = read_only(bias)
    if not x.flags.c_contiguous:  # the kernels read an input row as one run of values
        x = np.ascontiguousarray(x)
    if not isinstance(w, np.ndarray):  # a PackedMatrix (causallm/kernels/packed.py)
        w.linear(x, bias, y, x_row, y_row, nrows)
        return
    if nrows < BLAS_MIN_ROWS:
        run_ops(linear_ops(x, w, bias, y, x_row, y_row, nrows), w.size)
        return
    for b in range(x.shape[0]):
        out = y[b, y_row:y_row + nrows]
        matmul(x[b, x_row:x_row + nrows], w, out)
        if bias.shape[0]:
            out += bias


def run_ops(ops, weights: int) -> None:
    """A product's team ops (``linear_ops``) run as a program of their own: on every thread
    from PARALLEL_MIN_WEIGHTS weights, else on the caller's."""
    if ops is None:
        raise ValueError("linear: float32 arrays expected, x (B, rows, K) and y (B, rows, N) "
                         "C-contiguous, W (K, N) C-contiguous or the transpose of one")
    n = threads() if weights >= PARALLEL_MIN_WEIGHTS else 1
    Program(ops).run(n)


# -- team ops (kernels/team.py): a task is one block of output columns -----------------------------

@njit(cache=True)
def _io_team(args, k0, k1):
    """Column blocks [k0, k1) of y = x @ w + bias, w (K, N) [in, out] (``_io_block``): words
    x (3), w (2), bias (1), y (3), x_row, y_row, nrows, the block width."""
    a = words(args, 17)
    x, w, bias = array3(a, 0, np.float32), array2(a, 4, np.float32), array1(a, 7, np.float32)
    y, cols = array3(a, 9, np.float32), a[16]
    for blk in range(k0, k1):
        _io_block(x, w, bias, y, a[13], a[14], a[15], blk * cols,
                  min(blk * cols + cols, w.shape[1]))


@njit(cache=True)
def _rows_team(args, k0, k1):
    """Blocks [k0, k1) of ROWS_BLOCK output rows of a float row product (``_rows_block``) as a
    team op: words x (3), wt (2), bias (1), y (3), x_row, y_row, nrows, ahead, form; wt float32
    or uint16 bits as the form says."""
    a = words(args, 18)
    x, bias, y = array3(a, 0, np.float32), array1(a, 7, np.float32), array3(a, 9, np.float32)
    form, N = a[17], a[5]
    for blk in range(k0, k1):
        n0, n1 = blk * ROWS_BLOCK, min(blk * ROWS_BLOCK + ROWS_BLOCK, N)
        if form == BF16:
            _rows_block(BF16, x, array2(a, 4, np.uint16), bias, y, a[13], a[14], a[15], n0, n1,
                        a[16])
        elif form == F16:
            _rows_block(F16, x, array2(a, 4, np.uint16), bias, y, a[13], a[14], a[15], n0, n1,
                        a[16])
        else:
            _rows_block(FP32, x, array2(a, 4, np.float32), bias, y, a[13], a[14], a[15], n0,
                        n1, a[16])


def rows_ops(form: int, x, wt, bias, y, x_row, y_row, nrows, ahead=FLOAT_PREFETCH_BYTES):
    """y = x @ wt.T + bias for wt (N, K) float rows of ``form`` as one team op (``_rows_team``,
    its rows asked for ``ahead`` bytes on), or None when an array is not C-contiguous."""
    args = encode(x, wt, bias, y, x_row, y_row, nrows, ahead, form)
    tasks = (wt.shape[0] + ROWS_BLOCK - 1) // ROWS_BLOCK
    return None if args is None else [(address(_rows_team), args, tasks, (x, wt, bias, y))]


def linear_ops(x, w, bias, y, x_row, y_row, nrows):
    """``linear`` as team ops (kernels/team.py) for a step of fewer than BLAS_MIN_ROWS rows:
    [(address, args, tasks, what the words point into)], a task a block of output columns of
    the kernel ``linear`` runs, so the values are its own; None when an array is not one the
    ops read (float32, C-contiguous, or W the transpose of one)."""
    if not isinstance(w, np.ndarray):  # a PackedMatrix
        return w.linear_ops(x, bias, y, x_row, y_row, nrows)
    if nrows >= BLAS_MIN_ROWS or w.dtype != np.float32 or x.dtype != np.float32 \
            or y.dtype != np.float32 or x.ndim != 3 or y.ndim != 3:
        return None
    if not w.flags.c_contiguous:  # [out, in] rows, or a layout the kernels do not read
        return rows_ops(FP32, x, w.T, bias, y, x_row, y_row, nrows) if w.T.flags.c_contiguous \
            else None
    return io_ops(x, w, bias, y, x_row, y_row, nrows)


def io_ops(x, w, bias, y, x_row, y_row, nrows):
    """y = x @ w + bias for w (K, N) float32 [in, out] as one team op (``_io_team``), or None
    when an array is not C-contiguous."""
    cols, tasks = _io_blocking(x.shape[0], nrows, w.shape[1])
    args = encode(x, w, bias, y, x_row, y_row, nrows, cols)
    return None if args is None else [(address(_io_team), args, tasks, (x, w, bias, y))]
