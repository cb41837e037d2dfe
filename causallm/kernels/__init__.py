"""numba kernels: @njit(cache=True) functions over float32 C-contiguous arrays.

Conventions: activations are 3-D (B, H, W) = (batch, rows of this step, features); a call
processes rows [0, nrows) of every batch (or the explicit row offsets it is given). Outputs
and scratch are passed in, never allocated on the per-token path. Kernels know nothing of
layers or configs; each has a plain-numpy twin in tests/reference.py.

Modules: linear (fully connected), norm (rms_norm), layer_norm, rope (tables), attention (KV
cache write and attention), elementwise (activations, add, softmax), quant (ggml's block types,
and the norm / swiglu / multiply rows that round their output for them), softcap, embedding,
embedding_sum (learned positions and token types), pooling (sentence embeddings), moe and
gpt_oss_moe (routing and experts), scan (the load-time weight check), strings (a GGUF's string
arrays, a SentencePiece vocabulary's merges). The families' own kernels are imported from their
modules; this package re-exports the common ones. jit_cache chooses where numba caches them
(a writable folder, whatever the install) and reads a damaged cache file as a miss.
"""

import sys
import time

from causallm.kernels import jit_cache

jit_cache.install()  # before any kernel is declared: where numba caches them, and how

import numba  # noqa: E402
import numba.core.event  # noqa: E402

from causallm.kernels import threads  # noqa: E402
from causallm.kernels.attention import attention, kv_cache_write  # noqa: E402
from causallm.kernels.elementwise import (  # noqa: E402
    ACT_GELU,
    ACT_NONE,
    ACT_RELU,
    ACT_SIGMOID,
    ACT_SILU,
    ACT_TANH,
    ACT_TANH_GELU,
    ACTIVATIONS,
    activation,
    add,
    add_row,
    softmax_rows,
)
from causallm.kernels.embedding import embedding  # noqa: E402
from causallm.kernels.linear import BLAS_MIN_ROWS, linear  # noqa: E402
from causallm.kernels.norm import rms_norm  # noqa: E402
from causallm.kernels.rope import rope_inv_freq, rope_tables  # noqa: E402
from causallm.progress import progress  # noqa: E402


class _CompileNotice(numba.core.event.Listener):
    """Says on stderr when numba compiles a kernel (a cache miss: the first run on a machine,
    or after an edit), once, with where the compiled code is kept and that it takes seconds;
    on a terminal a counter of the kernels compiled follows, naming the one compiling now
    (causallm/progress.py); ``compile_report`` then erases it and says how many and how long
    (kernels compiled after that report, e.g. during generation, are counted for the next
    report without a counter). A cache hit triggers no compile event and prints nothing."""

    def __init__(self):
        self.depth = 0
        self.kernels = 0
        self.seconds = 0.0
        self.announced = False
        self.bar = None
        self.reported = False
        self._t0 = 0.0

    def on_start(self, event):
        self.depth += 1
        if self.depth > 1:  # a callee compiled for its caller
            return
        self._t0 = time.perf_counter()
        if not self.announced:
            self.announced = True
            cache = getattr(getattr(event.data["dispatcher"], "_cache", None), "_cache_path", "")
            where = f"once: they are cached in {cache}" if cache else "not cached"
            sys.stderr.write(f"[numba] compiling kernels for this CPU ({where}): a few "
                             f"seconds ...\n")
            sys.stderr.flush()
        if self.bar is None and not self.reported:  # later compiles: no bar amid the output
            self.bar = progress(None, "[numba] compiling", "kernel(s)")
        if self.bar is not None:
            self.bar.set_postfix_str(f"now {event.data['dispatcher'].py_func.__name__}")

    def on_end(self, event):
        self.depth -= 1
        if self.depth == 0:
            self.kernels += 1
            self.seconds += time.perf_counter() - self._t0
            if self.bar is not None:
                self.bar.set_postfix_str("", refresh=False)
                self.bar.update()


_notice = _CompileNotice()
numba.core.event.register("numba:compile", _notice)


def compile_report() -> None:
    """One stderr line with the kernels compiled since the last report and their time, if any
    (Model.warmup calls it)."""
    if _notice.bar is not None:
        _notice.bar.close()
        _notice.bar = None
    if _notice.kernels:
        _notice.reported = True
        sys.stderr.write(f"[numba] compiled {_notice.kernels} kernel(s) in "
                         f"{_notice.seconds:.1f} s\n")
        sys.stderr.flush()
        _notice.kernels, _notice.seconds = 0, 0.0


def set_num_threads(n):
    """Use n threads in the parallel kernels and the split BLAS products together, clamped to
    [1, NUMBA_NUM_THREADS]; returns it (``threads.set_threads``)."""
    return threads.set_threads(n)


def get_num_threads():
    """Number of threads the kernels use (``threads.threads``)."""
    return threads.threads()


__all__ = [
    "ACT_GELU", "ACT_NONE", "ACT_RELU", "ACT_SIGMOID", "ACT_SILU", "ACT_TANH", "ACT_TANH_GELU",
    "ACTIVATIONS", "BLAS_MIN_ROWS", "activation", "add", "add_row", "attention", "compile_report",
    "embedding",
    "get_num_threads", "kv_cache_write", "linear",
    "rms_norm", "rope_inv_freq", "rope_tables", "set_num_threads", "softmax_rows",
]
