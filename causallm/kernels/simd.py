"""Vectors in registers for the packed-weight kernels: a numba type per LLVM vector and the few
operations the kernels need, each one LLVM instruction or intrinsic.

numba vectorizes plain loops well, but two things it cannot reach from Python code: integer dot
products of bytes (its integer arithmetic widens to 64 bits) and keeping a partial sum per output
row in one register across a loop. These intrinsics give the kernels both, so a kernel stays a
plain numba loop over arrays that passes vectors between a handful of calls::

    float32  one value                bf16_to_f32, f16_to_f32 (widening scalars)
    U8x64    64 bytes                 load_u8x64, nibbles_lo, nibbles_hi
    I32x16   16 int32 lanes           splat_i32x16, dpbusd_bcast
    F32x16   16 float32 lanes         zero_f32x16, fma_scaled, lane

``dpbusd_bcast(acc, u, x, off)`` is the int8 dot product at the heart of ggml's quantized
kernels: lane i gets ``acc[i] + sum_j<4 u[4i + j] * x[off + j]`` (u unsigned bytes, x signed
bytes, the same four x bytes in every lane). Where the CPU has AVX-512 VNNI it is one
``vpdpbusd`` with the x dword broadcast from memory; elsewhere LLVM gets the same arithmetic in
plain vector IR (widen, multiply, add the four products), exact but slower.

Arrays are addressed by flat element offsets from their first element, so they must be
C-contiguous; loads are unaligned.
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba.core import cgutils, config, types
from numba.extending import intrinsic, models, register_model


def _target_features() -> set[str]:
    """The CPU features numba compiles for: the host's, or NUMBA_CPU_FEATURES when
    NUMBA_CPU_NAME asks for another target (a portable cache)."""
    if config.CPU_NAME:
        return {f[1:] for f in (config.CPU_FEATURES or "").split(",") if f.startswith("+")}
    return {name for name, on in llvm.get_host_cpu_features().items() if on}


VNNI = {"avx512f", "avx512bw", "avx512vnni"} <= _target_features()
"""``dpbusd_bcast`` is one ``vpdpbusd`` (AVX-512 VNNI) rather than generic vector IR."""


class SimdVector(types.Type):
    """An LLVM vector of ``lanes`` values of ``kind`` ("u8", "i32" or "f32"), held by value."""

    def __init__(self, kind: str, lanes: int) -> None:
        self.kind, self.lanes = kind, lanes
        super().__init__(name=f"SimdVector({kind}x{lanes})")


_I8, _I32, _F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
_ELEMENT = {"u8": _I8, "i32": _I32, "f32": _F32}


@register_model(SimdVector)
class _SimdVectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_ELEMENT[fe_type.kind], fe_type.lanes))


U8x64 = SimdVector("u8", 64)
I32x16 = SimdVector("i32", 16)
F32x16 = SimdVector("f32", 16)


def _pointer(context, builder, array_type, array, offset, pointee):
    """Address of element ``offset`` of ``array`` as a ``pointee`` pointer."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [offset]), pointee.as_pointer())


def _splat(builder, value, lanes):
    vt = ir.VectorType(value.type, lanes)
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vt, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes))


@intrinsic
def load_u8x64(typingctx, array, offset):
    """The 64 bytes of ``array`` (any 1-byte dtype) from element ``offset``."""
    def codegen(context, builder, sig, args):
        p = _pointer(context, builder, sig.args[0], args[0], args[1], ir.VectorType(_I8, 64))
        return builder.load(p, align=1)
    return U8x64(array, offset), codegen


@intrinsic
def nibbles_lo(typingctx, v):
    """Each byte's low four bits."""
    def codegen(context, builder, sig, args):
        return builder.and_(args[0], ir.Constant(ir.VectorType(_I8, 64), [15] * 64))
    return U8x64(v), codegen


@intrinsic
def nibbles_hi(typingctx, v):
    """Each byte's high four bits."""
    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], ir.Constant(ir.VectorType(_I8, 64), [4] * 64))
    return U8x64(v), codegen


@intrinsic
def splat_i32x16(typingctx, value):
    """int32(value) in every lane."""
    def codegen(context, builder, sig, args):
        return _splat(builder, context.cast(builder, args[0], sig.args[0], types.int32), 16)
    return I32x16(value), codegen


@intrinsic
def zero_f32x16(typingctx):
    """0.0 in every lane."""
    def codegen(context, builder, sig, args):
        return ir.Constant(ir.VectorType(_F32, 16), None)
    return F32x16(), codegen


@intrinsic
def dpbusd_bcast(typingctx, acc, u, x, offset):
    """acc[i] + sum_j<4 u[4i + j] * x[offset + j]: u unsigned bytes, x an int8 array whose four
    bytes from ``offset`` meet every lane (module docstring)."""
    def codegen(context, builder, sig, args):
        acc, u, array, offset = args
        dword = builder.load(_pointer(context, builder, sig.args[2], array, offset, _I32), align=1)
        xs = _splat(builder, dword, 16)
        if VNNI:
            v16 = ir.VectorType(_I32, 16)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16] * 3),
                                                "llvm.x86.avx512.vpdpbusd.512")
            return builder.call(fn, [acc, builder.bitcast(u, v16), xs])
        wide = ir.VectorType(_I32, 64)
        products = builder.mul(builder.zext(u, wide),
                               builder.sext(builder.bitcast(xs, ir.VectorType(_I8, 64)), wide))
        for j in range(4):
            picked = ir.Constant(ir.VectorType(_I32, 16), [4 * i + j for i in range(16)])
            acc = builder.add(acc, builder.shuffle_vector(products, products, picked))
        return acc
    return I32x16(acc, u, x, offset), codegen


@intrinsic
def fma_scaled(typingctx, acc, ints, halves, offset, scale):
    """acc + float32(ints) * float32(halves[offset:offset + 16]) * scale, ``halves`` a uint16
    array of IEEE half bits (16 per-lane scales), ``scale`` one float for every lane."""
    def codegen(context, builder, sig, args):
        acc, ints, array, offset, scale = args
        v16 = ir.VectorType(_F32, 16)
        p = _pointer(context, builder, sig.args[2], array, offset, ir.VectorType(ir.HalfType(), 16))
        d = builder.fpext(builder.load(p, align=2), v16)
        s = _splat(builder, context.cast(builder, scale, sig.args[4], types.float32), 16)
        flags = ("contract", "reassoc")
        return builder.fadd(acc, builder.fmul(builder.sitofp(ints, v16),
                                              builder.fmul(d, s, flags=flags), flags=flags),
                            flags=flags)
    return F32x16(acc, ints, halves, offset, scale), codegen


@intrinsic
def lane(typingctx, v, i):
    """Lane ``i`` of a float vector."""
    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1],
                                                             types.int32))
    return types.float32(v, i), codegen


@intrinsic
def bf16_to_f32(typingctx, bits):
    """float32 of bfloat16 bits (a uint32 holding them in its low half)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.shl(args[0], ir.Constant(_I32, 16)), _F32)
    return types.float32(types.uint32), codegen


@intrinsic
def f16_to_f32(typingctx, bits):
    """float32 of IEEE half bits (a uint16)."""
    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), _F32)
    return types.float32(types.uint16), codegen
