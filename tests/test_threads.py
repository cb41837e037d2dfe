"""One owner of the cores (causallm/kernels/threads.py): ``-t`` governs numba's kernels and
the BLAS products together, in every thread that runs a model. Each pool is asked through its
own query (threadpoolctl reads the BLAS library's, numba its own), not through our variable."""

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_info

import causallm
from causallm import kernels as K
from causallm.kernels import threads as T

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "res", "tiny-llama")
MANY = numba.config.NUMBA_NUM_THREADS >= 2


def blas_threads() -> list[int]:
    """The thread count each BLAS library loaded in this process reports."""
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


@pytest.fixture
def restore_threads():
    before = K.get_num_threads()
    yield
    K.set_num_threads(before)


def test_blas_runs_one_thread_per_call(restore_threads):
    assert blas_threads(), "numpy's BLAS not found by threadpoolctl"
    for n in (1, numba.config.NUMBA_NUM_THREADS):
        K.set_num_threads(n)
        assert blas_threads() == [1] * len(blas_threads())
        assert numba.get_num_threads() == n


@pytest.mark.slow
@pytest.mark.skipif(not MANY, reason="needs NUMBA_NUM_THREADS >= 2")
def test_load_threads_reaches_the_thread_that_runs_the_model(restore_threads):
    """numba keeps its count per Python thread: a server's worker thread must run with the
    count ``load(threads=1)`` chose, not numba's default."""
    model = causallm.load(TINY, threads=1)

    def work():
        model.generate("Hello", max_new_tokens=2)
        return numba.get_num_threads(), blas_threads()

    with ThreadPoolExecutor(1) as worker:
        numba_n, blas_n = worker.submit(work).result()
    assert numba_n == 1 and set(blas_n) == {1}


@pytest.mark.skipif(not MANY, reason="needs NUMBA_NUM_THREADS >= 2")
def test_a_split_product_uses_threads_minus_one_helpers(restore_threads, monkeypatch):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 512), dtype=np.float32)
    b = rng.standard_normal((512, 1024), dtype=np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    matmul = np.matmul
    seen = set()

    def spy(*args, **kwargs):  # a slow part: every thread gets one
        seen.add(threading.current_thread().name)
        time.sleep(0.005)
        return matmul(*args, **kwargs)

    monkeypatch.setattr(T.np, "matmul", spy)
    for n in (1, 2):
        K.set_num_threads(n)
        seen.clear()
        out = np.empty((32, 1024), np.float32)
        T.matmul(a, b, out)
        assert len(seen) == n
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)


def test_split_product_layouts_and_output_views(restore_threads):
    """Both weight layouts (C-contiguous (K, N) and the transpose of (N, K)), written into a
    column slice of a larger output, equal float64 products to float32 rounding."""
    K.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((20, 640), dtype=np.float32)
    w = rng.standard_normal((640, 1000), dtype=np.float32)
    want = a.astype(np.float64) @ w.astype(np.float64)
    for b in (w, np.ascontiguousarray(w.T).T):
        big = np.full((20, 1200), np.nan, np.float32)
        T.matmul(a, b, big[:, 100:1100])
        np.testing.assert_allclose(big[:, 100:1100], want, rtol=1e-4, atol=1e-3)
        assert np.isnan(big[:, :100]).all() and np.isnan(big[:, 1100:]).all()


@pytest.mark.slow
def test_without_threads_blas_is_held_at_one_thread_by_the_first_prefill():
    """No ``threads`` given (the CLI without -t): a prefill of BLAS_MIN_ROWS rows or more runs
    BLAS on one thread all the same, whatever OPENBLAS_NUM_THREADS asked at its start (float32
    weights: a BF16 prompt may multiply on AMX tiles, without BLAS)."""
    code = ("import json\n"
            "import causallm\n"
            "from threadpoolctl import threadpool_info\n"
            f"m = causallm.load({TINY!r}, dtype='FP32')\n"
            "before = [i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']\n"
            "m.generate('Hello ' * 40, max_new_tokens=1)\n"
            "after = [i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']\n"
            "print(json.dumps([before, after]))\n")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    before, after = json.loads(out.stdout.splitlines()[-1])
    assert before == [2] and after == [1]
