"""ggml's quantized types, multiplied on the bytes as a GGUF file stores them.

A quantized matrix of R rows of C values is a uint8 array (R, C / QK * BYTES): each row is
C / QK blocks of one ggml type (ggml-common.h), laid out as in the file, so a memory-mapped
tensor is used without a copy; the types of PANEL_KINDS are multiplied as panels of 16 rows
instead, the same bytes reordered once (``held``, the section on panels below). The types (QK values and BYTES bytes a block; the activation
blocks each is multiplied with)::

    type    QK   BYTES  value of element j of a block                         activations
    Q4_0    32   18     d * (q_j - 8),  q_j a nibble (j < 16 low, else high)  Q8_0
    Q4_1    32   20     d * q_j + m                                           Q8_1
    Q5_0    32   22     d * (q_j - 16), q_j = nibble | high bit j << 4        Q8_0
    Q5_1    32   24     d * q_j + m,    q_j = nibble | high bit j << 4        Q8_1
    Q8_0    32   34     d * q_j,        q_j int8                              Q8_0
    IQ4_NL  32   18     d * T[q_j],     T the 16 non-uniform levels           Q8_0
    Q2_K    256  84     d * s_k * q - dmin * m_k   (2-bit q, 4-bit s, m a 16)  Q8_K
    Q3_K    256  110    d * (s_k - 32) * (q - 4 (+4 with its high bit))       Q8_K
    Q4_K    256  144    d * s_k * q - dmin * m_k   (4-bit q, 6-bit s, m a 32)  Q8_K
    Q5_K    256  176    the same with 5-bit q                                 Q8_K
    Q6_K    256  210    d * s_k * (q - 32)         (6-bit q, int8 s a 16)      Q8_K
    IQ4_XS  256  136    d * (s_k - 32) * T[q]      (6-bit s a 32)              Q8_K

(d, dmin, m: fp16; the exact bit layouts are in the dequantizers below.) As ggml does, a row of
activations x is first rounded to blocks of its type's activation format, one per block of the
weights (``quantize_activations``)::

    Q8_0   blocks of 32: d = fp16(max|x| / 127), q = round(x * 127 / max|x|)  (ties to even)
    Q8_1   the same, and s = fp16(d * sum q) (before d is rounded), held beside d: pairs
           (d, s) a block, which a product multiplies by the weights' (d, m) at once
    Q8_K   blocks of 256: d = 1 / (-127 / x_m), q = min(127, round(-127 / x_m * x)), x_m the
           value of largest magnitude; and bsums, the sums of q over each 16

(ggml's x86 ``quantize_row_q8_0`` / ``q8_1`` and ``quantize_row_q8_K_ref``), then every output
is the blocks' exact integer dot products, scaled::

    y[t, n] = sum_b dw[n, b] * dx[t, b] * sum_j qw[n, b, j] * qx[t, b, j]  (+ the offset terms)

so a result equals ggml's ``vec_dot_<type>_<activation>`` to float rounding. The sub-block
scales of the K types multiply the integer sums (the row layout's int16 pair sums, ``madd``; the
panels' int32 sums, a row a lane), their offsets and mins meet the activation sums (s, bsums),
all in integers. ``linear`` runs it for every row of a call, parallel
over blocks of output rows for a large matrix; ``dequantize_rows`` widens rows (an embedding
lookup, or a check).
"""

from __future__ import annotations

import warnings

import numpy as np
from numba import carray, get_thread_id, njit, prange
from numba.core import config as numba_config
from numba.core import types
from numba.core.errors import NumbaIRAssumptionWarning
from numba.extending import overload

from causallm.kernels import amx, simd
from causallm.kernels.elementwise import swiglu_row
from causallm.kernels.jit_cache import read_only
from causallm.kernels.norm import rms_segment
from causallm.kernels.simd import (
    add16,
    add32,
    addf16,
    band,
    bor,
    bor64,
    bshl,
    bshr,
    bsub64,
    dot16,
    dot16_wide,
    dot_signed,
    f16,
    fma,
    fma16,
    fmaf,
    fmaf16,
    halves16,
    high4,
    hsum,
    lane16,
    lanes16,
    load1f,
    load8f,
    load16f,
    load32,
    load64,
    lookup,
    lookup64,
    low4,
    madd,
    maddubs,
    mul16,
    mulf,
    nibbles,
    PREFETCH_BYTES,
    prefetch,
    round_f16,
    sbyte16,
    scale16,
    shl_and64,
    shr_and64,
    splat16x2,
    splatf,
    spread4,
    store8f,
    store16f,
    store64,
    sub16,
    table16,
    zero16,
    zero32,
    zerof,
    zerof16,
)
from causallm.kernels.team import address, array1, array2, array3, encode, pointer, real, words
from causallm.kernels.threads import threads

_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}

# numba's own consistency check flags the loops of a block function inlined into the row loop
# ("variable ... is not in scope"); the code it compiles is right (every kernel is checked
# against its twin), and inlining is what keeps a row's sums in registers.
warnings.filterwarnings("ignore", category=NumbaIRAssumptionWarning)

# ggml type ids (GGMLQuantizationType), the kernels' compile-time switch
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
IQ4_NL, IQ4_XS = 20, 23

# activation formats
ACT_Q8_0, ACT_Q8_1, ACT_Q8_K = 0, 1, 2


class QType:
    """A ggml block type: its id, values and bytes a block, its activations' format, and where
    in a block its fp16 scales are (byte offsets)."""

    def __init__(self, name: str, kind: int, qk: int, nbytes: int, act: int,
                 halves: tuple[int, ...]) -> None:
        self.name, self.kind, self.qk, self.nbytes, self.act = name, kind, qk, nbytes, act
        self.halves = halves
        self._kernels = None

    @property
    def panelled(self) -> bool:
        """Whether a matrix of this type is held as panels of 16 rows (``panels``)."""
        return self.kind in PANEL_KINDS

    @property
    def kernels(self):
        """(rows, rows_parallel, widen, rows_table, rows_team): this type's compiled entry
        points."""
        if self._kernels is None:
            self._kernels = _entry_points(self.kind, self.qk)
        return self._kernels

    def row_bytes(self, C: int) -> int:
        return C // self.qk * self.nbytes


QTYPES = {t.name: t for t in (
    QType("Q4_0", Q4_0, 32, 18, ACT_Q8_0, (0,)),
    QType("Q4_1", Q4_1, 32, 20, ACT_Q8_1, (0, 2)),
    QType("Q5_0", Q5_0, 32, 22, ACT_Q8_0, (0,)),
    QType("Q5_1", Q5_1, 32, 24, ACT_Q8_1, (0, 2)),
    QType("Q8_0", Q8_0, 32, 34, ACT_Q8_0, (0,)),
    QType("IQ4_NL", IQ4_NL, 32, 18, ACT_Q8_0, (0,)),
    QType("Q2_K", Q2_K, 256, 84, ACT_Q8_K, (80, 82)),
    QType("Q3_K", Q3_K, 256, 110, ACT_Q8_K, (108,)),
    QType("Q4_K", Q4_K, 256, 144, ACT_Q8_K, (0, 2)),
    QType("Q5_K", Q5_K, 256, 176, ACT_Q8_K, (0, 2)),
    QType("Q6_K", Q6_K, 256, 210, ACT_Q8_K, (208,)),
    QType("IQ4_XS", IQ4_XS, 256, 136, ACT_Q8_K, (0,)),
)}
"""Every quantized type with a kernel, by ggml's name."""

IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.int8)
"""ggml's ``kvalues_iq4nl``: the 16 levels of IQ4_NL / IQ4_XS."""
IQ4_UNSIGNED = (IQ4_LEVELS.astype(np.int32) + 128).astype(np.uint8)
"""The levels plus 128 (IQ4_NL's panels: unsigned values, the 128 taken off through the
activation sums)."""


# -- activations ---------------------------------------------------------------------------------

@njit(cache=True, fastmath={"contract"})
def _q8_block(x, o, n, q):
    """Elements [o, o + n) of x as Q8_0 / Q8_1 (module docstring): q, and (d unrounded, sum).
    The loops run over slices from their index 0 (LLVM then knows no index is negative and
    vectorizes them; over x[o + j] they did not: 2.2x the time), the largest magnitude in four
    running maxima."""
    xs, qs = x[o:o + n], q[o:o + n]
    a0 = a1 = a2 = a3 = np.float32(0.0)
    for j in range(n // 4):
        a0, a1 = max(a0, abs(xs[4 * j])), max(a1, abs(xs[4 * j + 1]))
        a2, a3 = max(a2, abs(xs[4 * j + 2])), max(a3, abs(xs[4 * j + 3]))
    for j in range(n - n % 4, n):
        a0 = max(a0, abs(xs[j]))
    amax = max(max(a0, a1), max(a2, a3))
    d = amax / np.float32(127.0)
    inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
    total = 0
    for j in range(n):
        v = np.int32(np.rint(xs[j] * inv))
        qs[j] = v
        total += v
    return d, total


@njit(cache=True)
def _q8k_block(x, o, q, bsums, bo):
    """Elements [o, o + 256) of x as Q8_K: q, the 16 sums, and d (module docstring)."""
    amax = np.float32(0.0)
    xm = np.float32(0.0)
    for j in range(o, o + 256):
        if abs(x[j]) > amax:
            amax = abs(x[j])
            xm = x[j]
    if amax == 0:
        for j in range(o, o + 256):
            q[j] = 0
        for k in range(16):
            bsums[bo + k] = 0
        return np.float32(0.0)
    iscale = np.float32(-127.0) / xm
    for k in range(16):
        xs, qs = x[o + 16 * k:o + 16 * k + 16], q[o + 16 * k:o + 16 * k + 16]  # (_q8_block)
        s = 0
        for j in range(16):
            v = min(127, np.int32(np.rint(iscale * xs[j])))
            qs[j] = v
            s += v
        bsums[bo + k] = s
    return np.float32(1.0) / iscale


@njit(cache=True)
def _quantize_row(act, x, q, d, s, u):
    """One row x (K,) into q (K,) int8 and its scales d, s (float32) and sums u (int32)."""
    K = x.shape[0]
    if act == ACT_Q8_K:
        for b in range(K // 256):
            d[b] = _q8k_block(x, 256 * b, q, u, 16 * b)
        return
    for b in range(K // 32):
        db, total = _q8_block(x, 32 * b, 32, q)
        d[b] = round_f16(db)
        u[b] = total
        s[2 * b] = d[b]
        s[2 * b + 1] = round_f16(db * np.float32(total))


@njit(cache=True)
def _quantize_serial(act, x, x_row, nrows, q, d, s, u):
    for t in range(x.shape[0] * nrows):
        _quantize_row(act, x[t // nrows, x_row + t % nrows], q[t], d[t], s[t], u[t])


@njit(cache=True, parallel=True)
def _quantize_parallel(act, x, x_row, nrows, q, d, s, u):
    for t in prange(x.shape[0] * nrows):
        _quantize_row(act, x[t // nrows, x_row + t % nrows], q[t], d[t], s[t], u[t])


@njit(cache=True, inline="always")
def _activation_words(w, i):
    """The activation rows (q, d, s, u) whose addresses and shapes are words i .. i + 11 of a
    team op's (``encode``: four 2-D arrays)."""
    return (array2(w, i, np.int8), array2(w, i + 3, np.float32), array2(w, i + 6, np.float32),
            array2(w, i + 9, np.int32))


@njit(cache=True)
def _quantize_team(args, k0, k1):
    """Rows [k0, k1) of ``_quantize_serial`` as a team op (``quantize_op``)."""
    w = words(args, 19)
    x = array3(w, 1, np.float32)
    q, d, s, u = _activation_words(w, 7)
    x_row, nrows = w[5], w[6]
    for t in range(k0, k1):
        _quantize_row(w[0], x[t // nrows, x_row + t % nrows], q[t], d[t], s[t], u[t])


class Activations:
    """Reused buffers of quantized activation rows: q int8 (T, K); d (T, K / 32) float32 (the
    block scales); s (T, K / 16) float32 (Q8_1's (d, d * sum) pairs); u (T, K / 16) int32
    (Q8_0's block sums, Q8_K's bsums). ``generation`` counts the times the buffers were made
    anew (a longer step than any before): views taken before then are of the old ones."""

    def __init__(self) -> None:
        self._q = np.empty(0, np.int8)
        self._d = np.empty(0, np.float32)
        self._s = np.empty(0, np.float32)
        self._u = np.empty(0, np.int32)
        self._views: dict[tuple[int, int], tuple] = {}  # (T, K) -> the four views, made once
        self.generation = 0

    def take(self, T: int, K: int):
        views = self._views.get((T, K))
        if views is not None:
            return views
        if self._q.size < T * K:
            self._q = np.empty(T * K, np.int8)
            self._d = np.empty(T * K // 32 + 1, np.float32)
            self._s = np.empty(T * K // 16 + 1, np.float32)
            self._u = np.empty(T * K // 16 + 1, np.int32)
            self._views.clear()  # views of the old buffers
            self.generation += 1
        views = (self._q[:T * K].reshape(T, K), self._d[:T * (K // 32)].reshape(T, K // 32),
                 self._s[:T * (K // 16)].reshape(T, K // 16),
                 self._u[:T * (K // 16)].reshape(T, K // 16))
        if len(self._views) < 64:  # decode's and a few prompt lengths'
            self._views[(T, K)] = views
        return views


_activations = Activations()


def activation_rows(T: int, K: int):
    """The shared buffers (q, d, s, u) of T activation rows of K values (``Activations``): where
    ``quantize_activations`` rounds them, and a kernel that rounds its own output rows."""
    return _activations.take(T, K)


def activations_generation() -> int:
    """``Activations.generation`` of the shared buffers: kernel calls bound to their views
    (runtime/runner.py, ``BoundCalls``) are bound again when it changes."""
    return _activations.generation


def quantize_call(act: int, x, x_row: int, nrows: int, bufs: Activations | None = None):
    """The kernel call (kernel, args) that rounds rows [x_row, x_row + nrows) of every batch of
    x (B, H, K), batch-major, into ``act`` blocks: (q, d, s, u) = args[4:], as ``Activations``
    holds them (``bufs``, by default the shared ones)."""
    T, K = x.shape[0] * nrows, x.shape[2]
    q, d, s, u = (_activations if bufs is None else bufs).take(T, K)
    kernel = _quantize_parallel if T >= 8 and threads() > 1 else _quantize_serial
    return kernel, (act, x, x_row, nrows, q, d, s, u)


def quantize_op(act: int, x, x_row: int, nrows: int):
    """``quantize_call``'s work as a team op (kernels/team.py): (address, args, tasks), a task
    a row; None when x is not float32 C-contiguous."""
    if x.dtype != np.float32:
        return None
    T, K = x.shape[0] * nrows, x.shape[2]
    args = encode(act, x, x_row, nrows, *_activations.take(T, K))
    return None if args is None else (address(_quantize_team), args, T)


def quantize_activations(act: int, x, x_row: int, nrows: int, bufs: Activations | None = None):
    """Rows [x_row, x_row + nrows) of every batch of x (B, H, K), batch-major, as ``act``
    blocks: (q, d, s, u) as ``Activations`` holds them."""
    kernel, args = quantize_call(act, x, x_row, nrows, bufs)
    kernel(*args)
    return args[4:]


# -- rows made and rounded in one pass -------------------------------------------------------------
# The layer before a block product writes its rows and rounds them for the product in one kernel
# call (runtime/runner.py, ``make_plan``): the same values as the layer's kernel and then
# ``quantize_activations``, one call instead of two (three with a residual addition before a norm).

NO_ROWS = np.zeros((0, 0, 0), dtype=np.float32)
NO_Q, NO_D, NO_U = (np.zeros((0, 0), dtype=t) for t in (np.int8, np.float32, np.int32))
NO_ACT = -1
"""The ``act`` of row kernels that round nothing (their q, d, s, u: NO_Q, NO_D, NO_D, NO_U)."""

GLU_SWIGLU, GLU_MULTIPLY = 0, 1


@njit(cache=True, inline="always")
def _norm_row(act, a, b, total, gamma, y, nrows, eps, q, d, s, u, t):
    """Row t of ``norm_rows`` (``row_kernels``)."""
    i, r = t // nrows, t % nrows
    eps32 = np.float32(eps)
    size32 = np.float32(gamma.shape[0])
    if b.shape[0] > 0:
        ar, br, tr = a[i, r], b[i, r], total[i, r]
        for j in range(tr.shape[0]):
            tr[j] = ar[j] + br[j]
        rms_segment(tr, gamma, y[i, r], eps32, size32)
    else:
        rms_segment(a[i, r], gamma, y[i, r], eps32, size32)
    if act >= 0:
        _quantize_row(act, y[i, r], q[t], d[t], s[t], u[t])


@njit(cache=True, inline="always")
def _glu_row(act, kind, gate, up, out, nrows, q, d, s, u, t):
    """Row t of ``glu_rows`` (``row_kernels``)."""
    i, r = t // nrows, t % nrows
    g, v, o = gate[i, r], up[i, r], out[i, r]
    if kind == GLU_SWIGLU:
        swiglu_row(g, v, o)
    else:
        for j in range(o.shape[0]):
            o[j] = g[j] * v[j]
    if act >= 0:
        _quantize_row(act, o, q[t], d[t], s[t], u[t])


def _row_kernels(act: int):
    """``norm_rows`` and ``glu_rows`` rounding to ``act`` blocks (NO_ACT: not at all), a
    constant of each, so a model compiles only the rounding it uses; and the same two with
    the rows in a parallel loop. (The row functions are module-level: a kernel that closes over
    another numba function gets a cache key of its own in every process.)"""

    @njit(cache=True)
    def norm_rows(a, b, total, gamma, y, nrows, eps, q, d, s, u):
        for t in range(a.shape[0] * nrows):
            _norm_row(act, a, b, total, gamma, y, nrows, eps, q, d, s, u, t)

    @njit(cache=True, parallel=True)
    def norm_rows_parallel(a, b, total, gamma, y, nrows, eps, q, d, s, u):
        for t in prange(a.shape[0] * nrows):
            _norm_row(act, a, b, total, gamma, y, nrows, eps, q, d, s, u, t)

    @njit(cache=True)
    def glu_rows(kind, gate, up, out, nrows, q, d, s, u):
        for t in range(gate.shape[0] * nrows):
            _glu_row(act, kind, gate, up, out, nrows, q, d, s, u, t)

    @njit(cache=True, parallel=True)
    def glu_rows_parallel(kind, gate, up, out, nrows, q, d, s, u):
        for t in prange(gate.shape[0] * nrows):
            _glu_row(act, kind, gate, up, out, nrows, q, d, s, u, t)

    @njit(cache=True)
    def norm_team(args, k0, k1):
        w = words(args, 32)
        a, b, total = array3(w, 0, np.float32), array3(w, 4, np.float32), array3(w, 8, np.float32)
        gamma = array1(w, 12, np.float32)
        y = array3(w, 14, np.float32)
        q, d, s, u = _activation_words(w, 20)
        for t in range(k0, k1):
            _norm_row(act, a, b, total, gamma, y, w[18], real(args, 19), q, d, s, u, t)

    @njit(cache=True)
    def glu_team(args, k0, k1):
        w = words(args, 26)
        gate, up, out = array3(w, 1, np.float32), array3(w, 5, np.float32), array3(w, 9, np.float32)
        q, d, s, u = _activation_words(w, 14)
        for t in range(k0, k1):
            _glu_row(act, w[0], gate, up, out, w[13], q, d, s, u, t)

    return ((norm_rows, glu_rows), (norm_rows_parallel, glu_rows_parallel),
            (norm_team, glu_team))


_ROW_KERNELS: dict = {}
PARALLEL_MIN_ROWS = 8
"""Rows from which ``row_kernels`` gives the kernels with a parallel loop over them (a
prompt's; a decode step's one row would pay a parallel region's start for nothing)."""


def row_kernels(act: int = NO_ACT, rows: int = 1):
    """(norm_rows, glu_rows) for ``act`` (made at the first use of each)::

        norm_rows(a, b, total, gamma, y, nrows, eps, q, d, s, u)
            rows r < nrows of every batch i: x = a[i, r] + b[i, r], stored in total[i, r],
            when b has rows (else x = a[i, r]); y[i, r] = rms_norm(x) * gamma (kernels/norm.py)
        glu_rows(kind, gate, up, out, nrows, q, d, s, u)
            out = swiglu(gate, up) (GLU_SWIGLU, kernels/elementwise.py) or gate * up
            (GLU_MULTIPLY)

    and, unless act is NO_ACT, each output row (y, out) rounded to ``act`` blocks as row
    i * nrows + r of (q, d, s, u), as ``quantize_activations`` rounds it. Outputs may be
    inputs. For ``rows`` rows in all (batches times nrows) of PARALLEL_MIN_ROWS or more, on
    more than one thread, the rows are divided between the threads (the same values)."""
    return _row_kernel_sets(act)[rows >= PARALLEL_MIN_ROWS and threads() > 1]


def _row_kernel_sets(act: int):
    """``_row_kernels(act)``, made at the first ask."""
    kernels = _ROW_KERNELS.get(act)
    if kernels is None:
        kernels = _ROW_KERNELS[act] = _row_kernels(act)
    return kernels


def norm_op(act: int, a, b, total, gamma, y, nrows: int, eps: float, q, d, s, u):
    """``norm_rows`` as a team op (kernels/team.py): (address, args, tasks), a task a row;
    None when an array is not float32 C-contiguous."""
    if any(v.dtype != np.float32 for v in (a, b, total, gamma, y)) or gamma.ndim != 1:
        return None
    args = encode(a, b, total, gamma, y, nrows, float(eps), q, d, s, u)
    if args is None:
        return None
    return address(_row_kernel_sets(act)[2][0]), args, y.shape[0] * nrows


def glu_op(act: int, kind: int, gate, up, out, nrows: int, q, d, s, u):
    """``glu_rows`` as a team op, as ``norm_op``."""
    if any(v.dtype != np.float32 for v in (gate, up, out)):
        return None
    args = encode(kind, gate, up, out, nrows, q, d, s, u)
    if args is None:
        return None
    return address(_row_kernel_sets(act)[2][1]), args, out.shape[0] * nrows


# -- one row of weights with one row of activations ----------------------------------------------

@njit(cache=True, inline="always")
def _scale_min_k4(w, o, j):
    """Sub-block j's 6-bit scale and min of a Q4_K / Q5_K block's 12 scale bytes at ``o``."""
    if j < 4:
        return np.int32(w[o + j] & 63), np.int32(w[o + j + 4] & 63)
    return (np.int32((w[o + j + 4] & 15) | ((w[o + j - 4] >> 6) << 4)),
            np.int32((w[o + j + 4] >> 4) | ((w[o + j] >> 6) << 4)))


@njit(cache=True, inline="always")
def _scale_q3(w, o, k):
    """Scale k (0..15) of a Q3_K block's 12 scale bytes at ``o``, minus 32."""
    b = k % 4
    if k < 4:
        v = (w[o + b] & 15) | ((w[o + 8 + b] & 3) << 4)
    elif k < 8:
        v = (w[o + 4 + b] & 15) | (((w[o + 8 + b] >> 2) & 3) << 4)
    elif k < 12:
        v = (w[o + b] >> 4) | (((w[o + 8 + b] >> 4) & 3) << 4)
    else:
        v = (w[o + 4 + b] >> 4) | (((w[o + 8 + b] >> 6) & 3) << 4)
    return np.int32(v) - 32


# Each ``_block_<type>(acc, mins, w, b, x, d, s, u)``: block b of row w (its blocks' bytes)
# times the same block of activation row x (q int8; d, s, u as quantized for the type), added
# into a vector accumulator and a scalar one (the offsets and mins), as ggml's
# ``vec_dot_<type>_<activation>`` sums it; the row's product is hsum(acc) + mins.

# A 256-value block is written out as calls of a sub-block helper with constant indices, not a
# loop: its scale bytes are then read at fixed offsets without branches, and the code of the four
# activation rows a prompt multiplies together (``_dot_x4``) is one straight line, in which the
# compiler unpacks the weight bytes and scales once for the four. The helpers are plain
# functions that LLVM inlines (numba's own inlining of 4 rows x 8 calls costs minutes of
# compile time).

@njit(cache=True)
def _q3_k_run(total, offset, w, o, hm, q, x, xo, u, uo, h, j):
    """Run j (32 values, two 16s with their scales) of half h of a Q3_K block: two bits from
    ``q`` and the high bit from ``hm``; ``offset`` gathers sum scale * bsum (the -4)."""
    v = bor(band(bshr(q, 2 * j), 3), bshl(band(bshr(hm, 4 * h + j), 1), 2))
    k = 8 * h + 2 * j
    sa, sb = _scale_q3(w, o + 96, k), _scale_q3(w, o + 96, k + 1)
    total = add32(total, madd(maddubs(v, load32(x, xo + 128 * h + 32 * j)), splat16x2(sa, sb)))
    return total, offset + sa * u[uo + k] + sb * u[uo + k + 1]


@njit(cache=True, inline="always")
def _block_q3_k(acc, mins, w, i, x, d, s, u):
    o, xo, uo = 110 * i, 256 * i, 16 * i
    hm = load32(w, o)
    total, offset = zero32(), np.int32(0)
    q = load32(w, o + 32)
    total, offset = _q3_k_run(total, offset, w, o, hm, q, x, xo, u, uo, 0, 0)
    total, offset = _q3_k_run(total, offset, w, o, hm, q, x, xo, u, uo, 0, 1)
    total, offset = _q3_k_run(total, offset, w, o, hm, q, x, xo, u, uo, 0, 2)
    total, offset = _q3_k_run(total, offset, w, o, hm, q, x, xo, u, uo, 0, 3)
    q = load32(w, o + 64)
    total, offset = _q3_k_run(total, offset, w, o, hm, q, x, xo, u, uo, 1, 0)
    total, offset = _q3_k_run(total, offset, w, o, hm, q, x, xo, u, uo, 1, 1)
    total, offset = _q3_k_run(total, offset, w, o, hm, q, x, xo, u, uo, 1, 2)
    total, offset = _q3_k_run(total, offset, w, o, hm, q, x, xo, u, uo, 1, 3)
    dd = f16(w, o + 108) * d[i]
    return fma(acc, total, dd), mins - dd * np.float32(4 * offset)


@njit(cache=True)
def _q2_k_run(total, msum, w, o, q, x, xo, u, uo, h, j):
    """Run j (32 values, two 16s) of half h of a Q2_K block: two bits of ``q``, 4-bit scales
    and mins; ``msum`` gathers sum min * bsum."""
    k = 8 * h + 2 * j
    sa, sb = np.int32(w[o + k]), np.int32(w[o + k + 1])
    total = add32(total, madd(maddubs(band(bshr(q, 2 * j), 3), load32(x, xo + 128 * h + 32 * j)),
                              splat16x2(sa & 15, sb & 15)))
    return total, msum + (sa >> 4) * u[uo + k] + (sb >> 4) * u[uo + k + 1]


@njit(cache=True, inline="always")
def _block_q2_k(acc, mins, w, i, x, d, s, u):
    o, xo, uo = 84 * i, 256 * i, 16 * i
    total, msum = zero32(), np.int32(0)
    q = load32(w, o + 16)
    total, msum = _q2_k_run(total, msum, w, o, q, x, xo, u, uo, 0, 0)
    total, msum = _q2_k_run(total, msum, w, o, q, x, xo, u, uo, 0, 1)
    total, msum = _q2_k_run(total, msum, w, o, q, x, xo, u, uo, 0, 2)
    total, msum = _q2_k_run(total, msum, w, o, q, x, xo, u, uo, 0, 3)
    q = load32(w, o + 48)
    total, msum = _q2_k_run(total, msum, w, o, q, x, xo, u, uo, 1, 0)
    total, msum = _q2_k_run(total, msum, w, o, q, x, xo, u, uo, 1, 1)
    total, msum = _q2_k_run(total, msum, w, o, q, x, xo, u, uo, 1, 2)
    total, msum = _q2_k_run(total, msum, w, o, q, x, xo, u, uo, 1, 3)
    acc = fma(acc, total, f16(w, o + 80) * d[i])
    return acc, mins - f16(w, o + 82) * d[i] * np.float32(msum)


@njit(cache=True)
def _iq4_xs_run(acc, w, o, sh, table, x, xo, dd, j):
    """Run j (32 values) of an IQ4_XS block: its 6-bit scale (4 low bits, 2 high in ``sh``)
    and the levels its nibbles pick."""
    ls = ((np.int32(w[o + 4 + j // 2]) >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4)
    qw = lookup(table, nibbles(w, o + 8 + 16 * j))
    return fma(acc, dot_signed(zero32(), qw, load32(x, xo + 32 * j)), dd * np.float32(ls - 32))


@njit(cache=True, inline="always")
def _block_iq4_xs(acc, mins, w, i, x, d, s, u):
    o, xo = 136 * i, 256 * i
    table = table16(IQ4_LEVELS, 0)
    dd = f16(w, o) * d[i]
    sh = np.int32(w[o + 2]) | (np.int32(w[o + 3]) << 8)
    acc = _iq4_xs_run(acc, w, o, sh, table, x, xo, dd, 0)
    acc = _iq4_xs_run(acc, w, o, sh, table, x, xo, dd, 1)
    acc = _iq4_xs_run(acc, w, o, sh, table, x, xo, dd, 2)
    acc = _iq4_xs_run(acc, w, o, sh, table, x, xo, dd, 3)
    acc = _iq4_xs_run(acc, w, o, sh, table, x, xo, dd, 4)
    acc = _iq4_xs_run(acc, w, o, sh, table, x, xo, dd, 5)
    acc = _iq4_xs_run(acc, w, o, sh, table, x, xo, dd, 6)
    acc = _iq4_xs_run(acc, w, o, sh, table, x, xo, dd, 7)
    return acc, mins


_BLOCKS = {Q2_K: _block_q2_k, Q3_K: _block_q3_k, IQ4_XS: _block_iq4_xs}


def _block(kind, acc, mins, w, b, x, d, s, u):
    """``_block_<type>`` of the type ``kind`` (a literal: only that type's code is compiled)."""


@overload(_block, inline="always")
def _block_of(kind, acc, mins, w, b, x, d, s, u):
    if not isinstance(kind, types.IntegerLiteral):
        return None  # typed again with the literal the entry points pass
    fn = _BLOCKS[kind.literal_value]

    def impl(kind, acc, mins, w, b, x, d, s, u):
        return fn(acc, mins, w, b, x, d, s, u)
    return impl


@njit(cache=True, inline="always")
def _dot_x4(kind, qk, w, x0, x1, x2, x3, d0, d1, d2, d3, s0, s1, s2, s3, u0, u1, u2, u3):
    """Row w times activation rows x0..x3 (with their scales and sums): four independent sums,
    block by block. The four calls of a block read and unpack the same weight bytes, which the
    compiler does once: each weight block is unpacked once for four activation rows."""
    a0, a1, a2, a3 = zerof(), zerof(), zerof(), zerof()
    m0 = m1 = m2 = m3 = np.float32(0.0)
    for b in range(x0.shape[0] // qk):
        a0, m0 = _block(kind, a0, m0, w, b, x0, d0, s0, u0)
        a1, m1 = _block(kind, a1, m1, w, b, x1, d1, s1, u1)
        a2, m2 = _block(kind, a2, m2, w, b, x2, d2, s2, u2)
        a3, m3 = _block(kind, a3, m3, w, b, x3, d3, s3, u3)
    return hsum(a0) + m0, hsum(a1) + m1, hsum(a2) + m2, hsum(a3) + m3


@njit(cache=True, inline="always")
def _dot1(kind, qk, w, x, d, s, u):
    """Row w times activation row x, its blocks in order."""
    a0 = zerof()
    m0 = np.float32(0.0)
    for b in range(x.shape[0] // qk):
        a0, m0 = _block(kind, a0, m0, w, b, x, d, s, u)
    return hsum(a0) + m0


# -- widening ---------------------------------------------------------------------------------------
# Each ``_widen_<type>(w, out)``: row w (its blocks' bytes) as float32 into out (C,), as ggml's
# ``dequantize_row_<type>``.

@njit(cache=True)
def _widen_q4_0(w, out):
    for b in range(out.shape[0] // 32):
        dd = f16(w, 18 * b)
        for j in range(16):
            v = np.int32(w[18 * b + 2 + j])
            out[32 * b + j] = dd * np.float32((v & 15) - 8)
            out[32 * b + 16 + j] = dd * np.float32((v >> 4) - 8)


@njit(cache=True)
def _widen_iq4_nl(w, out):
    for b in range(out.shape[0] // 32):
        dd = f16(w, 18 * b)
        for j in range(16):
            v = np.int32(w[18 * b + 2 + j])
            out[32 * b + j] = dd * np.float32(IQ4_LEVELS[v & 15])
            out[32 * b + 16 + j] = dd * np.float32(IQ4_LEVELS[v >> 4])


@njit(cache=True)
def _widen_q4_1(w, out):
    for b in range(out.shape[0] // 32):
        dd, m = f16(w, 20 * b), f16(w, 20 * b + 2)
        for j in range(16):
            v = np.int32(w[20 * b + 4 + j])
            out[32 * b + j] = dd * np.float32(v & 15) + m
            out[32 * b + 16 + j] = dd * np.float32(v >> 4) + m


@njit(cache=True)
def _high_bits(w, o):
    """The 32 high bits of a Q5_0 / Q5_1 block at byte ``o`` (little-endian)."""
    return (np.int64(w[o]) | (np.int64(w[o + 1]) << 8) | (np.int64(w[o + 2]) << 16)
            | (np.int64(w[o + 3]) << 24))


@njit(cache=True)
def _widen_q5_0(w, out):
    for b in range(out.shape[0] // 32):
        o = 22 * b
        dd, qh = f16(w, o), _high_bits(w, o + 2)
        for j in range(16):
            v = np.int64(w[o + 6 + j])
            out[32 * b + j] = dd * np.float32(((v & 15) | (((qh >> j) & 1) << 4)) - 16)
            out[32 * b + 16 + j] = dd * np.float32(((v >> 4) | (((qh >> (j + 16)) & 1) << 4))
                                                   - 16)


@njit(cache=True)
def _widen_q5_1(w, out):
    for b in range(out.shape[0] // 32):
        o = 24 * b
        dd, m, qh = f16(w, o), f16(w, o + 2), _high_bits(w, o + 4)
        for j in range(16):
            v = np.int64(w[o + 8 + j])
            out[32 * b + j] = dd * np.float32((v & 15) | (((qh >> j) & 1) << 4)) + m
            out[32 * b + 16 + j] = dd * np.float32((v >> 4) | (((qh >> (j + 16)) & 1) << 4)) + m


@njit(cache=True)
def _widen_q8_0(w, out):
    for b in range(out.shape[0] // 32):
        dd = f16(w, 34 * b)
        for j in range(32):
            out[32 * b + j] = dd * np.float32(np.int8(w[34 * b + 2 + j]))


@njit(cache=True)
def _widen_q4_k(w, out):
    for i in range(out.shape[0] // 256):
        o = 144 * i
        dd, dmin = f16(w, o), f16(w, o + 2)
        for j in range(4):
            sc0, m0 = _scale_min_k4(w, o + 4, 2 * j)
            sc1, m1 = _scale_min_k4(w, o + 4, 2 * j + 1)
            for l in range(32):
                v = np.int32(w[o + 16 + 32 * j + l])
                out[256 * i + 64 * j + l] = (dd * np.float32(sc0) * np.float32(v & 15)
                                             - dmin * np.float32(m0))
                out[256 * i + 64 * j + 32 + l] = (dd * np.float32(sc1) * np.float32(v >> 4)
                                                  - dmin * np.float32(m1))


@njit(cache=True)
def _widen_q5_k(w, out):
    for i in range(out.shape[0] // 256):
        o = 176 * i
        dd, dmin = f16(w, o), f16(w, o + 2)
        for j in range(4):
            sc0, m0 = _scale_min_k4(w, o + 4, 2 * j)
            sc1, m1 = _scale_min_k4(w, o + 4, 2 * j + 1)
            for l in range(32):
                v, h = np.int32(w[o + 48 + 32 * j + l]), np.int32(w[o + 16 + l])
                lo = (v & 15) | (((h >> (2 * j)) & 1) << 4)
                hi = (v >> 4) | (((h >> (2 * j + 1)) & 1) << 4)
                out[256 * i + 64 * j + l] = (dd * np.float32(sc0) * np.float32(lo)
                                             - dmin * np.float32(m0))
                out[256 * i + 64 * j + 32 + l] = (dd * np.float32(sc1) * np.float32(hi)
                                                  - dmin * np.float32(m1))


@njit(cache=True)
def _widen_q6_k(w, out):
    for i in range(out.shape[0] // 256):
        o = 210 * i
        dd = f16(w, o + 208)
        for h in range(2):
            for l in range(32):
                q1, q2 = np.int32(w[o + 64 * h + l]), np.int32(w[o + 64 * h + 32 + l])
                qh = np.int32(w[o + 128 + 32 * h + l])
                sc = o + 192 + 8 * h + l // 16
                v = 256 * i + 128 * h + l
                out[v] = dd * np.float32(np.int8(w[sc])) * \
                    np.float32(((q1 & 15) | ((qh & 3) << 4)) - 32)
                out[v + 32] = dd * np.float32(np.int8(w[sc + 2])) * \
                    np.float32(((q2 & 15) | (((qh >> 2) & 3) << 4)) - 32)
                out[v + 64] = dd * np.float32(np.int8(w[sc + 4])) * \
                    np.float32(((q1 >> 4) | (((qh >> 4) & 3) << 4)) - 32)
                out[v + 96] = dd * np.float32(np.int8(w[sc + 6])) * \
                    np.float32(((q2 >> 4) | (((qh >> 6) & 3) << 4)) - 32)


@njit(cache=True)
def _widen_q3_k(w, out):
    for i in range(out.shape[0] // 256):
        o = 110 * i
        dd = f16(w, o + 108)
        for h in range(2):
            for j in range(4):
                for half in range(2):
                    dl = dd * np.float32(_scale_q3(w, o + 96, 8 * h + 2 * j + half))
                    for l in range(16 * half, 16 * half + 16):
                        q = (np.int32(w[o + 32 + 32 * h + l]) >> (2 * j)) & 3
                        high = (np.int32(w[o + l]) >> (4 * h + j)) & 1
                        out[256 * i + 128 * h + 32 * j + l] = dl * np.float32(q - 4 + 4 * high)


@njit(cache=True)
def _widen_q2_k(w, out):
    for i in range(out.shape[0] // 256):
        o = 84 * i
        dd, dmin = f16(w, o + 80), f16(w, o + 82)
        for h in range(2):
            for j in range(4):
                for half in range(2):
                    sc = np.int32(w[o + 8 * h + 2 * j + half])
                    dl, ml = dd * np.float32(sc & 15), dmin * np.float32(sc >> 4)
                    for l in range(16 * half, 16 * half + 16):
                        q = (np.int32(w[o + 16 + 32 * h + l]) >> (2 * j)) & 3
                        out[256 * i + 128 * h + 32 * j + l] = dl * np.float32(q) - ml


@njit(cache=True)
def _widen_iq4_xs(w, out):
    for i in range(out.shape[0] // 256):
        o = 136 * i
        dd = f16(w, o)
        sh = np.int32(w[o + 2]) | (np.int32(w[o + 3]) << 8)
        for j in range(8):
            ls = ((np.int32(w[o + 4 + j // 2]) >> (4 * (j % 2))) & 15) | \
                (((sh >> (2 * j)) & 3) << 4)
            dl = dd * np.float32(ls - 32)
            for l in range(16):
                v = np.int32(w[o + 8 + 16 * j + l])
                out[256 * i + 32 * j + l] = dl * np.float32(IQ4_LEVELS[v & 15])
                out[256 * i + 32 * j + 16 + l] = dl * np.float32(IQ4_LEVELS[v >> 4])


_WIDENS = {Q4_0: _widen_q4_0, Q4_1: _widen_q4_1, Q5_0: _widen_q5_0, Q5_1: _widen_q5_1,
           Q8_0: _widen_q8_0, IQ4_NL: _widen_iq4_nl, Q2_K: _widen_q2_k, Q3_K: _widen_q3_k,
           Q4_K: _widen_q4_k, Q5_K: _widen_q5_k, Q6_K: _widen_q6_k, IQ4_XS: _widen_iq4_xs}


def _row_widen(kind, w, out):
    """``_widen_<type>`` of the type ``kind`` (a literal)."""


@overload(_row_widen)
def _row_widen_of(kind, w, out):
    if not isinstance(kind, types.IntegerLiteral):
        return None
    fn = _WIDENS[kind.literal_value]

    def impl(kind, w, out):
        fn(w, out)
    return impl


@njit(cache=True, inline="always")
def _four_activation_rows(kind, qk, w, wn, q, d, s, u, bias, y, y_row, nrows, n0, n1):
    """Outputs [n0, n1) of every activation row t, weight row n at w[n - wn]: four activation
    rows at a time against every weight row of [n0, n1), a panel that stays in L1 (each weight
    row against all the activation rows in turn streamed those from L2: a 128-row prompt's
    Q4_1 / Q6_K / Q5_0 products 0.76-1.0 of the time, by shape, Q4_K 0.95-1.04)."""
    T = q.shape[0]
    has_bias = bias.shape[0] > 0
    for t in range(0, T, 4):
        t1, t2, t3 = min(t + 1, T - 1), min(t + 2, T - 1), min(t + 3, T - 1)
        for n in range(n0, n1):
            v0, v1, v2, v3 = _dot_x4(kind, qk, w[n - wn], q[t], q[t1], q[t2], q[t3], d[t],
                                     d[t1], d[t2], d[t3], s[t], s[t1], s[t2], s[t3], u[t],
                                     u[t1], u[t2], u[t3])
            b = bias[n] if has_bias else np.float32(0.0)
            y[t // nrows, y_row + t % nrows, n] = v0 + b
            y[t1 // nrows, y_row + t1 % nrows, n] = v1 + b
            y[t2 // nrows, y_row + t2 % nrows, n] = v2 + b
            y[t3 // nrows, y_row + t3 % nrows, n] = v3 + b


# -- panels: sixteen rows side by side ----------------------------------------------------------------
# A matrix of a type in PANEL_KINDS is held as panels of PANEL rows (``panels``, once, when it
# is first multiplied): the 16 rows' blocks b side by side, so that one 64-byte load holds four
# consecutive values of each of the 16 rows, the layout of a ``vpdpbusd`` whose other operand
# is four activation bytes spread to every lane (and of an AMX tile's B operand). A panel block
# is the 16 rows' blocks, reordered (byte offsets; r the row in the panel, i < 4):
#
#     type    fp16 scales, row r at 2 r     high bits (32-bit words)   values
#     Q8_0    d at 0                        -                          chunks at 32
#     Q4_0    d at 0                        -                          chunks at 32
#     Q4_1    d at 0, m at 32               -                          chunks at 64
#     Q5_0    d at 0                        H at 32 + 4 r              chunks at 96
#     Q5_1    d at 0, m at 32               H at 64 + 4 r              chunks at 128
#     Q4_K    d at 0, dmin at 32            -                          chunks at 64 (below)
#     Q5_K    d at 0, dmin at 32            -                          chunks at 64 (below)
#     Q6_K    d at 0                        -                          chunks at 32 (below)
#
# Q8_0 has 8 chunks of 64 bytes, chunk c byte 4 r + i value 4 c + i of row r plus 128
# (unsigned); the 4- and 5-bit types 4 chunks, chunk c byte 4 r + i byte 4 c + i of row r's
# nibbles (so value 4 c + i in its low nibble, value 16 + 4 c + i in its high one, as ggml packs
# them), and row r's 32 high bits as H_r, bit 8 i + c the high bit of value 4 c + i and bit
# 8 i + 4 + c that of value 16 + 4 c + i (a chunk's high bits are then two shifts and a mask
# for 16 rows). The panels of N rows are a uint8 array (16 ceil(N / 16), row bytes): panel p is
# the bytes of its rows [16 p, 16 p + 16), reordered (the last one padded with zeros). A
# block's 16 outputs are one vector:
#
#     y[t, 16 p : 16 p + 16] += (sum_c dot(values_c, x[t, 32 b + 4 c : + 4]) - z sum_j qx[t, b, j])
#                               * d * dx[t, b]  (+ m * sx[t, b])
#
# z the values' offset (128, 8, 16; 0 with an m), sx Q8_1's scaled sum: the per-row work of
# the row layout (scales widened and a horizontal sum per row) done once for 16 rows. The K
# types' 256-value blocks are the same move of 4-byte groups: every byte of a block but its fp16
# fields, from its start (Q6_K) or from byte 4 (Q4_K, Q5_K), a chunk per group (``_k_values``).

PANEL = 16
PANEL_KINDS = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K, Q6_K)
"""The types held as panels (the others as the rows a file stores)."""


def panel_rows(N: int) -> int:
    """Rows of the panels of an N-row matrix: N rounded up to a whole panel."""
    return -(-N // PANEL) * PANEL


@njit(cache=True, inline="always")
def _panel_form(kind):
    """(values a block, block bytes, its fp16 fields, where they are, where its high bits are
    (-1: none), where its words to move are, their bytes; where the panel block's high bits and
    words start)."""
    if kind == Q8_0:
        return 32, 34, 1, 0, -1, 2, 32, -1, 32
    if kind == Q4_0 or kind == IQ4_NL:
        return 32, 18, 1, 0, -1, 2, 16, -1, 32
    if kind == Q4_1:
        return 32, 20, 2, 0, -1, 4, 16, -1, 64
    if kind == Q5_0:
        return 32, 22, 1, 0, 2, 6, 16, 32, 96
    if kind == Q5_1:
        return 32, 24, 2, 0, 4, 8, 16, 64, 128
    if kind == Q4_K:
        return 256, 144, 2, 0, -1, 4, 140, -1, 64
    if kind == Q5_K:
        return 256, 176, 2, 0, -1, 4, 172, -1, 64
    return 256, 210, 1, 208, -1, 0, 208, -1, 32  # Q6_K


@njit(cache=True, inline="always")
def _transpose_4x4(x):
    """Each 16-bit half of x as a 4 x 4 bit matrix (bit 4 c + i) transposed (to bit 4 i + c):
    two swaps of bit pairs. Its own inverse."""
    t = (x ^ (x >> np.uint32(3))) & np.uint32(0x0A0A0A0A)
    x ^= t ^ (t << np.uint32(3))
    t = (x ^ (x >> np.uint32(6))) & np.uint32(0x00CC00CC)
    return x ^ t ^ (t << np.uint32(6))


@njit(cache=True, inline="always")
def _spread_high_bits(qh):
    """H (the panel's word) of a row's 32 high bits qh (table above): each half transposed,
    its nibble i then to byte i, the low half's in the low nibbles, the high half's above."""
    x = _transpose_4x4(qh)
    return _nibbles_to_bytes(x & np.uint32(0xFFFF)) | (_nibbles_to_bytes(x >> np.uint32(16))
                                                       << np.uint32(4))


@njit(cache=True, inline="always")
def _gather_high_bits(h):
    """The 32 high bits of the word H (the inverse of ``_spread_high_bits``)."""
    m = np.uint32(0x0F0F0F0F)
    return _transpose_4x4(_bytes_to_nibbles(h & m)
                          | (_bytes_to_nibbles((h >> np.uint32(4)) & m) << np.uint32(16)))


@njit(cache=True, inline="always")
def _nibbles_to_bytes(x):
    """The four nibbles of the 16-bit x, nibble i to the low nibble of byte i."""
    x = (x | (x << np.uint32(8))) & np.uint32(0x00FF00FF)
    return (x | (x << np.uint32(4))) & np.uint32(0x0F0F0F0F)


@njit(cache=True, inline="always")
def _bytes_to_nibbles(x):
    """The inverse of ``_nibbles_to_bytes``."""
    x = (x | (x >> np.uint32(4))) & np.uint32(0x00FF00FF)
    return (x | (x >> np.uint32(8))) & np.uint32(0xFFFF)


@njit(cache=True, inline="always")
def _word(a, i):
    """The little-endian 32-bit word at byte i of the byte array a (one unaligned load)."""
    return (np.uint32(a[i]) | (np.uint32(a[i + 1]) << np.uint32(8))
            | (np.uint32(a[i + 2]) << np.uint32(16)) | (np.uint32(a[i + 3]) << np.uint32(24)))


@njit(cache=True, inline="always")
def _put_word(a, i, v):
    """Bytes i .. i + 3 of the byte array a = the 32-bit word v, little-endian."""
    for k in range(4):
        a[i + k] = np.uint8((v >> np.uint32(8 * k)) & np.uint32(255))


@njit(cache=True)
def _panel_put(kind, row, flat, words, base, r, nb):
    """Row ``row`` (a file's blocks) into the panel at byte ``base`` of flat (``words`` its
    32-bit view), as its row r: the layout moves whole 32-bit words."""
    _, nbytes, nf, foff, hoff, qoff, nq, hdst, vdst = _panel_form(kind)
    flip = np.uint32(0x80808080 if kind == Q8_0 else 0)
    for b in range(nb):
        src, o = nbytes * b, base + PANEL * nbytes * b
        for f in range(nf):
            flat[o + 32 * f + 2 * r] = row[src + foff + 2 * f]
            flat[o + 32 * f + 2 * r + 1] = row[src + foff + 2 * f + 1]
        if hoff >= 0:
            words[(o + hdst) // 4 + r] = _spread_high_bits(_word(row, src + hoff))
        for c in range(nq // 4):
            words[(o + vdst + 64 * c) // 4 + r] = _word(row, src + qoff + 4 * c) ^ flip


@njit(cache=True)
def _panel_take(kind, flat, words, base, r, nb, row):
    """Row r of the panel at byte ``base`` of flat (``words`` its 32-bit view) into ``row``, as
    a file stores it."""
    _, nbytes, nf, foff, hoff, qoff, nq, hdst, vdst = _panel_form(kind)
    flip = np.uint32(0x80808080 if kind == Q8_0 else 0)
    for b in range(nb):
        src, o = nbytes * b, base + PANEL * nbytes * b
        for f in range(nf):
            row[src + foff + 2 * f] = flat[o + 32 * f + 2 * r]
            row[src + foff + 2 * f + 1] = flat[o + 32 * f + 2 * r + 1]
        if hoff >= 0:
            _put_word(row, src + hoff, _gather_high_bits(words[(o + hdst) // 4 + r]))
        for c in range(nq // 4):
            _put_word(row, src + qoff + 4 * c, words[(o + vdst + 64 * c) // 4 + r] ^ flip)


@njit(cache=True, parallel=True)
def _to_panels(kind, rows, out):
    N, rb = rows.shape
    nb = rb // _panel_form(kind)[1]
    flat = out.reshape(out.shape[0] * rb)
    words = flat.view(np.uint32)
    for p in prange(out.shape[0] // PANEL):
        for r in range(min(PANEL, N - PANEL * p)):
            _panel_put(kind, rows[PANEL * p + r], flat, words, PANEL * rb * p, r, nb)


@njit(cache=True, parallel=True)
def _from_panels(kind, panels, out):
    N, rb = out.shape
    nb = rb // _panel_form(kind)[1]
    flat = panels.reshape(panels.shape[0] * rb)
    words = flat.view(np.uint32)
    for p in prange(panels.shape[0] // PANEL):
        for r in range(min(PANEL, N - PANEL * p)):
            _panel_take(kind, flat, words, PANEL * rb * p, r, nb, out[PANEL * p + r])


PANELS_CHUNK = 1 << 14
"""Rows reordered into panels at a time (``panels``)."""


def panels(qtype: QType, rows: np.ndarray, done=None) -> np.ndarray:
    """The panels (read-only) of a matrix's rows (N, row bytes) of a type in PANEL_KINDS,
    made PANELS_CHUNK rows at a time, ``done(r0, r1)`` called after each (a file's pages given
    back as they are read: a 180 MB table never held twice)."""
    N = rows.shape[0]
    out = np.zeros((panel_rows(N), rows.shape[1]), dtype=np.uint8)
    for r0 in range(0, N, PANELS_CHUNK):
        r1 = min(N, r0 + PANELS_CHUNK)
        _to_panels(qtype.kind, np.ascontiguousarray(rows[r0:r1]), out[r0:panel_rows(r1)])
        if done is not None:
            done(r0, r1)
    return read_only(out)


def panels_rows(qtype: QType, blocks: np.ndarray, N: int) -> np.ndarray:
    """The N rows of ``panels``, as a file stores them (a new array)."""
    out = np.empty((N, blocks.shape[1]), dtype=np.uint8)
    _from_panels(qtype.kind, blocks, out)
    return out


def held(qtype: QType, rows: np.ndarray) -> np.ndarray:
    """A matrix's rows as this type's kernels read them: its panels, or the rows as they are."""
    return panels(qtype, rows) if qtype.panelled else rows


@njit(cache=True)
def _panel_values(kind, wf, o, c):
    """Values 4 c .. 4 c + 3 (c < 8) of the 16 rows of the panel block at byte o, unsigned
    (plus the type's offset)."""
    if kind == Q8_0:
        return load64(wf, o + 32 + 64 * c)
    if kind == IQ4_NL:  # the levels plus 128, by nibble
        n = low4(load64(wf, o + 32 + 64 * c)) if c < 4 else high4(load64(wf, o + 32 + 64 * (c - 4)))
        return lookup64(IQ4_UNSIGNED, 0, n)
    hdst, vdst = _panel_form(kind)[7:]
    m = 0x10101010  # a five-bit value's high bit (bit 8 i + c, or 8 i + 4 + c, of the word)
    if c < 4:
        v = low4(load64(wf, o + vdst + 64 * c))
        if hdst >= 0:
            v = bor64(v, shl_and64(load64(wf, o + hdst), 4 - c, m))
        return v
    v = high4(load64(wf, o + vdst + 64 * (c - 4)))
    if hdst >= 0:
        v = bor64(v, shr_and64(load64(wf, o + hdst), c - 4, m))
    return v


@njit(cache=True)
def _panel_block_values(kind, wf, o):
    """The eight 64-byte value vectors of the panel block at byte o (``_panel_values``), unpacked
    once for every activation row a panel meets."""
    return (_panel_values(kind, wf, o, 0), _panel_values(kind, wf, o, 1),
            _panel_values(kind, wf, o, 2), _panel_values(kind, wf, o, 3),
            _panel_values(kind, wf, o, 4), _panel_values(kind, wf, o, 5),
            _panel_values(kind, wf, o, 6), _panel_values(kind, wf, o, 7))


@njit(cache=True)
def _panel_dot(kind, acc, v, x, xo):
    """acc + each lane's four values v times x[xo : xo + 4]."""
    if kind == Q8_0 or kind == IQ4_NL:
        return dot16_wide(acc, v, spread4(x, xo))
    return dot16(acc, v, spread4(x, xo))


@njit(cache=True)
def _panel_block(kind, acc, vs, wf, o, x, d, s, u, b):
    """acc + the 16 outputs of the panel block at byte o of wf, its values vs, times block b of
    activation row x (d, s, u as rounded for the type)."""
    xo = 32 * b
    v0 = _panel_dot(kind, zero16(), vs[0], x, xo)
    v1 = _panel_dot(kind, zero16(), vs[1], x, xo + 4)
    v0 = _panel_dot(kind, v0, vs[2], x, xo + 8)
    v1 = _panel_dot(kind, v1, vs[3], x, xo + 12)
    v0 = _panel_dot(kind, v0, vs[4], x, xo + 16)
    v1 = _panel_dot(kind, v1, vs[5], x, xo + 20)
    v0 = _panel_dot(kind, v0, vs[6], x, xo + 24)
    v1 = _panel_dot(kind, v1, vs[7], x, xo + 28)
    total = add16(v0, v1)
    if kind == Q4_1 or kind == Q5_1:
        acc = fma16(acc, total, scale16(halves16(wf, o), s[2 * b]))
        return fmaf16(acc, halves16(wf, o + 32), s[2 * b + 1])
    z = 128 if kind == Q8_0 or kind == IQ4_NL else (8 if kind == Q4_0 else 16)
    return fma16(acc, sub16(total, z * u[b]), scale16(halves16(wf, o), d[b]))


# A K type's panel block holds 256 values of 16 rows: Q4_K its d at 0, dmin at 32, the 12 scale
# bytes as three chunks at 64 (chunk k byte 4 r + i scale byte 4 k + i of row r), its 128
# nibble bytes as 32 chunks at 256; Q5_K the same with its 32 bytes of high bits as 8 chunks at
# 256 and the nibbles at 768; Q6_K its d at 0, then the 128 low-nibble bytes (32 chunks
# at 32), the 64 bytes of high bits (16 chunks at 2080) and the 16 int8 scales (4 chunks at
# 3104). A sub-block j of 32 values is eight value vectors (chunk c values 4 c .. 4 c + 3 of
# the 16 rows), its integer sums times the 16 rows' scales in int32 lanes:
#
#     y[t, 16 p : 16 p + 16] += d * dx[t, i] * sum_j sc_j * dot_j - dmin * dx[t, i] * sum_j m_j * bsum_j
#
# (Q4_K, Q5_K; Q6_K's scales come a 16 values, its values' offset 32 taken off each dot through the
# bsums, and it has no mins.)

@njit(cache=True)
def _k_values(kind, wf, o, j):
    """The eight unsigned value vectors of sub-block j (< 8) of the K-type panel block at byte o."""
    if kind == Q4_K or kind == Q5_K:
        # pair j // 2: low nibbles, then high; Q5_K's high bits bit j of its qh chunks
        q, h, n = o + (256 if kind == Q4_K else 768) + 512 * (j // 2), o + 256, 4 * (j % 2)
        return (_k4_value(kind, wf, q, h, n, j), _k4_value(kind, wf, q + 64, h + 64, n, j),
                _k4_value(kind, wf, q + 128, h + 128, n, j),
                _k4_value(kind, wf, q + 192, h + 192, n, j),
                _k4_value(kind, wf, q + 256, h + 256, n, j),
                _k4_value(kind, wf, q + 320, h + 320, n, j),
                _k4_value(kind, wf, q + 384, h + 384, n, j),
                _k4_value(kind, wf, q + 448, h + 448, n, j))
    # Q6_K: half h = j // 4, run r = j % 4: low nibbles (r < 2) or high nibbles of ql bytes
    # 64 h + 32 (r % 2) .., the high bits 2 r, 2 r + 1 of qh bytes 32 h ..
    h, r = j // 4, j % 4
    lo, hi, n = o + 32 + 64 * (16 * h + 8 * (r % 2)), o + 2080 + 512 * h, 4 * (r // 2)
    return (_q6_k_value(wf, lo, hi, n, r), _q6_k_value(wf, lo + 64, hi + 64, n, r),
            _q6_k_value(wf, lo + 128, hi + 128, n, r), _q6_k_value(wf, lo + 192, hi + 192, n, r),
            _q6_k_value(wf, lo + 256, hi + 256, n, r), _q6_k_value(wf, lo + 320, hi + 320, n, r),
            _q6_k_value(wf, lo + 384, hi + 384, n, r), _q6_k_value(wf, lo + 448, hi + 448, n, r))


@njit(cache=True)
def _k4_value(kind, wf, q, h, n, j):
    """Q4_K / Q5_K values: the nibbles at bit n of the chunk at q (Q5_K: with bit j of each
    byte of the chunk at h as their bit 4)."""
    v = shr_and64(load64(wf, q), n, 0x0F0F0F0F)
    if kind == Q5_K:
        v = bor64(v, shl_and64(shr_and64(load64(wf, h), j, 0x01010101), 4, 0x10101010))
    return v


@njit(cache=True)
def _q6_k_value(wf, lo, hi, n, r):
    """Six-bit values: the nibbles at bit n of the chunk at lo, bits 2 r, 2 r + 1 of the chunk
    at hi as their bits 4, 5."""
    return bor64(shr_and64(load64(wf, lo), n, 0x0F0F0F0F),
                 shl_and64(shr_and64(load64(wf, hi), 2 * r, 0x03030303), 4, 0x30303030))


@njit(cache=True)
def _k_scales(kind, wf, o, j):
    """Sub-block j's scales of its values 0..15 and 16..31, and its min (Q4_K, Q5_K), as int32
    lanes of the 16 rows."""
    if kind == Q4_K or kind == Q5_K:
        s0, s1, s2 = load64(wf, o + 64), load64(wf, o + 128), load64(wf, o + 192)
        if j < 4:
            sc = lanes16(shr_and64(s0, 8 * j, 63))
            return sc, sc, lanes16(shr_and64(s1, 8 * j, 63))
        k = 8 * (j - 4)  # 4 bits from the third word, the top 2 from the first (second)
        sc = lanes16(bor64(shr_and64(s2, k, 15), shl_and64(shr_and64(s0, k + 6, 3), 4, 48)))
        m = lanes16(bor64(shr_and64(s2, k + 4, 15), shl_and64(shr_and64(s1, k + 6, 3), 4, 48)))
        return sc, sc, m
    v = load64(wf, o + 3104 + 64 * (j // 2))
    return sbyte16(v, 2 * (j % 2)), sbyte16(v, 2 * (j % 2) + 1), zero16()


@njit(cache=True)
def _k_sub(kind, isum, msum, vs, sc0, sc1, m, x, xo, u, uo):
    """(isum, msum) + sub-block j's sums for activation row x (values at xo, bsums u[uo],
    u[uo + 1]): two chains of four dots, for the values 0..15 and 16..31."""
    a = _panel_dot(kind, _panel_dot(kind, zero16(), vs[0], x, xo), vs[1], x, xo + 4)
    a = _panel_dot(kind, _panel_dot(kind, a, vs[2], x, xo + 8), vs[3], x, xo + 12)
    b = _panel_dot(kind, _panel_dot(kind, zero16(), vs[4], x, xo + 16), vs[5], x, xo + 20)
    b = _panel_dot(kind, _panel_dot(kind, b, vs[6], x, xo + 24), vs[7], x, xo + 28)
    if kind == Q4_K or kind == Q5_K:
        return (add16(isum, mul16(add16(a, b), sc0)),
                add16(msum, mul16(m, np.int32(u[uo]) + np.int32(u[uo + 1]))))
    isum = add16(isum, mul16(sub16(a, 32 * np.int32(u[uo])), sc0))
    return add16(isum, mul16(sub16(b, 32 * np.int32(u[uo + 1])), sc1)), msum


@njit(cache=True)
def _k_finish(kind, acc, isum, msum, wf, o, dx):
    """acc + the block's outputs from its integer sums (the comment above)."""
    acc = fma16(acc, isum, scale16(halves16(wf, o), dx))
    if kind == Q4_K or kind == Q5_K:
        acc = fma16(acc, msum, scale16(halves16(wf, o + 32), -dx))
    return acc


@njit(cache=True)
def _k_block(kind, acc, wf, o, x, d, u, i):
    """acc + the 16 outputs of the K-type panel block at byte o times block i of activation
    row x."""
    isum, msum = zero16(), zero16()
    for j in range(8):
        sc0, sc1, m = _k_scales(kind, wf, o, j)
        isum, msum = _k_sub(kind, isum, msum, _k_values(kind, wf, o, j), sc0, sc1, m, x,
                            256 * i + 32 * j, u, 16 * i + 2 * j)
    return _k_finish(kind, acc, isum, msum, wf, o, d[i])


@njit(cache=True)
def _k_block4(kind, a0, a1, a2, a3, wf, o, q, d, u, t, i):
    """``_k_block`` for activation rows t .. t + 3, each sub-block's values and scales unpacked
    once for the four."""
    x0, x1, x2, x3 = q[t], q[t + 1], q[t + 2], q[t + 3]
    u0, u1, u2, u3 = u[t], u[t + 1], u[t + 2], u[t + 3]
    i0, i1, i2, i3 = zero16(), zero16(), zero16(), zero16()
    m0, m1, m2, m3 = zero16(), zero16(), zero16(), zero16()
    for j in range(8):
        vs = _k_values(kind, wf, o, j)
        sc0, sc1, m = _k_scales(kind, wf, o, j)
        xo, uo = 256 * i + 32 * j, 16 * i + 2 * j
        i0, m0 = _k_sub(kind, i0, m0, vs, sc0, sc1, m, x0, xo, u0, uo)
        i1, m1 = _k_sub(kind, i1, m1, vs, sc0, sc1, m, x1, xo, u1, uo)
        i2, m2 = _k_sub(kind, i2, m2, vs, sc0, sc1, m, x2, xo, u2, uo)
        i3, m3 = _k_sub(kind, i3, m3, vs, sc0, sc1, m, x3, xo, u3, uo)
    return (_k_finish(kind, a0, i0, m0, wf, o, d[t, i]),
            _k_finish(kind, a1, i1, m1, wf, o, d[t + 1, i]),
            _k_finish(kind, a2, i2, m2, wf, o, d[t + 2, i]),
            _k_finish(kind, a3, i3, m3, wf, o, d[t + 3, i]))


@njit(cache=True)
def _panel_store(y, t, y_row, nrows, n0, N, acc, bias):
    """y[t's batch and row, n0 : n0 + 16] = acc + bias, the lanes below N."""
    out = y[t // nrows, y_row + t % nrows]
    if bias.shape[0] > 0:
        if n0 + PANEL <= N:
            acc = addf16(acc, load16f(bias, n0))
        else:
            for n in range(n0, N):
                out[n] = lane16(acc, n - n0) + bias[n]
            return
    if n0 + PANEL <= N:
        store16f(out, n0, acc)
    else:
        for n in range(n0, N):
            out[n] = lane16(acc, n - n0)


@njit(cache=True, fastmath=_FASTMATH)
def _panel_rows(kind, w, q, d, s, u, bias, y, y_row, nrows, p0, p1):
    """Panels [p0, p1) of w times every activation row t = b * nrows + i: four activation rows
    at a time against a panel that stays in L1 (its bytes loaded and unpacked once for the
    four), then one at a time, asking for the bytes PREFETCH_BYTES ahead (a decode step streams
    the panels from memory once)."""
    T, K = q.shape
    N = y.shape[2]
    rb = w.shape[1]
    qk, nbytes = _panel_form(kind)[:2]
    nb, bb = K // qk, PANEL * nbytes
    wf = w.reshape(w.shape[0] * rb)
    for p in range(p0, p1):
        base = PANEL * rb * p
        t = 0
        while t + 4 <= T:
            a0, a1, a2, a3 = zerof16(), zerof16(), zerof16(), zerof16()
            for b in range(nb):
                o = base + bb * b
                if kind == Q4_K or kind == Q5_K or kind == Q6_K:
                    a0, a1, a2, a3 = _k_block4(kind, a0, a1, a2, a3, wf, o, q, d, u, t, b)
                else:
                    vs = _panel_block_values(kind, wf, o)
                    a0 = _panel_block(kind, a0, vs, wf, o, q[t], d[t], s[t], u[t], b)
                    a1 = _panel_block(kind, a1, vs, wf, o, q[t + 1], d[t + 1], s[t + 1],
                                      u[t + 1], b)
                    a2 = _panel_block(kind, a2, vs, wf, o, q[t + 2], d[t + 2], s[t + 2],
                                      u[t + 2], b)
                    a3 = _panel_block(kind, a3, vs, wf, o, q[t + 3], d[t + 3], s[t + 3],
                                      u[t + 3], b)
            _panel_store(y, t, y_row, nrows, PANEL * p, N, a0, bias)
            _panel_store(y, t + 1, y_row, nrows, PANEL * p, N, a1, bias)
            _panel_store(y, t + 2, y_row, nrows, PANEL * p, N, a2, bias)
            _panel_store(y, t + 3, y_row, nrows, PANEL * p, N, a3, bias)
            t += 4
        while t < T:
            x0, d0, s0, u0 = q[t], d[t], s[t], u[t]
            a0 = zerof16()
            for b in range(nb):
                o = base + bb * b
                for line in range(0, bb, 64):
                    prefetch(wf, o + PREFETCH_BYTES + line)
                if kind == Q4_K or kind == Q5_K or kind == Q6_K:
                    a0 = _k_block(kind, a0, wf, o, x0, d0, u0, b)
                else:
                    a0 = _panel_block(kind, a0, _panel_block_values(kind, wf, o), wf, o, x0, d0,
                                      s0, u0, b)
            _panel_store(y, t, y_row, nrows, PANEL * p, N, a0, bias)
            t += 1


@njit(cache=True)
def _panel_widen(kind, w, n, out):
    """Row n of the panels w as float32 into out (K,): its blocks as a file stores them, then
    ggml's ``dequantize_row``."""
    rb = w.shape[1]
    row = np.empty(rb, dtype=np.uint8)
    flat = w.reshape(w.shape[0] * rb)
    _panel_take(kind, flat, flat.view(np.uint32), PANEL * rb * (n // PANEL), n % PANEL,
                rb // _panel_form(kind)[1], row)
    _row_widen(kind, row, out)


# -- prompts on AMX tiles ---------------------------------------------------------------------------
# Where the CPU has AMX (simd.LEVEL "amx"), a prompt of AMX_MIN_ROWS rows or more multiplies each
# panel of 16 weight rows by the activations 16 rows at a time in tiles (amx.py): the panel's
# values unpacked once into bytes, in the layout a tile product reads (its values stored as
# they come, ``_panel_values`` / ``_k_values``), each sub-block of 32 values one tile product
# of exact integer sums C[t, n], then
#
#     y[t, n] += C[t, n] * (ws[b, n] * dx[t, b]) + wm[b, n] * sx[t, b]
#
# ws the weights' scale of the sub-block (d, or d * its sub-scale), wm their offset (Q4_1's m,
# Q4_K's and Q5_K's -dmin * min; 0 for the symmetric types), dx the activations' scale and sx their scaled
# sum over the sub-block (Q8_1's s; Q8_K's d times two bsums).

AMX_KINDS = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K)
"""The types whose prompts run on AMX tiles (the others as on any CPU). Q6_K, whose scales
come a 16 values, took 2.7-3.5x the time of its vector loop on tiles of 16 (bench_quant_ab,
one thread, 1536 x 576 at 8 to 128 rows), so it stays with the vector loop."""
AMX_MIN_ROWS = 16
"""Activation rows from which a prompt's product runs on AMX tiles: one full tile. Against the
vector loops (one thread, 1536 x 576): 16 rows 0.49-0.78 of the time, 128 rows 0.25-0.45; at 8
rows Q4_K was 1.09."""


@njit(cache=True, inline="always")
def _amx_act(kind, d, s, u, t, b):
    """(dx, sx) of activation row t's sub-block b (module comment above)."""
    if kind == Q4_1 or kind == Q5_1:
        o = t * s.shape[1] + 2 * b
        return load1f(s, o), load1f(s, o + 1)
    if kind == Q4_K or kind == Q5_K:
        dx = load1f(d, t * d.shape[1] + b // 8)
        return dx, dx * np.float32(u[t, 2 * b] + u[t, 2 * b + 1])
    return load1f(d, t * d.shape[1] + b), np.float32(0.0)


@njit(cache=True, inline="always")
def _amx_configure(cfg, R):
    """Tile shapes: C (tiles 0 and 3) R rows of 16 int32; A (1, 4) R activation rows of 32
    bytes; B (2, 5) 8 rows of 16 x 4 bytes."""
    cfg[:] = 0
    cfg[0] = 1  # palette 1
    for c in (0, 3):
        cfg[16 + 2 * c], cfg[18 + 2 * c], cfg[20 + 2 * c] = 64, 32, 64
        cfg[48 + c], cfg[49 + c], cfg[50 + c] = R, R, 8
    amx.tile_config(cfg)


@njit(cache=True, inline="always")
def _amx_block(offset, flat_q, qo, K, flat_p, po, sums, so, first):
    """One sub-block's tile product into sums[so:so + 256]: tiles 0-2 when ``first``, else
    3-5 (two products in flight)."""
    if first:
        amx.tile_zero(0)
        amx.tile_load(1, flat_q, qo, K)
        amx.tile_load(2, flat_p, po, 64)
        if offset:
            amx.tile_dot_su(0, 1, 2)
        else:
            amx.tile_dot_ss(0, 1, 2)
        amx.tile_store(0, sums, so, 64)
    else:
        amx.tile_zero(3)
        amx.tile_load(4, flat_q, qo, K)
        amx.tile_load(5, flat_p, po, 64)
        if offset:
            amx.tile_dot_su(3, 4, 5)
        else:
            amx.tile_dot_ss(3, 4, 5)
        amx.tile_store(3, sums, so, 64)


@njit(cache=True)
def _amx_rows(kind, w, q, d, s, u, bias, y, y_row, nrows, n0, n1, room):
    """Outputs [n0, n1) of every activation row t = b * nrows + i on AMX tiles (module comment
    above), 16 weight rows at a time; ``room`` this thread's bytes (``amx_room_bytes``). The
    tile products of all sub-blocks of 16 activation rows go first (into ``sums``), then each
    row's scaled sum is made in registers."""
    T, K = q.shape
    nsub = K // 32
    cfg = room[:64]
    o = 64
    sums = room[o:o + 1024 * nsub].view(np.int32)
    o += 1024 * nsub
    panel = room[o:o + 16 * K].view(np.int32).reshape(K // 4, 16)
    pbytes = room[o:o + 16 * K]
    o += 16 * K
    ws = room[o:o + 64 * nsub].view(np.float32).reshape(nsub, 16)
    o += 64 * nsub
    wm = room[o:o + 64 * nsub].view(np.float32).reshape(nsub, 16)
    o += 64 * nsub
    out = room[o:o + 64].view(np.float32)
    offset = kind == Q4_1 or kind == Q5_1 or kind == Q4_K or kind == Q5_K
    has_bias = bias.shape[0] > 0
    flat_q = q.reshape(T * K)
    flat_p = panel.reshape(K * 4)
    flat_ws, flat_wm = ws.reshape(16 * nsub), wm.reshape(16 * nsub)
    wf = w.reshape(w.shape[0] * w.shape[1])
    bb = PANEL * _panel_form(kind)[1]
    for c0 in range(n0, n1, 16):
        c1 = min(c0 + 16, n1)
        base = c0 * w.shape[1]  # panel c0 / 16
        # each sub-block's values into the B operand: with the offset of Q4_0, Q5_0, Q8_0 and
        # IQ4_NL taken off (signed bytes, tdpbssd: an offset term in the scaling below cost a
        # third of the speed), Q4_1's, Q5_1's, Q4_K's and Q5_K's as they are, their m the offsets
        for b in range(nsub):
            if kind == Q4_K or kind == Q5_K:
                # sub-block b % 8 of block b // 8: ws = d * sc, wm = -dmin * m
                ob = base + bb * (b // 8)
                sc, _, m = _k_scales(kind, wf, ob, b % 8)
                store16f(flat_ws, 16 * b, fma16(zerof16(), sc, halves16(wf, ob)))
                store16f(flat_wm, 16 * b, fma16(zerof16(), m, scale16(halves16(wf, ob + 32),
                                                                     np.float32(-1.0))))
                vs = _k_values(kind, wf, ob, b % 8)
                for c in range(8):
                    store64(pbytes, 512 * b + 64 * c, vs[c])
                continue
            ob = base + bb * b
            store16f(flat_ws, 16 * b, halves16(wf, ob))
            if offset:
                store16f(flat_wm, 16 * b, halves16(wf, ob + 32))
            z = 128 if kind == Q8_0 or kind == IQ4_NL else (8 if kind == Q4_0 else 16)
            for c in range(8):
                v = _panel_values(kind, wf, ob, c)
                store64(pbytes, 512 * b + 64 * c, v if offset else bsub64(v, z))
        R = 0
        yb, yr = 0, y_row  # where row t's outputs go: y[yb, yr] (t = yb * nrows + yr - y_row)
        for t0 in range(0, T, 16):
            if min(16, T - t0) != R:
                R = min(16, T - t0)
                _amx_configure(cfg, R)
            # sub-block b: activations q[t0:, 32 b:], panel words [128 b, 128 b + 128)
            for b in range(0, nsub - 1, 2):
                _amx_block(offset, flat_q, t0 * K + 32 * b, K, flat_p, 128 * b, sums, 256 * b,
                           True)
                _amx_block(offset, flat_q, t0 * K + 32 * b + 32, K, flat_p, 128 * b + 128, sums,
                           256 * b + 256, False)
            if nsub % 2:
                b = nsub - 1
                _amx_block(offset, flat_q, t0 * K + 32 * b, K, flat_p, 128 * b, sums, 256 * b,
                           True)
            for i in range(R):
                t = t0 + i
                a0, a1 = zerof(), zerof()
                for b in range(nsub):
                    dx, sx = _amx_act(kind, d, s, u, t, b)
                    x = splatf(dx)
                    c = 256 * b + 16 * i
                    a0 = fmaf(a0, load8f(sums, c), mulf(load8f(flat_ws, 16 * b), x))
                    a1 = fmaf(a1, load8f(sums, c + 8), mulf(load8f(flat_ws, 16 * b + 8), x))
                    if offset:
                        m = splatf(sx)
                        a0 = fmaf(a0, load8f(flat_wm, 16 * b), m)
                        a1 = fmaf(a1, load8f(flat_wm, 16 * b + 8), m)
                store8f(out, 0, a0)
                store8f(out, 8, a1)
                for n in range(c0, c1):
                    v = out[n - c0]
                    y[yb, yr, n] = v + bias[n] if has_bias else v
                yr += 1
                if yr == y_row + nrows:
                    yb, yr = yb + 1, y_row


def amx_room_bytes(K: int) -> int:
    """Bytes of one thread's room for ``_amx_rows`` over rows of K values: the tile shapes, the
    sums of a tile's sub-blocks, the B operand, ws, wm and a row's outputs."""
    return 64 + 1024 * (K // 32) + 16 * K + 2 * 64 * (K // 32) + 64


# -- entry points -----------------------------------------------------------------------------------

@njit(cache=True, fastmath=_FASTMATH)
def _rows(kind, qk, w, q, d, s, u, bias, y, y_row, nrows, n0, n1):
    """Outputs [n0, n1) of every activation row t = b * nrows + i of a type held as rows: for
    one (decode) each weight row read once, in order (one memory stream); for several (a
    prompt), one weight row for four activation rows (its blocks unpacked once for the four),
    the rows [n0, n1) in turn for each four, the last group repeating its last row."""
    if q.shape[0] > 1:
        _four_activation_rows(kind, qk, w, 0, q, d, s, u, bias, y, y_row, nrows, n0, n1)
        return
    has_bias = bias.shape[0] > 0
    for n in range(n0, n1):
        v = _dot1(kind, qk, w[n], q[0], d[0], s[0], u[0])
        y[0, y_row, n] = v + bias[n] if has_bias else v


def _entry_points(kind: int, qk: int):
    """The compiled entry points of one type: ``kind`` is a constant of each (numba compiles
    only that type's code, and caches each type's apart). Where the CPU has AMX tiles, a prompt
    of AMX_MIN_ROWS rows or more of AMX_KINDS runs ``_amx_rows``, on ``scratch``; else a type
    of PANEL_KINDS runs ``_panel_rows``, the others ``_rows``; a parallel task is one panel of
    16 rows."""
    tiles = simd.LEVEL == "amx" and kind in AMX_KINDS
    panelled = kind in PANEL_KINDS

    @njit(cache=True)
    def rows(w, q, d, s, u, bias, y, y_row, nrows, scratch):
        # n0 a typed int64, not the literal 0: the signature rows_parallel's tasks call _rows
        # with, so one compile of _rows serves both
        N = y.shape[2]
        if tiles and q.shape[0] >= AMX_MIN_ROWS:
            _amx_rows(kind, w, q, d, s, u, bias, y, y_row, nrows, np.int64(0), N,
                      scratch[0, 0])
            return
        if panelled:
            _panel_rows(kind, w, q, d, s, u, bias, y, y_row, nrows, np.int64(0),
                        (N + PANEL - 1) // PANEL)
            return
        _rows(kind, qk, w, q, d, s, u, bias, y, y_row, nrows, np.int64(0), N)

    @njit(cache=True, parallel=True)
    def rows_parallel(w, q, d, s, u, bias, y, y_row, nrows, scratch):
        N = y.shape[2]
        if tiles and q.shape[0] >= AMX_MIN_ROWS:
            for task in prange((N + PANEL - 1) // PANEL):
                _amx_rows(kind, w, q, d, s, u, bias, y, y_row, nrows, task * PANEL,
                          min(N, task * PANEL + PANEL),
                          scratch[get_thread_id(), 0])
            return
        if panelled:
            for task in prange((N + PANEL - 1) // PANEL):
                p = np.int64(task)  # the signature rows calls _panel_rows with: one compile
                _panel_rows(kind, w, q, d, s, u, bias, y, y_row, nrows, p, p + 1)
            return
        for task in prange((N + PANEL - 1) // PANEL):
            _rows(kind, qk, w, q, d, s, u, bias, y, y_row, nrows, task * PANEL,
                  min(N, task * PANEL + PANEL))

    @njit(cache=True)
    def widen(w, index, out, in_panels):
        for r in range(index.shape[0]):
            if panelled and in_panels:
                _panel_widen(kind, w, index[r], out[r])
            else:
                _row_widen(kind, w[index[r]], out[r])

    @njit(cache=True, parallel=True)
    def rows_table(table, q, d, s, u, nrows, scratch):
        # one parallel region over the rows of every matrix of the table (MatrixTable)
        tasks = 0
        for m in range(table.shape[0]):
            tasks += (table[m, 1] + PANEL - 1) // PANEL
        if tiles and q.shape[0] >= AMX_MIN_ROWS:
            for task in prange(tasks):
                w, y, bias, t = _table_task(table, task, panelled)
                _amx_rows(kind, w, q, d, s, u, bias, y, np.int64(0), nrows, t * PANEL,
                          min(y.shape[2], t * PANEL + PANEL),
                          scratch[get_thread_id(), 0])
            return
        if panelled:
            for task in prange(tasks):
                w, y, bias, t = _table_task(table, task, panelled)
                _panel_rows(kind, w, q, d, s, u, bias, y, np.int64(0), nrows, t, t + 1)
            return
        for task in prange(tasks):
            w, y, bias, t = _table_task(table, task, panelled)
            _rows(kind, qk, w, q, d, s, u, bias, y, np.int64(0), nrows, t * PANEL,
                  min(w.shape[0], t * PANEL + PANEL))

    @njit(cache=True)
    def rows_team(args, k0, k1):
        # tasks [k0, k1) of rows_table (a decode step: no tiles), a team op (MatrixTable.op)
        w = words(args, 16)
        table = array2(w, 0, np.int64)
        q, d, s, u = _activation_words(w, 3)
        nrows = w[15]
        for task in range(k0, k1):
            m, y, bias, t = _table_task(table, task, panelled)
            if panelled:
                _panel_rows(kind, m, q, d, s, u, bias, y, np.int64(0), nrows, t, t + 1)
            else:
                _rows(kind, qk, m, q, d, s, u, bias, y, np.int64(0), nrows, t * PANEL,
                      min(m.shape[0], t * PANEL + PANEL))

    return rows, rows_parallel, widen, rows_table, rows_team


@njit(cache=True, inline="always")
def _table_task(table, task, panelled):
    """The arrays of the member whose task ``task`` is (MatrixTable's row: w, y, bias; w's
    panels when ``panelled``), and the task's number within the member."""
    m, t = _member_task(table, task)
    e = table[m]
    wrows = (e[1] + PANEL - 1) // PANEL * PANEL if panelled else e[1]
    return (carray(pointer(e[0]), (wrows, e[2]), np.uint8),
            carray(pointer(e[3]), (e[4], e[5], e[1]), np.float32),
            carray(pointer(e[6]), (e[7],), np.float32), t)


@njit(cache=True)
def _member_task(table, task):
    """(member, its task) of the table's task ``task``, the members' tasks numbered in order."""
    m, t = 0, np.int64(task)  # a prange index may be unsigned
    n = (table[0, 1] + PANEL - 1) // PANEL
    while t >= n:
        t -= n
        m += 1
        n = (table[m, 1] + PANEL - 1) // PANEL
    return m, t


PARALLEL_MIN_BYTES = 1 << 16
"""Weight bytes (times activation rows) below which one thread multiplies: a parallel region
costs some 5-10 us to start here. From 2^18 to 2^16 (SmolLM2's 576 x 576 Q4_1 output projection,
207 KB, now on both cores; together with attention's PARALLEL_MIN_WORK 2^18 -> 2^15): its decode
step 0.958-0.961 of before, the median of 40 paired runs in one process; Gemma 3 270M's
unchanged."""


def linear(qtype: QType, w, x, bias, y, x_row: int, y_row: int, nrows: int) -> None:
    """y[b, y_row + i] = x[b, x_row + i] @ W + bias for the W (K, N) whose N rows of K values
    are ``w``'s blocks as the type's kernels hold them (``held``: uint8 (N, row bytes), or its
    panels), every batch b and i < nrows."""
    q, d, s, u = quantize_activations(qtype.act, x, x_row, nrows)
    rows, rows_parallel = qtype.kernels[:2]
    (rows_parallel if _parallel(w.nbytes * q.shape[0]) else rows)(
        read_only(w), q, d, s, u, read_only(bias), y, y_row, nrows, scratch(qtype, q))


NO_SCRATCH = np.zeros((numba_config.NUMBA_NUM_THREADS, 0, 0), dtype=np.uint8)
_rooms: dict[int, np.ndarray] = {}


def scratch(qtype: QType, q):
    """Room for each thread's work on a prompt's weight rows, when the product of the
    activation rows ``q`` needs it (``_entry_points``): on AMX tiles (AMX_KINDS, AMX_MIN_ROWS
    rows or more), (threads, 1, ``amx_room_bytes``); else NO_SCRATCH. One room per shape,
    shared: the kernels hold the GIL, so no two products use it at once, and calls kept for many
    step lengths (runtime/runner.py, ``BoundCalls``) keep no room of their own."""
    if simd.LEVEL != "amx" or qtype.kind not in AMX_KINDS or q.shape[0] < AMX_MIN_ROWS:
        return NO_SCRATCH
    nbytes = amx_room_bytes(q.shape[1])
    room = _rooms.get(nbytes)
    if room is None:
        room = _rooms[nbytes] = np.empty((numba_config.NUMBA_NUM_THREADS, 1, nbytes),
                                         dtype=np.uint8)
    return room


def _parallel(work_bytes: int) -> bool:
    """Whether a product of ``work_bytes`` (weight bytes times activation rows) is worth a
    parallel region: enough work, and more than one thread to share it (a region of one
    thread still costs about 3.5 us more than a plain call)."""
    return work_bytes >= PARALLEL_MIN_BYTES and threads() > 1


class MatrixTable:
    """Several matrices of one block type, each with its bias and output, that multiply the same
    activation rows in one parallel region (``run``): the q, k and v projections of a layer,
    or its gate and up. A row of ``table`` (int64) describes one member by the addresses
    of its arrays, which this object keeps alive::

        [w address, N rows, row bytes, y address, y batch, y rows, bias address, bias length]

    so one compiled kernel serves any number of members (a tuple or list of arrays would
    compile once per length, or cost a second of start-up). Outputs are written at rows
    ``[0, nrows)`` of each y (B, H, N), C-contiguous."""

    def __init__(self, qtype: QType, members: list) -> None:
        self.qtype = qtype
        self.members = [(read_only(w), read_only(bias), y) for w, bias, y in members]
        self.nbytes = sum(w.nbytes for w, _, _ in self.members)
        rows = []
        for w, bias, y in self.members:
            N = y.shape[-1]
            if not (w.flags.c_contiguous and y.flags.c_contiguous and bias.flags.c_contiguous
                    and y.dtype == np.float32 and y.ndim == 3
                    and w.shape[0] == (panel_rows(N) if qtype.panelled else N)):
                raise ValueError("MatrixTable: C-contiguous blocks (the type's held layout), "
                                 "bias and (B, H, N) float32 output expected")
            rows.append([w.ctypes.data, N, w.shape[1], y.ctypes.data, y.shape[0],
                         y.shape[1], bias.ctypes.data, bias.shape[0]])
        self.table = read_only(np.array(rows, dtype=np.int64).reshape(-1, 8))

    def calls(self, q, d, s, u, nrows: int) -> list:
        """The kernel calls [(kernel, args)] of ``run``: one parallel region over every
        member, or each member on one thread when the bytes are few."""
        panels = scratch(self.qtype, q)
        if _parallel(self.nbytes * q.shape[0]):
            return [(self.qtype.kernels[3], (self.table, q, d, s, u, nrows, panels))]
        rows = self.qtype.kernels[0]
        return [(rows, (w, q, d, s, u, bias, y, 0, nrows, panels)) for w, bias, y in self.members]

    def op(self, q, d, s, u, nrows: int):
        """``run`` as a team op (kernels/team.py) for fewer than AMX_MIN_ROWS activation rows:
        (address, args, tasks), a task a panel of 16 output rows of a member."""
        if q.shape[0] >= AMX_MIN_ROWS:
            return None
        tasks = sum((y.shape[-1] + PANEL - 1) // PANEL for _, _, y in self.members)
        return (address(self.qtype.kernels[4]), encode(self.table, q, d, s, u, nrows), tasks)

    def run(self, q, d, s, u, nrows: int) -> None:
        """Every member's y[b, i] = x[b, i] @ W + bias for i < nrows, x the rows quantized as
        (q, d, s, u)."""
        for kernel, args in self.calls(q, d, s, u, nrows):
            kernel(*args)


def dequantize_rows(qtype: QType, w, index: np.ndarray, out: np.ndarray,
                    in_panels: bool) -> None:
    """Rows ``index`` of ``w`` as float32 into ``out`` (len(index), C): ``w`` the rows as a file
    stores them, or (``in_panels``, a type of PANEL_KINDS) their ``panels``."""
    qtype.kernels[2](read_only(w), np.asarray(index, dtype=np.int64), out, bool(in_panels))
