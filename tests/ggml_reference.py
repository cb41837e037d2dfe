"""numpy twins of ggml's quantized products, built on gguf-py's ``dequantize`` (ggml's reference
dequantizers in numpy), to check causallm/kernels/quant.py against.

A product y = x @ W of ggml's kernels is, exactly, the float64 product of two dequantized
operands: W's blocks as stored, and x after it was rounded to its activation blocks (Q8_0,
Q8_1 or Q8_K) the way ggml's x86 code rounds it. Q4_1 / Q5_1 take their activations' sum
from the Q8_1 block (s = fp16(d * sum q)) rather than from the rounded values, as ggml does.
"""

import gguf
import numpy as np

HALVES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
          "IQ4_NL": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
          "Q6_K": (208,), "IQ4_XS": (0,)}
"""Byte offsets of each block type's fp16 scales (from ggml-common.h's block structs)."""

ACTIVATIONS = {"Q4_0": "Q8_0", "Q5_0": "Q8_0", "Q8_0": "Q8_0", "IQ4_NL": "Q8_0",
               "Q4_1": "Q8_1", "Q5_1": "Q8_1"}
"""ggml's vec_dot_type of each block type (the K types and IQ4_XS: Q8_K)."""


def qtype(name):
    return gguf.GGMLQuantizationType[name]


def block_size(name):
    """(values, bytes) of one block of ``name``."""
    return gguf.GGML_QUANT_SIZES[qtype(name)]


def random_blocks(name, R, C, seed, scale=(0.001, 0.02)):
    """R rows of C values of random ``name`` blocks (uint8 (R, row bytes), read-only as a
    mapped file's are, so the kernels compiled for the file views serve): random bytes with
    finite fp16 scales drawn from ``scale``."""
    qk, nbytes = block_size(name)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(R, C // qk, nbytes), dtype=np.uint8)
    for o in HALVES[name]:
        d = rng.uniform(*scale, size=(R, C // qk)).astype(np.float16)
        raw[:, :, o:o + 2] = d.view(np.uint8).reshape(R, C // qk, 2)
    raw = raw.reshape(R, -1)
    raw.flags.writeable = False
    return raw


def dequantize(name, blocks, C):
    """gguf-py's dequantization of block rows (R, row bytes): float32 (R, C)."""
    return gguf.quants.dequantize(blocks, qtype(name)).reshape(blocks.shape[0], C)


def _fp16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def round_activations(act, x):
    """x (T, K) float32 as ``act`` blocks round it, dequantized, and Q8_1's s (T, K/32):
    Q8_0 / Q8_1 as ggml's x86 quantize_row_q8_0 / q8_1 (d = fp16(max|x| / 127), q =
    round-half-even(x * 127 / max|x|)); Q8_K as quantize_row_q8_K_ref (iscale = -127 / x_m,
    q = min(127, nearest(iscale * x)), d = 1 / iscale)."""
    T, K = x.shape
    if act == "Q8_K":
        out = np.zeros_like(x)
        for t in range(T):
            for b in range(K // 256):
                v = x[t, 256 * b:256 * b + 256]
                xm = v[np.argmax(np.abs(v))]
                if xm == 0:
                    continue
                iscale = np.float32(-127.0) / np.float32(xm)
                q = np.minimum(127, np.rint(iscale * v))
                out[t, 256 * b:256 * b + 256] = q * (np.float32(1.0) / iscale)
        return out, None
    blk = x.reshape(T, -1, 32)
    amax = np.abs(blk).max(axis=2, keepdims=True)
    safe = np.where(amax == 0, np.float32(1), amax)
    inv = np.where(amax == 0, np.float32(0), np.float32(127) / safe).astype(np.float32)
    q = np.rint(blk * inv)
    d = amax / np.float32(127)
    s = _fp16(d * q.sum(axis=2, keepdims=True))[:, :, 0]
    return (q * _fp16(d)).reshape(T, K), s


def linear(name, blocks, x):
    """x (T, K) @ W.T for W the (N, K) rows ``blocks`` of ``name``, as ggml computes it, in
    float64."""
    N, K = blocks.shape[0], x.shape[1]
    W = dequantize(name, blocks, K).astype(np.float64)
    xa, s = round_activations(ACTIVATIONS.get(name, "Q8_K"), x)
    if name in ("Q4_1", "Q5_1"):  # y = sum_b d dx sum qw qx + m s
        m = blocks.reshape(N, K // 32, -1)[:, :, 2:4].copy().view(np.float16)[:, :, 0]
        m = m.astype(np.float64)
        return xa @ (W - np.repeat(m, 32, axis=1)).T + s.astype(np.float64) @ m.T
    return xa.astype(np.float64) @ W.T
