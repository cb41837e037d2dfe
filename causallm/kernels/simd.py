"""Vectors in registers for the quantized kernels: a numba type per 256-bit LLVM vector and the
few operations ggml's block dot products are made of, each one instruction or a short sequence.

numba vectorizes plain float loops well, but not integer dot products of bytes (its integer
arithmetic widens to 64 bits), so the quantized kernels (quant.py) pass these vectors between a
handful of intrinsics instead::

    Bytes32   <32 x i8>     32 bytes, read unsigned or signed as the operation says
    I16x16    <16 x i16>
    I32x8     <8 x i32>
    F32x8     <8 x float>

The operations, with ``u`` bytes read unsigned and ``s`` signed::

    load32(a, o)            the 32 bytes a[o : o + 32]
    nibbles(a, o)           the 16 bytes a[o : o + 16] as 32 values: their low nibbles, then
                            their high nibbles (ggml's order in a block of 32)
    table16(a, o)           the 16 bytes a[o : o + 16] in both 128-bit halves (a lookup table)
    band, bor               bytewise and, or (another vector or a constant)
    bshr, bshl              bytewise shifts
    lookup(t, i)            t[i] for each byte i < 16 (a table16)
    maddubs(u, s)           16 lanes: u[2j] s[2j] + u[2j+1] s[2j+1]
    madd(a, b)              8 lanes: a[2j] b[2j] + a[2j+1] b[2j+1] of two I16x16
    dot_signed(acc, a, b)   acc + 8 lanes of sum_k<4 a[4j+k] b[4j+k], both signed (|a|
                            moved onto b's sign)
    splat16(x), splat16x2(lo, hi), add32, zero32
    f16(a, o)               float32 of the IEEE half at bytes a[o : o + 2]
    fma(acc, v, x)          acc + float32(v) * x (v an I32x8, x one float32 or an F32x8)
    zerof(), hsum(f)
    load8f(a, o), load1f(a, o)  8 float lanes (one float) of a float32 array, or of an array
                            of half bits (load8f: or of int32, converted)
    store8f(a, o, v), splatf(x), fmaf(acc, a, b) = acc + a * b     (attention's cache rows)
    addf(a, b), mulf(a, b), store_hsum4(a, o, v0, v1, v2, v3)  a[o + i] = hsum(vi)

maddubs of two bytes can saturate its int16 sum (at 32767); every kernel keeps u * |s| below
16384 (u < 128, or |s| <= 127 with u < 129), so the sums are exact.

How an operation is lowered depends on the CPU numba compiles for (``LEVEL``): "amx" and
"vnni" (AVX-512 VNNI with VL, or AVX-VNNI: a byte dot product is one ``vpdpbusd``), "avx2"
(``pmaddubsw`` / ``pmaddwd`` / ``psignb`` / ``pshufb``), else "generic" (plain vector IR,
exact, slower); "amx" is "vnni" where the CPU also has AMX's int8 and bf16 tiles and Linux lets
the process use them (amx.py; prompts multiply on them, quant.py and packed.py). The CPU is the host's,
or the one NUMBA_CPU_NAME / NUMBA_CPU_FEATURES name (numba keys its kernel cache by that target,
so a cached kernel always matches its path). Arrays are addressed by flat element offsets from
their first element, so they must be C-contiguous; loads are unaligned.

Sixteen weight rows at once (the panels of quant.py: 16 rows' values of one group of four side
by side), in 512-bit vectors that LLVM splits into halves or quarters on a CPU without
AVX-512::

    Bytes64   <64 x i8>     I32x16   <16 x i32>     F32x16   <16 x float>

    load64(a, o), store64(a, o, v)  the 64 bytes a[o : o + 64]
    spread4(a, o)           the 4 bytes a[o : o + 4] in each of the 16 lanes
    low4(v), high4(v)       each byte's low / high nibble
    shl_and64(v, n, m), shr_and64(v, n, m)   each 32-bit lane shifted by n, then & m
    bor64(a, b), bsub64(a, n)   bytewise a | b, a - n (wrapping; n one byte for all)
    lanes16(v)              the 64 bytes as 16 int32 lanes (the same bits)
    sbyte16(v, k)           byte k of each 32-bit lane, sign-extended to int32
    lookup64(a, o, i)       a[o + i[j]] for each byte i[j] < 16 (a 16-byte table)
    dot16(acc, u, s)        acc + 16 lanes of sum_k<4 u[4j+k] s[4j+k] (u < 128 unsigned)
    dot16_wide(acc, u, s)   the same for any unsigned u (one more product without VNNI)
    add16(a, b), sub16(a, x), mul16(a, b)   int32 lanes; x one int32 for every lane, b either
    halves16(a, o)          the 16 IEEE halves at bytes a[o : o + 32] as float32 lanes
    zero16(), zerof16(), scale16(f, x) = f * x, fma16(acc, v, f) = acc + float32(v) * f,
    fmaf16(acc, f, x) = acc + f * x (x one float32), addf16(a, b), store16f(a, o, v),
    lane16(v, i)
    load16f(a, o)           16 float lanes, as load8f's 8 (attention's cache rows; a float
                            weight row's, F16 bits widened)
    bf16x16(a, o)           16 bfloat16 bits of a uint16 array as float32 lanes
    fold8(v)                an F32x16's lanes k and k + 8 added: an F32x8 (for store_hsum4)

``prefetch(a, o)`` asks for the cache line of a[o] ahead of its use (decode's weight
streams). ``bf16_to_f32`` and ``f16_to_f32`` widen one scalar, ``f32_to_bf16`` rounds one to
bfloat16 bits (the BF16 / F16 kernels, packed.py);
``round_f16`` rounds one to half precision (ggml's fp16 scales).
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba.core import cgutils, config, types
from numba.extending import intrinsic, models, register_model

from causallm.kernels import amx


def target_features() -> set[str]:
    """The CPU features numba compiles for: the host's, or NUMBA_CPU_FEATURES when
    NUMBA_CPU_NAME asks for another target."""
    if config.CPU_NAME:
        return {f[1:] for f in (config.CPU_FEATURES or "").split(",") if f.startswith("+")}
    return {name for name, on in llvm.get_host_cpu_features().items() if on}


def _level(features: set[str]) -> str:
    if {"avx2", "avx512vnni", "avx512vl", "amx-tile", "amx-int8", "amx-bf16"} <= features:
        return "amx"
    if {"avx2", "avx512vnni", "avx512vl"} <= features or {"avx2", "avxvnni"} <= features:
        return "vnni"
    return "avx2" if "avx2" in features else "generic"


_V3 = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,+fxsr,+lzcnt,+mmx,+movbe,"
       "+popcnt,+sahf,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave")
TARGETS = {
    "generic": ("x86-64", "+64bit,+sse,+sse2"),
    "avx2": ("x86-64-v3", _V3),
    "vnni": ("x86-64-v4", _V3 + ",+avx512f,+avx512bw,+avx512cd,+avx512dq,+avx512vl,+avx512vnni"),
    "amx": ("x86-64-v4", _V3 + ",+avx512f,+avx512bw,+avx512cd,+avx512dq,+avx512vl,+avx512vnni"
            ",+amx-tile,+amx-int8,+amx-bf16"),
}
"""A CPU of each level, as NUMBA_CPU_NAME and NUMBA_CPU_FEATURES tell numba: x86-64-v3 (Haswell,
every Zen), x86-64-v4 with AVX-512 VNNI (Cascade Lake and later Xeons, Zen 4 and 5), and that
with AMX's int8 and bf16 tiles (Sapphire Rapids and later Xeons). The tests that force a path and
tools/prebuild_kernels.py compile for them."""


def target_needs(level: str) -> set[str]:
    """The CPU features a level's target uses: what a host must have to run its code."""
    return {f[1:] for f in TARGETS[level][1].split(",") if f.startswith("+")}


def _usable_level(features: set[str]) -> str:
    level = _level(features)
    # a Linux that keeps the tiles' state (< 5.16) lowers as "vnni"; a target named through
    # NUMBA_CPU_NAME is compiled for as named (tools/prebuild_kernels.py on a CPU without AMX)
    if level == "amx" and not amx.permitted() and not config.CPU_NAME:
        return _level(features - {"amx-tile"})
    return level


LEVEL = _usable_level(target_features())
"""How the vector operations are lowered: "amx", "vnni", "avx2" or "generic" (module
docstring); "amx" lowers them as "vnni" does, and its prompt products multiply tiles
(quant.py)."""

F16C = "f16c" in target_features()
"""Half-precision conversions are instructions (else integer code: LLVM's libcalls for them are
not in numba's JIT)."""


class SimdVector(types.Type):
    """An LLVM vector of ``lanes`` values of ``bits`` bits (float when ``kind`` is "f"), held by
    value."""

    def __init__(self, kind: str, bits: int, lanes: int) -> None:
        self.kind, self.bits, self.lanes = kind, bits, lanes
        super().__init__(name=f"SimdVector({kind}{bits}x{lanes})")


def _ir_type(t: SimdVector) -> ir.VectorType:
    element = ir.FloatType() if t.kind == "f" else ir.IntType(t.bits)
    return ir.VectorType(element, t.lanes)


@register_model(SimdVector)
class _SimdVectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _ir_type(fe_type))


Bytes32 = SimdVector("i", 8, 32)
Bytes64 = SimdVector("i", 8, 64)
I32x16 = SimdVector("i", 32, 16)
F32x16 = SimdVector("f", 32, 16)
I16x16 = SimdVector("i", 16, 16)
I32x8 = SimdVector("i", 32, 8)
F32x8 = SimdVector("f", 32, 8)

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V8, _V16, _V32, _VF = (ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8),
                        ir.VectorType(_F32, 8))


def _pointer(context, builder, array_type, array, offset, pointee):
    """Address of element ``offset`` of ``array`` as a ``pointee`` pointer."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [offset]), pointee.as_pointer())


def _const(vt: ir.VectorType, value) -> ir.Constant:
    return ir.Constant(vt, [value] * vt.count if not isinstance(value, list) else value)


def _splat(builder, value, lanes):
    vt = ir.VectorType(value.type, lanes)
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vt, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes))


def _half_to_float(builder, h):
    """float32 of IEEE half bits h (an i16), exactly: with F16C one instruction, else the
    exponent rebiased in integers (zeros, subnormals, infinities and NaNs included)."""
    if F16C:
        return builder.fpext(builder.bitcast(h, ir.HalfType()), _F32)
    h = builder.zext(h, _I32)
    sign = builder.shl(builder.and_(h, ir.Constant(_I32, 0x8000)), ir.Constant(_I32, 16))
    o = builder.shl(builder.and_(h, ir.Constant(_I32, 0x7FFF)), ir.Constant(_I32, 13))
    exp = builder.and_(o, ir.Constant(_I32, 0x0F800000))
    o = builder.add(o, ir.Constant(_I32, (127 - 15) << 23))
    special = builder.icmp_unsigned("==", exp, ir.Constant(_I32, 0x0F800000))  # inf / NaN
    o = builder.select(special, builder.add(o, ir.Constant(_I32, (128 - 16) << 23)), o)
    tiny = builder.icmp_unsigned("==", exp, ir.Constant(_I32, 0))  # zero / subnormal
    renorm = builder.fsub(builder.bitcast(builder.add(o, ir.Constant(_I32, 1 << 23)), _F32),
                          ir.Constant(_F32, 6.103515625e-05))
    value = builder.select(tiny, renorm, builder.bitcast(o, _F32))
    return builder.bitcast(builder.or_(builder.bitcast(value, _I32), sign), _F32)


def _widen_halves(builder, bits, lanes):
    """float32 lanes of a vector of ``lanes`` IEEE half bits (i16): one conversion with F16C."""
    vt = ir.VectorType(_F32, lanes)
    if F16C:
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), lanes)), vt)
    out = ir.Constant(vt, None)
    for k in range(lanes):
        lane = _half_to_float(builder, builder.extract_element(bits, ir.Constant(_I32, k)))
        out = builder.insert_element(out, lane, ir.Constant(_I32, k))
    return out


def _float_to_half(builder, f):
    """f (float32) rounded to the nearest IEEE half, ties to even, as float32: with F16C two
    instructions, else in integers (overflow to infinity, subnormals, NaN kept a NaN)."""
    if F16C:
        return builder.fpext(builder.fptrunc(f, ir.HalfType()), _F32)
    u = builder.bitcast(f, _I32)
    sign = builder.and_(u, ir.Constant(_I32, 0x80000000))
    a = builder.xor(u, sign)
    c = lambda v: ir.Constant(_I32, v)  # noqa: E731
    big = builder.icmp_unsigned(">=", a, c((127 + 16) << 23))
    inf_or_nan = builder.select(builder.icmp_unsigned(">", a, c(255 << 23)), c(0x7E00), c(0x7C00))
    magic = c(((127 - 15) + (23 - 10) + 1) << 23)
    sub = builder.sub(builder.bitcast(builder.fadd(builder.bitcast(a, _F32),
                                                   builder.bitcast(magic, _F32)), _I32), magic)
    odd = builder.and_(builder.lshr(a, c(13)), c(1))
    normal = builder.lshr(builder.add(builder.add(a, c(((15 - 127) << 23) + 0xFFF)), odd), c(13))
    h = builder.select(big, inf_or_nan,
                       builder.select(builder.icmp_unsigned("<", a, c(113 << 23)), sub, normal))
    h = builder.or_(h, builder.lshr(sign, c(16)))
    return _half_to_float(builder, builder.trunc(h, _I16))


def _x86(builder, name, ret, *args):
    fn = cgutils.get_or_insert_function(builder.module,
                                        ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, list(args))


# -- loads ---------------------------------------------------------------------------------------

@intrinsic
def load32(typingctx, array, offset):
    """The 32 bytes of ``array`` (a 1-byte dtype) from element ``offset``."""
    def codegen(context, builder, sig, args):
        return builder.load(_pointer(context, builder, sig.args[0], *args, _V8), align=1)
    return Bytes32(array, offset), codegen


def _load16(context, builder, sig, args):
    return builder.load(_pointer(context, builder, sig.args[0], args[0], args[1],
                                 ir.VectorType(_I8, 16)), align=1)


@intrinsic
def nibbles(typingctx, array, offset):
    """The 16 bytes from ``offset`` as 32 values: low nibbles of bytes 0..15, then their high
    nibbles."""
    def codegen(context, builder, sig, args):
        # the 16 bytes in both halves (one broadcast load), the upper half shifted right by 4 as
        # 32-bit lanes (one variable shift), then masked: three instructions, none of them on
        # the shuffle ports, where a shift, a lane insert and a mask took four
        v = _load16(context, builder, sig, args)
        both = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 32),
                                                        list(range(16)) * 2))
        shifted = builder.lshr(builder.bitcast(both, _V32),
                               ir.Constant(_V32, [0, 0, 0, 0, 4, 4, 4, 4]))
        return builder.and_(builder.bitcast(shifted, _V8), _const(_V8, 15))
    return Bytes32(array, offset), codegen


@intrinsic
def table16(typingctx, array, offset):
    """The 16 bytes from ``offset`` in both halves (a table for ``lookup``)."""
    def codegen(context, builder, sig, args):
        v = _load16(context, builder, sig, args)
        return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 32),
                                                        list(range(16)) * 2))
    return Bytes32(array, offset), codegen


@intrinsic
def f16(typingctx, array, offset):
    """float32 of the IEEE half at bytes ``offset``, ``offset + 1`` (little-endian)."""
    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], *args, _I16)
        return _half_to_float(builder, builder.load(p, align=1))
    return types.float32(array, offset), codegen


# -- bytes -----------------------------------------------------------------------------------------

def _bytes_operand(context, builder, value, typ):
    if isinstance(typ, SimdVector):
        return value
    return _splat(builder, context.cast(builder, value, typ, types.int8), 32)


@intrinsic
def band(typingctx, a, b):
    """Bytewise a & b (b a vector or a constant)."""
    def codegen(context, builder, sig, args):
        return builder.and_(args[0], _bytes_operand(context, builder, args[1], sig.args[1]))
    return Bytes32(a, b), codegen


@intrinsic
def bor(typingctx, a, b):
    """Bytewise a | b (b a vector or a constant)."""
    def codegen(context, builder, sig, args):
        return builder.or_(args[0], _bytes_operand(context, builder, args[1], sig.args[1]))
    return Bytes32(a, b), codegen


@intrinsic
def bshr(typingctx, a, n):
    """Each byte shifted right by ``n`` (logical)."""
    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], _bytes_operand(context, builder, args[1], sig.args[1]))
    return Bytes32(a, n), codegen


@intrinsic
def bshl(typingctx, a, n):
    """Each byte shifted left by ``n``."""
    def codegen(context, builder, sig, args):
        return builder.shl(args[0], _bytes_operand(context, builder, args[1], sig.args[1]))
    return Bytes32(a, n), codegen


@intrinsic
def lookup(typingctx, table, index):
    """table[index[j]] for every byte (index < 16, table a ``table16``)."""
    def codegen(context, builder, sig, args):
        t, i = args
        if LEVEL != "generic":
            return _x86(builder, "llvm.x86.avx2.pshuf.b", _V8, t, i)
        out = ir.Constant(_V8, ir.Undefined)
        for j in range(32):
            k = builder.extract_element(i, ir.Constant(_I32, j))
            value = builder.extract_element(t, builder.zext(k, _I32))
            out = builder.insert_element(out, value, ir.Constant(_I32, j))
        return out
    return Bytes32(table, index), codegen


# -- integer products ------------------------------------------------------------------------------

def _maddubs(builder, u, s):
    if LEVEL != "generic":
        return _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16, u, s)
    wide = ir.VectorType(_I16, 32)
    p = builder.mul(builder.zext(u, wide), builder.sext(s, wide))
    even = builder.shuffle_vector(p, p, ir.Constant(ir.VectorType(_I32, 16), list(range(0, 32, 2))))
    odd = builder.shuffle_vector(p, p, ir.Constant(ir.VectorType(_I32, 16), list(range(1, 32, 2))))
    sat = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16, _V16]),
                                         "llvm.sadd.sat.v16i16")
    return builder.call(sat, [even, odd])


def _madd(builder, a, b):
    if LEVEL != "generic":
        return _x86(builder, "llvm.x86.avx2.pmadd.wd", _V32, a, b)
    wide = ir.VectorType(_I32, 16)
    p = builder.mul(builder.sext(a, wide), builder.sext(b, wide))
    even = builder.shuffle_vector(p, p, ir.Constant(_V32, list(range(0, 16, 2))))
    odd = builder.shuffle_vector(p, p, ir.Constant(_V32, list(range(1, 16, 2))))
    return builder.add(even, odd)


def _dot(builder, acc, u, s):
    if LEVEL in ("vnni", "amx"):
        return _x86(builder, "llvm.x86.avx512.vpdpbusd.256", _V32, acc,
                    builder.bitcast(u, _V32), builder.bitcast(s, _V32))
    return builder.add(acc, _madd(builder, _maddubs(builder, u, s), _const(_V16, 1)))


@intrinsic
def maddubs(typingctx, u, s):
    """16 int16 lanes: u[2j] * s[2j] + u[2j + 1] * s[2j + 1] (u unsigned, s signed)."""
    def codegen(context, builder, sig, args):
        return _maddubs(builder, *args)
    return I16x16(u, s), codegen


@intrinsic
def madd(typingctx, a, b):
    """8 int32 lanes: a[2j] * b[2j] + a[2j + 1] * b[2j + 1] of two I16x16."""
    def codegen(context, builder, sig, args):
        return _madd(builder, *args)
    return I32x8(a, b), codegen


@intrinsic
def dot_signed(typingctx, acc, a, b):
    """acc + 8 lanes of sum_k<4 a[4j + k] * b[4j + k], both signed: |a| times b with a's sign
    (unsigned times signed, one ``vpdpbusd`` or ``pmaddubsw`` and ``pmaddwd``; b's values in
    [-127, 127])."""
    def codegen(context, builder, sig, args):
        acc, a, b = args
        if LEVEL != "generic":
            abs_a = _x86(builder, "llvm.x86.avx2.psign.b", _V8, a, a)
            signed_b = _x86(builder, "llvm.x86.avx2.psign.b", _V8, b, a)
        else:
            zero = ir.Constant(_V8, None)
            neg = builder.icmp_signed("<", a, zero)
            abs_a = builder.select(neg, builder.neg(a), a)
            signed_b = builder.select(neg, builder.neg(b),
                                      builder.select(builder.icmp_signed("==", a, zero), zero, b))
        return _dot(builder, acc, abs_a, signed_b)
    return I32x8(acc, a, b), codegen


@intrinsic
def splat16(typingctx, x):
    """int16(x) in all 16 lanes."""
    def codegen(context, builder, sig, args):
        return _splat(builder, context.cast(builder, args[0], sig.args[0], types.int16), 16)
    return I16x16(x), codegen


@intrinsic
def splat16x2(typingctx, lo, hi):
    """int16(lo) in lanes 0..7 and int16(hi) in lanes 8..15 (a scale per 16 bytes of a
    ``maddubs``)."""
    def codegen(context, builder, sig, args):
        a = _splat(builder, context.cast(builder, args[0], sig.args[0], types.int16), 16)
        b = _splat(builder, context.cast(builder, args[1], sig.args[1], types.int16), 16)
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, 16),
                                                        [*range(8), *range(24, 32)]))
    return I16x16(lo, hi), codegen


@intrinsic
def zero32(typingctx):
    """0 in all 8 int32 lanes."""
    def codegen(context, builder, sig, args):
        return ir.Constant(_V32, None)
    return I32x8(), codegen


@intrinsic
def add32(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.add(*args)
    return I32x8(a, b), codegen


# -- floats ----------------------------------------------------------------------------------------

_FLAGS = ("contract", "reassoc")


@intrinsic
def zerof(typingctx):
    """0.0 in all 8 lanes."""
    def codegen(context, builder, sig, args):
        return ir.Constant(_VF, None)
    return F32x8(), codegen


@intrinsic
def fma(typingctx, acc, v, x):
    """acc + float32(v) * x: v an I32x8, x one float32 for every lane or an F32x8."""
    def codegen(context, builder, sig, args):
        acc, v, x = args
        if not isinstance(sig.args[2], SimdVector):
            x = _splat(builder, context.cast(builder, x, sig.args[2], types.float32), 8)
        return builder.fadd(acc, builder.fmul(builder.sitofp(v, _VF), x, flags=_FLAGS),
                            flags=_FLAGS)
    return F32x8(acc, v, x), codegen


@intrinsic
def hsum(typingctx, v):
    """The sum of the 8 float lanes (in any order)."""
    def codegen(context, builder, sig, args):
        v = args[0]
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 4), [0, 1, 2, 3]))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 4), [4, 5, 6, 7]))
        s = builder.fadd(lo, hi, flags=_FLAGS)
        s2 = builder.fadd(s, builder.shuffle_vector(s, s, ir.Constant(ir.VectorType(_I32, 4),
                                                                     [2, 3, 2, 3])),
                          flags=_FLAGS)
        return builder.fadd(builder.extract_element(s2, ir.Constant(_I32, 0)),
                            builder.extract_element(s2, ir.Constant(_I32, 1)), flags=_FLAGS)
    return types.float32(v), codegen


# -- float lanes (attention) -----------------------------------------------------------------------

@intrinsic
def addf(typingctx, a, b):
    """a + b, lane by lane."""
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1], flags=_FLAGS)
    return F32x8(a, b), codegen


@intrinsic
def store_hsum4(typingctx, array, offset, a, b, c, d):
    """array[offset : offset + 4] = the lane sums of a, b, c, d (each in any order), array
    float32: the four reduced together, halves first, then pairwise (three horizontal adds
    for the four, where four ``hsum`` take six)."""
    def codegen(context, builder, sig, args):
        def pick(x, y, lanes):
            return builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(_I32, len(lanes)),
                                                            lanes))

        def pairs(x, y):  # [x0+x1, x2+x3, y0+y1, y2+y3]
            return builder.fadd(pick(x, y, [0, 2, 4, 6]), pick(x, y, [1, 3, 5, 7]),
                                flags=_FLAGS)

        halves = [builder.fadd(pick(v, v, [0, 1, 2, 3]), pick(v, v, [4, 5, 6, 7]), flags=_FLAGS)
                  for v in args[2:]]
        sums = pairs(pairs(halves[0], halves[1]), pairs(halves[2], halves[3]))
        builder.store(sums, _pointer(context, builder, sig.args[0], args[0], args[1],
                                     ir.VectorType(_F32, 4)), align=4)
        return context.get_dummy_value()
    return types.none(array, offset, a, b, c, d), codegen


def _float_load(lanes: int, vector: SimdVector):
    """The intrinsic (array, offset) -> the ``lanes`` values of ``array`` from element
    ``offset`` as float32 lanes: a float32 array's as they are, a uint16 array's as IEEE half
    bits widened (an FP16 KV cache), an int32 array's converted (a tile's sums)."""
    @intrinsic
    def load(typingctx, array, offset):
        if not isinstance(array, types.Array) or array.dtype not in (types.float32, types.uint16,
                                                                     types.int32):
            return None

        def codegen(context, builder, sig, args):
            def at(element, align):
                return builder.load(_pointer(context, builder, sig.args[0], *args,
                                             ir.VectorType(element, lanes)), align=align)
            dtype = sig.args[0].dtype
            if dtype == types.float32:
                return at(_F32, 4)
            if dtype == types.int32:
                return builder.sitofp(at(_I32, 4), ir.VectorType(_F32, lanes))
            return _widen_halves(builder, at(_I16, 2), lanes)
        return vector(array, offset), codegen
    return load


def _float_store(lanes: int):
    """The intrinsic (array, offset, v) -> array[offset : offset + lanes] = v, array float32."""
    @intrinsic
    def store(typingctx, array, offset, v):
        def codegen(context, builder, sig, args):
            builder.store(args[2], _pointer(context, builder, sig.args[0], args[0], args[1],
                                            ir.VectorType(_F32, lanes)), align=4)
            return context.get_dummy_value()
        return types.none(array, offset, v), codegen
    return store


load8f, load16f = _float_load(8, F32x8), _float_load(16, F32x16)
store8f, store16f = _float_store(8), _float_store(16)


@intrinsic
def load1f(typingctx, array, offset):
    """Element ``offset`` of ``array`` (flat) as float32: a float32 as it is, half bits
    widened."""
    if not isinstance(array, types.Array) or array.dtype not in (types.float32, types.uint16):
        return None

    def codegen(context, builder, sig, args):
        if sig.args[0].dtype == types.float32:
            return builder.load(_pointer(context, builder, sig.args[0], *args, _F32), align=4)
        return _half_to_float(builder, builder.load(
            _pointer(context, builder, sig.args[0], *args, _I16), align=2))
    return types.float32(array, offset), codegen


@intrinsic
def splatf(typingctx, x):
    """One float32 in all 8 lanes."""
    def codegen(context, builder, sig, args):
        return _splat(builder, context.cast(builder, args[0], sig.args[0], types.float32), 8)
    return F32x8(x), codegen


@intrinsic
def fmaf(typingctx, acc, a, b):
    """acc + a * b, lane by lane (one fused multiply-add where the CPU has it)."""
    def codegen(context, builder, sig, args):
        acc, a, b = args
        return builder.fadd(acc, builder.fmul(a, b, flags=_FLAGS), flags=_FLAGS)
    return F32x8(acc, a, b), codegen


@intrinsic
def mulf(typingctx, a, b):
    """a * b, lane by lane."""
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1], flags=_FLAGS)
    return F32x8(a, b), codegen


# -- sixteen rows (panels) -------------------------------------------------------------------------

_W8, _W32, _WF = ir.VectorType(_I8, 64), ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)
_WIDE_DOT = LEVEL in ("vnni", "amx") and {"avx512vnni", "avx512f"} <= target_features()
_WIDE_SHUFFLE = LEVEL in ("vnni", "amx") and "avx512bw" in target_features()


@intrinsic
def load64(typingctx, array, offset):
    """The 64 bytes of ``array`` (a 1-byte dtype) from element ``offset``."""
    def codegen(context, builder, sig, args):
        return builder.load(_pointer(context, builder, sig.args[0], *args, _W8), align=1)
    return Bytes64(array, offset), codegen


@intrinsic
def store64(typingctx, array, offset, v):
    """array[offset : offset + 64] = v, array of a 1-byte dtype."""
    def codegen(context, builder, sig, args):
        builder.store(args[2], _pointer(context, builder, sig.args[0], args[0], args[1], _W8),
                      align=1)
        return context.get_dummy_value()
    return types.none(array, offset, v), codegen


@intrinsic
def spread4(typingctx, array, offset):
    """The 4 bytes of ``array`` from element ``offset`` repeated in each 32-bit lane."""
    def codegen(context, builder, sig, args):
        word = builder.load(_pointer(context, builder, sig.args[0], *args, _I32), align=1)
        return builder.bitcast(_splat(builder, word, 16), _W8)
    return Bytes64(array, offset), codegen


@intrinsic
def low4(typingctx, v):
    """Each byte's low nibble."""
    def codegen(context, builder, sig, args):
        return builder.and_(args[0], _const(_W8, 15))
    return Bytes64(v), codegen


@intrinsic
def high4(typingctx, v):
    """Each byte's high nibble (a 32-bit shift, then a mask)."""
    def codegen(context, builder, sig, args):
        shifted = builder.lshr(builder.bitcast(args[0], _W32), _const(_W32, 4))
        return builder.and_(builder.bitcast(shifted, _W8), _const(_W8, 15))
    return Bytes64(v), codegen


def _shift_and(op: str, doc: str):
    """The intrinsic (v, n, m) -> each 32-bit lane of v shifted (``op``) by n, then & m, as the
    same 64 bytes."""
    @intrinsic
    def shift_and(typingctx, v, n, m):
        def codegen(context, builder, sig, args):
            n, m = (_splat(builder, context.cast(builder, a, t, types.int32), 16)
                    for a, t in zip(args[1:], sig.args[1:]))
            words = getattr(builder, op)(builder.bitcast(args[0], _W32), n)
            return builder.bitcast(builder.and_(words, m), _W8)
        return Bytes64(v, n, m), codegen
    shift_and.__doc__ = doc
    return shift_and


shl_and64 = _shift_and("shl", "Each 32-bit lane of v shifted left by n, then & m.")
shr_and64 = _shift_and("lshr", "Each 32-bit lane of v shifted right (logical) by n, then & m.")


@intrinsic
def lanes16(typingctx, v):
    """The 64 bytes v as 16 int32 lanes (the same bits)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _W32)
    return I32x16(v), codegen


@intrinsic
def sbyte16(typingctx, v, k):
    """Byte k (< 4) of each 32-bit lane of v as a signed int32: (lane << (24 - 8 k)) >> 24,
    the second shift arithmetic."""
    def codegen(context, builder, sig, args):
        k = context.cast(builder, args[1], sig.args[1], types.int32)
        n = builder.sub(ir.Constant(_I32, 24), builder.mul(k, ir.Constant(_I32, 8)))
        words = builder.shl(builder.bitcast(args[0], _W32), _splat(builder, n, 16))
        return builder.ashr(words, _const(_W32, 24))
    return I32x16(v, k), codegen


@intrinsic
def bor64(typingctx, a, b):
    """Bytewise a | b."""
    def codegen(context, builder, sig, args):
        return builder.or_(args[0], args[1])
    return Bytes64(a, b), codegen


@intrinsic
def bsub64(typingctx, a, n):
    """Bytewise a - n (wrapping), n one integer for every byte."""
    def codegen(context, builder, sig, args):
        n = context.cast(builder, args[1], sig.args[1], types.int8)
        return builder.sub(args[0], _splat(builder, n, 64))
    return Bytes64(a, n), codegen


@intrinsic
def lookup64(typingctx, array, offset, index):
    """array[offset + index[j]] for each of the 64 bytes of index (each < 16): a 16-byte table
    looked up by ``vpshufb`` (512-bit with AVX-512, two 256-bit with AVX2)."""
    def codegen(context, builder, sig, args):
        t, i = _load16(context, builder, sig, args), args[2]
        if LEVEL == "generic":
            out = ir.Constant(_W8, ir.Undefined)
            for j in range(64):
                k = builder.zext(builder.extract_element(i, ir.Constant(_I32, j)), _I32)
                out = builder.insert_element(out, builder.extract_element(t, k),
                                             ir.Constant(_I32, j))
            return out
        if _WIDE_SHUFFLE:
            t4 = builder.shuffle_vector(t, t, ir.Constant(ir.VectorType(_I32, 64),
                                                          list(range(16)) * 4))
            return _x86(builder, "llvm.x86.avx512.pshuf.b.512", _W8, t4, i)
        t2 = builder.shuffle_vector(t, t, ir.Constant(ir.VectorType(_I32, 32),
                                                      list(range(16)) * 2))
        parts = [_x86(builder, "llvm.x86.avx2.pshuf.b", _V8, t2, h)
                 for h in _halves(builder, i, 32)]
        return builder.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(_I32, 64),
                                                                      list(range(64))))
    return Bytes64(array, offset, index), codegen


def _halves(builder, v, lanes):
    """The two halves of a 2 * lanes vector."""
    return [builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, lanes),
                                                     list(range(h * lanes, (h + 1) * lanes))))
            for h in range(2)]


def _dot16(builder, acc, u, s):
    if _WIDE_DOT:
        return _x86(builder, "llvm.x86.avx512.vpdpbusd.512", _W32, acc, builder.bitcast(u, _W32),
                    builder.bitcast(s, _W32))
    parts = [_dot(builder, a, b, c) for a, b, c in zip(_halves(builder, acc, 8),
                                                        _halves(builder, u, 32),
                                                        _halves(builder, s, 32))]
    return builder.shuffle_vector(parts[0], parts[1], ir.Constant(_W32, list(range(16))))


@intrinsic
def dot16(typingctx, acc, u, s):
    """acc + 16 lanes of sum_k<4 u[4j + k] * s[4j + k] (u unsigned below 128, s signed): one
    ``vpdpbusd`` with AVX-512 VNNI, else the 256-bit product on each half."""
    def codegen(context, builder, sig, args):
        return _dot16(builder, *args)
    return I32x16(acc, u, s), codegen


@intrinsic
def dot16_wide(typingctx, acc, u, s):
    """``dot16`` for unsigned u of any value: with VNNI the same instruction; else u's low seven
    bits and its top bit times 128 in two products (``pmaddubsw`` saturates its pair sums)."""
    def codegen(context, builder, sig, args):
        acc, u, s = args
        if LEVEL in ("vnni", "amx"):
            return _dot16(builder, acc, u, s)
        low = _dot16(builder, acc, builder.and_(u, _const(_W8, 127)), s)
        top = _dot16(builder, ir.Constant(_W32, None), builder.lshr(u, _const(_W8, 7)), s)
        return builder.add(low, builder.shl(top, _const(_W32, 7)))
    return I32x16(acc, u, s), codegen


@intrinsic
def add16(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.add(*args)
    return I32x16(a, b), codegen


@intrinsic
def sub16(typingctx, a, x):
    """a - x in each int32 lane, x one int32."""
    def codegen(context, builder, sig, args):
        return builder.sub(args[0], _splat(builder, context.cast(builder, args[1], sig.args[1],
                                                                 types.int32), 16))
    return I32x16(a, x), codegen


@intrinsic
def mul16(typingctx, a, b):
    """a * b in each int32 lane (the low 32 bits), b an I32x16 or one int32."""
    def codegen(context, builder, sig, args):
        b = args[1]
        if not isinstance(sig.args[1], SimdVector):
            b = _splat(builder, context.cast(builder, b, sig.args[1], types.int32), 16)
        return builder.mul(args[0], b)
    return I32x16(a, b), codegen


@intrinsic
def zero16(typingctx):
    """0 in all 16 int32 lanes."""
    def codegen(context, builder, sig, args):
        return ir.Constant(_W32, None)
    return I32x16(), codegen


@intrinsic
def zerof16(typingctx):
    """0.0 in all 16 float lanes."""
    def codegen(context, builder, sig, args):
        return ir.Constant(_WF, None)
    return F32x16(), codegen


@intrinsic
def halves16(typingctx, array, offset):
    """The 16 IEEE halves at bytes ``offset`` .. ``offset + 31`` of a uint8 array as float32."""
    def codegen(context, builder, sig, args):
        return _widen_halves(builder, builder.load(
            _pointer(context, builder, sig.args[0], *args, ir.VectorType(_I16, 16)), align=1), 16)
    return F32x16(array, offset), codegen


def _float_operand(context, builder, value, typ):
    if isinstance(typ, SimdVector):
        return value
    return _splat(builder, context.cast(builder, value, typ, types.float32), 16)


@intrinsic
def scale16(typingctx, f, x):
    """f * x, x an F32x16 or one float32."""
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], _float_operand(context, builder, args[1], sig.args[1]),
                            flags=_FLAGS)
    return F32x16(f, x), codegen


@intrinsic
def fma16(typingctx, acc, v, f):
    """acc + float32(v) * f, v an I32x16, f an F32x16."""
    def codegen(context, builder, sig, args):
        acc, v, f = args
        return builder.fadd(acc, builder.fmul(builder.sitofp(v, _WF), f, flags=_FLAGS),
                            flags=_FLAGS)
    return F32x16(acc, v, f), codegen


@intrinsic
def fmaf16(typingctx, acc, f, x):
    """acc + f * x, x an F32x16 or one float32."""
    def codegen(context, builder, sig, args):
        acc, f, x = args
        x = _float_operand(context, builder, x, sig.args[2])
        return builder.fadd(acc, builder.fmul(f, x, flags=_FLAGS), flags=_FLAGS)
    return F32x16(acc, f, x), codegen


@intrinsic
def addf16(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1], flags=_FLAGS)
    return F32x16(a, b), codegen


@intrinsic
def fold8(typingctx, v):
    """The 16 float lanes of v added in pairs into 8 (lane k + lane k + 8)."""
    def codegen(context, builder, sig, args):
        v = args[0]
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 8), list(range(8))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 8),
                                                      list(range(8, 16))))
        return builder.fadd(lo, hi, flags=_FLAGS)
    return F32x8(v), codegen


@intrinsic
def bf16x16(typingctx, array, offset):
    """The 16 bfloat16 bits of a uint16 array from element ``offset`` as float32 lanes (each
    moved to the high half of its lane)."""
    if not isinstance(array, types.Array) or array.dtype != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        bits = builder.load(_pointer(context, builder, sig.args[0], *args,
                                     ir.VectorType(_I16, 16)), align=2)
        wide = builder.shl(builder.zext(bits, _W32), ir.Constant(_W32, [16] * 16))
        return builder.bitcast(wide, _WF)
    return F32x16(array, offset), codegen


@intrinsic
def lane16(typingctx, v, i):
    """Lane i of an F32x16."""
    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1],
                                                             types.int32))
    return types.float32(v, i), codegen


@intrinsic
def transpose16(typingctx, src, s_off, s_stride, dst, d_off):
    """dst[d_off + 16 r + c] = src[s_off + c * s_stride + r] for r, c < 16: a 16 x 16 block of
    32-bit words transposed (src, dst uint32 arrays), in registers: 16 loads, four rounds of
    16 two-vector shuffles (each swapping the off-diagonal blocks of 8, 4, 2, then 1 words),
    16 stores."""
    def codegen(context, builder, sig, args):
        vt = ir.VectorType(_I32, 16)
        stride = context.cast(builder, args[2], sig.args[2], types.int64)
        base = context.cast(builder, args[1], sig.args[1], types.int64)
        rows = [builder.load(_pointer(context, builder, sig.args[0], args[0],
                                      builder.add(base, builder.mul(stride, ir.Constant(
                                          ir.IntType(64), r))), vt), align=4)
                for r in range(16)]
        for b in (8, 4, 2, 1):
            low = ir.Constant(ir.VectorType(_I32, 16),
                              [k if not k & b else 16 + k - b for k in range(16)])
            high = ir.Constant(ir.VectorType(_I32, 16),
                               [k + b if not k & b else 16 + k for k in range(16)])
            for r in range(16):
                if r & b:
                    continue
                a, c = rows[r], rows[r + b]
                rows[r] = builder.shuffle_vector(a, c, low)
                rows[r + b] = builder.shuffle_vector(a, c, high)
        out = context.cast(builder, args[4], sig.args[4], types.int64)
        for r in range(16):
            builder.store(rows[r], _pointer(context, builder, sig.args[3], args[3], builder.add(
                out, ir.Constant(ir.IntType(64), 16 * r)), vt), align=4)
        return context.get_dummy_value()
    return types.none(src, s_off, s_stride, dst, d_off), codegen


# -- memory ---------------------------------------------------------------------------------------

PREFETCH_BYTES = 4096
"""How far ahead of the bytes it multiplies a one-row product (decode) asks for the weights'
next bytes (``prefetch``). The hardware's own prefetch keeps too few lines in flight for one
thread to stream a matrix from memory at the rate two reach: with the hint, one-row products
from DRAM took 0.61-0.93 of the time (quant's panels: Q4_1 the most, Q8_0 the least; BF16 and
F16 rows 0.61-0.72), and SmolLM2's and Gemma 3's decode steps about 0.8 and 0.85
(docs/performance.md, "Weights asked for ahead")."""


FLOAT_PREFETCH_BYTES = 0 if llvm.get_host_cpu_name().startswith("znver") else PREFETCH_BYTES
"""How far ahead a one-row product of float rows (float32, BF16, F16 weights: linear._dot_cols)
asks for their next bytes; 0: not at all. The hint took 0.61-0.72 of the time of a BF16 / F16
product from DRAM on the Xeon with AMX (above), but 1.4-1.8x on AMD Zen 5, at any distance
from 512 bytes to 16 KB (one thread, 252 MB of BF16 rows: 16-19 against 25-28 GB/s), where the
hardware's own prefetch keeps up with a row's one stream. A kernel's argument, not a constant
compiled in, so the kernels prebuilt for a CPU level serve both."""


@intrinsic
def prefetch(typingctx, array, offset):
    """Ask for the cache line of ``array``'s element ``offset`` ahead of its use (a hint: no
    fault past the array's end, no effect on results)."""
    def codegen(context, builder, sig, args):
        address = _pointer(context, builder, sig.args[0], *args, _I8)
        _x86(builder, "llvm.prefetch.p0i8", ir.VoidType(), address, ir.Constant(_I32, 0),
             ir.Constant(_I32, 3), ir.Constant(_I32, 1))  # a read, kept in every cache level
        return context.get_dummy_value()
    return types.none(array, offset), codegen


# -- scalars ---------------------------------------------------------------------------------------

@intrinsic
def round_f16(typingctx, x):
    """float32 x rounded to the nearest IEEE half (ties to even), as float32."""
    def codegen(context, builder, sig, args):
        return _float_to_half(builder, args[0])
    return types.float32(types.float32), codegen


@intrinsic
def bf16_to_f32(typingctx, bits):
    """float32 of bfloat16 bits (a uint32 holding them in its low half)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.shl(args[0], ir.Constant(_I32, 16)), _F32)
    return types.float32(types.uint32), codegen


@intrinsic
def f32_to_bf16(typingctx, x):
    """The bfloat16 bits (a uint16) nearest a float32, ties to even (a NaN stays a NaN unless
    its payload is all in the low half)."""
    def codegen(context, builder, sig, args):
        u = builder.bitcast(args[0], _I32)
        odd = builder.and_(builder.lshr(u, ir.Constant(_I32, 16)), ir.Constant(_I32, 1))
        u = builder.add(builder.add(u, ir.Constant(_I32, 0x7FFF)), odd)
        return builder.trunc(builder.lshr(u, ir.Constant(_I32, 16)), _I16)
    return types.uint16(types.float32), codegen


@intrinsic
def f16_to_f32(typingctx, bits):
    """float32 of IEEE half bits (a uint16)."""
    def codegen(context, builder, sig, args):
        return _half_to_float(builder, args[0])
    return types.float32(types.uint16), codegen
