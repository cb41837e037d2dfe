"""What the benchmarks share: each engine runs in a child process of the script, with every
thread pool (OpenMP, OpenBLAS, MKL, numba) sized before import, and reports one JSON line
(``spawn``); a program timed from the outside runs alone under ``measured_run`` (wall time,
its own peak RSS). Also: how busy the machine was, our pp / tg timing loop, llama.cpp's logging
silenced, and the quality measures against a reference (KL, top token, leading agreement)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

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


class ChildFailed(SystemExit):
    """A child that exited non-zero, ran past its time or reported nothing; the message is one
    line. A SystemExit, so a script that does not catch it stops with that line."""


def thread_env(threads: int) -> dict:
    """The environment with every thread pool (OpenMP, OpenBLAS, MKL, numba) sized to
    ``threads``."""
    n = str(threads)
    return dict(os.environ, OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, MKL_NUM_THREADS=n,
                NUMBA_NUM_THREADS=n)


def last_line(text: str) -> str:
    """The last non-empty line of ``text`` (a failure's reason), or ''."""
    return next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")


def spawn(script: str, args: list[str], threads: int, timeout: float | None = None,
          quiet: bool = False, python: str | None = None) -> dict:
    """Run ``script --child ARGS`` with every thread pool sized to ``threads``; the result it
    reported. ``timeout`` seconds at most; ``quiet`` keeps the child's stderr, whose last line
    then explains a failure, off the terminal; ``python``: the interpreter (this one). A
    failure raises ChildFailed."""
    try:
        proc = subprocess.run([python or sys.executable, os.path.abspath(script), "--child",
                               *args],
                              env=thread_env(threads), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE if quiet else None, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"child {args[0]} ran past {timeout:.0f} s") from None
    if proc.returncode != 0:
        why = last_line(proc.stderr or "")
        raise ChildFailed(f"child {args[0]} failed (exit {proc.returncode})"
                          + (f": {why}" if why else ""))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if not lines:
        raise ChildFailed(f"child {args[0]} reported nothing")
    return json.loads(lines[-1][len(MARK):])


def measured_run(cmd: list[str], env: dict | None = None, cwd: str | None = None,
                 timeout: float = 600) -> dict:
    """Run ``cmd`` alone and measure it: ``wall_s`` from spawn to exit, ``peak_rss_mb`` (the
    child's own maximum resident set, from the rusage ``os.wait4`` returns for it), ``rc``,
    ``stdout`` and ``stderr``. A run past ``timeout`` seconds is killed (``rc`` is then the
    signal's negative number and ``timed_out`` true). Linux counts in that peak the memory the
    child had before exec, the calling process's own peak: call it from a small process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = {"stdout": b"", "stderr": b""}

    def drain(name, stream):
        out[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, s), daemon=True)
               for n, s in (("stdout", proc.stdout), ("stderr", proc.stderr))]
    for r in readers:
        r.start()
    killed = []

    def kill():
        killed.append(True)
        proc.kill()

    killer = threading.Timer(timeout, kill)
    killer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    killer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    for r in readers:
        r.join()
    return {"wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "rc": proc.returncode,
            "timed_out": bool(killed),
            "stdout": out["stdout"].decode(errors="replace"),
            "stderr": out["stderr"].decode(errors="replace")}


def output_options(ap, cache_dir: str) -> None:
    """The options the real-file benches share on ``ap`` (an ArgumentParser): --json,
    --from-json FILE and --cache-dir DIR (default ``cache_dir``)."""
    ap.add_argument("--json", action="store_true", help="print the results as JSON only")
    ap.add_argument("--from-json", default=None, metavar="FILE",
                    help="print the table of the results a --json run saved, running nothing")
    ap.add_argument("--cache-dir", default=cache_dir)


def print_results(doc: dict, as_json: bool, print_table) -> None:
    """A run's results ``doc`` on stdout: as JSON, or the table ``print_table(doc, out)``
    writes."""
    if as_json:
        print(json.dumps(doc, indent=1))
    else:
        print_table(doc, sys.stdout)


def machine_load(doc: dict) -> str:
    """How busy the machine was around a run whose results ``doc`` holds
    (``busy_cores_before``, ``loadavg_after``), in words."""
    busy = doc["busy_cores_before"]
    return (f"{'?' if busy is None else f'{busy:.2f}'} of {os.cpu_count()} cores busy before "
            f"the start, load average {doc['loadavg_after'][0]:.2f} at the end")


def busy_cores(seconds: float = 1.0) -> float | None:
    """CPU cores kept busy by other processes while this one sleeps ``seconds`` (/proc/stat);
    None where /proc/stat is not available."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return sum(fields[:8]), fields[3] + fields[4]  # total (no guest), idle + iowait
    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (1 - (idle1 - idle0) / max(1, total1 - total0)) * (os.cpu_count() or 1)


@contextlib.contextmanager
def busy_neighbour():
    """Another process keeping one core busy (a Python loop) while the block runs, as a
    neighbour on a shared machine would; it is killed when the block ends, however it ends."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.2)  # running before the measurement starts
        yield proc
    finally:
        proc.kill()
        proc.wait()


def over_rounds(runs: list[dict], keys=("pp", "tg", "tg_depth")) -> dict:
    """One engine's rounds (run in turn with its peer's, ``--rounds``) as one result: the first
    good run's fields, each speed of ``keys`` the median of the good runs' (a noisy host's fast
    or slow minute then counts once), those runs' own under ``rounds``; the first failure when
    no run is good."""
    good = [r for r in runs if "failed" not in r]
    if not good:
        return runs[0]
    out = dict(good[0])
    if len(good) > 1:
        out["rounds"] = {key: [r[key] for r in good] for key in keys
                         if all(key in r for r in good)}
        for key, values in out["rounds"].items():
            out[key] = statistics.median(values)
    return out


def best_pp_tg(model, ids: list[int], D: int, repeat: int) -> tuple[float, float]:
    """Prefill and decode tokens a second of our ``model`` (a loaded CausalLM, EOS off):
    ``generate_tokens`` on the prompt ``ids`` for D + 1 greedy tokens (the prefill gives the
    first, then D steps), timed by its own performance_metrics; the best of ``repeat`` runs
    after one warm-up run."""
    def run():
        model.generate_tokens([ids], max_new_tokens=D + 1, do_sample=False)
        m = model.performance_metrics
        return (len(ids) / m.prefill_duration_ms * 1e3,
                m.generation_tokens / m.generation_duration_ms * 1e3)

    run()
    runs = [run() for _ in range(repeat)]
    return max(r[0] for r in runs), max(r[1] for r in runs)


def depth_steps(model, depth: int, D: int, ids: list[int], repeat: int) -> float:
    """Decode tokens a second of our ``model`` after ``depth`` cached positions: every self
    KV cache's rows [0, depth) first filled with random values of a key's scale (as a prompt
    would leave them: written pages, so attention reads real memory; an untouched cache reads
    the kernel's one zero page), then D single-token steps at positions [depth, depth + D),
    the best of ``repeat`` runs after one warm-up run. Their values do not change the work."""
    import numpy as np

    rng = np.random.default_rng(0)
    for cache in model.model.getKVCaches("self"):
        for a in (cache.key, cache.value):
            rows = rng.standard_normal(a[:, :, :depth].shape, np.float32)
            a[:, :, :depth] = rows.astype(np.float16).view(np.uint16) if a.dtype == np.uint16 \
                else rows
    step = np.zeros((1, 1), np.float32)

    def steps():
        t = time.perf_counter()
        for pos in range(depth, depth + D):
            step[0, 0] = ids[pos % len(ids)]
            model.model.incremental_inference(1, [step], None, 1, pos, pos + 1)
        return D / (time.perf_counter() - t)

    steps()
    return max(steps() for _ in range(repeat))


_LLAMA_LOG = None


def quiet_llama_cpp(llama_cpp) -> None:
    """Silence llama.cpp's logging (one line per tensor) through ``llama_cpp``, the
    llama-cpp-python module; the callback is kept alive as long as the process."""
    global _LLAMA_LOG
    _LLAMA_LOG = llama_cpp.llama_log_callback(lambda level, text, data: None)
    llama_cpp.llama_log_set(_LLAMA_LOG, ctypes.c_void_p())


def log_softmax(logits):
    """log p over the last axis, in float64."""
    import numpy as np

    x = np.asarray(logits, np.float64)
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def kl_top1(ref_logits, logits) -> dict:
    """Of next-token distributions over the same positions, (T, V) logits each: the mean and
    largest KL(ref || other) = sum_v p_ref (log p_ref - log p_other), and the share of rows
    whose argmax agrees. Computed a block of rows at a time (a vocabulary of 262144 makes a
    (T, V) float64 array large)."""
    import numpy as np

    if ref_logits.shape != logits.shape:
        raise SystemExit(f"logits of shape {logits.shape}, the reference's {ref_logits.shape}")
    kl, same = [], 0
    for a in range(0, len(ref_logits), 32):
        ref_lp, lp = log_softmax(ref_logits[a:a + 32]), log_softmax(logits[a:a + 32])
        kl.append(np.sum(np.exp(ref_lp) * (ref_lp - lp), axis=1))
        same += int(np.sum(ref_lp.argmax(1) == lp.argmax(1)))
    kl = np.concatenate(kl)
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "top1": same / len(kl), "positions": len(kl)}


def leading_agreement(reference, tokens) -> int:
    """How many leading tokens of ``tokens`` equal the reference's, before the first
    difference."""
    return next((i for i, (a, b) in enumerate(zip(reference, tokens)) if a != b),
                min(len(reference), len(tokens)))
