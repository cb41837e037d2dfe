"""Float32 rows to ggml's quantized block rows, bit for bit as ggml's reference quantizers.

A matrix of R rows of C values becomes uint8 (R, C / QK * BLOCK_BYTES): each row is the
sequence of ggml blocks a GGUF file stores for it (``block_*`` of ggml-common.h), made exactly as
``quantize_row_<type>_ref`` of ggml-quants.c makes them (what ``ggml_quantize_chunk`` does with
no importance matrix). Per block of values x (fp16 means ggml's fp32 -> fp16 rounding, to
nearest even; trunc and nearest as written)::

    Q8_0  32 v, 34 B  d, qs[32]        d = max|x| / 127, q = roundf(x * (1/d))  (half away from 0)
    Q4_0  32 v, 18 B  d, qs[16]        m = the first x of largest |x|, d = m / -8,
                                       q = min(15, trunc(x * (1/d) + 8.5))
    Q4_1  32 v, 20 B  d, m, qs[16]     d = (max - min) / 15, m = min,
                                       q = min(15, trunc((x - min) * (1/d) + 0.5))
    Q5_0  32 v, 22 B  d, qh[4], qs[16] as Q4_0 with d = m / -16, q = min(31, trunc(.. + 16.5))
    Q5_1  32 v, 24 B  d, m, qh[4], qs  as Q4_1 with d = (max - min) / 31, q = trunc(.. + 0.5)
    Q4_K  256 v, 144 B  d, dmin, scales[12], qs[128]
    Q5_K  256 v, 176 B  d, dmin, scales[12], qh[32], qs[128]
    Q6_K  256 v, 210 B  ql[128], qh[64], scales[16] (int8), d

(1/d is 0 when d is 0.) Nibbles: the 32-value types put value j in the low and value j + 16 in
the high nibble of qs[j], the fifth bit of value j in bit j of qh (little-endian uint32).

The K-quants search scales per sub-block:

- Q4_K / Q5_K: each of the 8 sub-blocks of 32 values gets (scale, min) from
  ``make_qkx2_quants`` (weights av + |x| with av = sqrt(mean x^2); nmax 15 / 31; a grid of
  21 / 16 inverse scales (nmax + rmin + 0.1 i) / (max - min), rmin -1 / -0.5, each refit by
  weighted least squares, the one of least weighted squared error kept). Scales and mins are
  quantized to 6 bits against their largest (d = max scale / 63, dmin = max min / 63, both
  fp16), then every value again: q = clamp(nearest((x + dmin * m) / (d * s)), 0, nmax).
- Q6_K: each of the 16 sub-blocks of 16 values gets a signed scale from ``make_qx_quants``
  (nmax 32, weights x^2, 19 inverse scales -(32 + 0.1 i) / max, i = -9..9); the scales are
  quantized to int8 against the largest in magnitude (d = 1 / (-128 / that one), fp16), then
  q = clamp(nearest(x / (d * s)), -32, 31) + 32.

The K-quants' bytes: Q4_K / Q5_K scales[12] hold the 6-bit scale s_j and min m_j of sub-block
j as bytes j and j + 4 (j < 4, low 6 bits), and for j >= 4 the low nibbles in byte j + 4
(s | m << 4) and the top two bits in bits 6-7 of bytes j - 4 (s) and j (m); qs byte 32g + l
holds value 64g + l (low nibble) and 64g + 32 + l (high); Q5_K's fifth bits: bit 2g of qh[l]
for value 64g + l, bit 2g + 1 for 64g + 32 + l. Q6_K: per half h of 128 values, ql[64h + l]
holds values 128h + l (low) and 128h + 64 + l (high), ql[64h + 32 + l] values + 32 and + 96,
qh[32h + l] their top two bits at bits 0, 2, 4, 6 (values + 0, + 32, + 64, + 96).

``nearest`` is ggml's ``nearest_int``: add 1.5 * 2^23 in float32 and read the low mantissa bits,
which rounds half to even. Every operation is the C's in float32, in the C's order, with no
fused multiply-add: the bytes equal ggml's (tests/test_quantize.py, against ggml's own library).

How it runs: the blocks of 32 with their values in four F8 of eight lanes (vec8.py); the
K-quants with one sub-block per lane, so each lane runs the C's operations for its sub-block and
the branches become selects. Inputs the vector code cannot vouch for (values not finite, a
scale whose inverse overflows, a rounding outside nearest_int's domain) go block by block to the
plain scalar code, which follows the C line by line. ``quantize_rows(fmt, rows)`` is the entry
point; ``QUANTIZERS[fmt](rows, out)`` the kernels, each parallel over rows. A 150k x 1024
float32 table (Zen 3) takes 0.3-0.7 CPU-seconds for the 32-value types, 1.9 (Q6_K), 2.7 (Q5_K)
and 3.3 (Q4_K) for the K-quants, spread over the cores; ggml's reference code, which runs on one
thread, 0.4-1.6 s and 8-29 s. The first call of a kind compiles for tens of seconds (cached).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from causallm.kernels.simd import f16_to_f32
from causallm.kernels.vec8 import (
    abs8, add8, and8, any8, bits8, div8, eq8, ge8, gt8, lane8, load8, lt8, mul8, not8,
    select8, splat8, sqrt8, store8, store_bytes8, sub8, trunc8,
)

# -- float bits, fp16, rounding ---------------------------------------------------------------


@intrinsic
def _f32_bits(typingctx, x):
    """The IEEE bits of a float32, as uint32."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, u):
    """The float32 of IEEE bits (uint32)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@njit(cache=True)
def fp16_bits(f):
    """ggml's fp32 -> fp16 (``ggml_compute_fp32_to_fp16``, the FP16 library's bit algorithm):
    round to nearest even, overflow to infinity, NaN to 0x7E00 with the sign. Returns an int."""
    base = (abs(f) * np.float32(2.0 ** 112)) * np.float32(2.0 ** -110)
    w = np.int64(_f32_bits(f))
    shl1_w = (w + w) & 0xFFFFFFFF
    sign = w & 0x80000000
    bias = shl1_w & 0xFF000000
    if bias < 0x71000000:
        bias = 0x71000000
    base = _bits_f32(np.uint32((bias >> 1) + 0x07800000)) + base
    bits = np.int64(_f32_bits(base))
    nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF)
    return (sign >> 16) | (0x7E00 if shl1_w > 0xFF000000 else nonsign)


@njit(cache=True)
def _put_fp16(y, p, f):
    """Store fp16(f) little-endian at y[p:p + 2]; return its value as float32."""
    h = fp16_bits(f)
    y[p] = h & 0xFF
    y[p + 1] = h >> 8
    return f16_to_f32(np.uint16(h))


@njit(cache=True)
def nearest_int(f):
    """ggml's ``nearest_int``: f + 1.5 * 2^23 in float32, the low 23 bits less 2^22 (round half
    to even, for |f| < 2^22)."""
    v = f + np.float32(12582912.0)
    return np.int64(_f32_bits(v) & 0x7FFFFF) - 0x400000


@njit(cache=True)
def _roundf(v):
    """C's roundf (half away from zero) of a float32, as an int."""
    a = np.int64(np.floor(np.float64(abs(v)) + 0.5))  # exact: |v| + 0.5 fits a double
    return -a if v < 0 else a


_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_FLT_MAX = np.float32(3.4028234663852886e38)
_EPS = np.float32(1e-15)  # GROUP_MAX_EPS


# -- 32-value blocks ------------------------------------------------------------------------------

@njit(cache=True)
def _block_q8_0(x, o, y, p):
    amax = _F0
    for j in range(32):
        amax = max(amax, abs(x[o + j]))
    d = amax / np.float32(127.0)
    idv = _F1 / d if d != 0 else _F0
    _put_fp16(y, p, d)
    for j in range(32):
        y[p + 2 + j] = _roundf(x[o + j] * idv) & 0xFF


@njit(cache=True)
def _signed_max(x, o):
    """The first value of largest magnitude in x[o:o + 32]."""
    amax = _F0
    m = _F0
    for j in range(32):
        v = x[o + j]
        if amax < abs(v):
            amax = abs(v)
            m = v
    return m


@njit(cache=True)
def _min_max(x, o):
    mn = _FLT_MAX
    mx = -_FLT_MAX
    for j in range(32):
        v = x[o + j]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    return mn, mx


@njit(cache=True)
def _block_q4_0(x, o, y, p):
    d = _signed_max(x, o) / np.float32(-8.0)
    idv = _F1 / d if d != 0 else _F0
    _put_fp16(y, p, d)
    for j in range(16):
        q0 = min(15, np.int32(x[o + j] * idv + np.float32(8.5)))
        q1 = min(15, np.int32(x[o + 16 + j] * idv + np.float32(8.5)))
        y[p + 2 + j] = q0 | (q1 << 4)


@njit(cache=True)
def _block_q4_1(x, o, y, p):
    mn, mx = _min_max(x, o)
    d = (mx - mn) / np.float32(15.0)
    idv = _F1 / d if d != 0 else _F0
    _put_fp16(y, p, d)
    _put_fp16(y, p + 2, mn)
    for j in range(16):
        q0 = min(15, np.int32((x[o + j] - mn) * idv + np.float32(0.5)))
        q1 = min(15, np.int32((x[o + 16 + j] - mn) * idv + np.float32(0.5)))
        y[p + 4 + j] = q0 | (q1 << 4)


@njit(cache=True)
def _put_q5(y, p, q0, q1, j, qh):
    """Byte j of qs at y[p + j] from 5-bit q0 (value j) and q1 (value j + 16); their fifth bits
    added to qh."""
    y[p + j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4)
    return qh | (((q0 & 0x10) >> 4) << j) | (((q1 & 0x10) >> 4) << (j + 16))


@njit(cache=True)
def _put_u32(y, p, v):
    for k in range(4):
        y[p + k] = (v >> (8 * k)) & 0xFF


@njit(cache=True)
def _block_q5_0(x, o, y, p):
    d = _signed_max(x, o) / np.float32(-16.0)
    idv = _F1 / d if d != 0 else _F0
    _put_fp16(y, p, d)
    qh = 0
    for j in range(16):
        q0 = min(31, np.int32(x[o + j] * idv + np.float32(16.5)))
        q1 = min(31, np.int32(x[o + 16 + j] * idv + np.float32(16.5)))
        qh = _put_q5(y, p + 6, q0, q1, j, qh)
    _put_u32(y, p + 2, qh)


@njit(cache=True)
def _block_q5_1(x, o, y, p):
    mn, mx = _min_max(x, o)
    d = (mx - mn) / np.float32(31.0)
    idv = _F1 / d if d != 0 else _F0
    _put_fp16(y, p, d)
    _put_fp16(y, p + 2, mn)
    qh = 0
    for j in range(16):
        q0 = np.int32((x[o + j] - mn) * idv + np.float32(0.5)) & 0xFF
        q1 = np.int32((x[o + 16 + j] - mn) * idv + np.float32(0.5)) & 0xFF
        qh = _put_q5(y, p + 8, q0, q1, j, qh)
    _put_u32(y, p + 4, qh)


# -- 32-value blocks, eight values at a time -------------------------------------------------
#
# The same blocks with the 32 values in four F8 (vec8.py). A maximum or minimum does not depend on
# the order the values are compared in, except for the sign of a zero and for which of +m and -m
# comes first: both are settled by finding the first value equal to the result, as the scalar
# scan keeps. A block whose values are not finite or whose 1/d overflows goes to the scalar code.

_INF = np.float32(np.inf)


@njit(cache=True)
def _first_equal(x, o, v, absolute):
    """The first of x[o:o + 32] equal to v (in magnitude when ``absolute``)."""
    for k in range(4):
        w = load8(x, o + 8 * k)
        bits = bits8(eq8(abs8(w) if absolute else w, splat8(v)))
        if bits:
            j = 0
            while not (bits >> j) & 1:
                j += 1
            return x[o + 8 * k + j]
    return v


@njit(cache=True)
def _abs_max8(x, o):
    """(max |x[o:o + 32]|, the first value of that magnitude; +0 for a block of zeros)."""
    a = abs8(load8(x, o))
    for k in range(1, 4):
        b = abs8(load8(x, o + 8 * k))
        a = select8(gt8(b, a), b, a)
    amax = lane8(a, 0)
    for k in range(1, 8):
        amax = max(amax, lane8(a, k))
    return amax, (_first_equal(x, o, amax, True) if amax > 0 else _F0)


@njit(cache=True)
def _min_max8(x, o):
    """(the first smallest, the first largest) of x[o:o + 32], as the scalar scan keeps them."""
    lo = load8(x, o)
    hi = lo
    for k in range(1, 4):
        b = load8(x, o + 8 * k)
        lo = select8(lt8(b, lo), b, lo)
        hi = select8(gt8(b, hi), b, hi)
    mn = lane8(lo, 0)
    mx = lane8(hi, 0)
    for k in range(1, 8):
        mn = min(mn, lane8(lo, k))
        mx = max(mx, lane8(hi, k))
    if mn == 0:
        mn = _first_equal(x, o, mn, False)
    if mx == 0:
        mx = _first_equal(x, o, mx, False)
    return mn, mx


@njit(cache=True)
def _levels8(x, o, shift, idv, add, top):
    """MIN(top, trunc((x[o:o + 8] - shift) * idv + add)) per lane (x - 0 is x, bit for bit)."""
    v = trunc8(add8(mul8(sub8(load8(x, o), splat8(shift)), splat8(idv)), splat8(add)))
    return select8(lt8(splat8(top), v), splat8(top), v)


@njit(cache=True)
def _block_q8_0v(x, o, y, p):
    amax, _ = _abs_max8(x, o)
    d = amax / np.float32(127.0)
    idv = _F1 / d if d != 0 else _F0
    if not (amax < _INF and abs(idv) < _INF):
        _block_q8_0(x, o, y, p)
        return
    _put_fp16(y, p, d)
    zero, one = splat8(_F0), splat8(_F1)
    for k in range(4):
        v = mul8(load8(x, o + 8 * k), splat8(idv))
        t = trunc8(v)  # roundf: away from zero when the fraction is at least one half
        up = ge8(abs8(sub8(v, t)), splat8(np.float32(0.5)))
        away = select8(lt8(v, zero), splat8(np.float32(-1.0)), one)
        store_bytes8(y, p + 2 + 8 * k, add8(t, select8(up, away, zero)))


@njit(cache=True)
def _put_q5v(y, p, k, lo, hi):
    """Bytes 8k..8k + 7 of qs (at y[p]) from the 5-bit lo (values 8k..) and hi (values
    16 + 8k..); returns their fifth bits at their places in qh."""
    sixteen, zero = splat8(np.float32(16.0)), splat8(_F0)
    top_lo = ge8(lo, sixteen)
    top_hi = ge8(hi, sixteen)
    lo = sub8(lo, select8(top_lo, sixteen, zero))
    hi = sub8(hi, select8(top_hi, sixteen, zero))
    store_bytes8(y, p + 8 * k, add8(lo, mul8(hi, sixteen)))
    return (bits8(top_lo) << (8 * k)) | (bits8(top_hi) << (16 + 8 * k))


@njit(cache=True)
def _block_q45v(x, o, y, p, bits, with_min):
    """Q4_0 / Q5_0 (bits 4 / 5, with_min False) and Q4_1 / Q5_1 (with_min True)."""
    nmax = np.float32(15.0 if bits == 4 else 31.0)
    mn = _F0
    if with_min:
        mn, mx = _min_max8(x, o)
        d = (mx - mn) / nmax
        shift, add, top = mn, np.float32(0.5), nmax if bits == 4 else _INF
        finite = abs(mn) < _INF and abs(mx) < _INF
    else:
        amax, m = _abs_max8(x, o)
        d = m / np.float32(-8.0 if bits == 4 else -16.0)
        shift, add, top = _F0, np.float32(8.5 if bits == 4 else 16.5), nmax
        finite = amax < _INF
    idv = _F1 / d if d != 0 else _F0
    if not (finite and abs(idv) < _INF):
        if bits == 4 and with_min:
            _block_q4_1(x, o, y, p)
        elif bits == 4:
            _block_q4_0(x, o, y, p)
        elif with_min:
            _block_q5_1(x, o, y, p)
        else:
            _block_q5_0(x, o, y, p)
        return
    _put_fp16(y, p, d)
    if with_min:
        _put_fp16(y, p + 2, mn)
    qs = p + (4 if with_min else 2) + (4 if bits == 5 else 0)
    qh = 0
    for k in range(2):
        lo = _levels8(x, o + 8 * k, shift, idv, add, top)
        hi = _levels8(x, o + 16 + 8 * k, shift, idv, add, top)
        if bits == 5:
            qh |= _put_q5v(y, qs, k, lo, hi)
        else:
            store_bytes8(y, qs + 8 * k, add8(lo, mul8(hi, splat8(np.float32(16.0)))))
    if bits == 5:
        _put_u32(y, qs - 4, qh)


# -- K-quants: the scale searches --------------------------------------------------------------

@njit(cache=True)
def _make_qkx2_quants(nmax, x, o, weights, L, lo, Laux, rmin, rdelta, nstep):
    """ggml's ``make_qkx2_quants`` over x[o:o + 32] (use_mad false): levels into L[lo:lo + 32];
    returns (scale, the_min) with the_min = -min >= 0."""
    n = 32
    fmax = np.float32(nmax)
    mn = x[o]
    mx = x[o]
    sum_w = weights[0]
    sum_x = sum_w * x[o]
    for i in range(1, n):
        if x[o + i] < mn:
            mn = x[o + i]
        if x[o + i] > mx:
            mx = x[o + i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[o + i]
    if mn > 0:
        mn = _F0
    if mx == mn:
        for i in range(n):
            L[lo + i] = 0
        return _F0, -mn
    iscale = fmax / (mx - mn)
    scale = _F1 / iscale
    best_error = _F0
    for i in range(n):
        l = nearest_int(iscale * (x[o + i] - mn))
        L[lo + i] = max(0, min(nmax, l))
        diff = scale * np.float32(L[lo + i]) + mn - x[o + i]
        best_error += weights[i] * (diff * diff)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * np.float32(step) + fmax) / (mx - mn)
        sum_l = _F0
        sum_l2 = _F0
        sum_xl = _F0
        for i in range(n):
            l = max(0, min(nmax, nearest_int(iscale * (x[o + i] - mn))))
            Laux[i] = l
            w = weights[i]
            fl = np.float32(l)
            sum_l += w * fl
            sum_l2 += w * fl * fl
            sum_xl += w * fl * x[o + i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = _F0
                this_scale = sum_xl / sum_l2
            cur_error = _F0
            for i in range(n):
                diff = this_scale * np.float32(Laux[i]) + this_min - x[o + i]
                cur_error += weights[i] * (diff * diff)
            if cur_error < best_error:
                for i in range(n):
                    L[lo + i] = Laux[i]
                best_error = cur_error
                scale = this_scale
                mn = this_min
    return scale, -mn


@njit(cache=True)
def _make_qx_quants_rmse1(nmax, x, o, L, lo):
    """ggml's ``make_qx_quants(16, nmax, x + o, L + lo, rmse_type=1, qw=NULL)``: levels + nmax
    into L[lo:lo + 16] (all 0 for an all-zero group); returns the scale."""
    n = 16
    mx = _F0
    amax = _F0
    for i in range(n):
        ax = abs(x[o + i])
        if ax > amax:
            amax = ax
            mx = x[o + i]
    if amax < _EPS:
        for i in range(n):
            L[lo + i] = 0
        return _F0
    fmax = np.float32(nmax)
    iscale = -fmax / mx
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        l = max(-nmax, min(nmax - 1, nearest_int(iscale * x[o + i])))
        L[lo + i] = l + nmax
        w = x[o + i] * x[o + i]
        fl = np.float32(l)
        sumlx += w * x[o + i] * fl
        suml2 += w * fl * fl
    scale = sumlx / suml2 if suml2 != 0 else _F0
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(fmax + np.float32(0.1) * np.float32(step)) / mx
        sumlx = _F0
        suml2 = _F0
        for i in range(n):
            fl = np.float32(max(-nmax, min(nmax - 1, nearest_int(iscale * x[o + i]))))
            w = x[o + i] * x[o + i]
            sumlx += w * x[o + i] * fl
            suml2 += w * fl * fl
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[lo + i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[o + i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


# -- K-quants: 256-value blocks -------------------------------------------------------------------

@njit(cache=True)
def _k_scales(y, p, scales, mins, q6):
    """Q4_K / Q5_K's d, dmin and scales[12] at y[p:p + 16] from the 8 sub-blocks' scales and
    mins; q6 (int64, 16) gets the 6-bit scales, then the 6-bit mins. Returns the fp16 values
    of (d, dmin)."""
    max_scale = _F0
    max_min = _F0
    for j in range(8):
        if scales[j] > max_scale:
            max_scale = scales[j]
        if mins[j] > max_min:
            max_min = mins[j]
    inv_scale = np.float32(63.0) / max_scale if max_scale > 0 else _F0
    inv_min = np.float32(63.0) / max_min if max_min > 0 else _F0
    for j in range(8):  # uint8 of nearest_int, then at most 63
        q6[j] = min(63, nearest_int(inv_scale * scales[j]) & 0xFF)
        q6[8 + j] = min(63, nearest_int(inv_min * mins[j]) & 0xFF)
    for j in range(4):  # scales[12]: low 6 bits of 0..3, then the rest split in nibbles
        ls, lm, ls4, lm4 = q6[j], q6[8 + j], q6[4 + j], q6[12 + j]
        y[p + 4 + j] = ls | ((ls4 >> 4) << 6)
        y[p + 8 + j] = lm | ((lm4 >> 4) << 6)
        y[p + 12 + j] = (ls4 & 0xF) | ((lm4 & 0xF) << 4)
    return (_put_fp16(y, p, max_scale / np.float32(63.0)),
            _put_fp16(y, p + 2, max_min / np.float32(63.0)))


@njit(cache=True)
def _block_qk_min(x, o, y, p, nmax, rmin, nstep, L, Laux, weights, scales, mins, q6):
    """What Q4_K and Q5_K share: d, dmin and the 12 scale bytes at y[p:p + 16], and the levels
    (0..nmax) of the 256 values x[o:o + 256] in L."""
    for j in range(8):
        s = o + 32 * j
        sum_x2 = _F0
        for i in range(32):
            sum_x2 += x[s + i] * x[s + i]
        av_x = np.sqrt(sum_x2 / np.float32(32.0))
        for i in range(32):
            weights[i] = av_x + abs(x[s + i])
        scales[j], mins[j] = _make_qkx2_quants(nmax, x, s, weights, L, 32 * j, Laux,
                                               rmin, np.float32(0.1), nstep)
    dd, dmin = _k_scales(y, p, scales, mins, q6)
    for j in range(8):
        d = dd * np.float32(q6[j])
        if d == 0:
            continue
        dm = dmin * np.float32(q6[8 + j])
        for i in range(32):
            L[32 * j + i] = max(0, min(nmax, nearest_int((x[o + 32 * j + i] + dm) / d)))


@njit(cache=True)
def _block_q4_K(x, o, y, p, L, Laux, weights, scales, mins, q6):
    _block_qk_min(x, o, y, p, 15, np.float32(-1.0), 20, L, Laux, weights, scales, mins, q6)
    for g in range(4):  # qs: byte 32g + l = value 64g + l | value 64g + 32 + l << 4
        for i in range(32):
            y[p + 16 + 32 * g + i] = L[64 * g + i] | (L[64 * g + 32 + i] << 4)


@njit(cache=True)
def _block_q5_K(x, o, y, p, L, Laux, weights, scales, mins, q6):
    _block_qk_min(x, o, y, p, 31, np.float32(-0.5), 15, L, Laux, weights, scales, mins, q6)
    qh = p + 16
    for i in range(32):
        y[qh + i] = 0
    for g in range(4):  # qs as Q4_K's low nibbles; bit 2g / 2g + 1 of qh[l] the fifth bits
        for i in range(32):
            l1 = L[64 * g + i]
            l2 = L[64 * g + 32 + i]
            y[qh + i] |= ((l1 >> 4) << (2 * g)) | ((l2 >> 4) << (2 * g + 1))
            y[p + 48 + 32 * g + i] = (l1 & 0xF) | ((l2 & 0xF) << 4)


@njit(cache=True)
def _block_q6_K(x, o, y, p, L, scales):
    max_scale = _F0
    max_abs_scale = _F0
    for ib in range(16):
        s = _make_qx_quants_rmse1(32, x, o + 16 * ib, L, 16 * ib)
        scales[ib] = s
        if abs(s) > max_abs_scale:
            max_abs_scale = abs(s)
            max_scale = s
    if max_abs_scale < _EPS:
        for k in range(210):
            y[p + k] = 0
        return
    iscale = np.float32(-128.0) / max_scale
    sc = p + 192
    dd = _put_fp16(y, p + 208, _F1 / iscale)
    for ib in range(16):
        y[sc + ib] = min(127, nearest_int(iscale * scales[ib])) & 0xFF
    for j in range(16):
        s = y[sc + j]
        d = dd * np.float32(s - 256 if s > 127 else s)
        if d == 0:
            continue
        for i in range(16):
            L[16 * j + i] = max(-32, min(31, nearest_int(x[o + 16 * j + i] / d))) + 32
    for h in range(2):  # 128 values each: ql[64h + l] = l | l + 64 << 4 (and + 32), qh 2 bits
        v, ql, qh = 128 * h, p + 64 * h, p + 128 + 32 * h
        for i in range(32):
            q1, q2, q3, q4 = L[v + i], L[v + 32 + i], L[v + 64 + i], L[v + 96 + i]
            y[ql + i] = (q1 & 0xF) | ((q3 & 0xF) << 4)
            y[ql + 32 + i] = (q2 & 0xF) | ((q4 & 0xF) << 4)
            y[qh + i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)


# -- K-quants, eight sub-blocks at a time ------------------------------------------------------
#
# The same searches with one sub-block per lane of an F8 (vec8.py): lane j of row i of a block's
# scratch X is value i of sub-block j, so every lane runs the scalar code's operations in its
# order. Where the scalar code branches per sub-block, the lanes select. nearest_int is
# (v + 1.5 * 2^23) - 1.5 * 2^23, the same integer while v + 1.5 * 2^23 lies in [2^23, 2^24) (what
# ggml's assert asks); a block where some rounding falls outside is redone by the scalar code.

_MAGIC = np.float32(12582912.0)


@njit(cache=True)
def _nearest8(v):
    """nearest_int(v) per lane, as float32: right while |v| < 2^22 - 1 (_inside8)."""
    return sub8(add8(v, splat8(_MAGIC)), splat8(_MAGIC))


_BOUND = np.float32(4194302.0)  # 2^22 - 2: v + 1.5 * 2^23 rounds into [2^23, 2^24)


@njit(cache=True)
def _inside8(bound, ok):
    """ok (1 or 0 per lane, a float: a mask carried through a loop costs more) with 0 where
    bound, a float32 bound of |v| for every v rounded, is not below _BOUND (or is NaN)."""
    return select8(lt8(bound, splat8(_BOUND)), ok, splat8(_F0))


@njit(cache=True)
def _clamp8(v, lo, hi):
    """MAX(lo, MIN(hi, v)) per lane (integers held as float32)."""
    v = select8(lt8(splat8(hi), v), splat8(hi), v)
    return select8(lt8(v, splat8(lo)), splat8(lo), v)


@njit(cache=True)
def _qkx2_8(X, W, L, Laux, nmax, rmin, nstep):
    """``make_qkx2_quants`` (as _make_qkx2_quants) of the 8 sub-blocks of 32 in X (lane j of
    X[8i:8i + 8] is value i of sub-block j), weights W alike; levels into L alike.
    Returns (scale, the_min, ok), ok 0 in a lane whose roundings may leave nearest_int's domain.

    The levels of the best grid step are made again at the end from its inverse scale and
    min, as the step made them. Every rounded value is iscale * (x - min) with
    |x - min| <= R = max(|max - min|, |smallest x - min|) (rounding is monotone), so one bound
    per step, iscale * R, vouches for all of them."""
    zero, one, fmax = splat8(_F0), splat8(_F1), splat8(np.float32(nmax))
    x = load8(X, 0)
    w = load8(W, 0)
    mn, mx, sum_w, sum_x = x, x, w, mul8(w, x)
    for i in range(1, 32):
        x = load8(X, 8 * i)
        w = load8(W, 8 * i)
        mn = select8(lt8(x, mn), x, mn)
        mx = select8(gt8(x, mx), x, mx)
        sum_w = add8(sum_w, w)
        sum_x = add8(sum_x, mul8(w, x))
    smallest = mn
    mn = select8(gt8(mn, zero), zero, mn)
    flat = eq8(mx, mn)  # L = 0, scale 0: computed on a stand-in range of 1, then overwritten
    iscale = div8(fmax, select8(flat, one, sub8(mx, mn)))
    scale = div8(one, iscale)
    best = zero
    ok = one
    reach = select8(flat, zero, sub8(mx, mn))
    ok = _inside8(mul8(abs8(iscale), reach), ok)
    for i in range(32):
        x = load8(X, 8 * i)
        l = _clamp8(_nearest8(mul8(iscale, sub8(x, mn))), _F0, np.float32(nmax))
        diff = sub8(add8(mul8(scale, l), mn), x)
        best = add8(best, mul8(load8(W, 8 * i), mul8(diff, diff)))
    best_iscale, best_min = iscale, mn  # what the kept levels were made with
    for step in range(nstep + 1):
        num = splat8(rmin + np.float32(0.1) * np.float32(step) + np.float32(nmax))
        iscale = div8(num, select8(flat, one, sub8(mx, mn)))
        d0 = abs8(sub8(mx, mn))
        d1 = abs8(sub8(smallest, mn))
        reach = select8(flat, zero, select8(gt8(d1, d0), d1, d0))
        ok = _inside8(mul8(abs8(iscale), reach), ok)
        sum_l, sum_l2, sum_xl = zero, zero, zero
        for i in range(32):
            x = load8(X, 8 * i)
            l = _clamp8(_nearest8(mul8(iscale, sub8(x, mn))), _F0, np.float32(nmax))
            store8(Laux, 8 * i, l)
            wl = mul8(load8(W, 8 * i), l)
            sum_l = add8(sum_l, wl)
            sum_l2 = add8(sum_l2, mul8(wl, l))
            sum_xl = add8(sum_xl, mul8(wl, x))
        D = sub8(mul8(sum_w, sum_l2), mul8(sum_l, sum_l))
        this_scale = div8(sub8(mul8(sum_w, sum_xl), mul8(sum_x, sum_l)), D)
        this_min = div8(sub8(mul8(sum_l2, sum_x), mul8(sum_l, sum_xl)), D)
        positive = gt8(this_min, zero)
        this_min = select8(positive, zero, this_min)
        this_scale = select8(positive, div8(sum_xl, sum_l2), this_scale)
        cur = zero
        for i in range(32):
            diff = sub8(add8(mul8(this_scale, load8(Laux, 8 * i)), this_min), load8(X, 8 * i))
            cur = add8(cur, mul8(load8(W, 8 * i), mul8(diff, diff)))
        take = and8(and8(gt8(D, zero), lt8(cur, best)), not8(flat))
        best = select8(take, cur, best)
        scale = select8(take, this_scale, scale)
        best_iscale = select8(take, iscale, best_iscale)
        best_min = select8(take, mn, best_min)
        mn = select8(take, this_min, mn)
    for i in range(32):
        x = load8(X, 8 * i)
        l = _clamp8(_nearest8(mul8(best_iscale, sub8(x, best_min))), _F0, np.float32(nmax))
        store8(L, 8 * i, select8(flat, zero, l))
    return select8(flat, zero, scale), mul8(mn, splat8(np.float32(-1.0))), ok


@njit(cache=True)
def _block_qk_min8(x, o, y, p, nmax, rmin, nstep, X, W, L, Laux, S, q6):
    """_block_qk_min with the sub-blocks in lanes: levels into L (8 * i + j = value i of
    sub-block j). False (and y not to be trusted) when the block needs the scalar code."""
    for j in range(8):
        for i in range(32):
            X[8 * i + j] = x[o + 32 * j + i]
    sum_x2 = splat8(_F0)
    for i in range(32):
        v = load8(X, 8 * i)
        sum_x2 = add8(sum_x2, mul8(v, v))
    if any8(not8(lt8(sum_x2, splat8(_INF)))):
        return False  # values not finite, or whose squares overflow: the scalar code
    av_x = sqrt8(div8(sum_x2, splat8(np.float32(32.0))))
    for i in range(32):
        store8(W, 8 * i, add8(av_x, abs8(load8(X, 8 * i))))
    scale, the_min, ok = _qkx2_8(X, W, L, Laux, nmax, rmin, nstep)
    store8(S, 0, scale)
    store8(S, 8, the_min)
    dd, dmin = _k_scales(y, p, S[:8], S[8:16], q6)
    for j in range(16):
        S[j] = np.float32(q6[j])
    d = mul8(splat8(dd), load8(S, 0))
    dm = mul8(splat8(dmin), load8(S, 8))
    skip = eq8(d, splat8(_F0))  # a sub-block whose scale is 0 keeps its levels
    d = select8(skip, splat8(_F1), d)
    reach = splat8(_F0)
    for i in range(32):
        v = div8(add8(load8(X, 8 * i), dm), d)
        reach = select8(gt8(abs8(v), reach), abs8(v), reach)
        l = _clamp8(_nearest8(v), _F0, np.float32(nmax))
        store8(L, 8 * i, select8(skip, load8(L, 8 * i), l))
    ok = select8(skip, ok, _inside8(reach, ok))
    return not any8(eq8(ok, splat8(_F0)))


@njit(cache=True)
def _block_q45_K8(x, o, y, p, bits, X, W, L, Laux, S, q6, Li, Lauxi):
    """A Q4_K (bits 4) or Q5_K (bits 5) block, the scalar code when the lanes cannot vouch."""
    if bits == 4:
        if not _block_qk_min8(x, o, y, p, 15, np.float32(-1.0), 20, X, W, L, Laux, S, q6):
            _block_q4_K(x, o, y, p, Li, Lauxi, W, S, S[16:], q6)
            return
    elif not _block_qk_min8(x, o, y, p, 31, np.float32(-0.5), 15, X, W, L, Laux, S, q6):
        _block_q5_K(x, o, y, p, Li, Lauxi, W, S, S[16:], q6)
        return
    qs = p + (16 if bits == 4 else 48)
    for i in range(32):  # value 64g + i is L[8i + 2g], value 64g + 32 + i is L[8i + 2g + 1]
        qh = 0
        for g in range(4):
            l1 = np.int32(L[8 * i + 2 * g])
            l2 = np.int32(L[8 * i + 2 * g + 1])
            qh |= ((l1 >> 4) << (2 * g)) | ((l2 >> 4) << (2 * g + 1))
            y[qs + 32 * g + i] = (l1 & 0xF) | ((l2 & 0xF) << 4)
        if bits == 5:
            y[p + 16 + i] = qh


@njit(cache=True)
def _qx_sums8(X, h, iscale, fmax):
    """make_qx_quants' (sum w x l, sum w l^2) of one inverse scale, w = x^2, in lanes
    8h..8h + 7 of X."""
    sumlx, suml2 = splat8(_F0), splat8(_F0)
    for i in range(16):
        x = load8(X, 16 * i + 8 * h)
        l = _clamp8(_nearest8(mul8(iscale, x)), -fmax, fmax - _F1)
        w = mul8(x, x)
        sumlx = add8(sumlx, mul8(mul8(w, x), l))
        suml2 = add8(suml2, mul8(mul8(w, l), l))
    return sumlx, suml2


@njit(cache=True)
def _qx_rmse1_8(X, h, L, nmax):
    """``make_qx_quants(16, nmax, .., rmse_type=1)`` (as _make_qx_quants_rmse1) of the 8
    sub-blocks of 16 in lanes 8h..8h + 7 of X (X[16i + j] is value i of sub-block j); levels
    + nmax into L alike. Returns (scale, ok) as _qkx2_8 (the bound: |iscale| * max |x|)."""
    zero, one = splat8(_F0), splat8(_F1)
    fmax = np.float32(nmax)
    mx = zero
    amax = zero
    for i in range(16):
        x = load8(X, 16 * i + 8 * h)
        ax = abs8(x)
        bigger = gt8(ax, amax)
        amax = select8(bigger, ax, amax)
        mx = select8(bigger, x, mx)
    empty = lt8(amax, splat8(_EPS))
    mx = select8(empty, one, mx)
    reach = select8(empty, zero, amax)
    iscale = div8(splat8(-fmax), mx)
    ok = _inside8(mul8(abs8(iscale), reach), one)
    sumlx, suml2 = _qx_sums8(X, h, iscale, fmax)
    scale = select8(eq8(suml2, zero), zero, div8(sumlx, suml2))
    best = mul8(scale, sumlx)
    best_iscale = iscale
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = div8(splat8(-(fmax + np.float32(0.1) * np.float32(step))), mx)
        ok = _inside8(mul8(abs8(iscale), reach), ok)
        sumlx, suml2 = _qx_sums8(X, h, iscale, fmax)
        take = and8(and8(gt8(suml2, zero), gt8(mul8(sumlx, sumlx), mul8(best, suml2))),
                    not8(empty))
        scale = select8(take, div8(sumlx, suml2), scale)
        best = select8(take, mul8(scale, sumlx), best)
        best_iscale = select8(take, iscale, best_iscale)
    for i in range(16):
        k = 16 * i + 8 * h
        l = _clamp8(_nearest8(mul8(best_iscale, load8(X, k))), -fmax, fmax - _F1)
        store8(L, k, select8(empty, zero, add8(l, splat8(fmax))))
    return select8(empty, zero, scale), ok


@njit(cache=True)
def _block_q6_K8(x, o, y, p, X, L, S, Li):
    """_block_q6_K with the 16 sub-blocks in two F8 of lanes; the scalar code when a rounding
    leaves nearest_int's domain."""
    finite = splat8(_F0)
    for j in range(16):
        for i in range(16):
            X[16 * i + j] = x[o + 16 * j + i]
    for i in range(32):
        finite = add8(finite, mul8(load8(X, 8 * i), splat8(_F0)))  # NaN if any is not finite
    if any8(not8(eq8(finite, splat8(_F0)))):
        _block_q6_K(x, o, y, p, Li, S)
        return
    s0, ok0 = _qx_rmse1_8(X, 0, L, 32)
    s1, ok1 = _qx_rmse1_8(X, 1, L, 32)
    store8(S, 0, s0)
    store8(S, 8, s1)
    max_scale = _F0
    max_abs_scale = _F0
    for ib in range(16):
        if abs(S[ib]) > max_abs_scale:
            max_abs_scale = abs(S[ib])
            max_scale = S[ib]
    if max_abs_scale < _EPS:
        if any8(eq8(mul8(ok0, ok1), splat8(_F0))):
            _block_q6_K(x, o, y, p, Li, S)
            return
        for k in range(210):
            y[p + k] = 0
        return
    iscale = np.float32(-128.0) / max_scale
    dd = _put_fp16(y, p + 208, _F1 / iscale)
    for ib in range(16):
        q = min(127, nearest_int(iscale * S[ib])) & 0xFF
        y[p + 192 + ib] = q
        S[16 + ib] = np.float32(q - 256 if q > 127 else q)
    bad = False
    for h in range(2):
        d = mul8(splat8(dd), load8(S, 16 + 8 * h))
        skip = eq8(d, splat8(_F0))  # a sub-block whose scale is 0 keeps its levels
        d = select8(skip, splat8(_F1), d)
        reach = splat8(_F0)
        for i in range(16):
            k = 16 * i + 8 * h
            v = div8(load8(X, k), d)
            reach = select8(gt8(abs8(v), reach), abs8(v), reach)
            l = _clamp8(_nearest8(v), np.float32(-32.0), np.float32(31.0))
            store8(L, k, select8(skip, load8(L, k), add8(l, splat8(np.float32(32.0)))))
        ok = ok0 if h == 0 else ok1
        bad |= any8(eq8(select8(skip, ok, _inside8(reach, ok)), splat8(_F0)))
    if bad:
        _block_q6_K(x, o, y, p, Li, S)
        return
    for half in range(2):  # value v = 128 half + 32 c + i is L[16 (v % 16) + v // 16]
        for i in range(32):
            v0 = 128 * half + i
            q1 = np.int32(L[16 * (v0 % 16) + v0 // 16])
            q2 = np.int32(L[16 * ((v0 + 32) % 16) + (v0 + 32) // 16])
            q3 = np.int32(L[16 * ((v0 + 64) % 16) + (v0 + 64) // 16])
            q4 = np.int32(L[16 * ((v0 + 96) % 16) + (v0 + 96) // 16])
            y[p + 64 * half + i] = (q1 & 0xF) | ((q3 & 0xF) << 4)
            y[p + 64 * half + 32 + i] = (q2 & 0xF) | ((q4 & 0xF) << 4)
            y[p + 128 + 32 * half + i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | \
                ((q4 >> 4) << 6)


# -- rows --------------------------------------------------------------------------------------

_CHUNK = 64  # rows per parallel task (the K-quants' scratch is made once per task)


@njit(cache=True, parallel=True)
def _rows32(kind, x, y):
    """Blocks of 32 values: kind 0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q5_0, 4 Q5_1."""
    R, C = x.shape
    nb = C // 32
    B = y.shape[1] // nb
    for r in prange(R):
        xr, yr = x[r], y[r]
        for b in range(nb):
            if kind == 0:
                _block_q8_0v(xr, 32 * b, yr, B * b)
            else:  # 1 Q4_0, 2 Q4_1, 3 Q5_0, 4 Q5_1
                _block_q45v(xr, 32 * b, yr, B * b, 4 if kind < 3 else 5, kind % 2 == 0)


@njit(cache=True, parallel=True)
def _rows256(kind, x, y):
    """Blocks of 256 values: kind 0 Q4_K, 1 Q5_K, 2 Q6_K."""
    R, C = x.shape
    nb = C // 256
    B = y.shape[1] // nb
    for t in prange((R + _CHUNK - 1) // _CHUNK):
        X = np.empty(256, np.float32)   # the lanes' scratch
        W = np.empty(256, np.float32)
        L = np.empty(256, np.float32)
        Laux = np.empty(256, np.float32)
        S = np.empty(32, np.float32)
        q6 = np.empty(16, np.int64)
        Li = np.empty(256, np.int64)    # the scalar code's
        Lauxi = np.empty(32, np.int64)
        for r in range(t * _CHUNK, min(R, t * _CHUNK + _CHUNK)):
            xr, yr = x[r], y[r]
            for b in range(nb):
                if kind < 2:
                    _block_q45_K8(xr, 256 * b, yr, B * b, 4 + kind, X, W, L, Laux, S, q6, Li,
                                  Lauxi)
                else:
                    _block_q6_K8(xr, 256 * b, yr, B * b, X, L, S, Li)


@njit(cache=True, parallel=True)
def _rows_scalar(kind, x, y):
    """The scalar code alone (what the vector code falls back to), kind 0..7 in QUANTIZERS'
    order: for the tests, which hold it to ggml's bytes on every case too."""
    R, C = x.shape
    qk = 32 if kind < 5 else 256
    nb = C // qk
    B = y.shape[1] // nb
    for r in prange(R):
        L = np.zeros(256, np.int64)
        Laux = np.zeros(32, np.int64)
        weights = np.zeros(32, np.float32)
        scales = np.zeros(16, np.float32)
        mins = np.zeros(8, np.float32)
        q6 = np.zeros(16, np.int64)
        xr, yr = x[r], y[r]
        for b in range(nb):
            o, p = qk * b, B * b
            if kind == 0:
                _block_q8_0(xr, o, yr, p)
            elif kind == 1:
                _block_q4_0(xr, o, yr, p)
            elif kind == 2:
                _block_q4_1(xr, o, yr, p)
            elif kind == 3:
                _block_q5_0(xr, o, yr, p)
            elif kind == 4:
                _block_q5_1(xr, o, yr, p)
            elif kind == 5:
                _block_q4_K(xr, o, yr, p, L, Laux, weights, scales, mins, q6)
            elif kind == 6:
                _block_q5_K(xr, o, yr, p, L, Laux, weights, scales, mins, q6)
            else:
                _block_q6_K(xr, o, yr, p, L, scales)


def _kernel(rows_fn, kind):
    def quantize(rows, out):
        rows_fn(kind, rows, out)
    return quantize


QUANTIZERS = {
    "Q8_0": _kernel(_rows32, 0), "Q4_0": _kernel(_rows32, 1), "Q4_1": _kernel(_rows32, 2),
    "Q5_0": _kernel(_rows32, 3), "Q5_1": _kernel(_rows32, 4),
    "Q4_K": _kernel(_rows256, 0), "Q5_K": _kernel(_rows256, 1), "Q6_K": _kernel(_rows256, 2),
}
"""fmt -> fn(rows float32 (R, C) C-contiguous, out uint8 (R, row_bytes(fmt, C))): fills out."""

QK = {"Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32,
      "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
"""Values per block (ggml-common.h's QK*; gguf's GGML_QUANT_SIZES, tests/test_quantize.py)."""
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24,
               "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
"""Bytes per block (sizeof(block_*))."""


def row_bytes(fmt: str, C: int) -> int:
    """Bytes of one row of C values in ``fmt`` (C a multiple of QK[fmt])."""
    return C // QK[fmt] * BLOCK_BYTES[fmt]


def quantize_rows(fmt: str, rows: np.ndarray, scalar: bool = False) -> np.ndarray:
    """Float rows (R, C) (any float dtype and strides; a 1-D array is one row) as ggml's
    ``fmt`` block rows, uint8 (R, row_bytes(fmt, C)): the bytes ggml's reference quantizer
    writes (module docstring). C must be a multiple of QK[fmt]. ``scalar`` runs the plain
    scalar code only (slower, the same bytes: for tests)."""
    if fmt not in QUANTIZERS:
        raise ValueError(f"no quantizer for {fmt!r}; known: {', '.join(QUANTIZERS)}")
    rows = np.asarray(rows)
    x = np.ascontiguousarray(rows.reshape(1, -1) if rows.ndim == 1 else rows, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK[fmt]:
        raise ValueError(f"{fmt} quantizes rows of a multiple of {QK[fmt]} values, "
                         f"got shape {rows.shape}")
    out = np.empty((x.shape[0], row_bytes(fmt, x.shape[1])), dtype=np.uint8)
    if x.size:
        if scalar:
            _rows_scalar(list(QUANTIZERS).index(fmt), x, out)
        else:
            QUANTIZERS[fmt](x, out)
    return out
