"""Fully connected: y = x @ W + bias on rows of 3-D float32 activations.

Shapes: x (B, Hx, K), y (B, Hy, N), bias (N,) or (0,) for none. A call computes, for every
batch b < B and row i < nrows::

    y[b, y_row + i, :] = x[b, x_row + i, :] @ W + bias          # [K] @ [K, N] -> [N]

W is the logical [in, out] = (K, N) matrix, stored one of two ways:

- ``linear_io(x, w, ...)``: w is (K, N) C-contiguous, NNTrainer's FC layout [in, out];
- ``linear_oi(x, wt, ...)``: wt is (N, K) C-contiguous, PyTorch's layout [out, in] (W = wt.T).

``linear`` picks one: the numba kernel of the layout for a few rows (decode, memory bound),
numpy's BLAS sgemm from Python for many rows (prefill, compute bound). Measured crossover:
see ``BLAS_MIN_ROWS`` and bench/bench_kernels.py. For decode, linear_oi is the faster layout.

The kernels are parallel over output columns (``prange``) and write only into ``y``; they
never allocate. ``fastmath`` here lets LLVM reorder the dot-product sums (to vectorize them),
so results differ from a sequential sum by float32 rounding; NaN/Inf semantics are kept.
"""

import numpy as np
from numba import njit, prange

from causallm.kernels.jit_cache import read_only
from causallm.kernels.threads import matmul

# reassociate / contract to FMA / ignore signed zeros / use reciprocals; keep NaN and Inf rules
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
_TILE = 4096  # linear_io: y values (B*nrows rows x block columns) a task keeps in L1: 16 KiB

# Rows per batch (nrows) from which linear() uses numpy BLAS instead of the numba kernels.
# bench/bench_kernels.py on a 2-core AMD EPYC (Zen 4) VM, OpenBLAS 0.3.31, 1024->3072 and
# 3072->1024, 1 and 2 threads: OpenBLAS sgemm costs about as much for 2 rows as for 12 (it
# packs all of W), while linear_oi adds ~0.1-0.2 ms per row, so BLAS wins from 16-32 rows,
# and the count that matters is the rows of each sgemm call (one per batch), not B * nrows:
# B=2 crosses over at the same nrows as B=1. For one row numba streams cold weights at
# ~31-35 GB/s against ~21-33 GB/s for sgemv.
BLAS_MIN_ROWS = 16


# Weights (K * N elements) below which the decode kernels run on one thread: a parallel region
# costs ~10-50 us to start and waits for its slowest thread, more than a small matrix takes.
PARALLEL_MIN_WEIGHTS = 1 << 19


@njit(cache=True)
def _io_blocking(B, nrows, N):
    """Column block width and count for linear_io: as wide as the L1 tile allows (long runs of
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


@njit(cache=True, parallel=True, fastmath=_FASTMATH)
def linear_io(x, w, bias, y, x_row, y_row, nrows):
    """y[b, y_row+i] = x[b, x_row+i] @ w + bias, w (K, N) C-contiguous [in, out].

    Parallel over blocks of output columns; W is streamed once per call whatever B * nrows is.
    """
    cols, nblocks = _io_blocking(x.shape[0], nrows, w.shape[1])
    for blk in prange(nblocks):
        _io_block(x, w, bias, y, x_row, y_row, nrows, blk * cols,
                  min(blk * cols + cols, w.shape[1]))


@njit(cache=True, fastmath=_FASTMATH)
def linear_io_serial(x, w, bias, y, x_row, y_row, nrows):
    """linear_io on one thread (small matrices)."""
    cols, nblocks = _io_blocking(x.shape[0], nrows, w.shape[1])
    for blk in range(nblocks):
        _io_block(x, w, bias, y, x_row, y_row, nrows, blk * cols,
                  min(blk * cols + cols, w.shape[1]))


@njit(cache=True, fastmath=_FASTMATH)
def _oi_cols(x, wt, bias, y, x_row, y_row, nrows, n0, n1):
    """Columns [n0, n1) of y = x @ wt.T + bias: each a dot product of a contiguous row of wt
    with the input row (a wt row stays in L1 across the B * nrows rows)."""
    B = x.shape[0]
    K = wt.shape[1]
    has_bias = bias.shape[0] > 0
    for n in range(n0, n1):
        wn = wt[n]
        for b in range(B):
            for i in range(nrows):
                xr = x[b, x_row + i]
                acc = np.float32(0.0)
                for k in range(K):
                    acc += xr[k] * wn[k]
                if has_bias:
                    acc += bias[n]
                y[b, y_row + i, n] = acc


_OI_COLS = 64  # output columns per parallel task


@njit(cache=True, parallel=True, fastmath=_FASTMATH)
def linear_oi(x, wt, bias, y, x_row, y_row, nrows):
    """y[b, y_row+i] = x[b, x_row+i] @ wt.T + bias, wt (N, K) C-contiguous [out, in].

    Parallel over blocks of output columns; W is streamed once per call.
    """
    N = wt.shape[0]
    for blk in prange((N + _OI_COLS - 1) // _OI_COLS):
        _oi_cols(x, wt, bias, y, x_row, y_row, nrows, blk * _OI_COLS,
                 min(blk * _OI_COLS + _OI_COLS, N))


@njit(cache=True, fastmath=_FASTMATH)
def linear_oi_serial(x, wt, bias, y, x_row, y_row, nrows):
    """linear_oi on one thread (small matrices)."""
    _oi_cols(x, wt, bias, y, x_row, y_row, nrows, np.int64(0), wt.shape[0])  # linear_oi's types


def linear(x, w, bias, y, x_row, y_row, nrows):
    """y[b, y_row+i] = x[b, x_row+i] @ w + bias for b < B, i < nrows; w is the logical (K, N).

    w is either C-contiguous (K, N) [in, out], or the transpose view ``wt.T`` of a C-contiguous
    (N, K) [out, in] array, or a transposed ``PackedMatrix`` (its own kernels). Below ``BLAS_MIN_ROWS`` rows the numba kernel of that layout
    runs (one pass over W for all batches; on one thread below ``PARALLEL_MIN_WEIGHTS``); otherwise numpy's BLAS (sgemm accepts both layouts
    without copying) writes each batch straight into y, and the bias is added afterwards.
    """
    bias = read_only(bias)
    if not isinstance(w, np.ndarray):  # a PackedMatrix (causallm/kernels/packed.py)
        w.linear(x, bias, y, x_row, y_row, nrows)
        return
    if nrows < BLAS_MIN_ROWS:
        w = read_only(w)
        big = w.size >= PARALLEL_MIN_WEIGHTS
        if w.flags.c_contiguous:
            (linear_io if big else linear_io_serial)(x, w, bias, y, x_row, y_row, nrows)
        else:
            (linear_oi if big else linear_oi_serial)(x, w.T, bias, y, x_row, y_row, nrows)
        return
    for b in range(x.shape[0]):
        out = y[b, y_row:y_row + nrows]
        matmul(x[b, x_row:x_row + nrows], w, out)
        if bias.shape[0]:
            out += bias
