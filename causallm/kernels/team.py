"""A team of threads that runs many small kernels in one parallel region.

A decode step of a small model is some 270 kernel calls of a few microseconds of work each; run
one by one, each pays numba's dispatch from Python and, for most, an OpenMP region's start
(docs/performance.md, "A decode step in one region"). Here a run of such calls is a *program*:
rows ``[op address, args address, tasks]`` of int64, one per call, that ``run`` executes
in one region. Every thread walks the program::

    for each op i:
        claim tasks [k0, k1) of op i, k1 - k0 = max(1, tasks left / threads) (a
        compare-and-swap on the op's counter), until none is left, running op(args, k0, k1)
        for each claim and counting its tasks done;
        wait until all of op i's tasks are done (another thread may still run one)

so op i + 1 sees every output of op i. The claims shrink as the op's tasks run out (OpenMP's
"guided" schedule): a thread streams a long run of an op's weight rows first, and the op ends
on claims of a task or two, so neither thread waits long for the other's last one. A thread
that starts late (the OS runs another process on its core) finds fewer tasks left rather than
making the others wait for its share.
No thread ever waits for a task nobody has claimed: one thread running the region alone runs
every task, so the program cannot deadlock whatever the thread pool does.

An op is an ``@njit`` function ``op(args, k0, k1)`` of three int64: ``args`` the address of its
own int64 words (``encode``: an array is its address then its shape, a float its bits), which
it reads back with ``words`` / ``array*`` / ``real``. ``address(op)`` compiles it (or reads it
from the kernel cache, as any kernel) and gives the address of numba's C-callable wrapper of
it, which ``_call`` calls. Task k of an op computes what one iteration of the kernel's own loop
does, in the same order, so a program gives the values the calls it replaces give.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

LINE = 8
"""int64 counters a cache line: each op's two counters sit on lines of their own."""


@intrinsic
def pointer(typingctx, address):
    """The int64 ``address`` as a pointer (for numba.carray)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(types.int64), codegen


@intrinsic
def _atomic_add(typingctx, counters, i, value):
    """counters[i] += value atomically; the value before."""
    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.atomic_rmw("add", builder.gep(array.data, [args[1]]), args[2], "seq_cst")
    return types.int64(counters, i, value), codegen


@intrinsic
def _cas(typingctx, counters, i, old, new):
    """counters[i] = new if it is old, atomically; whether it was."""
    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        pair = builder.cmpxchg(builder.gep(array.data, [args[1]]), args[2], args[3],
                               "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)
    return types.boolean(counters, i, old, new), codegen


@intrinsic
def _atomic_load(typingctx, counters, i):
    """counters[i], read with acquire order (what was written before its store is seen)."""
    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(builder.gep(array.data, [args[1]]), "acquire", 8)
    return types.int64(counters, i), codegen


@intrinsic
def _pause(typingctx):
    """The spin-wait hint (x86 ``pause``; nothing elsewhere)."""
    def codegen(context, builder, signature, args):
        if context.target_data is not None and "x86" in builder.module.triple:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def _call(typingctx, op, args, k0, k1):
    """op(args, k0, k1) through the op's address."""
    def codegen(context, builder, signature, a):
        i64 = ir.IntType(64)
        fn = builder.inttoptr(a[0], ir.FunctionType(ir.VoidType(), [i64, i64, i64]).as_pointer())
        builder.call(fn, [a[1], a[2], a[3]])
        return context.get_dummy_value()
    return types.none(types.int64, types.int64, types.int64, types.int64), codegen


@intrinsic
def _clock(typingctx):
    """The CPU's cycle counter (x86: rdtsc, which counts at a constant rate)."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(64), []), "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@njit(cache=True)
def clock():
    """``_clock`` from Python."""
    return _clock()


@njit(cache=True)
def _walk(program, counters, trace, t, n_threads):
    """One thread's walk through the program (module doc). Where ``trace`` has rows (a
    profile: bench/team_trace.py), trace[t, i] gets the cycle counts at which this thread came
    to op i, ran out of its tasks and saw them all done."""
    timed = trace.shape[0] > 0
    for i in range(program.shape[0]):
        if timed:
            trace[t, i, 0] = _clock()
        op, args, tasks = program[i, 0], program[i, 1], program[i, 2]
        claim, done = 2 * LINE * i, 2 * LINE * i + LINE
        while True:
            k0 = _atomic_load(counters, claim)
            if k0 >= tasks:
                break
            k1 = min(tasks, k0 + max(1, (tasks - k0) // n_threads))
            if not _cas(counters, claim, k0, k1):
                continue  # another thread claimed first: claim again from where it left off
            _call(op, args, k0, k1)
            _atomic_add(counters, done, k1 - k0)
        if timed:
            trace[t, i, 1] = _clock()
        while _atomic_load(counters, done) < tasks:
            _pause()
        if timed:
            trace[t, i, 2] = _clock()


@njit(cache=True, parallel=True)
def _run_parallel(program, counters, n_threads, trace):
    counters[:] = 0
    for t in prange(n_threads):
        _walk(program, counters, trace, t, n_threads)


@njit(cache=True)
def _run_serial(program, counters, trace):
    counters[:] = 0
    _walk(program, counters, trace, 0, 1)


UNTIMED = np.zeros((0, 0, 3), dtype=np.int64)
"""The trace of a run nobody times."""


class Program:
    """A program (module doc) and what it needs kept alive: ``ops`` [(op address, args (int64
    words), tasks, *anything else to keep)]. ``run(n_threads)`` executes it on any thread count
    (the claims only change how the tasks are shared), timed when given a trace."""

    def __init__(self, ops: list) -> None:
        self.ops = ops  # the words the program points to, and what an op keeps alive
        self.table = np.array([[op, a.ctypes.data, tasks] for op, a, tasks, *_ in ops],
                              dtype=np.int64).reshape(-1, 3)
        self.counters = np.zeros(2 * LINE * max(1, len(ops)), dtype=np.int64)

    def run(self, n_threads: int, trace: np.ndarray = UNTIMED) -> None:
        """Run it on ``n_threads``; ``trace`` (n_threads, ops, 3) int64 gets each thread's cycle
        counts at each op (``_walk``)."""
        if n_threads > 1:
            _run_parallel(self.table, self.counters, n_threads, trace)
        else:
            _run_serial(self.table, self.counters, trace)


OP_SIGNATURE = (types.int64, types.int64, types.int64)
_addresses: dict = {}


def address(op) -> int:
    """The address of the C-callable wrapper of ``op`` (an @njit function of three int64),
    compiled or read from the cache at the first ask."""
    found = _addresses.get(op)
    if found is None:
        op.compile(OP_SIGNATURE)
        result = op.overloads[OP_SIGNATURE]
        found = _addresses[op] = result.library.get_pointer_to_function(
            result.fndesc.llvm_cfunc_wrapper_name)
    return found


def encode(*parts) -> np.ndarray | None:
    """An op's argument words: an array as its address then its shape (C-contiguous, else None:
    the op cannot read it), a float as its float64 bits, an int as itself."""
    out: list[int] = []
    for p in parts:
        if isinstance(p, np.ndarray):
            if not p.flags.c_contiguous:
                return None
            out.append(p.ctypes.data)
            out.extend(p.shape)
        elif isinstance(p, float):
            out.append(int(np.float64(p).view(np.int64)))
        else:
            out.append(int(p))
    return np.array(out, dtype=np.int64)


# -- reading an op's arguments back ----------------------------------------------------------------

@njit(cache=True, inline="always")
def words(args, n):
    """The first n words at ``args``."""
    return carray(pointer(args), (n,), np.int64)


@njit(cache=True, inline="always")
def array1(w, i, dtype):
    """The 1-D array whose address and shape are words i, i + 1 of w."""
    return carray(pointer(w[i]), (w[i + 1],), dtype)


@njit(cache=True, inline="always")
def array2(w, i, dtype):
    return carray(pointer(w[i]), (w[i + 1], w[i + 2]), dtype)


@njit(cache=True, inline="always")
def array3(w, i, dtype):
    return carray(pointer(w[i]), (w[i + 1], w[i + 2], w[i + 3]), dtype)


@njit(cache=True, inline="always")
def array4(w, i, dtype):
    return carray(pointer(w[i]), (w[i + 1], w[i + 2], w[i + 3], w[i + 4]), dtype)


@njit(cache=True, inline="always")
def real(args, i):
    """Word i at ``args`` read as the float64 ``encode`` stored there."""
    return carray(pointer(args + 8 * i), (1,), np.float64)[0]
