"""Benchmark the fully connected kernels: decode matvec bandwidth and the prefill crossover.

Run by hand (not a test):  python bench/bench_kernels.py [--threads 1 2] [--reps 5]

1. Decode (one row): GB/s of weight bytes streamed per call, for
   the numba kernels of W [in, out] (``io_ops``) and W [out, in] (``rows_ops``), run as
   ``linear`` runs them (a team program of their own), and numpy BLAS (np.matmul on either
   layout), for 1024->3072, 3072->1024 and 1024->151936. Each measurement cycles through
   enough weight copies (>= 256 MB) that W comes from DRAM, as it does in a real model whose
   layers do not fit in the last-level cache. 10th percentile of single-call times.
2. Prefill crossover: ms per call of the numba kernels against the BLAS path of linear()
   (one sgemm of nrows rows per batch) for B = 1, 2 and 1024->3072, 3072->1024; the row
   count from which BLAS keeps winning is what linear.BLAS_MIN_ROWS should be. The "oi" line
   runs ``rows_ops`` at every row count: from BLAS_MIN_ROWS rows, where the CPU has AVX-512,
   that is part 3's tiles, which linear() leaves to BLAS for float32 weights.
3. Prompt products of BF16 / F16 rows: GMAC/s of the tiles ``rows_ops`` runs from
   BLAS_MIN_ROWS rows where the CPU has AVX-512 (linear.TILES) against widening the matrix
   and calling BLAS (packed.py's path without them), and float32 rows on both, at 16 to 512
   rows of 1024->3072 and 3072->1024.

Each thread count runs in a child process with OPENBLAS_NUM_THREADS / OMP_NUM_THREADS set, so
numba and BLAS use the same number of threads (BLAS reads it only at import).
"""

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DECODE_SHAPES = [(1024, 3072), (3072, 1024), (1024, 151936)]
PREFILL_SHAPES = [(1024, 3072), (3072, 1024)]
PREFILL_ROWS = [1, 2, 3, 4, 6, 8, 12, 16, 32, 64]
TILE_ROWS = [16, 32, 128, 512]
MIN_BYTES = 256e6  # weight bytes per rotation: well beyond the 32 MB L3 of the test box


def _time(fn, calls, reps):
    """Seconds per call: the 10th percentile of reps * calls single-call timings.

    A low percentile, not the mean, so that a shared machine's other load (which with
    2 threads on 2 cores stalls a parallel call for a whole scheduler slice) does not
    swamp what the kernel itself can do.
    """
    fn(0)  # warm-up (and compile)
    times = []
    for c in range(reps * calls):
        t0 = time.perf_counter()
        fn(c)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 10]


def child(threads, reps):
    # causallm first: it sets the OpenBLAS / OpenMP spin times the CLI runs with, which only
    # take effect if they are in the environment before numpy and numba load
    from causallm import kernels as K
    import importlib
    lin = importlib.import_module("causallm.kernels.linear")  # the module, not the function

    import numpy as np

    K.set_num_threads(threads)
    rng = np.random.default_rng(0)
    empty = np.zeros(0, np.float32)

    print(f"## threads = {threads} (numba {K.get_num_threads()}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')})")
    print("decode, 1 row: GB/s of weights (10th percentile of call times)")
    print(f"{'in->out':>14} {'MB':>7} {'numba[io]':>10} {'numba[oi]':>10} {'blas[io]':>10} "
          f"{'blas[oi]':>10}")
    for k_in, n_out in DECODE_SHAPES:
        nbytes = k_in * n_out * 4
        copies = max(1, int(-(-MIN_BYTES // nbytes)))
        w_io = [rng.standard_normal((k_in, n_out), dtype=np.float32) for _ in range(copies)]
        w_oi = [np.ascontiguousarray(w.T) for w in w_io]
        x = rng.standard_normal((1, 1, k_in), dtype=np.float32)
        y = np.zeros((1, 1, n_out), np.float32)
        calls = max(copies, 8)
        runs = {
            "io": lambda c: lin.run_ops(lin.io_ops(x, w_io[c % copies], empty, y, 0, 0, 1),
                                        k_in * n_out),
            "oi": lambda c: lin.run_ops(lin.rows_ops(lin.FP32, x, w_oi[c % copies], empty, y,
                                                     0, 0, 1), k_in * n_out),
            "blas_io": lambda c: np.matmul(x[0], w_io[c % copies], out=y[0]),
            "blas_oi": lambda c: np.matmul(x[0], w_oi[c % copies].T, out=y[0]),
        }
        gbs = {name: nbytes / _time(fn, calls, reps) / 1e9 for name, fn in runs.items()}
        print(f"{k_in:>6}->{n_out:<7} {nbytes / 1e6:7.1f} {gbs['io']:10.1f} {gbs['oi']:10.1f} "
              f"{gbs['blas_io']:10.1f} {gbs['blas_oi']:10.1f}", flush=True)
        del w_io, w_oi, runs

    print("prefill: ms per call, numba kernel vs linear()'s BLAS path (bias added), weights hot")
    for k_in, n_out in PREFILL_SHAPES:
        w = rng.standard_normal((k_in, n_out), dtype=np.float32)
        wt = np.ascontiguousarray(w.T)
        bias = rng.standard_normal(n_out, dtype=np.float32)
        for batch in (1, 2):
            print(f"{k_in}->{n_out}, B={batch}:  rows  " + " ".join(f"{r:>6}" for r in PREFILL_ROWS))
            line = {"io": [], "oi": [], "blas[io]": [], "blas[oi]": []}
            for nrows in PREFILL_ROWS:
                x = rng.standard_normal((batch, nrows, k_in), dtype=np.float32)
                y = np.zeros((batch, nrows, n_out), np.float32)

                def blas(c, wl):
                    for b in range(batch):
                        out = y[b, 0:nrows]
                        np.matmul(x[b, 0:nrows], wl, out=out)
                        out += bias
                calls = 20
                line["io"].append(_time(lambda c: lin.run_ops(
                    lin.io_ops(x, w, bias, y, 0, 0, nrows), w.size), calls, reps))
                line["oi"].append(_time(lambda c: lin.run_ops(
                    lin.rows_ops(lin.FP32, x, wt, bias, y, 0, 0, nrows), w.size), calls, reps))
                line["blas[io]"].append(_time(lambda c: blas(c, w), calls, reps))
                line["blas[oi]"].append(_time(lambda c: blas(c, wt.T), calls, reps))
            for name, ts in line.items():
                print(f"{'':>20}{name:>10} " + " ".join(f"{t * 1e3:6.2f}" for t in ts))
            for layout in ("io", "oi"):
                # smallest nrows from which BLAS is faster at every measured larger count
                cross = None
                for r, tn, tb in reversed(list(zip(PREFILL_ROWS, line[layout], line[f"blas[{layout}]"]))):
                    if tb >= tn:
                        break
                    cross = r
                print(f"{'':>20}crossover ({layout}): BLAS faster from nrows = {cross or 'never'}"
                      + (f" (B*nrows = {batch * cross})" if cross else ""), flush=True)

    if not lin.TILES:
        print("prompt tiles: this CPU has no AVX-512 (linear.TILES is False)")
        return
    print("prompt products: GMAC/s, tiles vs widened + BLAS (bf16, f16) and float32 rows")
    from causallm.kernels import packed
    from causallm.kernels.threads import matmul
    for k_in, n_out in PREFILL_SHAPES:
        wt = rng.standard_normal((n_out, k_in), dtype=np.float32)
        wide = np.empty_like(wt)
        for nrows in TILE_ROWS:
            x = rng.standard_normal((1, nrows, k_in), dtype=np.float32)
            y = np.zeros((1, nrows, n_out), np.float32)
            cells = []
            for fmt, form in (("BF16", lin.BF16), ("F16", lin.F16)):
                bits = packed.pack_rows(fmt, n_out, k_in, lambda r0, r1: wt[r0:r1])

                def widened(c):
                    matmul(x[0], wide.T, y[0], lambda c0, c1: packed._widen_rows(
                        bits[c0:c1], wide[c0:c1], fmt == "BF16"))
                tiles = _time(lambda c: lin.run_ops(lin.rows_ops(
                    form, x, bits, empty, y, 0, 0, nrows), bits.size), 5, reps)
                cells.append(f"{fmt.lower()} {_gmacs(nrows, wt, tiles):5.1f} / "
                             f"{_gmacs(nrows, wt, _time(widened, 5, reps)):5.1f}")
            tiles = _time(lambda c: lin.run_ops(lin.rows_ops(
                lin.FP32, x, wt, empty, y, 0, 0, nrows), wt.size), 5, reps)
            blas = _time(lambda c: matmul(x[0], wt.T, y[0]), 5, reps)
            cells.append(f"fp32 {_gmacs(nrows, wt, tiles):5.1f} / {_gmacs(nrows, wt, blas):5.1f}")
            print(f"{k_in}->{n_out}, {nrows:>3} rows:  " + "   ".join(cells), flush=True)


def _gmacs(nrows, wt, seconds):
    return nrows * wt.size / seconds / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=5, help="rounds of calls per measurement")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, ROOT)
        child(args.child, args.reps)
        return
    for n in args.threads:
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n))
        subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(n),
                        "--reps", str(args.reps)], env=env, check=True)


if __name__ == "__main__":
    main()
