"""Stages: a graph split into an encoder run once and a decoder run step by step, the
cross-attention between them, the KV caches as objects, and the position bias.

The graphs are tiny and built through the public API; every attention output is compared with a
plain float64 numpy formula written here.
"""

import json
import os

import numpy as np
import pytest
from graphs import feature_input

from causallm.api import createLayer, createModel, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.layers.mha_core import MHACoreLayer
from causallm.layers.relative_position_bias import RelativePositionBiasLayer

registerFactory(MHACoreLayer)
registerFactory(RelativePositionBiasLayer)

F32 = np.float32
N_HEADS, N_KV, D = 4, 2, 8          # head_dim 8, GQA 2
WIDTH = 12                          # features of both sequences
ENC_ROWS, DEC_ROWS, T = 7, 4, 9     # encoder step buffer, decoder step buffer, decoder cache
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def fc(name, unit, source):
    return createLayer("fully_connected", [withKey("name", name), withKey("unit", unit),
                                           withKey("disable_bias", "true"),
                                           withKey("input_layers", source)])


def cross_model(batch=1, stages=True, encoder_batch=None):
    """enc_x -> enc_out (the encoder's output) and the cross K/V projections enc_k, enc_v;
    dec_x -> dec_q -> cross (mha_core is_cross_attention over enc_k, enc_v)."""
    model = createModel()
    if batch != 1:
        model.setProperty([withKey("batch_size", batch)])
    layers = [feature_input("enc_x", ENC_ROWS, WIDTH), fc("enc_out", 5, "enc_x"),
              feature_input("dec_x", DEC_ROWS, WIDTH), fc("dec_q", N_HEADS * D, "dec_x"),
              fc("enc_k", N_KV * D, "enc_x"), fc("enc_v", N_KV * D, "enc_x"),
              createLayer("mha_core", [
                  withKey("name", "cross"), withKey("num_heads", N_HEADS),
                  withKey("num_heads_kv", N_KV), withKey("max_timestep", T),
                  withKey("is_cross_attention", "true"), withKey("use_rope", "false"),
                  withKey("is_causal", "false"), withKey("query_pre_attn_scalar", 1.0),
                  withKey("input_layers", ["dec_q", "enc_k", "enc_v"])])]
    for layer in layers:
        model.addLayer(layer)
    if stages:
        model.addStage("encoder", ["enc_x"], ["enc_out"], batch=encoder_batch)
        model.addStage("decoder", ["dec_x"], ["cross"])
    model.compile()
    model.initialize()
    rng = np.random.default_rng(0)
    for spec in model.getWeightSpecs():
        model.setWeight(spec.full_name, rng.standard_normal(spec.shape).astype(F32) * 0.3)
    return model


def weights(model, name):
    return model.getWeight(f"{name}:weight").astype(np.float64)


def cross_reference(model, enc, dec):
    """softmax(q k^T) v per head (scale 1), every encoder row visible: (B, S, nQ*d)."""
    q = dec @ weights(model, "dec_q")
    k, v = enc @ weights(model, "enc_k"), enc @ weights(model, "enc_v")
    out = np.zeros(q.shape)
    for h in range(N_HEADS):
        g = h // (N_HEADS // N_KV)
        s = q[..., h * D:(h + 1) * D] @ np.swapaxes(k[..., g * D:(g + 1) * D], -1, -2)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[..., h * D:(h + 1) * D] = p @ v[..., g * D:(g + 1) * D]
    return out


def run(model, stage, x, from_, to, width):
    batch = x.shape[0]
    out = model.incremental_inference(batch, [x.reshape(batch, -1)], None, None, from_, to,
                                      stage=stage)[0]
    return out.reshape(batch, -1, width)[:, :to - from_]


def test_layers_join_the_latest_stage_of_their_inputs():
    model = cross_model()
    assert model.getStageNames() == ["encoder", "decoder"]
    # the cross K/V projections read only the encoder: they run with it, once per prompt
    assert model.getLayerNames("encoder") == ["enc_x", "enc_out", "enc_k", "enc_v"]
    assert model.getLayerNames("decoder") == ["dec_x", "dec_q", "cross"]
    # the .bin order is still the insertion order, whatever the stages
    assert [s.full_name for s in model.getWeightSpecs()] == [
        "enc_out:weight", "dec_q:weight", "enc_k:weight", "enc_v:weight"]


@pytest.mark.parametrize("batch", [1, 2])
def test_cross_attention_reads_the_encoder_run_at_every_decoder_step(batch):
    model = cross_model(batch)
    rng = np.random.default_rng(1)
    enc = rng.standard_normal((batch, ENC_ROWS, WIDTH)).astype(F32)
    dec = rng.standard_normal((batch, T, WIDTH)).astype(F32)

    with pytest.raises(CausalLMError, match="needs stage 'encoder' run once"):
        run(model, "decoder", dec[:, :1], 0, 1, N_HEADS * D)
    enc_out = run(model, "encoder", enc, 0, ENC_ROWS, 5)
    np.testing.assert_allclose(enc_out, enc @ weights(model, "enc_out"), rtol=1e-5, atol=1e-6)

    want = cross_reference(model, enc, dec)
    got = [run(model, "decoder", dec[:, :3], 0, 3, N_HEADS * D)]       # a decoder prefill
    for p in range(3, T):                                               # then one row a step
        got.append(run(model, "decoder", dec[:, p:p + 1], p, p + 1, N_HEADS * D))
    np.testing.assert_allclose(np.concatenate(got, axis=1), want, rtol=1e-4, atol=2e-5)

    # a shorter encoder run: the decoder sees exactly its rows
    run(model, "encoder", enc[:, :4], 0, 4, 5)
    np.testing.assert_allclose(run(model, "decoder", dec[:, :2], 0, 2, N_HEADS * D),
                               cross_reference(model, enc[:, :4], dec[:, :2]), rtol=1e-4,
                               atol=2e-5)


@pytest.mark.parametrize("encoder_batch, batch", [(1, 3), (2, 4)])
def test_groups_of_decoder_rows_share_an_encoder_row(encoder_batch, batch):
    """A decoder stage of B x k rows (k beams per prompt) reads an encoder stage of B rows:
    decoder row b attends to encoder row b // k."""
    model = cross_model(batch, encoder_batch=encoder_batch)
    assert model.getStageBatch("encoder") == encoder_batch
    assert model.getStageBatch("decoder") == batch
    rng = np.random.default_rng(6)
    enc = rng.standard_normal((encoder_batch, ENC_ROWS, WIDTH)).astype(F32)
    dec = rng.standard_normal((batch, 2, WIDTH)).astype(F32)
    run(model, "encoder", enc, 0, ENC_ROWS, 5)
    got = run(model, "decoder", dec, 0, 2, N_HEADS * D)
    k = batch // encoder_batch
    want = cross_reference(model, np.repeat(enc, k, axis=0), dec)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


def test_kv_caches_are_listed_with_their_kind_and_stage():
    model = cross_model()
    (cache,) = model.getKVCaches()
    assert (cache.owner, cache.kind, cache.stage) == ("cross", "cross", "decoder")
    assert model.getKVCaches("self") == [] and model.getKVCaches(stage="encoder") == []
    rng = np.random.default_rng(2)
    enc = rng.standard_normal((1, 5, WIDTH)).astype(F32)
    run(model, "encoder", enc, 0, 5, 5)
    assert cache.length == 5
    np.testing.assert_allclose(cache.key[0, :5], enc[0] @ weights(model, "enc_k"), rtol=1e-5,
                               atol=1e-6)


def test_stage_errors_are_one_line():
    with pytest.raises(CausalLMError, match="stage 'decoder': output layer 'enc_out' is computed "
                                            "in stage 'encoder'"):
        m = createModel()
        for layer in (feature_input("a", 2, 3), fc("enc_out", 2, "a"), feature_input("b", 2, 3),
                      fc("o", 2, "b")):
            m.addLayer(layer)
        m.addStage("encoder", ["a"], ["enc_out"])
        m.addStage("decoder", ["b"], ["enc_out"])
        m.compile()
    m = createModel()
    for layer in (feature_input("a", 2, 3), fc("x", 2, "a"), feature_input("b", 2, 3),
                  fc("y", 2, "b")):
        m.addLayer(layer)
    m.addStage("encoder", ["a"], ["x"])
    with pytest.raises(CausalLMError, match="input layer 'b' belongs to no stage"):
        m.compile()
    model = cross_model()
    with pytest.raises(CausalLMError, match="name the stage to run"):
        model.incremental_inference(1, [np.zeros((1, WIDTH), F32)], None, None, 0, 1)
    with pytest.raises(CausalLMError, match="no stage 'vision'"):
        model.incremental_inference(1, [np.zeros((1, WIDTH), F32)], None, None, 0, 1,
                                    stage="vision")


def test_tensors_read_by_a_later_stage_keep_their_buffers():
    model = cross_model()
    rng = np.random.default_rng(3)
    enc = rng.standard_normal((1, ENC_ROWS, WIDTH)).astype(F32)
    run(model, "encoder", enc, 0, ENC_ROWS, 5)
    (cache,) = model.getKVCaches("cross")
    key, value = cache.key.copy(), cache.value.copy()
    for p in range(T):  # decoder steps must not write into the encoder's tensors
        run(model, "decoder", rng.standard_normal((1, 1, WIDTH)).astype(F32), p, p + 1,
            N_HEADS * D)
    np.testing.assert_array_equal(cache.key, key)
    np.testing.assert_array_equal(cache.value, value)


def test_warmup_runs_every_stage_in_order():
    model = cross_model()
    model.warmup()  # the decoder's cross-attention needs the encoder to have run first
    assert model.getKVCaches("cross")[0].length == 2


# ------------------------------------------------------------------- relative position bias
BUCKET_CASES = json.load(open(os.path.join(FIXTURES, "t5-buckets.json")))


@pytest.mark.parametrize("case", BUCKET_CASES,
                         ids=lambda c: f"{c['num_buckets']}-{c['max_distance']}-"
                                       f"{'bi' if c['bidirectional'] else 'causal'}")
def test_relative_position_buckets_match_transformers(case):
    from causallm.kernels.position_bias import relative_position_buckets
    span = (len(case["buckets"]) - 1) // 2
    got = relative_position_buckets(span + 1, case["num_buckets"], case["max_distance"],
                                    case["bidirectional"])
    assert got.tolist() == case["buckets"]


def bias_model(T_, heads, bidirectional, steps_rows):
    model = createModel()
    for layer in (createLayer("input", [withKey("name", "ids"),
                                        withKey("input_shape", f"1:1:{steps_rows}")]),
                  createLayer("relative_position_bias", [
                      withKey("name", "bias"), withKey("num_heads", heads),
                      withKey("max_timestep", T_), withKey("num_buckets", 8),
                      withKey("max_distance", 12), withKey("bidirectional", bidirectional)])):
        model.addLayer(layer)
    model.compile()
    model.initialize()
    table = np.random.default_rng(4).standard_normal((8, heads)).astype(F32)
    model.setWeight("bias:weight", table)
    return model, table


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_bias_rows_a_step_needs(bidirectional):
    from causallm.kernels.position_bias import relative_position_buckets
    T_, H = 20, 3
    model, table = bias_model(T_, H, bidirectional, 6)
    buckets = relative_position_buckets(T_, 8, 12, bidirectional)
    for from_, to in ((0, 6), (6, 7), (13, 14)):
        out = model.incremental_inference(1, [np.zeros((1, to - from_), F32)], None, None,
                                          from_, to)[0].reshape(H, 2 * T_ - 1)
        for p in range(from_, to):
            for t in range(to):
                j = T_ - 1 + t - p
                np.testing.assert_array_equal(out[:, j], table[buckets[j]])


@pytest.mark.parametrize("causal", [True, False])
def test_self_attention_adds_the_stack_position_bias(causal):
    """ids -> relative_position_bias; q, k, v features -> mha_core (no RoPE, scale 1) with the
    bias as 4th input: scores q.k + W[bucket(t - p), h], prefill then cached steps."""
    from causallm.kernels.position_bias import relative_position_buckets
    S, H, KV, d, T_ = 7, 4, 2, 8, 10
    model = createModel()
    for layer in (createLayer("input", [withKey("name", "ids"),
                                        withKey("input_shape", f"1:1:{S}")]),
                  createLayer("relative_position_bias", [
                      withKey("name", "bias"), withKey("num_heads", H), withKey("max_timestep", T_),
                      withKey("num_buckets", 8), withKey("max_distance", 6),
                      withKey("bidirectional", not causal), withKey("input_layers", "ids")]),
                  feature_input("q", S, H * d), feature_input("k", S, KV * d),
                  feature_input("v", S, KV * d),
                  createLayer("mha_core", [
                      withKey("name", "attn"), withKey("num_heads", H), withKey("num_heads_kv", KV),
                      withKey("max_timestep", T_), withKey("use_rope", "false"),
                      withKey("is_causal", causal), withKey("query_pre_attn_scalar", 1.0),
                      withKey("input_layers", ["q", "k", "v", "bias"])])):
        model.addLayer(layer)
    model.compile()
    model.initialize()
    rng = np.random.default_rng(5)
    table = rng.standard_normal((8, H)).astype(F32)
    model.setWeight("bias:weight", table)
    q, k, v = (rng.standard_normal((1, T_, w)).astype(F32) for w in (H * d, KV * d, KV * d))
    buckets = relative_position_buckets(T_, 8, 6, not causal)

    def step(from_, to):
        n = to - from_
        ins = [np.zeros((1, n), F32)] + [a[:, from_:to].reshape(1, -1) for a in (q, k, v)]
        return model.incremental_inference(1, ins, None, None, from_, to)[0].reshape(
            1, -1, H * d)[0, :n]

    steps = [(0, 5)] + [(p, p + 1) for p in range(5, T_)] if causal else [(0, S)]
    got = np.concatenate([step(f, t) for f, t in steps])
    n = len(got)
    want = np.zeros((n, H * d))
    for h in range(H):
        g = h // (H // KV)
        s = q[0, :n, h * d:(h + 1) * d].astype(np.float64) @ k[0, :n, g * d:(g + 1) * d].T
        p_, t_ = np.arange(n)[:, None], np.arange(n)[None, :]
        s = s + table[buckets[T_ - 1 + t_ - p_], h]
        if causal:
            s = np.where(t_ <= p_, s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        want[:, h * d:(h + 1) * d] = (e / e.sum(-1, keepdims=True)) @ v[0, :n, g * d:(g + 1) * d]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)


def test_position_bias_dims_are_checked():
    model = createModel()
    for layer in (feature_input("q", 2, 8), feature_input("k", 2, 8), feature_input("v", 2, 8),
                  feature_input("b", 2, 9),
                  createLayer("mha_core", [withKey("name", "attn"), withKey("num_heads", 2),
                                           withKey("num_heads_kv", 2), withKey("max_timestep", 6),
                                           withKey("use_rope", "false"),
                                           withKey("input_layers", ["q", "k", "v", "b"])])):
        model.addLayer(layer)
    with pytest.raises(CausalLMError, match=r"layer 'attn' \(mha_core\): position bias dims"):
        model.compile()


def test_kv_cache_reorder_takes_batch_rows():
    from causallm.runtime.kv_cache import KVCache
    key = np.arange(3 * 2 * 2 * 4, dtype=F32).reshape(3, 2, 2, 4)  # (B, n_kv, T, head_dim)
    value = -key
    cache = KVCache("attn", "self", "model", key, value)
    want_k, want_v = key[[2, 2, 0]].copy(), value[[2, 2, 0]].copy()
    cache.reorder([2, 2, 0])
    np.testing.assert_array_equal(cache.key, want_k)
    np.testing.assert_array_equal(cache.value, want_v)
    assert cache.key is key and cache.length == 2  # in place; a self cache's capacity
    before = cache.key.copy()
    cache.reorder([1, 1, 2], length=1)  # only position 0 of the rows that change
    np.testing.assert_array_equal(cache.key[0, :, 0], before[1, :, 0])
    np.testing.assert_array_equal(cache.key[0, :, 1], before[0, :, 1])
    np.testing.assert_array_equal(cache.key[1:], before[1:])
    # NNTrainer's layout, a row per position with the kv heads side by side, and back
    k_rows, v_rows = cache.rows(2)
    assert k_rows.shape == (3, 2, 8)
    np.testing.assert_array_equal(k_rows[1, 1], np.concatenate([key[1, 0, 1], key[1, 1, 1]]))
    other = KVCache("attn", "self", "model", np.zeros_like(key), np.zeros_like(value))
    other.setRows(2, k_rows, v_rows)
    np.testing.assert_array_equal(other.key, key)
    np.testing.assert_array_equal(other.value, value)
