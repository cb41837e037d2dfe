"""NNTrainer's CausalLM engine in Python: the graph API, registry, weights and kernels."""

import os as _os

# numba's OpenMP pool spins for a long while after each parallel region by default, taking the
# cores from the threads that run the prefill matrix products (causallm/kernels/threads.py);
# a short spin measured about twice the prefill speed and removed a slow first decode step
# (bench/README.md). It must be set before numba loads, so this module is imported first by
# main.py; settings already in the environment win. (numpy's BLAS runs one thread per call,
# kernels/threads.py, so its own pool's spin no longer matters.)
#
# numba's LLVM optimization level: at 3 (numba's default) LLVM spends about 1.2 s more on the
# first compile of the parallel packed-weight kernels alone, and the kernels measured no faster
# than at 2 (Qwen3-0.6B shape decode, BF16 / Q8_0 / Q4_0 / FP32; docs/performance.md). Level 1
# loses up to 15 %.
for _key, _value in (("GOMP_SPINCOUNT", "10000"), ("NUMBA_OPT", "2")):
    _os.environ.setdefault(_key, _value)


def _avx512_blas() -> None:
    """OpenBLAS picks its Haswell (AVX2) kernels on some AVX-512 CPUs (Zen 4 here); its
    SkylakeX kernels need AVX-512 F/DQ/BW/VL, which the kernel lists in /proc/cpuinfo only when
    the OS enables them. Where it does, ask for them: float32 matrix products 199 -> 322 GFLOP/s
    on 2 Zen 4 cores (docs/performance.md). A choice already in the environment wins."""
    if "OPENBLAS_CORETYPE" in _os.environ:
        return
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
            else:
                return
    except OSError:
        return
    if {"avx512f", "avx512dq", "avx512bw", "avx512vl"} <= flags:
        _os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"


_avx512_blas()

# The application's modules (main.py, factory.py, models/, layers/) are this package's too:
# imported as causallm.main, causallm.factory, causallm.models, causallm.layers. In the source
# tree they lie beside the package, at the repository's root, which joins the package's path;
# an installed copy holds them inside the package (setup.py puts them there), so no generic
# top-level name (main, models, ...) enters site-packages.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if (_os.path.isfile(_os.path.join(_root, "factory.py"))
        and not _os.path.isfile(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)),
                                              "factory.py"))):
    __path__.append(_root)  # noqa: F821  (a package's own __path__)

from causallm.errors import CausalLMError  # noqa: E402

__all__ = ["CausalLMError", "load"]


def load(path: str, **options):
    """A model folder or .gguf file, loaded for ``generate`` / ``stream`` / ``embed``: see
    causallm/loader.py (``options``: dtype, kv_dtype, threads, plugins, nntr_config keys and
    generation options, the defaults of every call; anything else is an error)."""
    from causallm.loader import load as _load

    return _load(path, **options)
