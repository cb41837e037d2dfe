"""The block-type kernels of this tree against those of another revision, in one process.

Run by hand (not a test):

    python bench/bench_quant_ab.py --rev REV [--types Q4_1 Q4_K ...] [--shapes 2048x1024 ...]
                                   [--rows 1 128] [-t 1] [--pairs 15] [--json]

This machine's speed drifts between processes by more than most kernel changes (10-25 %
between runs of the same binary an hour apart), so two trees timed in two processes cannot be
compared. Here ``causallm/kernels/quant.py`` of ``--rev`` (``git show REV:...``) is imported
beside this tree's, under another name, and the two products run alternately on the same
stored blocks and activations: a pair is one call of each (several calls for one row), and the
table gives the median over ``--pairs`` pairs of new time / old time, with each side's
GMAC/s from its best call and whether the outputs are bit-identical. The revision's file uses
this tree's ``simd.py`` and the rest of ``causallm.kernels``, so a revision whose quant.py needs
vector operations this tree lacks cannot be compared. A kernel against itself (``--rev
HEAD`` with no change) reads 0.9-1.1 here: differences inside that band are noise.

Weights are random block bytes with every fp16 scale 0.01 (the timing does not depend on the
values); activations are random normal floats rounded as the type's activation format.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def revision_module(rev: str):
    """quant.py of ``rev``, imported as a module of its own."""
    source = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:causallm/kernels/quant.py"],
                            capture_output=True, text=True, check=True).stdout
    folder = tempfile.mkdtemp(prefix="quant-ab-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the file and numba's cache
    path = os.path.join(folder, "quant_rev.py")  # numba caches its kernels beside it
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("quant_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_blocks(qtype, N: int, K: int, rng):
    """(N, row bytes) uint8 of random blocks whose fp16 scales are 0.01."""
    import numpy as np

    w = rng.integers(0, 256, size=(N, qtype.row_bytes(K)), dtype=np.uint8)
    blocks = w.reshape(N, K // qtype.qk, qtype.nbytes)
    half = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    for o in qtype.halves:
        blocks[:, :, o:o + 2] = half
    return w


def compare(new, old, name: str, N: int, K: int, T: int, pairs: int, rng) -> dict:
    import numpy as np

    w = random_blocks(new.QTYPES[name], N, K, rng)
    x = rng.standard_normal((1, T, K)).astype(np.float32)
    bias = np.zeros(0, np.float32)
    calls = max(1, 2_000_000 // (N * K * T // 64 + 1))  # a call of a few ms at least
    sides = []
    for m in (new, old):
        qt = m.QTYPES[name]
        q, d, s, u = (a.copy() for a in m.quantize_activations(qt.act, x, 0, T))
        y = np.empty((1, T, N), np.float32)
        rows = qt.kernels[1] if m.threads() > 1 else qt.kernels[0]
        # the room for unpacked weight panels, in revisions whose kernels take it
        extra = (m.scratch(qt, q),) if hasattr(m, "scratch") else ()
        held = m.held(qt, w) if hasattr(m, "held") else w  # the layout the kernels read
        rows(held, q, d, s, u, bias, y, 0, T, *extra)  # compile or load
        sides.append((rows, (held, q, d, s, u, bias, y, 0, T, *extra), y))

    def timed(side):
        rows, args, _ = side
        t = time.perf_counter()
        for _ in range(calls):
            rows(*args)
        return (time.perf_counter() - t) / calls

    ratios, best = [], [float("inf"), float("inf")]
    for _ in range(pairs):
        a, b = timed(sides[0]), timed(sides[1])
        ratios.append(a / b)
        best = [min(best[0], a), min(best[1], b)]
    macs = N * K * T
    return {"type": name, "shape": f"{N}x{K}", "rows": T,
            "new_over_old": statistics.median(ratios),
            "new_gmacs": macs / best[0] / 1e9, "old_gmacs": macs / best[1] / 1e9,
            "identical": bool(np.array_equal(sides[0][2], sides[1][2]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rev", required=True, help="the git revision to compare against")
    ap.add_argument("--types", nargs="+", default=["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K",
                                                   "Q6_K"])
    ap.add_argument("--shapes", nargs="+", default=["2048x1024"],
                    help="N x K: output rows x values a row")
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 128],
                    help="activation rows: 1 is decode, more a prompt")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import numpy as np

    from causallm.kernels import quant as new
    from causallm.kernels.threads import set_threads

    set_threads(args.threads)
    old = revision_module(args.rev)
    rng = np.random.default_rng(0)
    results = []
    for name in args.types:
        for shape in args.shapes:
            N, K = (int(v) for v in shape.lower().split("x"))
            for T in args.rows:
                results.append(compare(new, old, name, N, K, T, args.pairs, rng))
                if not args.json:
                    r = results[-1]
                    print(f"{r['type']:<7}{r['shape']:>11}{T:>5} rows  new/old time "
                          f"{r['new_over_old']:.3f}  GMAC/s new {r['new_gmacs']:.1f} old "
                          f"{r['old_gmacs']:.1f}  {'bit-identical' if r['identical'] else 'differs'}")
    if args.json:
        print(json.dumps({"rev": args.rev, "threads": args.threads, "results": results}))


if __name__ == "__main__":
    main()
