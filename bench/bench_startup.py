"""Start to first token of the embedded model (``python main.py``, res/tiny-llama), cold and warm.

A run is ``python main.py -n N [ARGS]`` spawned with stdout and stderr on pipes; its time to the
first token is the seconds from spawning it to the first byte of generated text on its stdout
(what a user sees; the prompt is not echoed), its total the seconds to its exit. Its peak RSS is
the child's own, from the rusage ``os.wait4`` returns.

- *cold*: numba's kernel cache is empty: ``NUMBA_CACHE_DIR`` is a new empty folder;
- *warm*: the same folder after a cold run filled it.

A round is a cold run in a new folder, then ``--warm`` warm runs in it; with several ``--main``
(trees to compare: ``git worktree`` or ``git archive`` copies) each round runs every tree in
turn, so a busy moment of a shared machine falls on all. The table shows each kind's best and
median, and the CPU seconds of the process (user + system), which other processes on the
machine disturb less than the wall time. The stderr lines the first cold run printed (the
compile notice) are shown with the second each appeared at. Bytecode writing is allowed in
the runs whatever the shell says (``PYTHONDONTWRITEBYTECODE``): an installed package has it.

    python bench/bench_startup.py [--rounds 3] [--warm 2] [-n 1] [--main PATH ...] [--json]
                                  [-- MAIN_ARGS ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from children import busy_cores  # noqa: E402


def timed_run(cmd: list[str], env: dict, timeout: float = 300) -> dict:
    """Run ``cmd``: ``first_s`` (spawn to its first stdout byte), ``wall_s`` (to its exit),
    ``cpu_s`` (its user + system CPU seconds, whole run), ``peak_rss_mb``, ``rc``, ``stdout`` and ``stderr_lines`` as (second, line)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    first = [None]
    out, err = [], []

    def read_out():
        while True:
            chunk = proc.stdout.read(1 if first[0] is None else 65536)
            if not chunk:
                return
            if first[0] is None:
                first[0] = time.perf_counter() - t0
            out.append(chunk)

    def read_err():
        for line in iter(proc.stderr.readline, b""):
            err.append((time.perf_counter() - t0, line.decode(errors="replace").rstrip()))

    readers = [threading.Thread(target=f, daemon=True) for f in (read_out, read_err)]
    for r in readers:
        r.start()
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    timer.cancel()
    for r in readers:
        r.join()
    return {"first_s": first[0], "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024,
            "rc": os.waitstatus_to_exitcode(status),
            "stdout": b"".join(out).decode(errors="replace"), "stderr_lines": err}


def summary(runs: list[dict]) -> dict:
    firsts = [r["first_s"] for r in runs]
    walls = [r["wall_s"] for r in runs]
    return {"first_best_s": min(firsts), "first_median_s": statistics.median(firsts),
            "first_runs_s": firsts, "wall_best_s": min(walls),
            "wall_median_s": statistics.median(walls),
            "cpu_best_s": min(r["cpu_s"] for r in runs),
            "peak_rss_mb": min(r["peak_rss_mb"] for r in runs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="cold runs, each in a new cache (3)")
    ap.add_argument("--warm", type=int, default=2, help="warm runs after each cold one (2)")
    ap.add_argument("-n", type=int, default=1, help="tokens to generate (1)")
    ap.add_argument("--main", action="append", default=None,
                    help="the CLI to run (this tree's main.py); repeat to compare trees, "
                         "their rounds interleaved")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("rest", nargs="*", help="after --: more arguments for main.py")
    args = ap.parse_args(argv)
    mains = args.main or [os.path.join(ROOT, "main.py")]
    # a user's install has its bytecode written (pip compiles it); a shell that forbids
    # writing it would time the compile of every module on every run
    env0 = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    busy = busy_cores()
    runs = {m: {"cold": [], "warm": [], "notice": []} for m in mains}
    for i in range(args.rounds):
        for m in mains:
            cmd = [sys.executable, m, "-n", str(args.n), *args.rest]
            cache = tempfile.mkdtemp(prefix="causallm-startup-")
            env = dict(env0, NUMBA_CACHE_DIR=cache)
            try:
                for kind in ["cold"] + ["warm"] * args.warm:
                    r = timed_run(cmd, env)
                    if r["rc"] != 0 or r["first_s"] is None:
                        tail = r["stderr_lines"][-1][1] if r["stderr_lines"] else ""
                        sys.exit(f"{' '.join(cmd)} failed (exit {r['rc']}): {tail}")
                    runs[m][kind].append(r)
                    if kind == "cold" and i == 0:
                        runs[m]["notice"] = r["stderr_lines"]
                    if not args.json:
                        print(f"{m} round {i + 1} {kind}: first token {r['first_s']:.2f} s, "
                              f"exit {r['wall_s']:.2f} s, CPU {r['cpu_s']:.2f} s, "
                              f"peak RSS {r['peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    doc = {"busy_cores_before": busy, "n": args.n, "args": args.rest, "trees": [
        {"main": m, "cold": summary(runs[m]["cold"]),
         "warm": summary(runs[m]["warm"]) if runs[m]["warm"] else None,
         "cold_stderr": [[round(t, 2), line] for t, line in runs[m]["notice"]]}
        for m in mains]}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    if busy is not None and busy > 0.25:
        print(f"NOTE: other processes kept {busy:.2f} cores busy before the run", flush=True)
    for tree in doc["trees"]:
        print(f"{tree['main']}: first cold run's stderr (second: line):")
        for t, line in tree["cold_stderr"]:
            print(f"  {t:6.2f}: {line}")
        print(f"{'':6} {'first token best':>17} {'median':>8} {'exit best':>10} {'CPU best':>9} "
              f"{'peak RSS':>9}")
        for kind in ("cold", "warm"):
            s = tree[kind]
            if s:
                print(f"{kind:6} {s['first_best_s']:16.2f}s {s['first_median_s']:7.2f}s "
                      f"{s['wall_best_s']:9.2f}s {s['cpu_best_s']:8.2f}s "
                      f"{s['peak_rss_mb']:7.0f}MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
