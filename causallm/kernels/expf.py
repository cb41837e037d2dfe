"""exp in float32 arithmetic, so loops that call it vectorize (a call to the C library's exp
keeps a loop scalar: swiglu of 1536 values took 22 us, mostly in exp).

    expf(x) = 2^n * p(r),   n = round(x / ln 2),   r = x - n ln 2  (ln 2 in two parts, exact)

with p Cephes' degree-7 polynomial for e^r on |r| <= ln(2) / 2; 2^n is built in the exponent
bits. Error below 1 ulp of float32 (the C library's: 0.5; tests/test_kernels.py checks a
sample of every float32 in range against float64). Beyond the range: 0 below -87.34 (where
e^x is subnormal), +inf above 88.72, and NaN stays NaN.
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_LOG2E = np.float32(1.44269504088896341)
_LN2_HI = np.float32(0.693359375)          # few bits: n * _LN2_HI is exact
_LN2_LO = np.float32(-2.12194440e-4)
_P = (np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3),
      np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1))
_HI = np.float32(88.72283935546875)        # above: +inf
_LO = np.float32(-87.33654022216797)       # below: 2^n leaves the normal range


@intrinsic
def _bits_as_float(typingctx, bits):
    """The float32 whose bits are the int32 ``bits``."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@njit(cache=True, inline="always")
def expf(x):
    """e^x for a float32 x (module docstring)."""
    x = np.float32(x)
    xc = min(max(x, _LO), _HI)
    n = np.floor(xc * _LOG2E + np.float32(0.5))
    r = xc - n * _LN2_HI - n * _LN2_LO
    p = _P[0]
    p = p * r + _P[1]
    p = p * r + _P[2]
    p = p * r + _P[3]
    p = p * r + _P[4]
    p = p * r + _P[5]
    p = p * r * r + r + np.float32(1.0)
    k = min(np.int32(n), np.int32(127))   # n = 128 (x near the top): 2^127 times 2
    v = p * _bits_as_float((k + np.int32(127)) << np.int32(23))
    if np.int32(n) > k:
        v = v * np.float32(2.0)
    if x > _HI:
        v = np.float32(np.inf)
    if x < _LO:
        v = np.float32(0.0)
    if x != x:
        v = x
    return v
