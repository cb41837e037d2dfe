"""Compile a model's kernels for this CPU ahead of its first run.

    python -m causallm.warmup [MODEL ...] [--dtype FMT] [--kv-dtype FP32|FP16]

numba compiles each kernel at its first call and caches the machine code (kernels/jit_cache.py
chooses where); the first run of a model on a machine pays that compile, seconds, before its
first token, less where the package's prebuilt kernels serve this CPU (kernels/jit_cache.py:
none for the embedded model). pip cannot run code when it installs a package, so an install
that wants the user's first run to be warm runs this after ``pip install``: it loads each MODEL
(a folder or a .gguf file; the embedded model, res/tiny-llama, when none is named) as
``causallm.load`` does, with the same weight and KV-cache formats as the run will use (kernels
compile per format), which runs the model's warm-up step (``Model.warmup``: every stage's
kernels, compiled or loaded), and generates nothing. It prints the compile notice on stderr as
a first run would, and one line per model with its seconds. Exit status 0, or 2 with the
one-line error of a model that cannot be loaded.
"""

from __future__ import annotations

import sys
import time


def main(argv: list[str] | None = None) -> int:
    import causallm  # noqa: F401  (first: it sizes the thread pools before numpy loads)
    from causallm.errors import CausalLMError
    from causallm.main import DEFAULT_MODEL_DIR, WARMUP, Parser, add_options

    p = Parser(prog="python -m causallm.warmup", description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=[DEFAULT_MODEL_DIR],
                   help="model folders or .gguf files (default: the embedded model)")
    add_options(p, WARMUP)  # --dtype, --kv-dtype: the formats the runs will use
    args = p.parse_args(argv)
    from causallm.loader import load

    for path in args.models:
        t0 = time.perf_counter()
        try:  # a load ends with the model's warm-up step: its kernels compiled or loaded
            load(path, dtype=args.dtype, kv_dtype=args.kv_dtype)
        except CausalLMError as e:
            sys.stderr.write(f"error: {e}\n")
            return 2
        sys.stderr.write(f"[warmup] {path}: kernels ready in {time.perf_counter() - t0:.1f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
