"""causallm.kernels against their numpy twins in tests/reference.py, with odd sizes.

head_dim 80, GQA 3 (6 q heads, 2 kv heads), vocab 1003, batch 2, single-row (decode) and
multi-row calls at row offsets, a cache continued from pos0 > 0, sliding windows shorter than
the sequence (causal and not), softcap, sinks, both FC layouts and both paths of linear(),
read-only (memory-mapped style) weights. Rows the kernels must not touch are filled with NaN
and checked afterwards.
"""

import math
import os
import sys

import numpy as np
import orjson
import pytest
from numba import njit
import reference as ref

from causallm import kernels as K
from causallm.kernels.expf import expf
from causallm.kernels.quant import GLU_MULTIPLY, GLU_SWIGLU, NO_D, NO_Q, NO_U, row_kernels
from causallm.kernels.team import Program

B, HEAD_DIM, N_HEADS, N_KV, VOCAB = 2, 80, 6, 2, 1003
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def rand(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def readonly(a):
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


def close(got, want, rtol=1e-5):
    """|got - want| <= rtol * (|want| + max|want|): relative, with a floor at the tensor's scale."""
    want = np.asarray(want, dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * max(1.0, float(np.abs(want).max())))


def untouched(a, rows):
    """Every row of a (B, H, W) outside `rows` still holds its NaN fill."""
    keep = np.ones(a.shape[1], bool)
    keep[rows] = False
    assert np.isnan(a[:, keep]).all()


# ---------------------------------------------------------------- linear

@pytest.mark.parametrize("ro", [False, True], ids=["writable", "readonly"])
@pytest.mark.parametrize("nrows", [1, 5])
@pytest.mark.parametrize("has_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("layout", ["io", "oi"])
def test_linear_kernels(layout, has_bias, nrows, ro):
    k_in, n_out, x_row, y_row = 203, 1003, 1, 2     # K % 8 != 0, N not a multiple of the block
    x = rand(B, 7, k_in, seed=1)
    w = rand(k_in, n_out, seed=2, scale=0.1)         # logical [in, out]
    bias = rand(n_out, seed=3) if has_bias else np.zeros(0, np.float32)
    if ro:
        bias = readonly(bias)
    y = np.full((B, 9, n_out), np.nan, np.float32)
    if layout == "io":
        K.linear(x, readonly(w) if ro else w, bias, y, x_row, y_row, nrows)
    else:
        wt = np.ascontiguousarray(w.T)
        K.linear(x, (readonly(wt) if ro else wt).T, bias, y, x_row, y_row, nrows)
    for b in range(B):
        close(y[b, y_row:y_row + nrows], ref.linear(x[b, x_row:x_row + nrows], w, bias))
    untouched(y, slice(y_row, y_row + nrows))


@pytest.mark.parametrize("path", ["numba", "blas"])
@pytest.mark.parametrize("layout", ["io", "oi"])
def test_linear_dispatch(layout, path):
    nrows = 1 if path == "numba" else K.BLAS_MIN_ROWS
    assert (nrows < K.BLAS_MIN_ROWS) == (path == "numba")
    k_in, n_out, x_row, y_row = 203, 1003, 2, 1
    x = rand(B, nrows + 3, k_in, seed=4)
    w = rand(k_in, n_out, seed=5, scale=0.1)
    bias = readonly(rand(n_out, seed=6))
    # the logical [in, out] matrix: C-contiguous, or the .T view of a C-contiguous [out, in]
    w_arg = readonly(w) if layout == "io" else readonly(np.ascontiguousarray(w.T)).T
    y = np.full((B, nrows + 2, n_out), np.nan, np.float32)
    K.linear(x, w_arg, bias, y, x_row, y_row, nrows)
    for b in range(B):
        close(y[b, y_row:y_row + nrows], ref.linear(x[b, x_row:x_row + nrows], w, bias))
    untouched(y, slice(y_row, y_row + nrows))


# ---------------------------------------------------------------- rms_norm

@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("nrows", [1, 3])
@pytest.mark.parametrize("feature_size", [N_HEADS * HEAD_DIM, HEAD_DIM], ids=["row", "per_head"])
def test_rms_norm(feature_size, nrows, in_place):
    width, eps = N_HEADS * HEAD_DIM, 1e-3     # NNTrainer's default epsilon; eps ~ 10% of mean(x^2)
    x = rand(B, 4, width, seed=7, scale=0.1)
    x[:, nrows:] = np.nan
    gamma = readonly(rand(feature_size, seed=8))
    want = [ref.rms_norm(x[b, :nrows].reshape(-1, feature_size), gamma, eps).reshape(nrows, width)
            for b in range(B)]
    y = x if in_place else np.full_like(x, np.nan)
    K.rms_norm(x, gamma, y, nrows, eps, feature_size)
    for b in range(B):
        close(y[b, :nrows], want[b])
    untouched(y, slice(0, nrows))


# ---------------------------------------------------------------- rope

def test_rope_inv_freq_matches_transformers():
    """HF values from tools/make_fixtures.py (transformers' own init functions).

    torch's float32 pow (SLEEF) can differ from the correctly rounded one by 1 ulp, and the
    yarn blend carries that through, hence maxulp=2.
    """
    with open(os.path.join(FIXTURES, "rope", "hf_rope.json"), "rb") as f:
        cases = orjson.loads(f.read())
    kinds = set()
    for case in cases:
        params = dict(case["case"])
        kind, theta = params.pop("rope_type"), params.pop("rope_theta")
        inv_freq, scaling = K.rope_inv_freq(case["head_dim"], theta, kind, **params)
        assert inv_freq.dtype == np.float32 and inv_freq.shape == (case["head_dim"] // 2,)
        np.testing.assert_array_max_ulp(inv_freq, np.array(case["inv_freq"], np.float32), maxulp=2)
        assert scaling == pytest.approx(case["attention_scaling"], rel=1e-12)
        kinds.add(kind)
    assert kinds == {"default", "linear", "llama3", "yarn"}


def test_rope_inv_freq_rules():
    base, s = K.rope_inv_freq(HEAD_DIM, 10000.0)
    assert s == 1.0
    np.testing.assert_allclose(base, 1 / 10000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM), rtol=1e-6)
    _, s = K.rope_inv_freq(HEAD_DIM, 10000.0, "yarn", factor=4.0, original_max_position_embeddings=64,
                           attention_factor=1.25)
    assert s == 1.25
    _, s = K.rope_inv_freq(HEAD_DIM, 10000.0, "yarn", factor=4.0, original_max_position_embeddings=64)
    assert s == pytest.approx(0.1 * math.log(4.0) + 1)
    with pytest.raises(ValueError, match="dynamic"):
        K.rope_inv_freq(HEAD_DIM, 10000.0, "dynamic", factor=2.0)


def test_rope_tables_values_and_sharing():
    inv_freq, _ = K.rope_inv_freq(HEAD_DIM, 1e6)
    cos, sin = K.rope_tables(inv_freq, 1.5, 300)
    want_cos, want_sin = ref.rope_tables(inv_freq, 1.5, 300)
    assert cos.shape == sin.shape == (300, HEAD_DIM // 2) and cos.dtype == np.float32
    close(cos, want_cos, rtol=2e-7)
    close(sin, want_sin, rtol=2e-7)
    assert not cos.flags.writeable and not sin.flags.writeable
    assert K.rope_tables(inv_freq.copy(), 1.5, 300)[0] is cos        # same settings: one table
    assert K.rope_tables(inv_freq, 1.0, 300)[0] is not cos           # other scaling: its own
    assert K.rope_tables(inv_freq * 2, 1.5, 300)[0] is not cos       # other theta: its own


# ---------------------------------------------------------------- attention

def _caches_before(k_all, v_all, cos, sin, pos0, T, dtype):
    """Caches (B, N_KV, T, HEAD_DIM) of ``dtype`` holding positions [0, pos0) of k_all, v_all
    (the rest NaN), as a prefill left them."""
    k_cache = np.full((B, N_KV, T, HEAD_DIM), np.nan, np.float32).astype(dtype)
    v_cache = k_cache.copy()
    if pos0:
        K.kv_cache_write(k_all[:, :pos0].copy(), v_all[:, :pos0].copy(), k_cache, v_cache,
                         cos, sin, 0, pos0, N_KV, HEAD_DIM)
    return k_cache, v_cache


def _cache_setup(pos0, nrows, seed, dtype=np.float32):
    """Random q/k/v for positions [0, pos0 + nrows); cache positions [0, pos0) written by a
    prefill, [pos0, pos0 + nrows) by a second step. Caches (B, N_KV, T, HEAD_DIM) of ``dtype``
    (float32, or uint16 FP16 bits)."""
    total, T = pos0 + nrows, pos0 + nrows + 4
    q_all = rand(B, total, N_HEADS * HEAD_DIM, seed=seed)
    k_all = rand(B, total, N_KV * HEAD_DIM, seed=seed + 1)
    v_all = rand(B, total, N_KV * HEAD_DIM, seed=seed + 2)
    inv_freq, scaling = K.rope_inv_freq(HEAD_DIM, 10000.0, "yarn", factor=4.0,
                                        original_max_position_embeddings=16)
    cos, sin = K.rope_tables(inv_freq, scaling, T)
    k_cache, v_cache = _caches_before(k_all, v_all, cos, sin, pos0, T, dtype)
    # the step buffers hold the new rows first and stale rows after them
    k = np.full((B, nrows + 2, N_KV * HEAD_DIM), np.nan, np.float32)
    v = np.full_like(k, np.nan)
    k[:, :nrows], v[:, :nrows] = k_all[:, pos0:], v_all[:, pos0:]
    K.kv_cache_write(k, v, k_cache, v_cache, cos, sin, pos0, nrows, N_KV, HEAD_DIM)
    return q_all, k_all, v_all, k_cache, v_cache, cos, sin


@pytest.mark.parametrize("pos0,nrows", [(0, 5), (13, 1), (13, 9)])
def test_kv_cache_write(pos0, nrows):
    _, k_all, v_all, k_cache, v_cache, cos, sin = _cache_setup(pos0, nrows, seed=10)
    total = pos0 + nrows
    want_cos, want_sin = ref.rope_tables(*K.rope_inv_freq(HEAD_DIM, 10000.0, "yarn", factor=4.0,
                                                          original_max_position_embeddings=16), total)
    for b in range(B):
        for g in range(N_KV):
            cols = slice(g * HEAD_DIM, (g + 1) * HEAD_DIM)
            close(k_cache[b, g, :total], ref.apply_rope(k_all[b, :, cols], want_cos, want_sin))
            assert np.array_equal(v_cache[b, g, :total], v_all[b, :, cols])
    assert np.isnan(k_cache[:, :, total:]).all() and np.isnan(v_cache[:, :, total:]).all()


@pytest.mark.parametrize("pos0,nrows", [(0, 5), (13, 9)])
def test_fp16_cache_holds_the_float32_values_rounded_to_nearest_even(pos0, nrows):
    *_, k32, v32, _, _ = _cache_setup(pos0, nrows, seed=10)
    *_, k16, v16, _, _ = _cache_setup(pos0, nrows, seed=10, dtype=np.uint16)
    total = pos0 + nrows
    for c32, c16 in ((k32, k16), (v32, v16)):
        np.testing.assert_array_equal(c16[:, :, :total].view(np.float16),
                                      c32[:, :, :total].astype(np.float16))


@pytest.mark.parametrize("pos0,nrows", [(13, 1), (0, 11)])
def test_attention_reads_an_fp16_cache_as_its_values(pos0, nrows):
    """Attention over FP16 bits equals attention over float32 caches of the same values."""
    q_all, _, _, k16, v16, cos, sin = _cache_setup(pos0, nrows, seed=20, dtype=np.uint16)
    k32, v32 = (c.view(np.float16).astype(np.float32) for c in (k16, v16))
    T = k16.shape[2]
    outs = []
    for kc, vc in ((k16, v16), (k32, v32)):
        out = np.full((B, nrows, N_HEADS * HEAD_DIM), np.nan, np.float32)
        scratch = np.empty((B * N_HEADS, T + HEAD_DIM), np.float32)
        K.attention(q_all[:, pos0:].copy(), kc, vc, out, cos, sin, scratch, pos0, nrows,
                    pos0 + nrows, N_HEADS, N_KV, HEAD_DIM, scale=HEAD_DIM ** -0.5, window=7)
        outs.append(out)
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("d", [4, 12, 72])
def test_attention_of_any_head_size(d):
    """Head sizes that are not a multiple of the kernel's 64 and 8 float lanes (their last
    columns summed one by one), against the reference on a float32 and an FP16 cache."""
    nh, nkv, T, pos0 = 4, 2, 9, 6
    q, k, v = (rand(1, T, n * d, seed=70 + i) for i, n in enumerate((nh, nkv, nkv)))
    cos, sin = np.ones((T, d // 2), np.float32), np.zeros((T, d // 2), np.float32)
    for dtype in (np.float32, np.uint16):
        kc = np.ascontiguousarray(k.reshape(1, T, nkv, d).transpose(0, 2, 1, 3))
        vc = np.ascontiguousarray(v.reshape(1, T, nkv, d).transpose(0, 2, 1, 3))
        if dtype == np.uint16:
            kc, vc = (c.astype(np.float16).view(np.uint16) for c in (kc, vc))
            kf, vf = (c.view(np.float16).astype(np.float32).transpose(0, 2, 1, 3).reshape(1, T, -1)
                      for c in (kc, vc))
        else:
            kf, vf = k, v
        out = np.full((1, T - pos0, nh * d), np.nan, np.float32)
        scratch = np.empty((nh, T + d), np.float32)
        K.attention(q[:, pos0:].copy(), kc, vc, out, cos, sin, scratch, pos0, T - pos0, T, nh,
                    nkv, d, scale=d ** -0.5)
        want = ref.mha(q[0, pos0:], kf[0], vf[0], np.arange(pos0, T), np.arange(T), nh, nkv, cos,
                       sin, 1 << 32, True, d ** -0.5)
        close(out[0], want)


ATTENTION_CASES = {
    # name: (causal, window, softcap, sinks, position bias)
    "causal": (True, 1 << 32, 0.0, False, False),
    "causal_window": (True, 5, 0.0, False, False),
    "causal_window_softcap_sinks": (True, 5, 2.0, True, False),
    "causal_bias": (True, 1 << 32, 0.0, False, True),
    "bidirectional": (False, 1 << 32, 0.0, False, False),
    "bidirectional_window_sinks": (False, 7, 0.0, True, False),
    "bidirectional_bias": (False, 1 << 32, 0.0, False, True),
}


def _position_bias(T, seed):
    """A random bias by relative position (B, N_HEADS, 2T - 1) and its [h, p, t] expansion."""
    bias = rand(B, N_HEADS, 2 * T - 1, seed=seed)
    p, t = np.arange(T)[:, None], np.arange(T)[None, :]
    return bias, bias[:, :, T - 1 + t - p]             # (B, N_HEADS, T, T)


@pytest.mark.parametrize("pos0,nrows", [(13, 1), (13, 9), (0, 11)])
@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention(case, pos0, nrows):
    causal, window, softcap, use_sinks, use_bias = ATTENTION_CASES[case]
    q_all, k_all, v_all, k_cache, v_cache, cos, sin = _cache_setup(pos0, nrows, seed=20)
    total, T = pos0 + nrows, k_cache.shape[2]
    sinks = readonly(rand(N_HEADS, seed=30)) if use_sinks else np.zeros(0, np.float32)
    bias, full_bias = _position_bias(T, seed=31) if use_bias else (np.zeros((0, 0, 0), np.float32),
                                                                   None)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    q = np.full((B, nrows + 2, N_HEADS * HEAD_DIM), np.nan, np.float32)
    q[:, :nrows] = q_all[:, pos0:]
    in_place = case == "causal"                      # out may be the q buffer itself
    out = q if in_place else np.full_like(q, np.nan)
    scratch = np.empty((B * N_HEADS, T + HEAD_DIM), np.float32)
    K.attention(q, k_cache, v_cache, out, cos, sin, scratch, pos0, nrows, total, N_HEADS, N_KV,
                HEAD_DIM, scale=scale, window=window, causal=causal, softcap=softcap,
                sinks=sinks, bias=bias)
    want_cos, want_sin = ref.rope_tables(*K.rope_inv_freq(HEAD_DIM, 10000.0, "yarn", factor=4.0,
                                                          original_max_position_embeddings=16), T)
    for b in range(B):
        want = ref.mha(q_all[b, pos0:], k_all[b], v_all[b], np.arange(pos0, total), np.arange(total),
                       N_HEADS, N_KV, want_cos, want_sin, window, causal, scale, softcap,
                       sinks if use_sinks else None,
                       None if full_bias is None else full_bias[b][:, pos0:total, :total])
        close(out[b, :nrows], want)
    untouched(out, slice(0, nrows))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
@pytest.mark.parametrize("pos0,nrows", [(13, 1), (0, 11), (40, 1)])
def test_attention_writes_the_step_keys_it_is_given(pos0, nrows, dtype, threads):
    """attention(..., k=, v=) writes the step's rows into the caches as kv_cache_write does and
    attends over them in the same call (one kernel call a decode step), on one thread and on
    the pool (40 keys: enough work for the parallel kernel); against the reference."""
    q_all, k_all, v_all, want_k, want_v, cos, sin = _cache_setup(pos0, nrows, seed=25, dtype=dtype)
    total, T = pos0 + nrows, want_k.shape[2]
    k_cache, v_cache = _caches_before(k_all, v_all, cos, sin, pos0, T, dtype)
    q = q_all[:, pos0:].copy()
    out = np.full_like(q, np.nan)
    scratch = np.empty((B * N_HEADS, T + HEAD_DIM), np.float32)
    before = K.get_num_threads()
    try:
        K.set_num_threads(threads)
        K.attention(q, k_cache, v_cache, out, cos, sin, scratch, pos0, nrows, total, N_HEADS,
                    N_KV, HEAD_DIM, scale=HEAD_DIM ** -0.5, k=k_all[:, pos0:].copy(),
                    v=v_all[:, pos0:].copy())
    finally:
        K.set_num_threads(before)
    np.testing.assert_array_equal(k_cache, want_k)
    np.testing.assert_array_equal(v_cache, want_v)
    if dtype == np.uint16:  # rounded keys: the same call over the caches written before it
        again = np.full_like(q, np.nan)
        try:
            K.set_num_threads(threads)
            K.attention(q, want_k, want_v, again, cos, sin, scratch, pos0, nrows, total,
                        N_HEADS, N_KV, HEAD_DIM, scale=HEAD_DIM ** -0.5)
        finally:
            K.set_num_threads(before)
        np.testing.assert_array_equal(out, again)
        return
    want_cos, want_sin = ref.rope_tables(*K.rope_inv_freq(HEAD_DIM, 10000.0, "yarn", factor=4.0,
                                                          original_max_position_embeddings=16), T)
    for b in range(B):
        want = ref.mha(q_all[b, pos0:], k_all[b], v_all[b], np.arange(pos0, total),
                       np.arange(total), N_HEADS, N_KV, want_cos, want_sin, 1 << 32, True,
                       HEAD_DIM ** -0.5)
        close(out[b], want)


@pytest.mark.parametrize("pos0,nrows", [(0, 1), (6, 1), (2, 4)])
def test_cross_attention_reads_every_key_of_the_other_sequence(pos0, nrows):
    """Cross-attention: the keys are another sequence's kv_len rows (more than the decoder's
    positions), unrotated, all visible to every query; no RoPE (identity tables)."""
    kv_len, T = 11, 8
    q_all = rand(B, T, N_HEADS * HEAD_DIM, seed=50)
    k_rows = np.full((B, kv_len + 3, N_KV * HEAD_DIM), np.nan, np.float32)
    v_rows = np.full_like(k_rows, np.nan)
    k_rows[:, :kv_len] = rand(B, kv_len, N_KV * HEAD_DIM, seed=51)
    v_rows[:, :kv_len] = rand(B, kv_len, N_KV * HEAD_DIM, seed=52)
    cos = np.ones((T, HEAD_DIM // 2), np.float32)
    sin = np.zeros((T, HEAD_DIM // 2), np.float32)
    q = q_all[:, pos0:pos0 + nrows].copy()
    out = np.full_like(q, np.nan)
    scratch = np.empty((B * N_HEADS, kv_len + 3 + HEAD_DIM), np.float32)
    scale = 1.0
    K.attention(q, k_rows, v_rows, out, cos, sin, scratch, pos0, nrows, kv_len, N_HEADS, N_KV,
                HEAD_DIM, scale=scale, causal=False)
    for b in range(B):
        identity = np.ones((kv_len, HEAD_DIM // 2)), np.zeros((kv_len, HEAD_DIM // 2))
        want = ref.mha(q[b], k_rows[b, :kv_len], v_rows[b, :kv_len], np.arange(nrows),
                       np.arange(kv_len), N_HEADS, N_KV, *identity, 1 << 40, False, scale)
        close(out[b], want)


@pytest.mark.parametrize("pos0,nrows", [(0, 13), (0, 6)])
@pytest.mark.parametrize("window", [8, 9, 3])
def test_two_sided_window_with_its_own_right_side(window, pos0, nrows):
    """T5Gemma2's encoder window W: keys q - ((W+1)//2 - 1) .. q + W//2 (left (W+1)//2, right
    W//2 + 1, exclusive)."""
    q_all, k_all, v_all, k_cache, v_cache, cos, sin = _cache_setup(pos0, nrows, seed=60)
    total, T = pos0 + nrows, k_cache.shape[2]
    left, right = (window + 1) // 2, window // 2 + 1
    q = q_all[:, pos0:].copy()
    out = np.full_like(q, np.nan)
    scratch = np.empty((B * N_HEADS, T + HEAD_DIM), np.float32)
    K.attention(q, k_cache, v_cache, out, cos, sin, scratch, pos0, nrows, total, N_HEADS, N_KV,
                HEAD_DIM, scale=0.3, window=left, window_right=right, causal=False)
    want_cos, want_sin = ref.rope_tables(*K.rope_inv_freq(HEAD_DIM, 10000.0, "yarn", factor=4.0,
                                                          original_max_position_embeddings=16), T)
    qp, kp = np.arange(pos0, total), np.arange(total)
    hf = ((qp[:, None] - kp[None, :] >= 0) & (qp[:, None] - kp[None, :] < left)) | \
        ((qp[:, None] - kp[None, :] < 0) & (kp[None, :] - qp[:, None] < right))
    assert np.array_equal(ref.attention_mask(qp, kp, left, False, right), hf)  # HF's formula
    for b in range(B):
        close(out[b], ref.mha(q_all[b, pos0:], k_all[b], v_all[b], qp, kp, N_HEADS, N_KV,
                              want_cos, want_sin, left, False, 0.3, window_right=right))


@pytest.mark.parametrize("pos0,nrows", [(0, 1), (0, 7), (9, 1), (5, 4)])
def test_merged_attention_adds_the_cross_keys_to_the_softmax(pos0, nrows):
    """T5Gemma2's decoder: the causal, windowed, rotated self keys and every cross key (another
    sequence's, unrotated) in one softmax; the cross rows are shared by groups of query rows."""
    q_all, k_all, v_all, k_cache, v_cache, cos, sin = _cache_setup(pos0, nrows, seed=70)
    total, T = pos0 + nrows, k_cache.shape[2]
    nx, window = 6, 4
    cross_k = np.full((1, nx + 2, N_KV * HEAD_DIM), np.nan, np.float32)
    cross_v = np.full_like(cross_k, np.nan)
    cross_k[:, :nx] = rand(1, nx, N_KV * HEAD_DIM, seed=71)
    cross_v[:, :nx] = rand(1, nx, N_KV * HEAD_DIM, seed=72)
    q = q_all[:, pos0:].copy()
    out = np.full_like(q, np.nan)
    scratch = np.empty((B * N_HEADS, T + nx + 2 + HEAD_DIM), np.float32)
    K.attention(q, k_cache, v_cache, out, cos, sin, scratch, pos0, nrows, total, N_HEADS, N_KV,
                HEAD_DIM, scale=0.25, window=window, causal=True, cross_k=cross_k,
                cross_v=cross_v, cross_len=nx)
    want_cos, want_sin = ref.rope_tables(*K.rope_inv_freq(HEAD_DIM, 10000.0, "yarn", factor=4.0,
                                                          original_max_position_embeddings=16), T)
    for b in range(B):
        want = ref.mha(q_all[b, pos0:], k_all[b], v_all[b], np.arange(pos0, total),
                       np.arange(total), N_HEADS, N_KV, want_cos, want_sin, window, True, 0.25,
                       cross_k=cross_k[0, :nx], cross_v=cross_v[0, :nx])
        close(out[b], want)


def test_key_end_opens_the_rest_of_a_block_to_a_causal_query():
    """Gemma 3's image tokens: rows of a block see the block's later keys too, within the
    window's lower bound; rows outside blocks stay causal."""
    pos0, nrows, window = 2, 9, 4
    q_all, k_all, v_all, k_cache, v_cache, cos, sin = _cache_setup(pos0, nrows, seed=80)
    total, T = pos0 + nrows, k_cache.shape[2]
    key_end = np.zeros((B, nrows), np.int64)
    key_end[:, 2:7] = pos0 + 7                         # positions 4..8 form a block
    q = q_all[:, pos0:].copy()
    out = np.full_like(q, np.nan)
    scratch = np.empty((B * N_HEADS, T + HEAD_DIM), np.float32)
    K.attention(q, k_cache, v_cache, out, cos, sin, scratch, pos0, nrows, total, N_HEADS, N_KV,
                HEAD_DIM, scale=0.25, window=window, causal=True, key_end=key_end)
    want_cos, want_sin = ref.rope_tables(*K.rope_inv_freq(HEAD_DIM, 10000.0, "yarn", factor=4.0,
                                                          original_max_position_embeddings=16), T)
    for b in range(B):
        want = ref.mha(q_all[b, pos0:], k_all[b], v_all[b], np.arange(pos0, total),
                       np.arange(total), N_HEADS, N_KV, want_cos, want_sin, window, True, 0.25,
                       key_end=key_end[b])
        close(out[b], want)


# ---------------------------------------------------------------- elementwise

@njit(cache=True)
def _expf_of(x, out):
    for i in range(x.shape[0]):
        out[i] = expf(x[i])


def test_expf_is_within_one_ulp_of_exp_on_every_sampled_float32():
    bits = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & (x > -87.33) & (x < 88.72)]   # normal results
    out = np.empty_like(x)
    _expf_of(x, out)
    exact = np.exp(x.astype(np.float64))
    ulps = np.abs(out - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert x.size > 400_000 and ulps.max() < 1.0, f"max error {ulps.max():.3f} ulp"
    edges = np.array([-np.inf, -1e30, -88.0, 89.0, 1e30, np.inf, np.nan, 0.0, -0.0],
                     dtype=np.float32)
    out = np.empty_like(edges)
    _expf_of(edges, out)
    assert out[:3].tolist() == [0.0, 0.0, 0.0] and out[3:6].tolist() == [np.inf] * 3
    assert np.isnan(out[6]) and out[7:].tolist() == [1.0, 1.0]


def test_swiglu_add_multiply():
    gate, up = rand(B, 4, 301, seed=40, scale=4.0), rand(B, 4, 301, seed=41)
    out = np.full_like(gate, np.nan)
    glu_rows = row_kernels()[1]
    glu_rows(GLU_SWIGLU, gate, up, out, 3, NO_Q, NO_D, NO_D, NO_U)
    for b in range(B):
        close(out[b, :3], ref.swiglu(gate[b, :3], up[b, :3]))
    untouched(out, slice(0, 3))
    for kernel, op in ((K.add, np.add),
                       (lambda g, v, o, n: glu_rows(GLU_MULTIPLY, g, v, o, n, NO_Q, NO_D, NO_D,
                                                    NO_U), np.multiply)):
        out = np.full_like(gate, np.nan)
        kernel(gate, up, out, 2)
        assert np.array_equal(out[:, :2], op(gate[:, :2], up[:, :2]))
        untouched(out, slice(0, 2))
    a = gate.copy()
    K.add(a, up, a, 4)                                 # in place
    assert np.array_equal(a, gate + up)


@pytest.mark.parametrize("name", sorted(K.ACTIVATIONS))
def test_activation(name):
    x = rand(B, 3, 257, seed=50, scale=4.0)
    y = np.full_like(x, np.nan)
    K.activation(x, y, 2, K.ACTIVATIONS[name])
    twin = ref.ACTIVATIONS["silu" if name == "swish" else name]
    for b in range(B):
        close(y[b, :2], twin(x[b, :2]))
    untouched(y, slice(0, 2))


def test_activation_constants_and_bad_kind():
    assert K.ACTIVATIONS["swish"] == K.ACTIVATIONS["silu"] == K.ACT_SILU
    assert len({K.ACT_NONE, K.ACT_SILU, K.ACT_GELU, K.ACT_TANH_GELU, K.ACT_RELU, K.ACT_TANH,
                K.ACT_SIGMOID}) == 7
    x = rand(1, 1, 4)
    with pytest.raises(ValueError):
        K.activation(x, x, 1, 99)


def test_softmax_rows():
    x = rand(B, 4, VOCAB, seed=60, scale=20.0)
    y = np.full_like(x, np.nan)
    K.softmax_rows(x, y, 3)
    for b in range(B):
        close(y[b, :3], ref.softmax(x[b, :3].astype(np.float64)))
    untouched(y, slice(0, 3))
    K.softmax_rows(x, x, 1)                            # in place
    close(x[:, 0], y[:, 0], rtol=1e-6)


# ---------------------------------------------------------------- embedding

@pytest.mark.parametrize("scale", [1.0, math.sqrt(HEAD_DIM)])
def test_embedding(scale):
    table = readonly(rand(VOCAB, HEAD_DIM, seed=70))
    ids = np.zeros((B, 1, 6), np.float32)
    ids[0, 0, :4] = [0, 5, VOCAB - 1, 5]
    ids[1, 0, :4] = [7, 1, 2, 1000]
    out = np.full((B, 5, HEAD_DIM), np.nan, np.float32)
    assert K.embedding(ids, table, out, 4, scale) == -1
    for b in range(B):
        close(out[b, :4], ref.embedding(ids[b, 0, :4], table, scale), rtol=1e-7)
    untouched(out, slice(0, 4))


@pytest.mark.parametrize("bad,returned", [(VOCAB, VOCAB), (VOCAB + 40, VOCAB + 40), (-3, -3),
                                          (-1, -2), (np.nan, VOCAB)])
def test_embedding_bad_id(bad, returned):
    table = readonly(rand(VOCAB, HEAD_DIM, seed=71))
    ids = np.zeros((B, 1, 3), np.float32)
    ids[1, 0, 1] = bad
    out = np.full((B, 3, HEAD_DIM), np.nan, np.float32)
    assert K.embedding(ids, table, out, 3, 1.0) == returned
    assert np.isnan(out).all()                         # nothing written
    assert K.embedding(ids, table, out, 1, 1.0) == -1  # the bad id is beyond nrows: fine


# ---------------------------------------------------------------- threads

def test_set_num_threads_clamps():
    import numba
    before = K.get_num_threads()
    try:
        assert K.set_num_threads(0) == 1 and K.get_num_threads() == 1
        top = numba.config.NUMBA_NUM_THREADS
        assert K.set_num_threads(top + 5) == top and K.get_num_threads() == top
    finally:
        K.set_num_threads(before)


@pytest.mark.slow
def test_serial_and_parallel_kernels_agree_exactly():
    """A product's or attention's team ops give the same bits run by one thread or shared by
    two (a task computes the same values whoever runs it; kernels/team.py): the [in, out] and
    [out, in] float32 layouts, BF16 and F16 rows, attention's row kernel."""
    import importlib
    att = importlib.import_module("causallm.kernels.attention")
    lin = importlib.import_module("causallm.kernels.linear")
    from causallm.kernels.packed import PackedMatrix
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 67)).astype(np.float32)
    w = rng.standard_normal((67, 701)).astype(np.float32)  # 11 blocks of output rows
    bias = rng.standard_normal(701).astype(np.float32)
    for weight in (w, np.ascontiguousarray(w.T).T, PackedMatrix.fromFloat("BF16", w.T),
                   PackedMatrix.fromFloat("F16", w.T)):
        outs = []
        for n_threads in (1, 2):
            y = np.zeros((2, 3, 701), np.float32)
            Program(lin.linear_ops(x, weight, bias, y, 0, 0, 3)).run(n_threads)
            outs.append(y)
        np.testing.assert_array_equal(outs[0], outs[1])
    B, T, H, KV, D = 2, 16, 6, 2, 80
    q = rng.standard_normal((B, 5, H * D)).astype(np.float32)
    kc = rng.standard_normal((B, KV, T, D)).astype(np.float32)
    vc = rng.standard_normal((B, KV, T, D)).astype(np.float32)
    cos, sin = np.cos(np.ones((T, D // 2), np.float32)), np.sin(np.ones((T, D // 2), np.float32))
    k = rng.standard_normal((B, 5, KV * D)).astype(np.float32)  # the step's, written first
    v = rng.standard_normal((B, 5, KV * D)).astype(np.float32)
    outs = []
    slots, positions = att.step_rows(B, 7, 5, B)
    for n_threads in (2, 1):  # one task a head (3 parts a group) on the pool, or one whole task
        out = np.zeros_like(q)
        scratch = np.zeros((B * H, T + D), np.float32)
        caches = kc.copy(), vc.copy()
        ops = att.attention_ops(q, *caches, out, cos, sin, scratch, 5, 12, H, KV, D,
                                scale=D ** -0.5, window=4, slots=slots, positions=positions,
                                k=k, v=v, n_threads=n_threads)
        Program(ops).run(n_threads)
        outs += [out, *caches]
    for a, b in zip(outs[:3], outs[3:]):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(outs[1], kc)  # the step's keys were written


def test_attention_splits_groups_for_an_even_share():
    """Tasks per group of query heads: the fewest dividing the group that share evenly or give
    each thread several tasks."""
    from causallm.kernels.attention import PARALLEL_TASKS, _parts
    assert _parts(4, 2, 2) == 1  # 4 groups, 2 threads
    assert _parts(3, 3, 2) == 3  # SmolLM2: 3 groups of 3 heads -> 9 one-head tasks
    assert _parts(1, 4, 2) == 2  # Gemma 3 270M: 1 group of 4 -> 2 tasks of 2 heads
    assert _parts(3, 1, 2) == 1  # a group of one cannot split
    assert _parts(PARALLEL_TASKS * 3 + 1, 2, 3) == 1  # uneven, but enough tasks a thread


@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
def test_attention_split_by_heads(dtype):
    """A decode step whose 3 groups of 3 heads run as 9 one-head tasks on 2 threads (the split
    above), against the reference on a float32 and an FP16 cache."""
    nh, nkv, d, T = 9, 3, 64, 81
    pos0 = T - 1
    q, k, v = (rand(1, T, n * d, seed=90 + i) for i, n in enumerate((nh, nkv, nkv)))
    cos, sin = np.ones((T, d // 2), np.float32), np.zeros((T, d // 2), np.float32)
    kc, vc = (np.ascontiguousarray(c.reshape(1, T, nkv, d).transpose(0, 2, 1, 3)) for c in (k, v))
    kf, vf = k, v
    if dtype == np.uint16:
        kc, vc = (c.astype(np.float16).view(np.uint16) for c in (kc, vc))
        kf, vf = (c.view(np.float16).astype(np.float32).transpose(0, 2, 1, 3).reshape(1, T, -1)
                  for c in (kc, vc))
    out = np.full((1, 1, nh * d), np.nan, np.float32)
    scratch = np.empty((nh, T + d), np.float32)
    before = K.get_num_threads()
    try:
        K.set_num_threads(2)
        K.attention(q[:, pos0:].copy(), kc, vc, out, cos, sin, scratch, pos0, 1, T, nh, nkv, d,
                    scale=d ** -0.5)
    finally:
        K.set_num_threads(before)
    want = ref.mha(q[0, pos0:], kf[0], vf[0], np.arange(pos0, T), np.arange(T), nh, nkv, cos,
                   sin, 1 << 32, True, d ** -0.5)
    close(out[0], want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
@pytest.mark.parametrize("pos0,nrows", [(0, 70), (23, 130)])
@pytest.mark.parametrize("case", ["causal", "causal_window_softcap_sinks"])
def test_a_long_causal_step_runs_as_blocks_of_matrix_products(case, pos0, nrows, dtype, threads,
                                                               monkeypatch):
    """A causal step of BLOCKED_MIN_ROWS rows or more (a prompt) runs attention_blocked (here
    whatever its keys: BLOCKED_MIN_KEYS 0): blocks of BLOCK_ROWS query rows (the last one
    partial), the step's keys written first, a window inside and across blocks, softcap and
    sinks, out the q buffer itself; against the reference, on one thread and on the pool."""
    A = sys.modules["causallm.kernels.attention"]  # the module (the package exports the function)
    assert nrows >= A.BLOCKED_MIN_ROWS and nrows % A.BLOCK_ROWS
    blocked, original = [], A.attention_blocked
    monkeypatch.setattr(A, "BLOCKED_MIN_KEYS", 0)
    monkeypatch.setattr(A, "attention_blocked", lambda *a: blocked.append(1) or original(*a))
    _, window, softcap, use_sinks, _ = ATTENTION_CASES[case]
    window = 50 if window < 1 << 32 else window  # more keys than a block's rows: a real window
    q_all, k_all, v_all, want_k, want_v, cos, sin = _cache_setup(pos0, nrows, seed=27, dtype=dtype)
    total, T = pos0 + nrows, want_k.shape[2]
    k_cache, v_cache = _caches_before(k_all, v_all, cos, sin, pos0, T, dtype)
    sinks = readonly(rand(N_HEADS, seed=32)) if use_sinks else np.zeros(0, np.float32)
    q = q_all[:, pos0:].copy()
    scratch = np.empty((B * N_HEADS, T + HEAD_DIM), np.float32)
    before = K.get_num_threads()
    try:
        K.set_num_threads(threads)
        K.attention(q, k_cache, v_cache, q, cos, sin, scratch, pos0, nrows, total, N_HEADS,
                    N_KV, HEAD_DIM, scale=HEAD_DIM ** -0.5, window=window, softcap=softcap,
                    sinks=sinks, k=k_all[:, pos0:].copy(), v=v_all[:, pos0:].copy())
    finally:
        K.set_num_threads(before)
    np.testing.assert_array_equal(k_cache, want_k)
    np.testing.assert_array_equal(v_cache, want_v)
    want_cos, want_sin = ref.rope_tables(*K.rope_inv_freq(HEAD_DIM, 10000.0, "yarn", factor=4.0,
                                                          original_max_position_embeddings=16), T)
    kf, vf = k_all, v_all
    if dtype == np.uint16:  # the keys and values as the cache holds them: rounded to FP16
        kf, vf = (c.astype(np.float16).astype(np.float32) for c in (k_all, v_all))
    for b in range(B):
        want = ref.mha(q_all[b, pos0:], kf[b], vf[b], np.arange(pos0, total), np.arange(total),
                       N_HEADS, N_KV, want_cos, want_sin, window, True, HEAD_DIM ** -0.5,
                       softcap, sinks if use_sinks else None)
        close(q[b], want, rtol=1e-5 if dtype == np.float32 else 2e-3)
    assert blocked


def test_a_step_of_several_sequences_stays_a_row_at_a_time():
    """Rows of different slots (or positions that do not follow on) in one batch row are not
    one prompt: attention_blocked does not take them."""
    from causallm.kernels.attention import _runs
    positions = np.arange(40, dtype=np.int64)[None, :].repeat(2, axis=0)
    slots = np.array([[0] * 40, [1] * 40], np.int64)
    assert _runs(slots, positions, 40)
    mixed = slots.copy()
    mixed[1, 20:] = 3
    assert not _runs(mixed, positions, 40)
    jump = positions.copy()
    jump[0, 30:] += 5
    assert not _runs(slots, jump, 40)


@pytest.mark.parametrize("n_kv", [N_HEADS, N_KV])
def test_attention_dense_is_the_bidirectional_kernel(n_kv):
    """The BLAS path of a long bidirectional step equals the per-row kernel (no RoPE)."""
    L = 70
    q = rand(B, L + 3, N_HEADS * HEAD_DIM, seed=90)
    k = rand(B, L + 3, n_kv * HEAD_DIM, seed=91)
    v = rand(B, L + 3, n_kv * HEAD_DIM, seed=92)
    cos, sin = np.ones((L, HEAD_DIM // 2), np.float32), np.zeros((L, HEAD_DIM // 2), np.float32)
    want, got = np.full_like(q, np.nan), np.full_like(q, np.nan)
    scratch = np.empty((B * N_HEADS, L + 3 + HEAD_DIM), np.float32)
    K.attention(q, k, v, want, cos, sin, scratch, 0, L, L, N_HEADS, n_kv, HEAD_DIM, scale=0.2,
                causal=False)
    import importlib
    importlib.import_module("causallm.kernels.attention").attention_dense(
        q, k, v, got, L, N_HEADS, n_kv, HEAD_DIM, 0.2)
    close(got[:, :L], want[:, :L])
    untouched(got, slice(0, L))
    for b in range(B):
        ref_out = ref.mha(q[b, :L], k[b, :L], v[b, :L], np.arange(L), np.arange(L), N_HEADS, n_kv,
                          np.ones((L, HEAD_DIM // 2)), np.zeros((L, HEAD_DIM // 2)), 1 << 40,
                          False, 0.2)
        close(got[b, :L], ref_out)
