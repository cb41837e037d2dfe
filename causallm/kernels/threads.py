"""One owner of the cores: ``-t`` threads compute, in numba's kernels and in BLAS together.

Two pools could run our work: numba's OpenMP pool (every kernel) and numpy's BLAS (the matrix
products of prefill). Here numba's pool has ``threads()`` threads and BLAS is held at one thread
per call (threadpoolctl, whichever BLAS numpy carries); a large product is split by columns
into parts that the calling thread and a pool of ``threads() - 1`` Python threads take one by
one until none is left (numpy releases the GIL inside BLAS)::

    out[:, c0:c1] = a @ b[:, c0:c1]      for each part [c0, c1)

The pools take turns (a step runs one kernel or one product at a time), so at most
``threads()`` threads compute. A split product waits once, at its end, for the part still
running; OpenBLAS's own threads wait for each other many times within one product, and with
another process on a core a descheduled one stalls the rest each time (a 22-token FP32
prefill of the Qwen3-0.6B shape on 2 shared cores: 9.3 s with OpenBLAS's threads, 1.4 s split
here; beside one more busy process 15.6 and 3.3 s; docs/performance.md, "One owner of the
cores").

numba's thread count belongs to the Python thread that sets it: ``own()`` gives the calling
thread the count ``set_threads`` chose (the runtime calls it at every step), so a server's
worker thread or a user's own threads run with ``-t`` too.
"""

from concurrent.futures import ThreadPoolExecutor
from queue import Empty, SimpleQueue

import numba
import numpy as np

SPLIT_MIN_WORK = 1 << 22
"""Multiply-adds (rows x K x N) below which a product runs whole on the calling thread:
handing a part to another thread costs tens of microseconds."""
SPLIT_ALIGN = 64
"""Columns per part are a multiple of this (whole cache lines of the output rows)."""
PARTS_PER_THREAD = 4
"""Parts a split product is cut into, per thread. The threads take parts one by one until none
is left, so a thread the OS runs less (another process on its core) takes fewer parts and
the product waits at most one part for it, not half of the product."""

_count = numba.get_num_threads()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pinned = False


def _pin_blas() -> None:
    """Every BLAS numpy has loaded runs one thread per call from here on. Done at the first
    ``set_threads`` or product, not at import: threadpoolctl takes some 40 ms to load and ask
    the libraries, which a start that never multiplies many rows does not pay."""
    global _pinned
    if not _pinned:
        import threadpoolctl

        threadpoolctl.threadpool_limits(limits=1, user_api="blas")
        _pinned = True


def set_threads(n: int) -> int:
    """``-t``: n threads (clamped to [1, NUMBA_NUM_THREADS]) for numba's kernels and the split
    products, from the calling thread on, and in every thread that calls ``own()``; returns
    the count."""
    global _count
    _pin_blas()
    _count = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(_count)
    return _count


def threads() -> int:
    """The thread count ``set_threads`` chose (every core by default)."""
    return _count


def own() -> None:
    """Give the calling thread the chosen count: numba's kernels it starts use ``threads()``
    threads (numba keeps the count per Python thread)."""
    if numba.get_num_threads() != _count:
        numba.set_num_threads(_count)


def _workers(n: int) -> ThreadPoolExecutor:
    """The pool of n Python threads that run the other parts of a split product."""
    global _pool, _pool_size
    if _pool_size != n:
        if _pool is not None:
            _pool.shutdown(wait=True)
        _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="causallm-blas")
        _pool_size = n
    return _pool


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, before=None) -> None:
    """out = a @ b for 2-D float arrays (out (M, N) with unit column stride), split by columns
    of b over ``threads()`` threads when the product is large enough (module docstring);
    ``before(c0, c1)``, when given, makes columns [c0, c1) of b, on the thread that multiplies
    them, just before (a BF16 matrix widened a part at a time, while it is in cache)."""
    _pin_blas()
    m, k = a.shape
    n = b.shape[1]
    parts = min(_count * PARTS_PER_THREAD, n // SPLIT_ALIGN)
    if _count < 2 or parts < 2 or m * k * n < SPLIT_MIN_WORK:
        if before is not None:
            before(0, n)
        np.matmul(a, b, out=out)
        return
    step = -(-n // parts // SPLIT_ALIGN) * SPLIT_ALIGN
    todo = SimpleQueue()
    for c in range(0, n, step):
        todo.put(c)

    def work():
        while True:
            try:
                c = todo.get_nowait()
            except Empty:
                return
            if before is not None:
                before(c, min(n, c + step))
            np.matmul(a, b[:, c:c + step], out=out[:, c:c + step])

    pool = _workers(_count - 1)
    futures = [pool.submit(work) for _ in range(min(_count, todo.qsize()) - 1)]
    try:
        work()
    finally:
        for f in futures:
            f.result()
