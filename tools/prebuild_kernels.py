"""Compile the embedded model's kernels ahead of time for CPU levels: causallm/kernels/prebuilt/.

A first run of ``python main.py`` on a machine compiles the kernels it calls (about 10 s on a
2-core VM), and numba caches them for later runs. A prebuilt folder is such a cache made here,
once, for a CPU level rather than for this CPU: the runs below set ``NUMBA_CPU_NAME`` /
``NUMBA_CPU_FEATURES`` to the level, so LLVM uses only its instructions and numba keys every
entry by it; kernels/jit_cache.py looks there first on any machine whose CPU has the level's
features and lowers the vector operations the same way (kernels/simd.py ``LEVEL``), so a user's
first run reads them back instead of compiling.

The runs: the README's ``python main.py``, a sampled one-thread run, a long two-thread greedy run
(attention over many keys), a beam search, and ``python -m causallm.warmup``: every kernel the
embedded model's usual commands call. For a level this machine can execute, they run as they
are, and so do runs of the real GGUF files the tests use when their packages are installed
(tests/real_files.py: SmolLM2-135M Q4_1, Gemma 3 270M Q4_K_M; short and long prompts, one and
two threads): their vocabulary's kernels serve any GGUF file's first run, and their block types'
products (Q4_1, Q5_0, Q8_0, Q4_K, Q6_K) any file of those types. For a level it cannot execute
(AVX-512 on an AVX2 CPU), the embedded model's runs go with every kernel call replaced by a
compile for its arguments' types (``COMPILE_ONLY``): what a run compiles depends on the types it
passes, never on the values it computes (the x86-64-v3 folder made that way held exactly the
entries of real runs). A GGUF run reads what its vocabulary's kernels compute, so in such a run
those kernels run too (``TOKENIZER_MODULES``): a level whose instructions this CPU has but for
AMX's tiles (x86-64-v4-amx on an AVX-512 CPU without AMX) gets the real files' kernels that
way; a level whose vector instructions it lacks holds the embedded model's kernels alone until
the tool runs on a machine of that level. A level the machine can execute is then checked: a
run on an empty cache compiles nothing (tests/test_numba_cache.py also compares its tokens with
a run that compiles for the machine). A level's entries are valid for the sources, Python and numba they
were made with (the key and the file names carry them); jit_cache compiles whatever they do not
hold. Run it after any change to causallm/kernels/ (tests/test_numba_cache.py fails until then):

    python tools/prebuild_kernels.py [--level LEVEL ...]   # 30 s to 3 min a level
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREBUILT = os.path.join(ROOT, "causallm", "kernels", "prebuilt")

sys.path.insert(0, ROOT)
from causallm.kernels.simd import TARGETS, target_needs  # noqa: E402

FOLDERS = {"avx2": "x86-64-v3", "vnni": "x86-64-v4", "amx": "x86-64-v4-amx"}
"""The levels built (kernels/simd.py's TARGETS: x86-64-v3, x86-64-v4 with AVX-512 VNNI, and that
with AMX's int8 tiles), each with its folder."""
LEVELS = tuple(FOLDERS)

COMPILE_ONLY = """
import os, runpy, sys
import causallm.kernels  # noqa: F401  (the kernels' cache, jit_cache.install)
from numba.core import dispatcher

real = set(filter(None, os.environ.get("PREBUILD_RUN_MODULES", "").split(",")))
call = dispatcher.Dispatcher.__call__

def compile_only(self, *args):
    if self.py_func.__module__ in real:
        return call(self, *args)
    self.compile(tuple(self.typeof_pyval(a) for a in args))

dispatcher.Dispatcher.__call__ = compile_only
sys.argv = sys.argv[1:]
if sys.argv[0] == "-m":
    del sys.argv[0]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""Run a script (or ``-m module``) with every numba kernel call compiling for the arguments'
types and running nothing: the buffers keep whatever they held, the generated tokens are
nonsense, and the kernels a real run calls are compiled. The kernels of the modules that
PREBUILD_RUN_MODULES names run as well (TOKENIZER_MODULES: a GGUF vocabulary's, whose results a
run reads)."""

TOKENIZER_MODULES = "causallm.kernels.bpe,causallm.kernels.strings"
"""The kernels a GGUF file's vocabulary is read and built by: they run in a compile-only run of
a level whose instructions this CPU has but for AMX's (none of them uses a tile)."""

RUNS = [
    ["main.py"],
    ["main.py", "-n", "40", "--temp", "0.8", "--top-p", "0.9", "--seed", "1", "-t", "1"],
    ["main.py", "res/tiny-llama", "word " * 300, "-n", "40", "--greedy", "-t", "2"],
    ["main.py", "-n", "8", "--num-beams", "3"],
    ["-m", "causallm.warmup"],
]


def real_file_runs(folder: str) -> list[list[str]]:
    """Runs of the real GGUF files whose packages are installed (their parts joined into
    ``folder``)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import real_files

    files = []
    if not real_files.SMOLLM2_MISSING:
        files.append(real_files.smollm2_path())
    if not real_files.GEMMA3_MISSING:
        files.append(real_files.join_gemma3(folder))
    long = "The history of the city is long and full of events. " * 12
    return [args for f in files for args in (
        ["main.py", f, "What is a tuple?", "-n", "16"],
        ["main.py", f, long, "-n", "4", "-t", "1"],
        ["main.py", f, long, "-n", "4", "-t", "2"])]


def build(level: str, runnable: bool, tokenizes: bool) -> str:
    """The level's folder, from real runs (``runnable``) or compile-only ones, with the real
    GGUF files too when the level's vocabulary kernels run here (``tokenizes``)."""
    cpu, features = TARGETS[level]
    cache = tempfile.mkdtemp(prefix="causallm-prebuild-")
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES=features,
               PYTHONPATH=ROOT, PREBUILD_RUN_MODULES=TOKENIZER_MODULES if tokenizes else "")
    try:
        runs = RUNS + real_file_runs(cache) if runnable or tokenizes else RUNS
        for args in runs:
            how = [] if runnable else ["-c", COMPILE_ONLY]
            run = subprocess.run([sys.executable, *how, *args], cwd=ROOT, env=env,
                                 capture_output=True, text=True)
            if run.returncode:
                sys.exit(f"prebuild_kernels: {' '.join(args)[:60]} failed:\n{run.stderr}")
        files = sorted(glob.glob(os.path.join(cache, "*", "*.nb[ic]")))
        magic = _magic(f for f in files if f.endswith(".nbi"))
        out = os.path.join(PREBUILT, FOLDERS[level])
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        for f in files:
            shutil.copy(f, out)
        from numba import __version__ as numba_version
        target = {"triple": magic[0], "cpu": magic[1], "features": magic[2], "level": level,
                  "f16c": "+f16c" in magic[2].split(","), "numba": numba_version,
                  "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}
        with open(os.path.join(out, "target.json"), "w") as f:
            json.dump(target, f, indent=1)
            f.write("\n")
        return out
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _magic(indexes) -> tuple:
    """The one target (numba's magic tuple) every entry of the index files is keyed by."""
    seen = set()
    for path in indexes:
        with open(path, "rb") as f:
            pickle.load(f)  # numba's version
            _, overloads = pickle.loads(f.read())
        seen.update(key[1] for key in overloads)
    if len(seen) != 1:
        sys.exit(f"prebuild_kernels: expected one target in the built cache, found {seen}")
    return seen.pop()


def check() -> str:
    """Run ``main.py -n 1`` with an empty cache: stderr, which names any kernel compiled."""
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
        run = subprocess.run([sys.executable, "main.py", "-n", "1"], cwd=ROOT, capture_output=True,
                             text=True, env=dict(env, NUMBA_CACHE_DIR=cache, PYTHONPATH=ROOT))
        return run.stderr


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--level", choices=LEVELS, nargs="+", default=LEVELS)
    args = p.parse_args()
    import llvmlite.binding as llvm
    host = {name for name, on in llvm.get_host_cpu_features().items() if on}
    for level in args.level:
        needs = target_needs(level)
        tiles = {f for f in needs if f.startswith("amx")}
        out = build(level, needs <= host, needs - tiles <= host)
        n = len(glob.glob(os.path.join(out, "*.nbi")))
        if not needs <= host:
            print(f"{os.path.relpath(out, ROOT)}: {n} kernels (compiled, not run: this CPU lacks "
                  f"{', '.join(sorted(needs - host))})")
            continue
        stderr = check()
        print(f"{os.path.relpath(out, ROOT)}: {n} kernels")
        if "compiling kernels" in stderr:
            print("note: a first run here still compiles (this CPU lowers the vector operations "
                  "at another level):\n" + stderr)


if __name__ == "__main__":
    main()
