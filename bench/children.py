"""What the benchmarks share: each engine runs in a child process of the script, with every
thread pool (OpenMP, OpenBLAS, MKL, numba) sized before import, and reports one JSON line."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

MARK = "@@BENCH_JSON@@ "
"""Prefix of the one stdout line a child reports on."""
SEED = 1234
"""Seed of every random model and input."""


@contextlib.contextmanager
def new_folder(folder: str):
    """A temporary folder beside ``folder`` to write a model into, renamed to ``folder`` when
    the block ends without an error and removed otherwise: a half-written model is never
    taken for a made one."""
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(folder) + ".tmp", dir=parent)
    try:
        yield tmp
        os.replace(tmp, folder)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)


def report(result: dict) -> None:
    """A child's result: one marked JSON line on stdout."""
    print(MARK + json.dumps(result), flush=True)


def peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def spawn(script: str, args: list[str], threads: int) -> dict:
    """Run ``script --child ARGS`` with every thread pool sized to ``threads``; the result it
    reported."""
    n = str(threads)
    env = dict(os.environ, OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, MKL_NUM_THREADS=n,
               NUMBA_NUM_THREADS=n)
    proc = subprocess.run([sys.executable, os.path.abspath(script), "--child", *args], env=env,
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {args[0]} failed (exit {proc.returncode})")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if not lines:
        raise SystemExit(f"child {args[0]} reported nothing")
    return json.loads(lines[-1][len(MARK):])
