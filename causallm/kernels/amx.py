"""AMX tiles (Intel Xeon from Sapphire Rapids on): eight registers of up to 16 rows x 64 bytes
and one instruction that multiplies two of them into a third.

A tile product ``C += A B`` takes A as rows x K bytes (here up to 16 activation rows x 32
values, int8) and B in the "VNNI" layout, K / 4 rows of 16 columns x 4 consecutive K values
(here a 32-value sub-block of 16 weight rows), and adds to C's 16 x 16 int32 the exact sums
``C[i, j] += sum_k A[i, k] B[k, j]``: 16 x 16 x 32 multiply-adds in one instruction, where a
256-bit ``vpdpbusd`` does 32. The operations, each one instruction; ``t`` is a tile number,
a constant::

    tile_config(cfg)              load the shapes in cfg (64 bytes, ``configure``)
    tile_release()                back to the initial state (the registers' contents lost)
    tile_zero(t)                  tile t = 0
    tile_load(t, a, o, stride)    tile t's rows from a[o], a[o + stride], ... (flat bytes)
    tile_store(t, a, o, stride)   the reverse
    tile_dot_ss(c, a, b)          C += A B, A and B signed bytes
    tile_dot_su(c, a, b)          the same with B's bytes unsigned
    tile_dot_bf16(c, a, b)        C += A B in float32, A and B pairs of bfloat16 (A rows x 32
                                  values, B 16 rows of 16 columns x 2 consecutive K values)

Linux hands out the tiles' 8 KB of register state per process on request (``permitted``,
kernel 5.16 and later); a CPU that has AMX but whose process may not use it is treated as one
without (simd.LEVEL). The intrinsics are LLVM's with the tile as an immediate, as C's
``_tile_loadd`` and friends are: the kernel loads its own configuration.
"""

from __future__ import annotations

import ctypes

from llvmlite import ir
from numba.core import cgutils, types
from numba.core.errors import RequireLiteralValue
from numba.extending import intrinsic

_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158


def permitted() -> bool:
    """Ask Linux for the tile registers' state (arch_prctl ARCH_REQ_XCOMP_PERM): whether this
    process may run tile instructions (without it the first one is an illegal instruction)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


_I8, _I64, _VOID = ir.IntType(8), ir.IntType(64), ir.VoidType()


def _call(builder, name, *args):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_VOID, [a.type for a in args]), name)
    builder.call(fn, list(args))


def _tile(t) -> ir.Constant:
    return ir.Constant(_I8, t.literal_value)


def _literal(*ts) -> None:
    for t in ts:
        if not isinstance(t, types.IntegerLiteral):
            raise RequireLiteralValue("a tile number must be a constant")


def _address(context, builder, array_type, array, offset):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [offset]), _I8.as_pointer())


@intrinsic
def tile_config(typingctx, cfg):
    """ldtilecfg cfg (a uint8 array of 64 bytes, ``configure``)."""
    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.ldtilecfg",
              _address(context, builder, sig.args[0], args[0], ir.Constant(_I64, 0)))
        return context.get_dummy_value()
    return types.none(cfg), codegen


@intrinsic
def tile_release(typingctx):
    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.tilerelease")
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def tile_zero(typingctx, t):
    _literal(t)

    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.tilezero", _tile(sig.args[0]))
        return context.get_dummy_value()
    return types.none(t), codegen


def _move(name):
    def typer(typingctx, t, array, offset, stride):
        _literal(t)

        def codegen(context, builder, sig, args):
            _call(builder, name, _tile(sig.args[0]),
                  _address(context, builder, sig.args[1], args[1], args[2]),
                  context.cast(builder, args[3], sig.args[3], types.int64))
            return context.get_dummy_value()
        return types.none(t, array, offset, stride), codegen
    return typer


tile_load = intrinsic(_move("llvm.x86.tileloadd64"))
tile_store = intrinsic(_move("llvm.x86.tilestored64"))


def _dot(name):
    def typer(typingctx, c, a, b):
        _literal(c, a, b)

        def codegen(context, builder, sig, args):
            _call(builder, name, *(_tile(t) for t in sig.args))
            return context.get_dummy_value()
        return types.none(c, a, b), codegen
    return typer


tile_dot_ss = intrinsic(_dot("llvm.x86.tdpbssd"))
tile_dot_su = intrinsic(_dot("llvm.x86.tdpbsud"))
tile_dot_bf16 = intrinsic(_dot("llvm.x86.tdpbf16ps"))
