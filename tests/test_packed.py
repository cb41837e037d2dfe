"""Weights kept in their own precision (causallm/kernels/packed.py) against numpy twins: the
quantizers against gguf-py's (ggml's reference quantizers in numpy, byte for byte), each
format's matrix-vector kernel and prefill path against widen-then-multiply, the row gather
of an embedding table, and NNTrainer's x86 Q4_0 .bin layout against the spec's recipe."""

import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from causallm.io import nntr_bin
from causallm.kernels import linear, quant
from causallm.kernels.packed import (
    FORMATS,
    PackedMatrix,
    quantize_q4_0,
    quantize_q8_0,
    rows_to_ggml_blocks,
)

GGML = {"Q8_0": gguf.GGMLQuantizationType.Q8_0, "Q4_0": gguf.GGMLQuantizationType.Q4_0}


def rand(*shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def ggml_blocks(fmt, qs, d):
    """Our (qs, d) rows as ggml block bytes (fp16 d, then qs), for comparison."""
    return rows_to_ggml_blocks(fmt, qs, d)


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_quantizers_are_ggmls_byte_for_byte(fmt):
    rows = rand(7, 96, seed=1)
    rows[0, :32] = 0.0                         # an all-zero block: d = 0
    rows[1, 5] = 40.0                          # a block dominated by one value
    rows[2, 33] = -40.0                        # ... by a negative one (Q4_0 keeps the sign)
    rows[3] = np.round(rows[3] * 4) / 4        # ties for roundf
    quantize = quantize_q8_0 if fmt == "Q8_0" else quantize_q4_0
    ours = ggml_blocks(fmt, *quantize(rows))
    theirs = gguf.quants.quantize(rows, GGML[fmt])
    np.testing.assert_array_equal(ours, theirs)
    widened = PackedMatrix.fromFloat(fmt, rows, transposed=False).toFloat()
    np.testing.assert_array_equal(widened, gguf.quants.dequantize(theirs, GGML[fmt]))


def test_bf16_and_f16_keep_their_bits():
    rows = rand(3, 40, seed=2)
    bf = PackedMatrix.fromFloat("BF16", rows)
    ggml_bf16 = gguf.quants.quantize(rows, gguf.GGMLQuantizationType.BF16).view(np.uint16)
    np.testing.assert_array_equal(bf.data, ggml_bf16)
    np.testing.assert_array_equal(bf.rowsFloat(), (bf.data.astype(np.uint32) << 16)
                                  .view(np.float32))
    f16 = PackedMatrix.fromFloat("F16", rows)
    np.testing.assert_array_equal(f16.rowsFloat(), rows.astype(np.float16).astype(np.float32))


def q8_0_activations(x):
    """x as the Q8_0 kernels see it: each row's blocks of 32 quantized by gguf-py's Q8_0
    (ggml's reference: d = max|x| / 127, q = roundf(x / d)) and widened again with d unrounded
    (the kernels keep the activations' d in float32, ggml rounds it to fp16)."""
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    qs = gguf.quants.quantize(blocks, GGML["Q8_0"]).reshape(-1, 34)[:, 2:].view(np.int8)
    return (qs * d).reshape(x.shape)


@pytest.mark.parametrize("nrows", [1, 3, 17])      # 17 rows: BF16 / F16 widen then BLAS
@pytest.mark.parametrize("N", [37, 2100])          # one task / the parallel kernel
@pytest.mark.parametrize("fmt", FORMATS)
def test_linear_is_widen_then_multiply(fmt, N, nrows):
    """BF16 / F16: x @ W of the widened W; Q8_0 / Q4_0: of x rounded to Q8_0 blocks, as ggml's
    vec_dot_q8_0_q8_0 and vec_dot_q4_0_q8_0 compute (B * nrows = 2, 6, 34 rows: tiles of four
    activation rows and the rest; N = 37: a last tile of 5 rows)."""
    K, B = 96 if N < 100 else 256, 2
    w = PackedMatrix.fromFloat(fmt, rand(N, K, seed=3, scale=0.1))    # rows (N, K): W is (K, N)
    assert w.shape == (K, N) and w.transposed
    W = w.rowsFloat().T.astype(np.float64)
    x = np.full((B, nrows + 3, K), np.nan, np.float32)
    x[:, 1:1 + nrows] = rand(B, nrows, K, seed=4)
    seen = x[:, 1:1 + nrows]
    if fmt in ("Q8_0", "Q4_0"):
        seen = q8_0_activations(seen)
    for bias in (np.zeros(0, np.float32), rand(N, seed=5)):
        y = np.full((B, nrows + 2, N), np.nan, np.float32)
        linear(x, w, bias, y, 1, 2, nrows)
        want = seen.astype(np.float64) @ W + (bias if bias.size else 0)
        np.testing.assert_allclose(y[:, 2:2 + nrows], want, rtol=2e-5, atol=2e-5)
        assert np.isnan(y[:, :2]).all()           # only the rows asked for are written


def test_activations_round_as_ggml():
    """The int8 kernels' activation rounding is ggml's Q8_0 (gguf-py's quants, byte for byte)."""
    x = rand(3, 5, 96, seed=11)
    x[0, 0, :32] = 0.0                                        # an all-zero block
    x[1, 2] = np.round(x[1, 2] * 8) / 8                       # ties for roundf
    T, nb = 3 * 4, 3
    qx, dx, sx = np.empty((T, 96), np.int8), np.empty((T, nb), np.float32), \
        np.empty((T, nb), np.int32)
    quant.quantize_activations(x, 1, 4, qx, dx, sx)
    rows = x[:, 1:5].reshape(T, 96)
    theirs = gguf.quants.quantize(rows, GGML["Q8_0"]).reshape(T, nb, 34)
    np.testing.assert_array_equal(qx.reshape(T, nb, 32), theirs[:, :, 2:].view(np.int8))
    np.testing.assert_array_equal(dx, np.abs(rows.reshape(T, nb, 32)).max(axis=2)
                                  / np.float32(127))
    np.testing.assert_array_equal(sx, qx.reshape(T, nb, 32).astype(np.int32).sum(axis=2))


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_tiles_hold_the_blocks(fmt):
    """Tiles of 16 rows (quant.py's layout, written out here byte by byte) and back."""
    R, C = 21, 64
    qs, d = (quantize_q8_0 if fmt == "Q8_0" else quantize_q4_0)(rand(R, C, seed=12))
    w = PackedMatrix.fromBlocks(fmt, qs, d)
    chunks, nb = (8, 2) if fmt == "Q8_0" else (4, 2)
    u = qs.view(np.uint8) ^ (0x80 if fmt == "Q8_0" else 0)
    assert w.data.shape == (2, nb, 64 * chunks) and w.scales.shape == (2, nb, 16)
    for r in range(32):
        for b in range(nb):
            for c in range(chunks):
                got = w.data[r // 16, b, 64 * c + 4 * (r % 16):64 * c + 4 * (r % 16) + 4]
                span = qs.shape[1] // nb
                want = u[r, b * span + 4 * c:b * span + 4 * c + 4] if r < R else 0
                np.testing.assert_array_equal(got, want)
            scale = w.scales[r // 16, b, r % 16:r % 16 + 1].view(np.float16)[0]
            assert scale == (d[r, b] if r < R else 0)
    back_qs, back_d = w.blocks()
    np.testing.assert_array_equal(back_qs, qs)
    np.testing.assert_array_equal(back_d, d)


@pytest.mark.parametrize("fmt", FORMATS)
def test_embedding_rows_gather_and_the_tied_head(fmt):
    V, D = 50, 64
    table = PackedMatrix.fromFloat(fmt, rand(V, D, seed=6), transposed=False)
    rows = table.rowsFloat()
    out = np.empty((4, D), np.float32)
    table.gather(np.array([3, 0, 49, 3]), out)
    np.testing.assert_array_equal(out, rows[[3, 0, 49, 3]])
    x = rand(1, 1, D, seed=7)
    y = np.zeros((1, 1, V), np.float32)
    linear(x, table.T, np.zeros(0, np.float32), y, 0, 0, 1)   # logits = x @ table^T
    seen = q8_0_activations(x[0, 0]) if fmt in ("Q8_0", "Q4_0") else x[0, 0]
    np.testing.assert_allclose(y[0, 0], rows @ seen, rtol=1e-5, atol=1e-5)


def q4_0x8_by_the_spec(qs, d):
    """NNTrainer's x86 Q4_0 bytes written from the porting spec's words (§7.3), in loops: for
    each group of 8 rows and each K-block, the 8 fp16 scales, then 16 chunks of 8 bytes, chunk i
    = bytes (i // 8) * 8 .. + 8 of row i % 8's qs, XOR 0x88."""
    N, nb = d.shape
    out = bytearray()
    for g in range(0, N, 8):
        for blk in range(nb):
            out += np.array([d[g + r, blk] for r in range(8)], dtype="<f2").tobytes()
            for i in range(16):
                src = qs[g + i % 8, blk * 16 + (i // 8) * 8:blk * 16 + (i // 8) * 8 + 8]
                out += bytes(int(b) ^ 0x88 for b in src)
    return np.frombuffer(bytes(out), dtype=np.uint8)


def test_q4_0_bin_layout_is_nntrainers_x86_repack(tmp_path):
    K, N = 64, 16                                         # a (K, N) fully connected weight
    w = PackedMatrix.fromFloat("Q4_0", rand(N, K, seed=8))
    w_qs, w_d = w.blocks()
    raw = nntr_bin.repack_q4_0x8(w_qs, w_d)
    np.testing.assert_array_equal(raw, q4_0x8_by_the_spec(w_qs, w_d))
    qs, d = nntr_bin.unpack_q4_0x8(raw, N, K)
    np.testing.assert_array_equal(qs, w_qs)
    np.testing.assert_array_equal(d, w_d)
    table = PackedMatrix.fromFloat("Q8_0", rand(10, 32, seed=9), transposed=False)
    path = tmp_path / "q.bin"
    nntr_bin.write_bin(path, [w, table, rand(3, seed=10)], ["Q4_0", "Q8_0", "FP32"],
                       ["fc:weight", "emb:Embedding", "norm:gamma"])
    assert path.stat().st_size == N * K // 32 * 18 + 10 * 34 + 12
    got = nntr_bin.read_bin(path, [("fc:weight", (K, N), "Q4_0", True),
                                   ("emb:Embedding", (10, 32), "Q8_0", True),
                                   ("norm:gamma", (3,), "FP32", False)])
    assert got[0].format == "Q4_0" and got[0].transposed
    np.testing.assert_array_equal(got[0].data, w.data)
    np.testing.assert_array_equal(got[0].scales, w.scales)
    np.testing.assert_array_equal(got[1].rowsFloat(), table.rowsFloat())
    widened = nntr_bin.read_bin(path, [("fc:weight", (K, N), "Q4_0", False),
                                       ("emb:Embedding", (10, 32), "Q8_0", False),
                                       ("norm:gamma", (3,), "FP32", False)])
    np.testing.assert_array_equal(widened[0], w.toFloat())  # a float weight gets it widened


def test_int8_kernels_without_vnni(tmp_path):
    """On a CPU without AVX-512 VNNI (numba told to compile for Haswell), dpbusd is generic
    vector IR: the Q8_0 / Q4_0 products still equal their twins."""
    env = {**os.environ, "NUMBA_CPU_NAME": "haswell", "NUMBA_CACHE_DIR": str(tmp_path),
           "NUMBA_CPU_FEATURES": "+avx,+avx2,+fma,+f16c,+popcnt,+sse4.2"}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"{__file__}::test_linear_is_widen_then_multiply", "-k", "Q8_0 or Q4_0",
                        "--override-ini=addopts="], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "12 passed" in p.stdout, p.stdout
    check = subprocess.run([sys.executable, "-c", "from causallm.kernels import simd; "
                            "print(simd.VNNI)"], env=env, capture_output=True, text=True,
                           cwd=os.path.dirname(os.path.dirname(__file__)))
    assert check.stdout.strip() == "False", check.stderr
