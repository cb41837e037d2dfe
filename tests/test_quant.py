"""ggml's block types on their stored bytes (causallm/kernels/quant.py) against numpy twins built on
gguf-py's dequantize (tests/ggml_reference.py): the type table, widening, the activation
rounding, and every type's product, on shapes that are not multiples of the kernels' groups
(4 rows, 16-row tasks) and on each vector path this CPU can run."""

import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
from numba import njit

import ggml_reference as ref
import reference
from causallm.kernels import quant, simd

TYPES = list(quant.QTYPES)


def test_the_types_are_ggmls():
    for name, qt in quant.QTYPES.items():
        assert (qt.qk, qt.nbytes) == ref.block_size(name), name
        assert qt.kind == int(ref.qtype(name)), name
        assert qt.halves == ref.HALVES[name], name
        assert qt.act == {"Q8_0": quant.ACT_Q8_0, "Q8_1": quant.ACT_Q8_1,
                          "Q8_K": quant.ACT_Q8_K}[ref.ACTIVATIONS.get(name, "Q8_K")], name


@pytest.mark.parametrize("name", TYPES)
def test_widening_is_gguf_pys_dequantize(name):
    R, C = 7, 512
    blocks = ref.random_blocks(name, R, C, seed=1)
    out = np.empty((3, C), np.float32)
    qt = quant.QTYPES[name]
    want = ref.dequantize(name, blocks, C)[[6, 0, 3]]
    quant.dequantize_rows(qt, blocks, np.array([6, 0, 3]), out, in_panels=False)
    np.testing.assert_array_equal(out, want)
    out[...] = np.nan
    quant.dequantize_rows(qt, quant.held(qt, blocks), np.array([6, 0, 3]), out,
                          in_panels=qt.panelled)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("act", ["Q8_0", "Q8_1", "Q8_K"])
def test_activations_round_as_ggml(act):
    """The rounded activations, their scales and sums are the twin's (ggml's rounding)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 512)).astype(np.float32)
    x[0, 1, :256] = 0.0                         # an all-zero block
    x[1, 2] = np.round(x[1, 2] * 8) / 8         # values whose scaled copies tie
    x[1, 3, 300] = -40.0                        # a block led by a negative value
    code = {"Q8_0": quant.ACT_Q8_0, "Q8_1": quant.ACT_Q8_1, "Q8_K": quant.ACT_Q8_K}[act]
    q, d, s, u = quant.quantize_activations(code, x, 1, 3)
    rows = x[:, 1:4].reshape(6, 512)
    want, want_s = ref.round_activations(act, rows)
    n = 256 if act == "Q8_K" else 32
    got = q.astype(np.float32).reshape(6, -1, n) * d[:, :512 // n, None]
    np.testing.assert_array_equal(got.reshape(6, 512), want)
    sums = q.astype(np.int32).reshape(6, -1, 16).sum(axis=2)
    if act == "Q8_K":
        np.testing.assert_array_equal(u, sums)
    else:
        np.testing.assert_array_equal(u[:, :16], sums.reshape(6, 16, 2).sum(axis=2))
    if act == "Q8_1":  # (d, s) pairs
        np.testing.assert_array_equal(s[:, 0::2], d[:, :16])
        np.testing.assert_array_equal(s[:, 1::2], want_s)


@pytest.mark.parametrize("act", ["Q8_0", "Q8_1", "Q8_K"])
def test_rows_rounded_where_they_are_made(act):
    """norm_rows (with the residual sum) and glu_rows (swiglu, multiply) write the twin's
    values and round each row exactly as quantize_activations rounds it afterwards."""
    rng = np.random.default_rng(3)
    a, b, up = (rng.standard_normal((2, 4, 512)).astype(np.float32) for _ in range(3))
    gamma = rng.standard_normal(512).astype(np.float32)
    code = {"Q8_0": quant.ACT_Q8_0, "Q8_1": quant.ACT_Q8_1, "Q8_K": quant.ACT_Q8_K}[act]
    norm_rows, glu_rows = quant.row_kernels(code)
    total, y = np.full_like(a, np.nan), np.full_like(a, np.nan)
    q, d, s, u = quant.activation_rows(6, 512)
    norm_rows(a, b, total, gamma, y, 3, 1e-5, q, d, s, u)
    fused = [v.copy() for v in (q, d, s, u)]
    np.testing.assert_array_equal(total[:, :3], a[:, :3] + b[:, :3])
    np.testing.assert_allclose(y[:, :3].reshape(6, 512),
                               reference.rms_norm((a + b)[:, :3].reshape(6, 512), gamma, 1e-5),
                               rtol=1e-5, atol=1e-5)
    assert np.isnan(total[:, 3:]).all() and np.isnan(y[:, 3:]).all()
    for got, want in zip(fused, quant.quantize_activations(code, y, 0, 3)):
        np.testing.assert_array_equal(got, want)
    for kind, op in ((quant.GLU_SWIGLU, reference.swiglu), (quant.GLU_MULTIPLY, np.multiply)):
        out = np.full_like(a, np.nan)
        glu_rows(kind, a, up, out, 3, q, d, s, u)
        fused = [v.copy() for v in (q, d, s, u)]
        np.testing.assert_allclose(out[:, :3].reshape(6, 512),
                                   op(a[:, :3].reshape(6, 512), up[:, :3].reshape(6, 512)),
                                   rtol=1e-6, atol=1e-6)
        assert np.isnan(out[:, 3:]).all()
        for got, want in zip(fused, quant.quantize_activations(code, out, 0, 3)):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("act", ["Q8_0", "Q8_K"])
def test_rows_of_a_prompt_divided_between_threads_are_the_same(act):
    """For PARALLEL_MIN_ROWS rows or more on two threads, row_kernels gives the kernels whose
    rows are divided between the threads: the same bits as the serial ones."""
    from causallm import kernels

    code = {"Q8_0": quant.ACT_Q8_0, "Q8_K": quant.ACT_Q8_K}[act]
    rng = np.random.default_rng(4)
    T = quant.PARALLEL_MIN_ROWS + 3
    a, b, up = (rng.standard_normal((2, T, 512)).astype(np.float32) for _ in range(3))
    gamma = rng.standard_normal(512).astype(np.float32)
    before = kernels.threads.threads()
    try:
        kernels.set_num_threads(2)
        serial, parallel = quant.row_kernels(code), quant.row_kernels(code, 2 * T)
        assert parallel[0] is not serial[0] and parallel[1] is not serial[1]
        got = []
        for norm_rows, glu_rows in (serial, parallel):
            total, y, out = (np.full_like(a, np.nan) for _ in range(3))
            bufs = quant.Activations()
            q, d, s, u = bufs.take(2 * T, 512)
            for v in (q, d, s, u):
                v[...] = 0  # what a format leaves unwritten compares equal
            norm_rows(a, b, total, gamma, y, T, 1e-5, q, d, s, u)
            rounded = [v.copy() for v in (q, d, s, u)]
            glu_rows(quant.GLU_SWIGLU, a, up, out, T, q, d, s, u)
            got.append([total, y, out, *rounded, q, d, s, u])
        for one, two in zip(*got):
            np.testing.assert_array_equal(one, two)
    finally:
        kernels.set_num_threads(before)


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("N,K,B,nrows", [(37, 512, 1, 1), (11, 768, 2, 3), (300, 1024, 1, 5),
                                         (29, 256, 2, 9)])
def test_product_is_ggmls(name, N, K, B, nrows):
    """y = x @ W (+ bias) of the stored blocks equals the twin's to float rounding: N rows not a
    multiple of 4 or 16, several batches and rows at offsets, a matrix large enough for the
    parallel kernel (300 x 1024 x 5 rows), and a prompt of 18 rows (several groups of four)."""
    qt = quant.QTYPES[name]
    blocks = ref.random_blocks(name, N, K, seed=3)
    rng = np.random.default_rng(4)
    x = np.full((B, nrows + 2, K), np.nan, np.float32)
    x[:, 1:1 + nrows] = rng.standard_normal((B, nrows, K))
    x[0, 1, :256] = 0.0
    for bias in (np.zeros(0, np.float32), rng.standard_normal(N).astype(np.float32)):
        y = np.full((B, nrows + 3, N), np.nan, np.float32)
        quant.linear(qt, quant.held(qt, blocks), x, bias, y, 1, 2, nrows)
        want = ref.linear(name, blocks, x[:, 1:1 + nrows].reshape(-1, K)).reshape(B, nrows, N)
        if bias.size:
            want = want + bias
        scale = np.abs(want).max()
        np.testing.assert_allclose(y[:, 2:2 + nrows], want, rtol=0, atol=2e-6 * scale)
        assert np.isnan(y[:, :2]).all() and np.isnan(y[:, 2 + nrows:]).all()


@pytest.mark.parametrize("threads", [1, 2])
def test_large_q8_0_decode_is_ggmls(threads):
    """A Q8_0 matrix of 16 MiB (a tied head, past the caches), its rows not a multiple of a
    panel: the twin's products."""
    from causallm import kernels

    K = 512
    N = (1 << 24) // quant.QTYPES["Q8_0"].row_bytes(K) + 37
    w = ref.random_blocks("Q8_0", N, K, seed=8)
    x = np.random.default_rng(9).standard_normal((1, 1, K)).astype(np.float32)
    want = ref.linear("Q8_0", w, x[0])
    before = kernels.threads.threads()
    try:
        kernels.set_num_threads(threads)
        y = np.full((1, 1, N), np.nan, np.float32)
        qt = quant.QTYPES["Q8_0"]
        quant.linear(qt, quant.held(qt, w), x, np.zeros(0, np.float32), y, 0, 0, 1)
    finally:
        kernels.set_num_threads(before)
    np.testing.assert_allclose(y[0], want, rtol=0, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize("name", [t.name for t in quant.QTYPES.values() if t.panelled])
def test_panels_hold_the_rows_exactly(name):
    """A matrix held as panels gives back the rows a file stores, byte for byte, for row
    counts that fill no panel, one, and one and a bit; its padding is whole panels."""
    qt = quant.QTYPES[name]
    for N in (3, 16, 37):
        rows = ref.random_blocks(name, N, 256, seed=N)
        held = quant.held(qt, rows)
        assert held.shape == (quant.panel_rows(N), rows.shape[1]) and held.shape[0] % 16 == 0
        assert not held.flags.writeable
        np.testing.assert_array_equal(quant.panels_rows(qt, held, N), rows)


@pytest.mark.skipif(simd.LEVEL != "amx", reason="this CPU has no AMX tiles (or may not use them)")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", quant.AMX_KINDS)
def test_prompt_on_amx_tiles_is_ggmls(kind, threads):
    """A prompt of AMX_MIN_ROWS rows or more multiplies tiles: one tile of 16 rows, a last tile
    of fewer, several, weight rows not a multiple of 16, a bias, two batches,
    through linear() (one thread and parallel) and a table of two matrices: the twin's
    products."""
    from causallm import kernels

    name = next(n for n, t in quant.QTYPES.items() if t.kind == kind)
    qt = quant.QTYPES[name]
    N, K = 45, 512
    rng = np.random.default_rng(7)
    mats = [ref.random_blocks(name, N + 16 * i, K, seed=8 + i) for i in range(2)]
    before = kernels.threads.threads()
    try:
        kernels.set_num_threads(threads)
        for B, T in ((1, quant.AMX_MIN_ROWS), (1, quant.AMX_MIN_ROWS + 5), (2, 19)):
            x = rng.standard_normal((B, T + 1, K)).astype(np.float32)
            rows = x[:, 1:].reshape(-1, K)
            q = quant.quantize_activations(qt.act, x, 1, T)[0]
            assert quant.scratch(qt, q).shape[1:] == (1, quant.amx_room_bytes(K))  # the tiles'
            for w in mats:
                bias = rng.standard_normal(w.shape[0]).astype(np.float32)
                want = ref.linear(name, w, rows).reshape(B, T, -1) + bias
                y = np.full((B, T + 2, w.shape[0]), np.nan, np.float32)
                quant.linear(qt, quant.held(qt, w), x, bias, y, 1, 1, T)
                np.testing.assert_allclose(y[:, 1:1 + T], want, rtol=0,
                                           atol=2e-6 * np.abs(want).max())
                assert np.isnan(y[:, 0]).all() and np.isnan(y[:, 1 + T:]).all()
            ys = [np.full((B, T, w.shape[0]), np.nan, np.float32) for w in mats]
            table = quant.MatrixTable(qt, [(quant.held(qt, w), np.zeros(0, np.float32), y)
                                           for w, y in zip(mats, ys)])
            table.run(*quant.quantize_activations(qt.act, x, 1, T), T)
            for w, y in zip(mats, ys):
                want = ref.linear(name, w, rows).reshape(B, T, -1)
                np.testing.assert_allclose(y, want, rtol=0, atol=2e-6 * np.abs(want).max())
    finally:
        kernels.set_num_threads(before)


@njit
def _sum_asking_ahead(a, ahead):
    total = 0
    for i in range(a.shape[0]):
        simd.prefetch(a, i + ahead)
        total += a[i]
    return total


def test_prefetch_is_only_a_hint():
    """Asking for lines past an array's end (as a decode product does near its matrix's end)
    neither faults nor changes what the loop computes."""
    a = np.arange(100_000, dtype=np.uint8)
    for ahead in (0, 4096, 1 << 30):
        assert _sum_asking_ahead(a, ahead) == int(a.sum(dtype=np.int64))


@njit
def _halves_to_floats(bits, out):
    for i in range(out.shape[0]):
        out[i] = simd.f16(bits, 2 * i)


@njit
def _round_to_halves(x, out):
    for i in range(x.shape[0]):
        out[i] = simd.round_f16(x[i])


@pytest.mark.slow
def test_half_conversions_are_exact():
    """Every half widens to its float32 value; float32 values (normal, subnormal, ties,
    overflowing, infinite, NaN) round to the nearest half as numpy rounds them."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    out = np.empty(bits.size, np.float32)
    _halves_to_floats(bits.view(np.uint8), out)
    halves = bits.view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(out, halves)
    finite = halves[np.isfinite(halves)]
    finite.sort()
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(20000).astype(np.float32) * np.float32(s)
                        for s in (1e-8, 1e-6, 1e-4, 1, 100, 6e4, 1e6)]
                       + [finite, (finite[:-1] + finite[1:]) / 2,
                          np.array([np.inf, -np.inf, np.nan, 65504, 65520, 65519.99],
                                   np.float32)]).astype(np.float32)
    got = np.empty_like(x)
    _round_to_halves(x, got)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float32))


def test_the_vector_path_is_the_cpus():
    features = {name for name, on in __import__("llvmlite.binding").binding
                .get_host_cpu_features().items() if on}
    assert simd.LEVEL == simd._usable_level(features)


PATH_TYPES = ("Q8_0", "IQ4_NL", "Q6_K")
"""Types whose kernels use every operation simd.py lowers per path: dot16_wide and so dot16
(Q8_0's panels: 512-bit VNNI, 256-bit halves, or the top bit apart without VNNI), lookup and
dot_signed (IQ4_NL), maddubs and madd (Q6_K)."""


@pytest.mark.slow
@pytest.mark.parametrize("path", simd.TARGETS)
def test_each_vector_path_the_cpu_can_run(path, tmp_path):
    """numba told to compile for a CPU with (or without) AVX2 / AVX-512 VNNI lowers the vector
    operations that way; the products of types that between them use every operation lowered
    per path still equal their twins. The host's own path is the in-process tests'; a path
    whose instructions this CPU lacks is skipped."""
    import llvmlite.binding as llvm
    (cpu, features), needs = simd.TARGETS[path], simd.target_needs(path)
    host = {name for name, on in llvm.get_host_cpu_features().items() if on}
    if not needs <= host:
        pytest.skip(f"this CPU cannot run the {path} path ({', '.join(sorted(needs - host))})")
    if path == simd.LEVEL:
        pytest.skip(f"the {path} path is the host's: test_product_is_ggmls runs it")
    env = {**os.environ, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": features,
           "NUMBA_CACHE_DIR": str(tmp_path)}
    here = os.path.dirname(__file__)
    check = subprocess.run([sys.executable, "-c", "from causallm.kernels import simd; "
                            "print(simd.LEVEL)"], env=env, capture_output=True, text=True,
                           cwd=os.path.dirname(here))
    assert check.stdout.strip() == path, check.stderr
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"{__file__}::test_product_is_ggmls",
                        f"{__file__}::test_half_conversions_are_exact", "-k",
                        f"37-512 and ({' or '.join(PATH_TYPES)}) or half",
                        "--override-ini=addopts="], env=env,
                       capture_output=True, text=True, timeout=1800, cwd=os.path.dirname(here))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"{len(PATH_TYPES) + 1} passed" in p.stdout, p.stdout[-2000:]


def test_gguf_py_agrees_on_every_type_we_hold():
    """Every block type with a kernel is one gguf-py can dequantize (the twins' ground)."""
    for name in TYPES:
        assert gguf.GGMLQuantizationType[name] in gguf.GGML_QUANT_SIZES
