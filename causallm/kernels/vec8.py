"""Eight float32 lanes in one register, for kernels that must round exactly as scalar C does.

numba vectorizes a loop only when LLVM can prove its arrays do not overlap, which it rarely can
for a loop over many small state arrays; and it must not reorder a float sum (that would change
the rounding). These types and intrinsics let a kernel run eight independent scalar computations
side by side, each lane doing exactly the IEEE float32 operations of the scalar code, in the same
order, with no fused multiply-add (LLVM instructions without fast-math flags)::

    F8     <8 x float>    splat8, load8, store8, lane8, add8, sub8, mul8, div8, sqrt8, abs8,
                          trunc8 (toward zero), store_bytes8 (integers -128..255 as 8 bytes)
    M8     <8 x i1>       lt8, le8, gt8, ge8, eq8 (ordered: false when a lane is NaN),
                          and8, or8, not8, any8, bits8 (lane k -> bit k of an int),
                          select8(m, a, b) = m ? a : b

Arrays are float32, C-contiguous, addressed by the flat offset of the first element; loads and
stores are unaligned.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, models, register_model


class Vec8(types.Type):
    """Eight lanes of ``kind``: "f32" (float32) or "mask" (i1)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        super().__init__(name=f"Vec8({kind})")


@register_model(Vec8)
class _Vec8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        element = ir.FloatType() if fe_type.kind == "f32" else ir.IntType(1)
        super().__init__(dmm, fe_type, ir.VectorType(element, 8))


F8 = Vec8("f32")
M8 = Vec8("mask")
_F32 = ir.FloatType()
_V = ir.VectorType(_F32, 8)
_I32 = ir.IntType(32)


def _pointer(context, builder, array_type, array, offset):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [offset]), _V.as_pointer())


@intrinsic
def splat8(typingctx, x):
    """All lanes x (a float32)."""
    def codegen(context, builder, sig, args):
        one = builder.insert_element(ir.Constant(_V, ir.Undefined), args[0], ir.Constant(_I32, 0))
        return builder.shuffle_vector(one, ir.Constant(_V, ir.Undefined),
                                      ir.Constant(ir.VectorType(_I32, 8), [0] * 8))
    return F8(types.float32), codegen


@intrinsic
def load8(typingctx, a, offset):
    """a[offset:offset + 8] of a float32 array."""
    def codegen(context, builder, sig, args):
        return builder.load(_pointer(context, builder, sig.args[0], args[0], args[1]), align=4)
    return F8(a, offset), codegen


@intrinsic
def store8(typingctx, a, offset, v):
    """a[offset:offset + 8] = v."""
    def codegen(context, builder, sig, args):
        builder.store(args[2], _pointer(context, builder, sig.args[0], args[0], args[1]),
                      align=4)
        return context.get_dummy_value()
    return types.none(a, offset, F8), codegen


@intrinsic
def lane8(typingctx, v, i):
    """Lane i of v, a float32."""
    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1],
                                                             types.int32))
    return types.float32(F8, i), codegen


def _binary(op, doc):
    def typer(typingctx, a, b):
        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])
        return F8(F8, F8), codegen
    typer.__doc__ = doc
    return intrinsic(typer)


add8 = _binary("fadd", "a + b, lane by lane.")
sub8 = _binary("fsub", "a - b, lane by lane.")
mul8 = _binary("fmul", "a * b, lane by lane.")
div8 = _binary("fdiv", "a / b, lane by lane.")


def _compare(op, doc):
    def typer(typingctx, a, b):
        def codegen(context, builder, sig, args):
            return builder.fcmp_ordered(op, args[0], args[1])
        return M8(F8, F8), codegen
    typer.__doc__ = doc
    return intrinsic(typer)


lt8 = _compare("<", "a < b per lane (false for NaN).")
le8 = _compare("<=", "a <= b per lane (false for NaN).")
gt8 = _compare(">", "a > b per lane (false for NaN).")
ge8 = _compare(">=", "a >= b per lane (false for NaN).")
eq8 = _compare("==", "a == b per lane (false for NaN).")


def _unary_float(name, doc):
    def typer(typingctx, a):
        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V, [_V]),
                                                f"{name}.v8f32")
            return builder.call(fn, [args[0]])
        return F8(F8), codegen
    typer.__doc__ = doc
    return intrinsic(typer)


sqrt8 = _unary_float("llvm.sqrt", "The correctly rounded square root of each lane.")
abs8 = _unary_float("llvm.fabs", "|a| per lane.")
trunc8 = _unary_float("llvm.trunc", "Each lane rounded toward zero (C's truncf).")


@intrinsic
def store_bytes8(typingctx, a, offset, v):
    """a[offset:offset + 8] = v of a uint8 / int8 array, v's lanes integers in -128..255
    (converted to int32, then their low byte)."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]),
                              ir.VectorType(ir.IntType(8), 8).as_pointer())
        ints = builder.fptosi(args[2], ir.VectorType(_I32, 8))
        builder.store(builder.trunc(ints, ir.VectorType(ir.IntType(8), 8)), ptr, align=1)
        return context.get_dummy_value()
    return types.none(a, offset, F8), codegen


@intrinsic
def bits8(typingctx, m):
    """The lanes of mask m as the bits of an int (lane k is bit k)."""
    def codegen(context, builder, sig, args):
        return builder.zext(builder.bitcast(args[0], ir.IntType(8)), ir.IntType(64))
    return types.int64(M8), codegen


@intrinsic
def and8(typingctx, a, b):
    """a and b per lane."""
    def codegen(context, builder, sig, args):
        return builder.and_(args[0], args[1])
    return M8(M8, M8), codegen


@intrinsic
def or8(typingctx, a, b):
    """a or b per lane."""
    def codegen(context, builder, sig, args):
        return builder.or_(args[0], args[1])
    return M8(M8, M8), codegen


@intrinsic
def not8(typingctx, a):
    """not a per lane."""
    def codegen(context, builder, sig, args):
        return builder.not_(args[0])
    return M8(M8), codegen


@intrinsic
def any8(typingctx, m):
    """Whether any lane of mask m is true."""
    def codegen(context, builder, sig, args):
        bits = builder.bitcast(args[0], ir.IntType(8))
        return builder.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(8), 0))
    return types.boolean(M8), codegen


@intrinsic
def select8(typingctx, m, a, b):
    """m ? a : b per lane."""
    def codegen(context, builder, sig, args):
        return builder.select(args[0], args[1], args[2])
    return F8(M8, F8, F8), codegen
