"""Element-wise kernels on rows [0, nrows) of every batch of (B, H, W) float32 arrays.

    swiglu_row(g, u)  = g * sigmoid(g) * u  over one row   computed as g / (1 + exp(-g)) * u
    add(a, b)         = a + b
    add_row(a, row)   = a + row               one (W,) row added to every row
    softmax_rows(x)   = exp(x - max(x)) / sum(exp(x - max(x)))      over the last axis
    activation(x, kind), kind one of:
        ACT_NONE       x
        ACT_SILU       x * sigmoid(x) = x / (1 + exp(-x))          (NNTrainer "swish")
        ACT_GELU       0.5 x (1 + erf(x / sqrt(2)))               (exact gelu)
        ACT_TANH_GELU  0.5 x (1 + tanh(z)), z = 0.7978845608 (x + 0.044715 x^3)  (gelu_pytorch_tanh)
                       computed as x / (1 + exp(-2 z)): 1 + tanh(z) = 2 / (1 + exp(-2z)), which
                       has no cancellation at either end and vectorizes (a scalar tanh does not)
        ACT_RELU       max(x, 0)
        ACT_TANH       tanh(x)
        ACT_SIGMOID    1 / (1 + exp(-x))

Outputs may be one of the inputs (in place). Everything stays float32. The kernels use numpy's
error model (a float division by zero is IEEE's inf or nan, not an exception: the check kept
every loop with a division scalar) and ``expf`` (kernels/expf.py), so each loop vectorizes.
"""

import math

import numpy as np
from numba import njit

from causallm.kernels.expf import expf
from causallm.kernels.team import address, array3, encode, words

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}  # for the softmax sum; keep NaN/Inf rules

ACT_NONE = 0
ACT_SILU = 1
ACT_GELU = 2
ACT_TANH_GELU = 3
ACT_RELU = 4
ACT_TANH = 5
ACT_SIGMOID = 6

# NNTrainer activation names -> kind
ACTIVATIONS = {
    "none": ACT_NONE,
    "swish": ACT_SILU,
    "silu": ACT_SILU,
    "gelu": ACT_GELU,
    "tanh_gelu": ACT_TANH_GELU,
    "relu": ACT_RELU,
    "tanh": ACT_TANH,
    "sigmoid": ACT_SIGMOID,
}


@njit(cache=True, error_model="numpy")
def swiglu_row(g, u, o):
    """o = g / (1 + exp(-g)) * u over one row."""
    one = np.float32(1.0)
    for j in range(g.shape[0]):
        o[j] = g[j] / (one + expf(-g[j])) * u[j]


@njit(cache=True, error_model="numpy")
def _act_row(x, y, kind):
    """y = act(x) over one row; one loop per kind, so each loop vectorizes (module doc)."""
    one = np.float32(1.0)
    n = x.shape[0]
    if kind == ACT_SILU:
        for j in range(n):
            y[j] = x[j] / (one + expf(-x[j]))
    elif kind == ACT_GELU:
        for j in range(n):
            y[j] = np.float32(0.5) * x[j] * (one + math.erf(x[j] * np.float32(0.7071067811865476)))
    elif kind == ACT_TANH_GELU:
        for j in range(n):
            v = x[j]
            z = np.float32(0.7978845608028654) * (v + np.float32(0.044715) * v * v * v)
            y[j] = v / (one + expf(np.float32(-2.0) * z))
    elif kind == ACT_RELU:
        for j in range(n):
            y[j] = x[j] if x[j] > 0 else np.float32(0.0)
    elif kind == ACT_TANH:
        for j in range(n):
            y[j] = np.tanh(x[j])
    elif kind == ACT_SIGMOID:
        for j in range(n):
            y[j] = one / (one + expf(-x[j]))
    else:
        for j in range(n):
            y[j] = x[j]


@njit(cache=True, error_model="numpy")
def activation(x, y, nrows, kind):
    """y = act(x) for rows [0, nrows), kind one of the ACT_* ints; y may be x."""
    if kind < ACT_NONE or kind > ACT_SIGMOID:
        raise ValueError("activation: unknown activation kind")
    for b in range(x.shape[0]):
        for r in range(nrows):
            _act_row(x[b, r], y[b, r], kind)


@njit(cache=True, error_model="numpy")
def _activation_team(args, k0, k1):
    """Rows [k0, k1) of ``activation`` (row t: batch t // nrows, row t % nrows), a team op."""
    w = words(args, 10)
    x, y = array3(w, 0, np.float32), array3(w, 4, np.float32)
    nrows = w[8]
    for t in range(k0, k1):
        _act_row(x[t // nrows, t % nrows], y[t // nrows, t % nrows], w[9])


def activation_op(x, y, nrows: int, kind: int):
    """``activation`` as a team op (kernels/team.py): (address, args, tasks), a task a row;
    None for arrays it cannot read (float32, C-contiguous) or an unknown kind."""
    if x.dtype != np.float32 or y.dtype != np.float32 or not ACT_NONE <= kind <= ACT_SIGMOID:
        return None
    args = encode(x, y, nrows, kind)
    return None if args is None else (address(_activation_team), args, x.shape[0] * nrows)


@njit(cache=True, error_model="numpy")
def add(a, b, y, nrows):
    """y = a + b for rows [0, nrows)."""
    for i in range(a.shape[0]):
        for r in range(nrows):
            ar = a[i, r]
            br = b[i, r]
            yr = y[i, r]
            for j in range(ar.shape[0]):
                yr[j] = ar[j] + br[j]


@njit(cache=True, error_model="numpy")
def add_row(a, row, y, nrows):
    """y = a + row (one (W,) row added to every row) for rows [0, nrows)."""
    for i in range(a.shape[0]):
        for r in range(nrows):
            ar = a[i, r]
            yr = y[i, r]
            for j in range(ar.shape[0]):
                yr[j] = ar[j] + row[j]


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def softmax_rows(x, y, nrows):
    """y = softmax(x) over the last axis, max-shifted, for rows [0, nrows); y may be x."""
    for b in range(x.shape[0]):
        for r in range(nrows):
            xr = x[b, r]
            yr = y[b, r]
            m = xr[0]
            for j in range(1, xr.shape[0]):
                if xr[j] > m:
                    m = xr[j]
            total = np.float32(0.0)
            for j in range(xr.shape[0]):
                e = expf(xr[j] - m)
                yr[j] = e
                total += e
            inv = np.float32(1.0) / total
            for j in range(yr.shape[0]):
                yr[j] *= inv
