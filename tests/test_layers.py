"""Every layer against its formula, through the public graph API.

Each test builds a tiny graph with createModel / createLayer / withKey, compiles and initializes
it, sets random weights with setWeight, runs incremental_inference and compares the result with
a plain numpy formula written here in float64 (independent of the kernels and of
tests/reference.py). RoPE tables are also checked against transformers' own inv_freq and
attention_scaling (tests/fixtures/rope/hf_rope.json, written by tools/make_fixtures.py).
"""

import math
import os

import numpy as np
import orjson
import pytest
from graphs import build, feature_input

from causallm.api import UINT_MAX, createLayer, createModel, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.layers.embedding_layer import EmbeddingLayer
from causallm.layers.lm_head import LmHeadLayer
from causallm.layers.mha_core import MHACoreLayer
from causallm.layers.reshaped_rms_norm import ReshapedRMSNormLayer
from causallm.layers.rms_norm import RMSNormLayer
from causallm.layers.swiglu import SwiGLULayer
from causallm.layers.tie_word_embeddings import TieWordEmbedding
from causallm.models.transformer import Transformer

for _cls in (EmbeddingLayer, TieWordEmbedding, RMSNormLayer, ReshapedRMSNormLayer, SwiGLULayer,
             LmHeadLayer, MHACoreLayer):
    registerFactory(_cls)

F32 = np.float32
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


# ------------------------------------------------------------------------------ helpers
def id_input(rows, name="input0"):
    """An input layer of token ids: buffer (B, 1, rows)."""
    return createLayer("input", [withKey("name", name), withKey("input_shape", f"1:1:{rows}")])


def run(model, inputs, from_, to, width):
    """One step over positions [from_, to): ``inputs`` are (B, step, W) features or (B, step)
    ids, one per input layer; returns the first graph output's valid rows, (B, rows, width)."""
    batch = inputs[0].shape[0]
    flat = [np.asarray(a, dtype=F32).reshape(batch, -1) for a in inputs]
    out = model.incremental_inference(batch, flat, None, None, from_, to)[0]
    out = out.reshape(batch, -1, width)
    return out[:, :to - from_] if out.shape[1] > 1 else out


def close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def one_line_error(excinfo, *needles):
    message = str(excinfo.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message


# ------------------------------------------------------------------------------ embedding
@pytest.mark.parametrize("layer_type", ["embedding_layer", "tie_word_embeddings"])
def test_embedding_lookup_with_scale(layer_type):
    rng = np.random.default_rng(1)
    V, D, L = 11, 6, 5
    emb = createLayer(layer_type, [withKey("name", "embedding0"), withKey("in_dim", V),
                                   withKey("out_dim", D), withKey("scale", 2.5)])
    model = build([id_input(L), emb], batch=2)
    assert [(s.full_name, s.shape) for s in model.getWeightSpecs()] == [("embedding0:Embedding", (V, D))]
    W = rng.standard_normal((V, D)).astype(F32)
    model.setWeight("embedding0:Embedding", W)
    ids = np.array([[0, 10, 3, 3], [7, 1, 0, 2]])
    close(run(model, [ids], 0, 4, D), W[ids].astype(np.float64) * 2.5, rtol=1e-7, atol=0)
    # a decode step: one id per batch at row 0
    close(run(model, [ids[:, 1:2]], 4, 5, D), W[ids[:, 1:2]].astype(np.float64) * 2.5, rtol=1e-7, atol=0)


@pytest.mark.parametrize("layer_type", ["embedding_layer", "tie_word_embeddings"])
@pytest.mark.parametrize("bad", [11, 250, -1])
def test_embedding_out_of_range_id_is_one_line_error(layer_type, bad):
    emb = createLayer(layer_type, [withKey("name", "embedding0"), withKey("in_dim", 11),
                                   withKey("out_dim", 4)])
    model = build([id_input(3), emb])
    model.setWeight("embedding0:Embedding", np.ones((11, 4), F32))
    with pytest.raises(CausalLMError) as e:
        run(model, [np.array([[1, bad, 2]])], 0, 3, 4)
    one_line_error(e, "layer 'embedding0'", "out of range", "in_dim 11")
    assert f"token id {bad} " in str(e.value)


# ------------------------------------------------------------------------------ tied head
def test_tie_word_embeddings_head_reads_the_embedding_tensor():
    V, D, L = 13, 8, 4
    emb = createLayer("tie_word_embeddings", [withKey("name", "embedding0"), withKey("in_dim", V),
                                              withKey("out_dim", D), withKey("scale", 1.5)])
    head = createLayer("tie_word_embeddings", [withKey("name", "head"), withKey("unit", V),
                                               withKey("disable_bias", True),
                                               withKey("shared_from", "embedding0"),
                                               withKey("input_layers", "embedding0")])
    model = build([id_input(L), emb, head])
    assert [(s.full_name, s.shape) for s in model.getWeightSpecs()] == [("embedding0:Embedding", (V, D))]
    used = []
    ids = np.array([[3, 12, 0]])
    for seed in (3, 4):  # setting the one weight changes both the lookup and the head
        W = np.random.default_rng(seed).standard_normal((V, D)).astype(F32)
        model.setWeight("embedding0:Embedding", W)
        logits = run(model, [ids], 0, 3, V)[:, 0]
        want = (W[0].astype(np.float64) * 1.5) @ W.T.astype(np.float64)   # last id of the step: 0
        close(logits[0], want, rtol=1e-5, atol=1e-5)
        used.append(logits)
    assert not np.allclose(used[0], used[1])
    weights = []
    model.forEachLayer(lambda layer, ctx, acc: acc.append(ctx.weights), weights)
    emb_w, head_w = weights[1][0], weights[2][0]
    assert emb_w is head_w is model.getWeight("embedding0:Embedding")


def test_tie_word_embeddings_head_mode_with_own_weight_and_bias():
    rng = np.random.default_rng(5)
    V, D, L = 7, 5, 4
    head = createLayer("tie_word_embeddings", [withKey("name", "head"), withKey("unit", V),
                                               withKey("input_layers", "x")])
    model = build([feature_input("x", L, D), head], batch=2)
    assert [(s.full_name, s.shape) for s in model.getWeightSpecs()] == [
        ("head:Embedding", (V, D)), ("head:bias", (V,))]
    W = rng.standard_normal((V, D)).astype(F32)
    b = rng.standard_normal(V).astype(F32)
    model.setWeight("head:Embedding", W)
    model.setWeight("head:bias", b)
    x = rng.standard_normal((2, 3, D)).astype(F32)
    close(run(model, [x], 0, 3, V)[:, 0], x[:, 2].astype(np.float64) @ W.T + b, atol=1e-5)


# ------------------------------------------------------------------------------ norms
def rms(x, gamma, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gamma


def test_rms_norm_eps_inside_sqrt():
    rng = np.random.default_rng(6)
    W, L = 8, 3
    norm = createLayer("rms_norm", [withKey("name", "norm"), withKey("epsilon", 0.5),
                                    withKey("packed", False)])
    model = build([feature_input("x", L, W), norm], batch=2)
    gamma = rng.standard_normal(W).astype(F32)
    model.setWeight("norm:gamma", gamma)
    x = (rng.standard_normal((2, L, W)) * 0.3).astype(F32)
    got = run(model, [x], 0, L, W)
    close(got, rms(x, gamma, 0.5))
    ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    assert not np.allclose(got, x / (np.sqrt(ms) + 0.5) * gamma, rtol=1e-3)  # eps outside sqrt
    close(run(model, [x[:, :1]], L, L + 1, W), rms(x[:, :1], gamma, 0.5))        # decode row


def test_rms_norm_default_epsilon_is_1e_3():
    rng = np.random.default_rng(7)
    W = 6
    norm = createLayer("rms_norm", [withKey("name", "norm")])
    model = build([feature_input("x", 2, W), norm])
    assert norm.layer.props["epsilon"] == 1e-3
    gamma = rng.standard_normal(W).astype(F32)
    model.setWeight("norm:gamma", gamma)
    x = (rng.standard_normal((1, 2, W)) * 0.02).astype(F32)  # mean square ~ 4e-4: eps matters
    got = run(model, [x], 0, 2, W)
    close(got, rms(x, gamma, 1e-3))
    assert not np.allclose(got, rms(x, gamma, 1e-6), rtol=1e-2)


def test_reshaped_rms_norm_per_head_segments():
    rng = np.random.default_rng(8)
    fs, heads, L = 4, 3, 2
    norm = createLayer("reshaped_rms_norm", [withKey("name", "qnorm"), withKey("feature_size", fs),
                                             withKey("epsilon", 1e-6)])
    model = build([feature_input("x", L, fs * heads), norm], batch=2)
    assert [(s.full_name, s.shape) for s in model.getWeightSpecs()] == [("qnorm:gamma", (fs,))]
    gamma = rng.standard_normal(fs).astype(F32)
    model.setWeight("qnorm:gamma", gamma)
    x = (rng.standard_normal((2, L, fs * heads)) * np.array([0.1] * fs + [1] * fs + [10] * fs)).astype(F32)
    got = run(model, [x], 0, L, fs * heads)
    want = rms(x.reshape(2, L, heads, fs), gamma, 1e-6).reshape(2, L, heads * fs)
    close(got, want)
    assert not np.allclose(got, rms(x, np.tile(gamma, heads), 1e-6), rtol=1e-2)  # whole-row norm


def test_reshaped_rms_norm_width_not_a_multiple():
    norm = createLayer("reshaped_rms_norm", [withKey("name", "qnorm"), withKey("feature_size", 4)])
    model = createModel()
    model.addLayer(feature_input("x", 1, 10))
    model.addLayer(norm)
    with pytest.raises(CausalLMError) as e:
        model.compile()
    one_line_error(e, "layer 'qnorm'", "input width 10 is not a multiple of feature_size 4")


# ------------------------------------------------------------------------------ fully connected
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
def test_fully_connected_both_weight_layouts(batch, bias):
    rng = np.random.default_rng(9)
    K, N, L = 12, 7, 6
    W = rng.standard_normal((K, N)).astype(F32)               # [in, out], C-contiguous
    Wt = np.ascontiguousarray(W.T)                            # [out, in] as PyTorch stores it
    b = rng.standard_normal(N).astype(F32)
    x = rng.standard_normal((batch, 11, K)).astype(F32)
    results = []
    for weight in (W, Wt.T):
        fc = createLayer("fully_connected", [withKey("name", "fc"), withKey("unit", N),
                                             withKey("disable_bias", not bias)])
        model = build([feature_input("x", L, K), fc], batch=batch)
        names = [s.full_name for s in model.getWeightSpecs()]
        assert names == (["fc:weight", "fc:bias"] if bias else ["fc:weight"])
        model.setWeight("fc:weight", weight)
        assert np.shares_memory(model.getWeight("fc:weight"), weight)  # kept without a copy
        if bias:
            model.setWeight("fc:bias", b)
        got = []
        for from_, to in ((0, 6), (6, 7), (7, 10), (10, 11)):  # prefill, decode, 3 rows, decode
            y = run(model, [x[:, from_:to]], from_, to, N)
            want = x[:, from_:to].astype(np.float64) @ W + (b if bias else 0)
            close(y, want, atol=1e-5)
            got.append(y)
        results.append(np.concatenate(got, axis=1))
    close(results[0], results[1], rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------ elementwise
def test_addition_of_three_inputs():
    rng = np.random.default_rng(10)
    W, L = 5, 3
    add = createLayer("addition", [withKey("name", "sum"), withKey("input_layers", ["a", "b", "c"])])
    model = build([feature_input("a", L, W), feature_input("b", L, W), feature_input("c", L, W), add],
                  batch=2)
    a, b, c = (rng.standard_normal((2, L, W)).astype(F32) for _ in range(3))
    close(run(model, [a, b, c], 0, L, W), a.astype(np.float64) + b + c)
    a1, b1, c1 = a[:, :1], b[:, :1], c[:, :1]                  # a decode row
    close(run(model, [a1, b1, c1], L, L + 1, W), a1.astype(np.float64) + b1 + c1)


def test_multiply():
    rng = np.random.default_rng(11)
    W, L = 5, 3
    mul = createLayer("multiply", [withKey("name", "mul"), withKey("input_layers", ["a", "b"])])
    model = build([feature_input("a", L, W), feature_input("b", L, W), mul], batch=2)
    a, b = (rng.standard_normal((2, L, W)).astype(F32) for _ in range(2))
    close(run(model, [a, b], 0, L, W), a.astype(np.float64) * b)


def test_swiglu_gate_then_up():
    rng = np.random.default_rng(12)
    W, L = 6, 3
    sw = createLayer("swiglu", [withKey("name", "sw"), withKey("input_layers", ["gate", "up"])])
    model = build([feature_input("gate", L, W), feature_input("up", L, W), sw], batch=2)
    gate, up = (rng.standard_normal((2, L, W)).astype(F32) * 3 for _ in range(2))
    got = run(model, [gate, up], 0, L, W)
    g = gate.astype(np.float64)
    close(got, g / (1 + np.exp(-g)) * up)
    assert not np.allclose(got, up / (1 + np.exp(-up.astype(np.float64))) * gate, rtol=1e-2)


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _hf_gelu_pytorch_tanh(x):  # transformers PytorchGELUTanh / NewGELUActivation
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * np.power(x, 3.0))))


ACTIVATION_FORMULAS = {
    "silu": lambda x: x / (1 + np.exp(-x)),
    "swish": lambda x: x * (1 / (1 + np.exp(-x))),
    "gelu": _gelu,
    "tanh_gelu": _hf_gelu_pytorch_tanh,
    "relu": lambda x: np.maximum(x, 0),
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


@pytest.mark.parametrize("name", sorted(ACTIVATION_FORMULAS))
def test_activation(name):
    rng = np.random.default_rng(13)
    W, L = 16, 3
    act = createLayer("activation", [withKey("name", "act"), withKey("activation", name)])
    model = build([feature_input("x", L, W), act], batch=2)
    x = np.concatenate([np.linspace(-6, 6, 2 * W).reshape(2, 1, W),
                        rng.standard_normal((2, L - 1, W)) * 3], axis=1).astype(F32)
    got = run(model, [x], 0, L, W)
    close(got, ACTIVATION_FORMULAS[name](x.astype(np.float64)), rtol=2e-6, atol=1e-6)
    if name in ("gelu", "tanh_gelu"):  # the two gelus really differ (by up to ~5e-4 here)
        other = _gelu if name == "tanh_gelu" else _hf_gelu_pytorch_tanh
        assert np.abs(got - other(x.astype(np.float64))).max() > 1e-4


def test_unknown_activation_is_an_error():
    with pytest.raises(CausalLMError) as e:
        createLayer("activation", [withKey("name", "act"), withKey("activation", "mish")])
    one_line_error(e, "layer 'act' (activation)", "'activation'", "mish")


# ------------------------------------------------------------------------------ lm_head
@pytest.mark.parametrize("bias", [False, True])
def test_lm_head_projects_only_the_last_row_of_the_step(bias):
    rng = np.random.default_rng(14)
    D, V, L = 6, 9, 4
    head = createLayer("lm_head", [withKey("name", "head"), withKey("unit", V),
                                   withKey("disable_bias", not bias)])
    model = build([feature_input("x", L, D), head], batch=2)
    W = rng.standard_normal((D, V)).astype(F32)
    b = rng.standard_normal(V).astype(F32) if bias else np.zeros(V, F32)
    model.setWeight("head:weight", W)
    if bias:
        model.setWeight("head:bias", b)
    x = rng.standard_normal((2, 8, D)).astype(F32)
    for from_, to in ((0, 4), (4, 7), (7, 8)):  # the 3-row step leaves a stale 4th row behind
        logits = run(model, [x[:, from_:to]], from_, to, V)
        assert logits.shape == (2, 1, V)
        close(logits[:, 0], x[:, to - 1].astype(np.float64) @ W + b, atol=1e-5)


# ------------------------------------------------------------------------------ mha_core
def inv_freq_of(d, theta):
    return 1.0 / float(theta) ** (np.arange(0, d, 2) / d)   # [d/2] float64


def rotate(x, pos, inv_freq):
    """Rotate-half RoPE of x [n, d] at positions pos [n] (HF apply_rotary_pos_emb)."""
    angle = pos[:, None] * inv_freq[None, :]               # [n, d/2]
    c, s = np.cos(angle), np.sin(angle)
    h = x.shape[1] // 2
    a, b = x[:, :h], x[:, h:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=1)


def attend(q, k, v, allowed, n_heads, n_kv, theta=10000.0, rope=True, softcap=0.0, sinks=None):
    """Full-matrix attention of one sequence at positions 0..S-1.

    q [S, n_heads*d], k and v [S, n_kv*d] (not rotated), allowed [S, S] bool (query, key);
    query head h reads kv head h // (n_heads / n_kv). Returns [S, n_heads*d] float64.
    """
    S = q.shape[0]
    d = q.shape[1] // n_heads
    pos = np.arange(S, dtype=np.float64)
    inv = inv_freq_of(d, theta)
    out = np.zeros((S, n_heads * d))
    for h in range(n_heads):
        g = h // (n_heads // n_kv)
        qh = q[:, h * d:(h + 1) * d].astype(np.float64)
        kh = k[:, g * d:(g + 1) * d].astype(np.float64)
        vh = v[:, g * d:(g + 1) * d].astype(np.float64)
        if rope:
            qh, kh = rotate(qh, pos, inv), rotate(kh, pos, inv)
        s = qh @ kh.T / math.sqrt(d)                               # [S, S]
        if softcap:
            s = np.tanh(s / softcap) * softcap
        s = np.where(allowed, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, sinks[h])
        e = np.exp(s - m)
        den = e.sum(axis=1, keepdims=True)
        if sinks is not None:
            den = den + np.exp(sinks[h] - m)                      # exp(sink) joins the sum
        out[:, h * d:(h + 1) * d] = (e / den) @ vh
    return out


def causal_mask(S, window=None):
    """Query p sees keys t with p - window < t <= p."""
    p, t = np.arange(S)[:, None], np.arange(S)[None, :]
    mask = t <= p
    if window is not None:
        mask &= t > p - window
    return mask


def noncausal_mask(S, steps, window=None):
    """Query p of the step [from_, to) sees the keys t < to with |p - t| < ``window``."""
    mask = np.zeros((S, S), dtype=bool)
    t = np.arange(S)
    for from_, to in steps:
        for p in range(from_, to):
            mask[p] = (t < to) & (np.abs(p - t) < (window or S + 1))
    return mask


def mha_model(rows, T, n_heads=6, n_kv=2, d=80, batch=1, props=()):
    """Inputs q, k, v of ``rows`` rows -> mha_core 'attn' with a cache of T positions."""
    node = createLayer("mha_core", [withKey("name", "attn"), withKey("num_heads", n_heads),
                                    withKey("num_heads_KV", n_kv), withKey("max_timestep", T),
                                    *props, withKey("input_layers", ["q", "k", "v"])])
    model = build([feature_input("q", rows, n_heads * d), feature_input("k", rows, n_kv * d),
                   feature_input("v", rows, n_kv * d), node], batch=batch)
    return model, node.layer


def qkv(seed, S, n_heads=6, n_kv=2, d=80, batch=1, q_scale=1.0):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((batch, S, n_heads * d)) * q_scale).astype(F32)
    k = rng.standard_normal((batch, S, n_kv * d)).astype(F32)
    v = rng.standard_normal((batch, S, n_kv * d)).astype(F32)
    return q, k, v


def run_steps(model, q, k, v, steps):
    """Run each (from_, to) step with the sequence's rows [from_, to); outputs stacked (B, S', W)."""
    outs = [run(model, [q[:, f:t], k[:, f:t], v[:, f:t]], f, t, q.shape[2]) for f, t in steps]
    return np.concatenate(outs, axis=1)


ATOL = 2e-5  # float32 kernel vs the float64 formula, outputs of magnitude ~0.5
RTOL = 1e-4


def test_mha_causal_prefill_matches_full_matrix_reference():
    S = 9
    q, k, v = qkv(20, S, batch=2)
    model, layer = mha_model(S, 16, batch=2, props=[withKey("rope_theta", 10000.0)])
    assert layer.head_dim == 80 and layer.n_heads == 6 and layer.n_kv == 2
    assert model.getWeightSpecs() == []
    got = run_steps(model, q, k, v, [(0, S)])
    for b in range(2):
        close(got[b], attend(q[b], k[b], v[b], causal_mask(S), 6, 2), RTOL, ATOL)
    # one decode step for both batches continues the same sequences
    q2, k2, v2 = qkv(21, S + 1, batch=2)
    q2[:, :S], k2[:, :S], v2[:, :S] = q, k, v
    got = run_steps(model, q2, k2, v2, [(S, S + 1)])
    for b in range(2):
        close(got[b], attend(q2[b], k2[b], v2[b], causal_mask(S + 1), 6, 2)[S:], RTOL, ATOL)


def test_mha_gqa_groups_are_contiguous():
    S = 5
    q, k, v = qkv(22, S)
    model, _ = mha_model(S, 8, props=[withKey("rope_theta", 10000.0)])
    got = run_steps(model, q, k, v, [(0, S)])[0]
    # interleaved grouping (kv head h % n_kv) would be a different answer
    d = 80
    k_il = np.concatenate([k[0][:, (h % 2) * d:(h % 2 + 1) * d] for h in range(6)], axis=1)
    v_il = np.concatenate([v[0][:, (h % 2) * d:(h % 2 + 1) * d] for h in range(6)], axis=1)
    assert not np.allclose(got, attend(q[0], k_il, v_il, causal_mask(S), 6, 6), atol=1e-3)
    close(got, attend(q[0], k[0], v[0], causal_mask(S), 6, 2), RTOL, ATOL)


def test_mha_incremental_equals_full():
    S = 9
    q, k, v = qkv(23, S)
    full, _ = mha_model(S, 16, props=[withKey("rope_theta", 10000.0)])
    want = run_steps(full, q, k, v, [(0, S)])
    inc, _ = mha_model(S, 16, props=[withKey("rope_theta", 10000.0)])
    got = run_steps(inc, q, k, v, [(0, 5)] + [(p, p + 1) for p in range(5, S)])
    close(got, want, rtol=1e-5, atol=2e-6)
    close(got[0], attend(q[0], k[0], v[0], causal_mask(S), 6, 2), RTOL, ATOL)


def test_mha_kv_written_at_from():
    S = 10
    q, k, v = qkv(24, S)
    props = [withKey("rope_theta", 10000.0)]
    one, _ = mha_model(S, 16, props=props)
    want = run_steps(one, q, k, v, [(0, S)])
    two, _ = mha_model(S, 16, props=props)
    got = run_steps(two, q, k, v, [(0, 5), (5, 10)])   # the second step starts at from_ = 5
    close(got, want, rtol=1e-5, atol=2e-6)
    # rewriting positions [3, 8) with new tokens: the cache rows [3, 8) are replaced
    q2, k2, v2 = qkv(25, S)
    for new, old in ((q2, q), (k2, k), (v2, v)):
        new[:, :3] = old[:, :3]
    got = run_steps(two, q2, k2, v2, [(3, 8)])
    close(got[0], attend(q2[0, :8], k2[0, :8], v2[0, :8], causal_mask(8), 6, 2)[3:], RTOL, ATOL)


@pytest.mark.parametrize("steps", [
    [(0, 12)],                                        # one prefill step longer than the window
    [(0, 6)] + [(p, p + 1) for p in range(6, 12)],    # prefill > W, then decode steps
    [(0, 6), (6, 12)],                                # a chunk starting past the window
    [(0, 2), (2, 3), (3, 9), (9, 10), (10, 12)],
])
def test_mha_sliding_window_causal(steps):
    S, W = 12, 4
    q, k, v = qkv(26, S)
    model, _ = mha_model(S, 16, props=[withKey("rope_theta", 1e6), withKey("sliding_window", W)])
    got = run_steps(model, q, k, v, steps)[0]
    close(got, attend(q[0], k[0], v[0], causal_mask(S, W), 6, 2, theta=1e6), RTOL, ATOL)
    assert not np.allclose(got, attend(q[0], k[0], v[0], causal_mask(S), 6, 2, theta=1e6), atol=1e-3)


@pytest.mark.parametrize("window", [None, 3])
def test_mha_non_causal(window):
    S = 9
    steps = [(0, 7), (7, 8), (8, 9)]
    q, k, v = qkv(27, S)
    props = [withKey("rope_theta", 10000.0), withKey("is_causal", False),
             withKey("sliding_window", UINT_MAX if window is None else window)]  # UINT_MAX: none
    model, _ = mha_model(7, 16, props=props)
    got = run_steps(model, q, k, v, steps)[0]
    close(got, attend(q[0], k[0], v[0], noncausal_mask(S, steps, window), 6, 2), RTOL, ATOL)
    assert not np.allclose(got, attend(q[0], k[0], v[0], causal_mask(S), 6, 2), atol=1e-3)


def test_mha_attn_logit_softcapping():
    S = 7
    q, k, v = qkv(28, S, q_scale=4.0)      # large logits, so the cap matters
    model, _ = mha_model(S, 8, props=[withKey("rope_theta", 10000.0),
                                      withKey("attn_logit_softcapping", 1.5)])
    got = run_steps(model, q, k, v, [(0, 4), (4, 5), (5, 7)])[0]
    close(got, attend(q[0], k[0], v[0], causal_mask(S), 6, 2, softcap=1.5), RTOL, ATOL)
    assert not np.allclose(got, attend(q[0], k[0], v[0], causal_mask(S), 6, 2), atol=1e-2)


def test_mha_sink():
    S = 6
    q, k, v = qkv(29, S)
    model, _ = mha_model(S, 8, props=[withKey("rope_theta", 10000.0), withKey("use_sink", True)])
    assert [(s.full_name, s.shape) for s in model.getWeightSpecs()] == [("attn:sink", (6,))]
    sinks = np.array([-1.0, 0.0, 1.0, 2.0, 0.5, 3.0], dtype=F32)
    model.setWeight("attn:sink", sinks)
    got = run_steps(model, q, k, v, [(0, 5), (5, 6)])[0]
    close(got, attend(q[0], k[0], v[0], causal_mask(S), 6, 2, sinks=sinks.astype(np.float64)), RTOL, ATOL)
    assert not np.allclose(got, attend(q[0], k[0], v[0], causal_mask(S), 6, 2), atol=1e-2)


def test_mha_without_rope():
    S = 6
    q, k, v = qkv(30, S)
    model, layer = mha_model(S, 8, props=[withKey("use_rope", False)])
    assert np.all(layer.cos == 1) and np.all(layer.sin == 0)
    got = run_steps(model, q, k, v, [(0, 3), (3, 4), (4, 6)])[0]
    close(got, attend(q[0], k[0], v[0], causal_mask(S), 6, 2, rope=False), RTOL, ATOL)


def _tables(inv_freq, T, scaling=1.0):
    """cos/sin [T, d/2] in float64 from float64 positions."""
    angle = np.arange(T, dtype=np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None, :]
    return np.cos(angle) * scaling, np.sin(angle) * scaling


@pytest.mark.parametrize("prop, theta", [
    (withKey("rope_theta", 1e6), 1e6),
    ("rope_theta=1e6", 1e6),                       # nntrainer read this as the integer 1
    (withKey("rope_theta", 10000.5), 10000.5),     # nntrainer truncated this to 10000
    ("rope_theta=10000.000000", 10000.0),          # std::to_string's form
])
def test_mha_rope_theta_is_a_float(prop, theta):
    T, d = 512, 80
    node = createLayer("mha_core", [withKey("name", "attn"), withKey("num_heads", 1),
                                    withKey("max_timestep", T), prop,
                                    withKey("input_layers", ["q", "k", "v"])])
    model = createModel()
    for layer in (feature_input("q", 1, d), feature_input("k", 1, d), feature_input("v", 1, d), node):
        model.addLayer(layer)
    model.compile()
    layer = node.layer
    assert layer.props["rope_theta"] == theta
    cos, sin = _tables(inv_freq_of(d, theta), T)
    # float32 inv_freq and angle (as HF): |error| <= ~T * 1e-7 on the angle
    close(layer.cos, cos, rtol=0, atol=1e-4)
    close(layer.sin, sin, rtol=0, atol=1e-4)
    if theta == 10000.5:
        cos_trunc, _ = _tables(inv_freq_of(d, 10000.0), T)
        assert np.abs(layer.cos - cos_trunc).max() > 3e-4


# ---------------------------------------------------------------- RoPE scaling vs transformers
def _hf_rope_cases():
    with open(os.path.join(FIXTURES, "rope", "hf_rope.json"), "rb") as f:
        return orjson.loads(f.read())


HF_ROPE_CASES = _hf_rope_cases()

PROPERTY_OF = {  # rope_parameters key -> mha_core property
    "rope_type": "rope_scaling_type", "rope_theta": "rope_theta", "factor": "rope_scaling_factor",
    "original_max_position_embeddings": "rope_scaling_max_position_embeddings",
    "low_freq_factor": "rope_scaling_low_freq_factor",
    "high_freq_factor": "rope_scaling_high_freq_factor",
    "beta_fast": "rope_scaling_beta_fast", "beta_slow": "rope_scaling_beta_slow",
    "truncate": "rope_scaling_truncate", "attention_factor": "rope_scaling_attention_factor",
    "mscale": "rope_scaling_mscale", "mscale_all_dim": "rope_scaling_mscale_all_dim",
}


def _case_id(case):
    c = case["case"]
    extra = ",".join(f"{k}={v}" for k, v in c.items() if k not in ("rope_type",))
    return f"{c['rope_type']}-d{case['head_dim']}-{extra}"


def check_tables_against_hf(layer, case, T):
    """The layer's cos/sin against cos/sin built from HF's float32 inv_freq and scaling."""
    inv = np.array(case["inv_freq"], dtype=F32)
    scaling = case["attention_scaling"]
    d = case["head_dim"]
    assert layer.cos.shape == layer.sin.shape == (T, d // 2)
    angle = (np.arange(T, dtype=F32)[:, None] * inv[None, :]).astype(np.float64)  # HF: float32 angle
    # inv_freq may differ from torch's by 2 ulp (float32 pow): angle error <= T * 2.4e-7
    atol = T * 3e-7 * scaling + 1e-6
    close(layer.cos, np.cos(angle) * scaling, rtol=0, atol=atol)
    close(layer.sin, np.sin(angle) * scaling, rtol=0, atol=atol)
    # row 1 holds angle = inv_freq itself: recover it and the scaling precisely
    got_inv = np.arctan2(layer.sin[1].astype(np.float64), layer.cos[1].astype(np.float64))
    close(got_inv, inv, rtol=1e-6, atol=0)
    close(np.hypot(layer.cos, layer.sin), np.full(layer.cos.shape, scaling), rtol=1e-6, atol=0)


@pytest.mark.parametrize("case", HF_ROPE_CASES, ids=_case_id)
def test_mha_rope_tables_match_transformers(case):
    T, d = 64, case["head_dim"]
    params = dict(case["case"])
    if params["rope_type"] == "yarn":
        params.setdefault("truncate", True)    # HF's default (the layer's default is nntrainer's)
    props = [withKey(PROPERTY_OF[key], value) for key, value in params.items()]
    node = createLayer("mha_core", [withKey("name", "attn"), withKey("num_heads", 2),
                                    withKey("num_heads_KV", 1), withKey("max_timestep", T), *props,
                                    withKey("input_layers", ["q", "k", "v"])])
    model = createModel()
    for layer in (feature_input("q", 1, 2 * d), feature_input("k", 1, d), feature_input("v", 1, d), node):
        model.addLayer(layer)
    model.compile()
    check_tables_against_hf(node.layer, case, T)


def _transformer_from_config(config):
    """A Transformer whose parameters are read from ``config`` (no tokenizer, no weights)."""
    base = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 131072}
    cfg = JsonConfig({**base, **config}, "/nowhere/config.json")
    nntr = JsonConfig({"init_seq_len": 4, "num_to_generate": 60, "max_seq_len": 64},
                      "/nowhere/nntr_config.json")
    model = Transformer.__new__(Transformer)
    model.cfg, model.nntr_cfg = cfg, nntr
    model.setupParameters(cfg, JsonConfig({}, "/nowhere/generation_config.json", exists=False), nntr)
    model.setupContext(nntr)
    return model


def _config_styles(case):
    """The same RoPE settings as config.json files write them."""
    params = dict(case["case"])
    theta = params.pop("rope_theta")
    styles = {"v5 rope_parameters": {"rope_parameters": {"rope_theta": theta, **params}}}
    if params["rope_type"] == "default":
        styles["v4 rope_scaling null"] = {"rope_theta": theta, "rope_scaling": None}
    else:
        styles["v4 rope_scaling"] = {"rope_theta": theta, "rope_scaling": dict(params)}
        legacy = {k: v for k, v in params.items() if k != "rope_type"}
        styles["v4 rope_scaling type"] = {"rope_theta": theta,
                                          "rope_scaling": {"type": params["rope_type"], **legacy}}
    return styles


def _compiled_attention(t):
    """The mha_core node of Transformer t's layer-0 attention block, compiled on an input "x"
    of t.INIT_SEQ_LEN rows of t.DIM features."""
    layers = t.createAttention(0, t.INIT_SEQ_LEN, t.NUM_HEADS, t.HEAD_DIM, "x", "x", "x")
    model = createModel()
    model.addLayer(feature_input("x", t.INIT_SEQ_LEN, t.DIM))
    for layer in layers:
        model.addLayer(layer)
    model.compile()
    (attn,) = [n for n in layers if n.getType() == "mha_core"]
    return attn


@pytest.mark.parametrize("case", [c for c in HF_ROPE_CASES if c["head_dim"] in (16, 80)],
                         ids=_case_id)
def test_transformer_rope_properties_reproduce_transformers(case):
    d = case["head_dim"]
    for style, config in _config_styles(case).items():
        attn = _compiled_attention(_transformer_from_config({**config, "head_dim": d}))
        assert attn.layer.max_timestep == 64, style
        try:
            check_tables_against_hf(attn.layer, case, 64)
        except AssertionError as e:
            raise AssertionError(f"{style}: {e}") from None


def test_transformer_rope_properties_yarn_null_factor():
    """HF: yarn with ``factor: null`` uses max_position_embeddings / original (256 / 64 = 4)."""
    (case,) = [c for c in HF_ROPE_CASES if c["head_dim"] == 16 and c["case"] == {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 64}]
    t = _transformer_from_config({"head_dim": 16, "max_position_embeddings": 256, "rope_theta": 10000.0,
                                  "rope_scaling": {"rope_type": "yarn", "factor": None,
                                                   "original_max_position_embeddings": 64}})
    check_tables_against_hf(_compiled_attention(t).layer, case, 64)


# ------------------------------------------------------------------------------ mha_core errors
def _compile_mha(q_width, k_width, v_width, props):
    node = createLayer("mha_core", [withKey("name", "attn"), withKey("max_timestep", 8), *props,
                                    withKey("input_layers", ["q", "k", "v"])])
    model = createModel()
    for layer in (feature_input("q", 2, q_width), feature_input("k", 2, k_width),
                  feature_input("v", 2, v_width), node):
        model.addLayer(layer)
    model.compile()
    return model, node


def test_mha_key_width_must_be_kv_heads_times_head_dim():
    with pytest.raises(CausalLMError) as e:
        _compile_mha(6 * 8, 2 * 8, 2 * 8, [withKey("num_heads", 6), withKey("num_heads_KV", 1)])
    one_line_error(e, "layer 'attn'", "key width 16 != num_heads_KV 1 x head_dim 8")
    with pytest.raises(CausalLMError) as e:
        _compile_mha(6 * 8, 2 * 8, 3 * 8, [withKey("num_heads", 6), withKey("num_heads_KV", 2)])
    one_line_error(e, "layer 'attn'", "value width 24 != num_heads_KV 2 x head_dim 8")


def test_mha_heads_must_be_a_multiple_of_kv_heads():
    with pytest.raises(CausalLMError) as e:
        _compile_mha(6 * 8, 4 * 8, 4 * 8, [withKey("num_heads", 6), withKey("num_heads_KV", 4)])
    one_line_error(e, "layer 'attn'", "num_heads 6 must be a positive multiple of num_heads_KV 4")


def test_mha_to_past_max_timestep():
    S, T = 9, 8
    q, k, v = qkv(31, S)
    model, _ = mha_model(5, T, props=[withKey("rope_theta", 10000.0)])
    got = run_steps(model, q, k, v, [(0, 5), (5, 8)])      # to == max_timestep is allowed
    close(got[0], attend(q[0, :T], k[0, :T], v[0, :T], causal_mask(T), 6, 2), RTOL, ATOL)
    with pytest.raises(CausalLMError) as e:
        run_steps(model, q, k, v, [(8, 9)])
    one_line_error(e, "layer 'attn'", "position 8 is past max_timestep 8")
    fresh, _ = mha_model(5, T, props=[withKey("rope_theta", 10000.0)])
    with pytest.raises(CausalLMError) as e:                 # a prefill running past the cache
        run_steps(fresh, q, k, v, [(4, 9)])
    one_line_error(e, "layer 'attn'", "past max_timestep 8")


@pytest.mark.parametrize("key", ["num_heads_KV", "num_heads_kv", "NUM_HEADS_KV"])
def test_mha_property_keys_are_case_insensitive(key):
    S = 4
    q, k, v = qkv(32, S)
    node = createLayer("mha_core", [withKey("name", "attn"), withKey("NUM_HEADS", 6),
                                    withKey(key, 2), withKey("Max_Timestep", 8),
                                    withKey("rope_theta", 10000.0),
                                    withKey("input_layers", ["q", "k", "v"])])
    assert node.layer.props["num_heads_KV"] == 2 and node.layer.props["num_heads"] == 6
    model = build([feature_input("q", S, 480), feature_input("k", S, 160),
                   feature_input("v", S, 160), node])
    got = run_steps(model, q, k, v, [(0, S)])[0]
    close(got, attend(q[0], k[0], v[0], causal_mask(S), 6, 2), RTOL, ATOL)
