"""Weights kept in their own precision (causallm/kernels/packed.py) against numpy twins: BF16 /
F16 bits, each format's product through ``linear`` (decode and prefill) against
widen-then-multiply or ggml's twin, the row gather of an embedding table and its tied head,
and the .bin round trip of every quantized layout (NNTrainer's x86 Q4_0 repack against the
spec's recipe). The block types' kernels: tests/test_quant.py; the quantizers:
tests/test_quantize.py."""

import importlib
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

import ggml_reference as ref
from causallm import kernels
from causallm.io import nntr_bin
from causallm.kernels import linear, packed
from causallm.kernels.packed import FORMATS, QUANTIZABLE, PackedMatrix
from causallm.kernels.team import Program

linear_module = importlib.import_module("causallm.kernels.linear")  # `linear` is the function


def rand(*shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def test_bf16_and_f16_keep_their_bits():
    rows = rand(3, 40, seed=2)
    bf = PackedMatrix.fromFloat("BF16", rows)
    ggml_bf16 = gguf.quants.quantize(rows, gguf.GGMLQuantizationType.BF16).view(np.uint16)
    np.testing.assert_array_equal(bf.data, ggml_bf16)
    np.testing.assert_array_equal(bf.rowsFloat(), (bf.data.astype(np.uint32) << 16)
                                  .view(np.float32))
    f16 = PackedMatrix.fromFloat("F16", rows)
    np.testing.assert_array_equal(f16.rowsFloat(), rows.astype(np.float16).astype(np.float32))


@pytest.mark.slow
@pytest.mark.parametrize("nrows", [1, 3, 17])      # 17 rows: a prompt (tiles, or BLAS)
@pytest.mark.parametrize("N", [37, 2100])          # one task / the parallel kernel
@pytest.mark.parametrize("fmt", ["BF16", "F16", *QUANTIZABLE])
def test_linear_is_widen_then_multiply(fmt, N, nrows):
    """BF16 / F16: x @ W of the widened W; a block type: ggml's product, of x rounded to its
    activation blocks (B * nrows = 2, 6, 34 rows; N = 37: a last group of one row)."""
    K, B = 256 if N < 100 else 512, 2
    w = PackedMatrix.fromFloat(fmt, rand(N, K, seed=3, scale=0.1))    # rows (N, K): W is (K, N)
    assert w.shape == (K, N) and w.transposed
    W = w.rowsFloat().T.astype(np.float64)
    x = np.full((B, nrows + 3, K), np.nan, np.float32)
    x[:, 1:1 + nrows] = rand(B, nrows, K, seed=4)
    seen = x[:, 1:1 + nrows]
    for bias in (np.zeros(0, np.float32), rand(N, seed=5)):
        y = np.full((B, nrows + 2, N), np.nan, np.float32)
        linear(x, w, bias, y, 1, 2, nrows)
        if w.qtype is None:
            want = seen.astype(np.float64) @ W
        else:
            want = ref.linear(fmt, w.data, seen.reshape(-1, K)).reshape(B, nrows, N)
        want = want + (bias if bias.size else 0)
        np.testing.assert_allclose(y[:, 2:2 + nrows], want, rtol=2e-5, atol=2e-5)
        assert np.isnan(y[:, :2]).all()           # only the rows asked for are written


@pytest.mark.parametrize("fmt", ["FP32", "BF16", "F16"])
def test_float_rows_with_and_without_the_prefetch_hint(fmt):
    """The float row product (linear._dot_cols) asks for its rows ahead on some CPUs and not on
    others (simd.FLOAT_PREFETCH_BYTES): both loops give the float32 product, bit for bit the
    same (K = 203: a 64-value body, a 16-value step and single values; N = 131: a last short
    block)."""
    K, N, B, nrows = 203, 131, 2, 3
    w = rand(N, K, seed=11, scale=0.1)
    x = rand(B, nrows, K, seed=12)
    bias = rand(N, seed=13)
    if fmt == "FP32":
        form, data, W = linear_module.FP32, w, w.T.astype(np.float64)
    else:
        m = PackedMatrix.fromFloat(fmt, w)
        form = linear_module.BF16 if fmt == "BF16" else linear_module.F16
        data, W = m.data, m.rowsFloat().T.astype(np.float64)
    outs = []
    for ahead in (0, 4096):
        y = np.full((B, nrows, N), np.nan, np.float32)
        ops = linear_module.rows_ops(form, x, data, bias, y, 0, 0, nrows, ahead=ahead)
        Program(ops).run(2)
        outs.append(y)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], x.astype(np.float64) @ W + bias, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("fmt", ["FP32", "BF16", "F16"])
@pytest.mark.parametrize("B,nrows,K,N", [(2, 17, 203, 131), (1, 20, 11011, 9), (1, 130, 64, 389),
                                         (2, 7, 100, 37)])
def test_prompt_rows_are_the_float32_product(fmt, B, nrows, K, N):
    """Float rows times a prompt's input rows: from BLAS_MIN_ROWS tiles of 4 x 6 where the CPU
    has AVX-512 (linear.TILES), else widened for BLAS (BF16 / F16 through ``linear``) or each
    row against every input row (FP32's row op, and every form below BLAS_MIN_ROWS: 7 rows):
    x @ W to float32 rounding, with K not a multiple of 16 (203, 11011: passes of 6 input rows),
    N not of 4, input rows not a multiple of 6; only the rows asked for are read (the others
    NaN) and written; the same bits on 1 and 2 threads."""
    w = rand(N, K, seed=14, scale=0.1)
    if fmt == "FP32":
        W = w.T.astype(np.float64)
    else:
        m = PackedMatrix.fromFloat(fmt, w)
        W = m.rowsFloat().T.astype(np.float64)
    x = np.full((B, nrows + 2, K), np.nan, np.float32)
    x[:, 2:] = rand(B, nrows, K, seed=15)
    bias = rand(N, seed=16)
    want = x[:, 2:].astype(np.float64) @ W + bias
    before, outs = kernels.get_num_threads(), []
    try:
        for threads in (1, 2):
            kernels.set_num_threads(threads)
            y = np.full((B, nrows + 1, N), np.nan, np.float32)
            if fmt == "FP32":
                linear_module.run_ops(linear_module.rows_ops(linear_module.FP32, x, w, bias, y,
                                                             2, 1, nrows), w.size)
            else:
                linear(x, m, bias, y, 2, 1, nrows)
            np.testing.assert_allclose(y[:, 1:], want, rtol=2e-5, atol=1e-5 * np.abs(want).max())
            assert np.isnan(y[:, 0]).all()
            outs.append(y)
    finally:
        kernels.set_num_threads(before)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.slow
@pytest.mark.skipif(not linear_module.TILES, reason="this CPU has no AVX-512: its prompts "
                    "already take the path without tiles")
def test_prompt_rows_without_tiles(tmp_path):
    """On a CPU without AVX-512 (numba told to compile for x86-64-v3 here), BF16 / F16 prompts
    widen the matrix for BLAS: the same checks."""
    import llvmlite.binding as llvm
    from causallm.kernels import simd
    cpu, features = simd.TARGETS["avx2"]
    host = {name for name, on in llvm.get_host_cpu_features().items() if on}
    if not simd.target_needs("avx2") <= host:
        pytest.skip("this CPU cannot run the x86-64-v3 path")
    here = os.path.dirname(__file__)
    env = {**os.environ, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": features,
           "NUMBA_CACHE_DIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"{__file__}::test_prompt_rows_are_the_float32_product", "-k", "17",
                        "--override-ini=addopts="], env=env, capture_output=True, text=True,
                       timeout=1800, cwd=os.path.dirname(here))
    assert p.returncode == 0 and "3 passed" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    check = subprocess.run([sys.executable, "-c", "import importlib; print(importlib."
                            "import_module('causallm.kernels.linear').TILES)"], env=env,
                           capture_output=True, text=True, cwd=os.path.dirname(here))
    assert check.stdout.strip() == "False", check.stderr


@pytest.mark.skipif(not packed.BF16_TILES, reason="this CPU has no AMX tiles (or may not use them)")
@pytest.mark.parametrize("B,nrows,K,N", [(1, 130, 100, 45), (2, 20, 64, 33), (1, 16, 512, 96)])
def test_bf16_prompt_on_tiles_is_the_float32_product(B, nrows, K, N):
    """A BF16 prompt on AMX tiles (each activation split into three bfloat16 parts) is x @ W to
    float32 rounding: K not a multiple of 32 (padded), N not of 32 (a half-empty panel pair),
    more rows than one pass (BF16_TILE_ROWS), on one thread and on the pool."""
    w = PackedMatrix.fromFloat("BF16", rand(N, K, seed=7, scale=0.1))
    W = w.rowsFloat().T.astype(np.float64)
    x = rand(B, nrows + 1, K, seed=8)
    x[0, 1, :3] = [3e4, -2e-3, 1e-30]  # magnitudes far apart: their low bits still count
    bias = rand(N, seed=9)
    want = x[:, 1:].astype(np.float64) @ W + bias
    before = kernels.get_num_threads()
    try:
        for threads in (1, 2):
            kernels.set_num_threads(threads)
            y = np.full((B, nrows + 2, N), np.nan, np.float32)
            linear(x, w, bias, y, 1, 1, nrows)
            np.testing.assert_allclose(y[:, 1:1 + nrows], want, rtol=1e-5,
                                       atol=1e-6 * np.abs(want).max())
            assert np.isnan(y[:, 0]).all() and np.isnan(y[:, -1]).all()
    finally:
        kernels.set_num_threads(before)


@pytest.mark.parametrize("fmt", FORMATS)
def test_embedding_rows_gather_and_the_tied_head(fmt):
    """A table in any format: gathered rows are its widened rows (gguf-py's dequantize for the
    block types), and the tied head multiplies the same rows."""
    V, D = 50, 256
    if fmt in ("BF16", "F16", *QUANTIZABLE):
        table = PackedMatrix.fromFloat(fmt, rand(V, D, seed=6), transposed=False)
    else:
        table = PackedMatrix(fmt, ref.random_blocks(fmt, V, D, seed=6), transposed=False)
    rows = table.rowsFloat()
    if table.qtype is not None:
        np.testing.assert_array_equal(rows, ref.dequantize(fmt, table.data, D))
    out = np.empty((4, D), np.float32)
    table.gather(np.array([3, 0, 49, 3]), out)
    np.testing.assert_array_equal(out, rows[[3, 0, 49, 3]])
    x = rand(1, 1, D, seed=7)
    y = np.zeros((1, 1, V), np.float32)
    linear(x, table.T, np.zeros(0, np.float32), y, 0, 0, 1)   # logits = x @ table^T
    if table.qtype is None:
        want = rows.astype(np.float64) @ x[0, 0]
    else:
        want = ref.linear(fmt, table.data, x[0])[0]
    np.testing.assert_allclose(y[0, 0], want, rtol=0, atol=2e-6 * np.abs(want).max())


def q4_0x8_by_the_spec(rows):
    """NNTrainer's x86 Q4_0 bytes written from the words of docs/nntrainer.md, "The .bin file", in
    loops, from plain block_q4_0 rows (N, K / 32 * 18): for each group of 8 rows and each K-block,
    the 8 fp16 scales, then 16 chunks of 8 bytes, chunk i = bytes (i // 8) * 8 .. + 8 of row i % 8's
    qs, XOR 0x88."""
    N, nb = rows.shape[0], rows.shape[1] // 18
    blocks = rows.reshape(N, nb, 18)
    out = bytearray()
    for g in range(0, N, 8):
        for blk in range(nb):
            for r in range(8):
                out += blocks[g + r, blk, :2].tobytes()
            for i in range(16):
                src = blocks[g + i % 8, blk, 2 + (i // 8) * 8:2 + (i // 8) * 8 + 8]
                out += bytes(int(b) ^ 0x88 for b in src)
    return np.frombuffer(bytes(out), dtype=np.uint8)


def test_q4_0_bin_layout_is_nntrainers_x86_repack():
    K, N = 64, 16                                         # a (K, N) fully connected weight
    w = PackedMatrix.fromFloat("Q4_0", rand(N, K, seed=8))
    raw = nntr_bin.block_rows_to_bin("fc:weight", (K, N), "Q4_0", w.data)
    np.testing.assert_array_equal(raw, q4_0x8_by_the_spec(w.data))
    np.testing.assert_array_equal(nntr_bin.bin_to_block_rows("fc:weight", (K, N), "Q4_0", raw),
                                  w.data)


@pytest.mark.parametrize("fc,table", [("Q4_0", "Q8_0"), ("Q4_K", "Q6_K"), ("Q6_K", "Q4_0"),
                                      ("Q8_0", "Q6_K")])
def test_quantized_bin_round_trip(tmp_path, fc, table):
    """A fully connected weight and a table in NNTrainer's quantized layouts: written, read back
    as the same block rows (plain rows as views of the mapped file), and widened on request."""
    K, N, V, D = 512, 16, 10, 256
    w = PackedMatrix.fromFloat(fc, rand(N, K, seed=8))
    t = PackedMatrix.fromFloat(table, rand(V, D, seed=9), transposed=False)
    path = tmp_path / "q.bin"
    nntr_bin.write_bin(path, [w, t, rand(3, seed=10)], [fc, table, "FP32"],
                       ["fc:weight", "emb:Embedding", "norm:gamma"])
    assert path.stat().st_size == (nntr_bin.bin_nbytes((K, N), fc)
                                   + nntr_bin.bin_nbytes((V, D), table) + 12)
    specs = [("fc:weight", (K, N), fc), ("emb:Embedding", (V, D), table),
             ("norm:gamma", (3,), "FP32")]
    got = nntr_bin.read_bin(path, [(*s, True) for s in specs[:2]] + [(*specs[2], False)])
    assert (got[0].format, got[0].transposed, got[1].format, got[1].transposed) == \
        (fc, True, table, False)
    np.testing.assert_array_equal(got[0].data, w.data)
    np.testing.assert_array_equal(got[1].data, t.data)
    assert not got[1].data.flags.owndata             # a table's plain rows: the mapped file
    widened = nntr_bin.read_bin(path, [(*s, False) for s in specs])
    np.testing.assert_array_equal(widened[0], w.toFloat())  # a float weight gets it widened
    np.testing.assert_array_equal(widened[1], t.toFloat())
