"""GPT2LMHeadModel: its new kernels and layers against plain formulas, and the model against
Hugging Face transformers on committed fixtures (tools/fixtures_gpt2.py).

- ``gpt2-tied``: the OpenAI layout on the Hub (unprefixed names, ``attn.bias`` mask buffers,
  Hub-style config.json), BF16, gelu_new, tied head, n_positions 128.
- ``gpt2-untied-scaled``: as transformers 5 saves it, F16, untied lm_head,
  scale_attn_by_inverse_layer_idx, n_inner 80, exact gelu, 3 heads.

Nothing here imports torch or transformers.
"""

import json
import os
import shutil
import sys

import numpy as np
import parity
import pytest
from graphs import build, feature_input
from parity import FIXTURES, ROOT, expected, prefill

from causallm.api import createLayer, registerFactory
from causallm.errors import CausalLMError
from causallm.io.config import load_model_configs
from causallm.io.safetensors import Checkpoint, write_safetensors
from causallm.kernels.layer_norm import layer_norm
from causallm.layers.layer_normalization import LayerNormalizationLayer
from causallm.layers.positional_embedding import PositionalEmbeddingLayer
from causallm.models.gpt2.gpt2_causallm import GPT2CausalLM

GPT2_FIXTURES = ["gpt2-tied", "gpt2-untied-scaled"]
F32 = np.float32

for _cls in (LayerNormalizationLayer, PositionalEmbeddingLayer):
    registerFactory(_cls)


# ------------------------------------------------------------------ numpy twins of the kernels

def layer_norm_ref(x, gamma, beta, eps):  # [m, w], [w], [w] -> [m, w]
    x = x.astype(np.float64)
    mu = x.mean(axis=-1, keepdims=True)                  # [m, 1]
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)   # [m, 1], biased
    return (x - mu) / np.sqrt(var + eps) * gamma + beta  # [m, w]


def add_positions_ref(x, table, row0):  # [n, w], [P, w] -> [n, w]
    return x.astype(np.float64) + table[row0:row0 + x.shape[0]]


@pytest.mark.parametrize("in_place", [False, True])
def test_layer_norm_kernel_matches_twin(in_place):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 5, 48)) * 3 + 1.5).astype(F32)
    gamma, beta = rng.standard_normal(48).astype(F32), rng.standard_normal(48).astype(F32)
    y = x.copy() if in_place else np.full_like(x, 7.0)
    untouched = y[:, 3:].copy()
    layer_norm(y if in_place else x, gamma, beta, y, 3, 1e-5)
    for b in range(2):
        np.testing.assert_allclose(y[b, :3], layer_norm_ref(x[b, :3], gamma, beta, 1e-5),
                                   rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(y[:, 3:], untouched)  # rows past nrows are left alone


# ------------------------------------------------------------------ the layers, through a graph

def test_layer_normalization_is_torch_layer_norm():
    rng = np.random.default_rng(2)
    model = build([feature_input("in", 4, 16), createLayer("layer_normalization", [
        "name=ln", "input_layers=in", "axis=3", "epsilon=0.01"])], batch=2)
    gamma, beta = rng.standard_normal(16).astype(F32), rng.standard_normal(16).astype(F32)
    model.setWeight("ln:gamma", gamma)
    model.setWeight("ln:beta", beta)
    x = (rng.standard_normal((2, 4, 16)) * 2 + 3).astype(F32)
    out = model.incremental_inference(2, [x.reshape(2, -1)], None, None, 0, 4)[0]
    want = np.stack([layer_norm_ref(x[b], gamma, beta, 0.01) for b in range(2)])
    np.testing.assert_allclose(out.reshape(2, 4, 16), want, rtol=1e-5, atol=1e-5)


def test_layer_normalization_default_epsilon_and_weight_order():
    model = build([feature_input("in", 1, 2), createLayer("layer_normalization", [
        "name=ln", "input_layers=in", "axis=3"])])
    assert [s.full_name for s in model.getWeightSpecs()] == ["ln:gamma", "ln:beta"]
    model.setWeight("ln:gamma", np.ones(2, F32))
    model.setWeight("ln:beta", np.zeros(2, F32))
    out = model.incremental_inference(1, [np.array([[0.0, 0.2]], F32)], None, None, 0, 1)[0]
    # x - mu = -+0.1, var = 0.01: eps 1e-3 (nntrainer's default) gives 0.1 / sqrt(0.011)
    np.testing.assert_allclose(out.ravel(), [-0.1 / np.sqrt(0.011), 0.1 / np.sqrt(0.011)],
                               rtol=1e-5)


@pytest.mark.parametrize("axis", ["1", "2", "1,3"])
def test_layer_normalization_other_axes_are_one_line_errors(axis):
    with pytest.raises(CausalLMError, match=r"layer 'ln'.*only axis=3") as e:
        build([feature_input("in", 2, 4), createLayer("layer_normalization", [
            "name=ln", "input_layers=in", f"axis={axis}"])])
    assert "\n" not in str(e.value)


def test_positional_embedding_adds_the_rows_of_absolute_positions():
    rng = np.random.default_rng(3)
    model = build([feature_input("in", 4, 8), createLayer("positional_embedding", [
        "name=pe", "input_layers=in", "max_position_embeddings=6"])], batch=2)
    table = rng.standard_normal((6, 8)).astype(F32)
    model.setWeight("pe:Embedding", table)
    x = rng.standard_normal((2, 3, 8)).astype(F32)
    out = model.incremental_inference(2, [x.reshape(2, -1)], None, None, 2, 5)[0]
    got = out.reshape(2, 4, 8)[:, :3]
    for b in range(2):
        np.testing.assert_allclose(got[b], add_positions_ref(x[b], table, 2), rtol=1e-6)
    with pytest.raises(CausalLMError, match=r"layer 'pe'.*position 6 is past "
                                            r"max_position_embeddings 6"):
        model.incremental_inference(2, [x[:, :1].reshape(2, -1)], None, None, 6, 7)


# ------------------------------------------------------------------ the model against transformers

def load(name, **nntr):
    return parity.load(GPT2CausalLM, name, **nntr)


@pytest.mark.slow
@pytest.mark.parametrize("name", GPT2_FIXTURES)
def test_prefill_and_cached_decode_match_transformers(name):
    ref = expected(name)
    model = load(name)
    parity.check_prompt_ids(model, ref)
    assert len(ref["tokens"]) >= 24
    parity.check_prefill_and_cached_decode(model, ref)


@pytest.mark.parametrize("name", GPT2_FIXTURES)
def test_greedy_generation_gives_transformers_tokens(name):
    parity.check_greedy(load(name), expected(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", GPT2_FIXTURES)
def test_one_shot_and_chunked_prefill_match_no_cache_reference(name):
    ref = expected(name)
    model = load(name, init_seq_len=len(parity.full_sequence(ref)), num_to_generate=8)
    parity.check_one_shot(model, ref)
    parity.check_chunked_prefill(load(name, init_seq_len=7), ref)  # positions count on per chunk


@pytest.mark.slow
def test_cli_gives_transformers_tokens():
    record = parity.check_cli("gpt2-tied", "GPT2LMHeadModel", 32)
    assert record["finish_reason"] == "length"


def test_cli_untied():
    record = parity.cli_record("gpt2-untied-scaled", 24)
    assert record["generated_ids"] == expected("gpt2-untied-scaled")["tokens"].tolist()[:24]


# ------------------------------------------------------------------ weights, positions, configs

def test_weight_map_splits_c_attn_and_covers_every_weight():
    model = load("gpt2-untied-scaled", init_seq_len=8, num_to_generate=8)
    m = model.getHFWeightMap()
    parts = m["transformer.h.1.attn.c_attn.weight"]
    assert [(p.target, p.resolve((48, 144)), p.transpose) for p in parts] == [
        ("layer1_wq:weight", (slice(None), slice(0, 48)), False),
        ("layer1_wk:weight", (slice(None), slice(48, 96)), False),
        ("layer1_wv:weight", (slice(None), slice(96, 144)), False)]
    ckpt = Checkpoint(os.path.join(FIXTURES, "gpt2-untied-scaled"))
    fused = ckpt.get("transformer.h.1.attn.c_attn.weight")
    bias = ckpt.get("transformer.h.1.attn.c_attn.bias")
    for j, name in enumerate(("wq", "wk", "wv")):
        np.testing.assert_array_equal(model.model.getWeight(f"layer1_{name}:weight"),
                                      fused[:, 48 * j:48 * (j + 1)])
        np.testing.assert_array_equal(model.model.getWeight(f"layer1_{name}:bias"),
                                      bias[48 * j:48 * (j + 1)])
    assert "lm_head.weight" in m  # untied: its own head, [V, D] read transposed
    specs = [s.full_name for s in model.model.getWeightSpecs()]
    assert specs[:4] == ["embedding0:Embedding", "position_embedding0:Embedding",
                         "layer0_attention_norm:gamma", "layer0_attention_norm:beta"]
    assert specs[-3:] == ["output_norm:gamma", "output_norm:beta", "output_of_causallm:weight"]


def test_c_attn_with_wrong_width_is_one_line_error(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(os.path.join(FIXTURES, "gpt2-untied-scaled"), folder)
    ckpt = Checkpoint(folder)
    tensors = {k: np.array(ckpt.get(k)) for k in ckpt.keys()}
    del ckpt
    name = "transformer.h.0.attn.c_attn.weight"
    tensors[name] = np.ones((48, 192), F32)
    write_safetensors(str(folder / "model.safetensors"), tensors, {"format": "pt"})
    cfg, gen, nntr = load_model_configs(str(folder))
    model = GPT2CausalLM(cfg, gen, nntr)
    model.initialize()
    with pytest.raises(CausalLMError, match=r"c_attn.weight' of shape \(48, 192\): weight "
                                            r"'layer0_wq:weight': expected shape \(48, 48\)") as e:
        model.load_weight(str(folder))
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_nntrainer_bin_round_trip_gives_the_same_logits(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import hf_to_bin

    ref = expected("gpt2-tied")
    r = hf_to_bin.convert(os.path.join(FIXTURES, "gpt2-tied"), str(tmp_path / "m.bin"))
    from_hf = load("gpt2-tied", init_seq_len=32, num_to_generate=8)
    from_bin = load("gpt2-tied", weights=r.path, init_seq_len=32, num_to_generate=8)
    np.testing.assert_array_equal(prefill(from_bin, ref["prompt_ids"]),
                                  prefill(from_hf, ref["prompt_ids"]))


def test_generation_stops_at_n_positions():
    ref = expected("gpt2-tied")  # n_positions 128
    model = load("gpt2-tied", init_seq_len=64, num_to_generate=512)
    P = len(ref["prompt_ids"])
    result = model.generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=500,
                                   do_sample=False)
    assert len(result.generated_ids[0]) == 128 - P + 1  # the last one is never fed back
    assert result.generated_ids[0][:32] == ref["tokens"].tolist()
    assert result.finish_reasons == ["cache_full"]
    with pytest.raises(CausalLMError, match=r"prompt has 129 tokens but the model has "
                                            r"n_positions = 128 learned positions"):
        model.generate_tokens([[5] * 129], max_new_tokens=1, do_sample=False)


def write_config(tmp_path, **changes):
    folder = tmp_path / "cfg"
    folder.mkdir()
    data = json.load(open(os.path.join(FIXTURES, "gpt2-tied", "config.json")))
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    (folder / "config.json").write_text(json.dumps(data))
    shutil.copy(os.path.join(FIXTURES, "gpt2-tied", "tokenizer.json"), folder)
    return load_model_configs(str(folder))


@pytest.mark.parametrize("changes, needle", [
    (dict(activation_function="quick_gelu"), "'activation_function' must be one of gelu_new"),
    (dict(add_cross_attention=True), "'add_cross_attention' must be false"),
    (dict(n_head=5), "'n_head' must be a divisor of n_embd (64)"),
    (dict(n_embd=None), "missing key 'n_embd'"),
    (dict(n_positions=None), "missing key 'n_positions'"),
])
def test_bad_configs_are_one_line_errors(tmp_path, changes, needle):
    cfg, gen, nntr = write_config(tmp_path, **changes)
    with pytest.raises(CausalLMError) as e:
        GPT2CausalLM(cfg, gen, nntr)
    assert needle in str(e.value) and "config.json" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("weights, inverse, want", [
    (True, False, [16.0, 16.0]), (False, False, [1.0, 1.0]), (True, True, [16.0, 64.0]),
    (False, True, [1.0, 4.0])])
def test_attention_scale_follows_scale_attn_flags(tmp_path, weights, inverse, want):
    """HF: s = head_dim^-1/2 (scale_attn_weights) or 1, / (layer_idx + 1) with
    scale_attn_by_inverse_layer_idx; mha_core scales by query_pre_attn_scalar^-1/2."""
    cfg, gen, nntr = write_config(tmp_path, scale_attn_weights=weights,
                                  scale_attn_by_inverse_layer_idx=inverse,
                                  activation_function="gelu_pytorch_tanh", n_inner=100)
    nntr.update(init_seq_len=8, num_to_generate=8)
    model = GPT2CausalLM(cfg, gen, nntr)
    model.initialize()
    scales = []
    model.model.forEachLayer(lambda layer, ctx, _: scales.append(layer.scale)
                             if layer.getType() == "mha_core" else None)
    np.testing.assert_allclose(scales, [w ** -0.5 for w in want], rtol=1e-12)
    specs = {s.full_name: s.shape for s in model.model.getWeightSpecs()}
    assert specs["layer0_ffn_up:weight"] == (64, 100)  # n_inner


@pytest.mark.slow
def test_bin_to_hf_joins_c_attn_back(tmp_path):
    """hf -> .bin -> hf gives the checkpoint's tensors back, c_attn re-fused [D, 3D]."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import bin_to_hf
    import hf_to_bin

    folder = os.path.join(FIXTURES, "gpt2-untied-scaled")
    r = hf_to_bin.convert(folder, str(tmp_path / "m.bin"))
    out = bin_to_hf.export(folder, r.path, str(tmp_path / "hf"))
    back, orig = Checkpoint(str(tmp_path / "hf")), Checkpoint(folder)
    assert sorted(back.keys()) == sorted(orig.keys())
    for name in orig.keys():
        np.testing.assert_array_equal(back.get(name), orig.get(name), err_msg=name)
    assert out.tensors == len(orig)
