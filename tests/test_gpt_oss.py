"""GptOssForCausalLM / GptOssCachedSlimCausalLM against Hugging Face transformers, and the
``gpt_oss_moe`` layer and its kernels against numpy.

tools/fixtures_gpt_oss.py built tests/fixtures/gpt-oss-tiny with transformers 5 (see its
docstring): BF16, GQA 3, head_dim 16 with hidden 64, attention sinks, q/k/v/o biases, layers
[sliding 8, full, sliding 8], yarn RoPE scaling every position past 16, 4 experts top-2 with
active gate/up clamps, untied head; a 35-token prompt and 28 greedy tokens. Nothing here
imports torch or transformers.
"""

import json
import os
import shutil
import sys

import numpy as np
import parity
import pytest
from graphs import build, feature_input
from parity import FIXTURES, ROOT, assert_logits_close, expected, prefill

from causallm.api import createLayer, createModel, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.io.config import load_model_configs
from causallm.io.safetensors import Checkpoint
from causallm.kernels.gpt_oss_moe import clamped_glu, moe_route, scatter_add_rows
from causallm.runtime.properties import UINT_MAX
from causallm.layers.gpt_oss_moe import CHUNK_ROWS, CachedSlimGptOssMoELayer, GptOssMoELayer
from causallm.models.gpt_oss.gptoss_causallm import GptOssForCausalLM
from causallm.models.gpt_oss_cached_slim.gptoss_cached_slim_causallm import GptOssCachedSlimCausalLM

NAME = "gpt-oss-tiny"
FOLDER = os.path.join(FIXTURES, NAME)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import hf_to_bin  # noqa: E402

CLASSES = [GptOssForCausalLM, GptOssCachedSlimCausalLM]
F32 = np.float32
ALPHA, LIMIT = 1.702, 7.0


def load(cls=GptOssForCausalLM, folder=FOLDER, weights=None, cfg_changes=None, **nntr):
    return parity.load(cls, folder, cfg_changes, weights, **nntr)


REF = expected(NAME)


def logit_error(model):
    ref = REF["prefill_logits"]
    err = float(np.abs(prefill(model, REF["prompt_ids"]) - ref).max())
    return err / max(1.0, float(np.abs(ref).max()))


# ------------------------------------------------------------------ numpy twins of the kernels

def route_ref(logits, k):
    """(top (T, k) expert ids, weights (T, k)) for logits (T, E): softmax over the top k."""
    order = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, order, axis=1).astype(np.float64)
    w = np.exp(top - top[:, :1])
    return order, w / w.sum(axis=1, keepdims=True)


def glu_ref(g, u, alpha=ALPHA, limit=LIMIT):
    g = np.minimum(g, limit)
    u = np.clip(u, -limit, limit)
    return (u + 1) * g / (1 + np.exp(-alpha * g))


def expert_ref(x, wg, bg, wu, bu, wd, bd, alpha=ALPHA, limit=LIMIT):
    """transformers' GptOssExperts math for rows x (n, H), in float64."""
    x = x.astype(np.float64)
    return glu_ref(x @ wg + bg, x @ wu + bu, alpha, limit) @ wd + bd


def moe_ref(x, gate, gate_b, experts, k, alpha=ALPHA, limit=LIMIT):
    """The whole layer for rows x (T, H); experts[e] = (up, up_b, gate, gate_b, down, down_b)."""
    top, w = route_ref((x.astype(np.float64) @ gate + gate_b).astype(F32), k)
    y = np.zeros(x.shape, dtype=np.float64)
    for t in range(x.shape[0]):
        for j in range(k):
            wu, bu, wg, bg, wd, bd = experts[top[t, j]]
            y[t] += w[t, j] * expert_ref(x[t:t + 1], wg, bg, wu, bu, wd, bd, alpha, limit)[0]
    return y


def rng_arrays(seed, *shapes, scale=1.0):
    rng = np.random.default_rng(seed)
    return [(scale * rng.standard_normal(s)).astype(F32) for s in shapes]


def test_moe_route_groups_tokens_by_expert():
    B, S, E, k, nrows = 2, 5, 6, 3, 4
    (logits,) = rng_arrays(1, (B, S, E))
    logits[1, 2, 4] = logits[1, 2, 1]  # a tie goes to the lower index
    top = np.zeros(k, np.int32)
    counts, rows, coefs = np.zeros(E, np.int32), np.zeros((E, B * S), np.int32), \
        np.zeros((E, B * S), F32)
    moe_route(logits, nrows, top, counts, rows, coefs)
    want = {e: [] for e in range(E)}
    for b in range(B):
        order, w = route_ref(logits[b, :nrows], k)
        for r in range(nrows):
            for j in range(k):
                want[order[r, j]].append((b * S + r, w[r, j]))
    for e in range(E):
        assert counts[e] == len(want[e])
        assert rows[e, :counts[e]].tolist() == [t for t, _ in want[e]]
        np.testing.assert_allclose(coefs[e, :counts[e]], [c for _, c in want[e]], rtol=1e-6)
    assert counts.sum() == B * nrows * k


def test_clamped_glu_and_scatter_add_match_formula():
    n, I, H, B, S = 3, 7, 5, 1, 4
    g, u = rng_arrays(4, (n + 1, I), (n + 1, I), scale=6.0)
    assert g.max() > LIMIT and np.abs(u).max() > LIMIT  # both clamps bite
    want = glu_ref(g[:n].astype(np.float64), u[:n].astype(np.float64))
    last = g[n].copy()
    clamped_glu(g, u, n, ALPHA, LIMIT)
    np.testing.assert_allclose(g[:n], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(g[n], last)  # rows past n untouched
    out, y = rng_arrays(5, (B, S, H), (n, H))
    rows, coefs = np.array([3, 1, 2], np.int32), np.array([0.5, 0.25, 2.0], F32)
    want = out.astype(np.float64)
    want[0, rows] += coefs[:, None] * y
    scatter_add_rows(out, rows, coefs, y, n)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ the layer through a graph

def moe_graph(rows, H, E, k, I, batch=1, layer_type="gpt_oss_moe", props=()):
    registerFactory(GptOssMoELayer)
    registerFactory(CachedSlimGptOssMoELayer)
    return build([feature_input("x", rows, H), createLayer(layer_type, [
        withKey("name", "moe"), withKey("input_layers", "x"), withKey("unit", I),
        withKey("num_experts", E), withKey("num_experts_per_token", k), *props])], batch)


def set_moe_weights(model, seed, H, E, I):
    rng = np.random.default_rng(seed)
    gate, gate_b = rng.standard_normal((H, E)).astype(F32), rng.standard_normal(E).astype(F32)
    model.setWeight("moe:gate", gate)
    model.setWeight("moe:gate_bias", gate_b)
    experts = []
    for e in range(E):
        ws = [(s * rng.standard_normal(shape)).astype(F32) for s, shape in
              ((0.5, (H, I)), (0.3, (I,)), (0.5, (H, I)), (0.3, (I,)), (0.3, (I, H)), (0.3, (H,)))]
        for name, w in zip(("up", "up_bias", "gate", "gate_bias", "down", "down_bias"), ws):
            model.setWeight(f"moe:expert_{name}_{e}", w)
        experts.append(ws)
    return gate, gate_b, experts


@pytest.mark.parametrize("batch, steps, E, k", [
    (1, [80], 2, 2),            # every expert gets 80 rows: two chunks of CHUNK_ROWS
    (2, [20, 1, 1, 3], 5, 2),   # batch 2: BLAS prefill, numba decode rows
    (1, [1, 2, 5], 5, 3),
])
def test_gpt_oss_moe_layer_matches_formula(batch, steps, E, k):
    H, I = 24, 20
    model = moe_graph(max(steps), H, E, k, I, batch)
    gate, gate_b, experts = set_moe_weights(model, 6, H, E, I)
    (x,) = rng_arrays(7, (batch, sum(steps), H), scale=2.0)
    pos = 0
    for step in steps:
        chunk = x[:, pos:pos + step]
        out = model.incremental_inference(batch, [chunk.reshape(batch, -1)], None, None, pos,
                                          pos + step)[0].reshape(batch, -1, H)[:, :step]
        for b in range(batch):
            want = moe_ref(chunk[b], gate, gate_b, experts, k)
            np.testing.assert_allclose(out[b], want, rtol=1e-4, atol=1e-4)
        pos += step
    if steps == [80]:
        layers = []
        model.forEachLayer(lambda layer, context, _: layers.append(layer))
        assert layers[-1].counts.max() > CHUNK_ROWS


def test_gpt_oss_moe_properties_and_weight_order():
    model = moe_graph(3, 8, 3, 2, 6, props=[withKey("swiglu_alpha", 1.0),
                                             withKey("swiglu_limit", 0.5)])
    names = [s.full_name for s in model.getWeightSpecs()]
    per_expert = ["expert_up_{}", "expert_up_bias_{}", "expert_gate_{}", "expert_gate_bias_{}",
                  "expert_down_{}", "expert_down_bias_{}"]
    assert names == ["moe:gate", "moe:gate_bias"] + [f"moe:{p.format(e)}" for e in range(3)
                                                     for p in per_expert]
    shapes = {s.full_name: s.shape for s in model.getWeightSpecs()}
    assert shapes["moe:gate"] == (8, 3) and shapes["moe:expert_down_2"] == (6, 8)
    gate, gate_b, experts = set_moe_weights(model, 8, 8, 3, 6)
    (x,) = rng_arrays(9, (1, 3, 8), scale=3.0)
    out = model.incremental_inference(1, [x.reshape(1, -1)], None, None, 0, 3)[0]
    want = moe_ref(x[0], gate, gate_b, experts, 2, alpha=1.0, limit=0.5)
    np.testing.assert_allclose(out.reshape(3, 8), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("props, needle", [
    ([withKey("num_experts_per_token", 4)], "num_experts_per_token"),
    ([withKey("swiglu_limit", 0)], "swiglu_limit"),
])
def test_gpt_oss_moe_bad_properties_are_one_line_errors(props, needle):
    registerFactory(GptOssMoELayer)
    model = createModel()
    model.addLayer(createLayer("input", [withKey("name", "x"), withKey("input_shape", "1:2:8")]))
    model.addLayer(createLayer("gpt_oss_moe", [
        withKey("name", "moe"), withKey("input_layers", "x"), withKey("unit", 4),
        withKey("num_experts", 3), withKey("num_experts_per_token", 2), *props]))
    with pytest.raises(CausalLMError) as e:
        model.compile()
        model.initialize()
    assert "\n" not in str(e.value) and needle in str(e.value) and "moe" in str(e.value)


# ------------------------------------------------------------------ parity with transformers

def test_prompt_ids_match_tokenizer_json():
    parity.check_prompt_ids(load(), REF)


def test_graph_follows_the_config():
    """Sliding windows from layer_types, sinks, yarn properties, one MoE layer per block."""
    model = load()
    attention = {}

    def collect(layer, context, _):
        if layer.getType() == "mha_core":
            attention[context.getName()] = (layer.props, layer.sink_index is not None)
        if layer.getType() == "gpt_oss_moe":
            attention.setdefault("moe", []).append(layer.props)
    model.model.forEachLayer(collect)
    windows = [attention[f"layer{i}_attention"][0]["sliding_window"] for i in range(3)]
    assert windows == [8, UINT_MAX, 8]
    props, has_sink = attention["layer1_attention"]
    assert has_sink and props["rope_scaling_type"] == "yarn"
    assert props["rope_scaling_factor"] == 4.0
    assert props["rope_scaling_max_position_embeddings"] == 16
    assert props["rope_scaling_truncate"] is False and props["rope_theta"] == 150000.0
    assert [p["num_experts"] for p in attention["moe"]] == [4, 4, 4]
    assert attention["moe"][0]["num_experts_per_token"] == 2 and attention["moe"][0]["unit"] == 48


@pytest.mark.slow
@pytest.mark.parametrize("cls", CLASSES)
def test_prefill_and_cached_decode_match_transformers(cls):
    parity.check_prefill_and_cached_decode(load(cls), REF)


@pytest.mark.slow
def test_greedy_generation_gives_transformers_tokens():
    parity.check_greedy(load(), REF)


@pytest.mark.slow
def test_one_shot_forward_matches_no_cache_reference():
    parity.check_one_shot(load(init_seq_len=len(parity.full_sequence(REF)), num_to_generate=8), REF)


@pytest.mark.slow
@pytest.mark.parametrize("init_seq_len", [5, 8, 13])
def test_chunked_prefill_across_the_window_gives_the_same_tokens(init_seq_len):
    parity.check_chunked_prefill(load(GptOssCachedSlimCausalLM, init_seq_len=init_seq_len), REF)


@pytest.mark.parametrize("what", ["clamp", "sinks", "router_bias", "yarn", "window"])
def test_each_gpt_oss_feature_matters_on_the_fixture(what):
    """Leaving any one feature out moves the prefill logits far past the parity tolerance."""
    changes = {"clamp": {"swiglu_limit": 1e30},
               "yarn": {"rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}},
               "window": {"sliding_window": 4096}}.get(what, {})
    model = load(cfg_changes=changes)
    if what == "sinks":
        for i in range(3):
            model.model.setWeight(f"layer{i}_attention:sink", np.full(6, -1e30, F32))
    if what == "router_bias":
        for i in range(3):
            model.model.setWeight(f"layer{i}_ffn_down:gate_bias", np.zeros(4, F32))
    assert logit_error(model) > 50 * 2e-4


def test_transformers_4_style_config_gives_the_same_logits(tmp_path):
    """The config.json shape of openai/gpt-oss-20b: rope_scaling + rope_theta, no layer_types
    (transformers' default alternation), no swiglu_alpha."""
    folder = tmp_path / "v4"
    shutil.copytree(FOLDER, folder)
    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope
    for key in ("layer_types", "swiglu_alpha", "dtype"):
        cfg.pop(key)
    cfg["torch_dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(cfg))
    model = load(folder=str(folder))
    assert_logits_close(prefill(model, REF["prompt_ids"]), REF["prefill_logits"], "v4 config")


def test_config_without_rope_gets_gpt_oss_defaults():
    cfg, gen, nntr = load_model_configs(FOLDER)
    for key in ("rope_parameters", "sliding_window", "rms_norm_eps", "attention_bias"):
        cfg.pop(key)
    model = GptOssForCausalLM(cfg, gen, nntr)
    assert model.ROPE_THETA == 150000.0 and model.SLIDING_WINDOW == 128
    assert model.NORM_EPS == 1e-5 and model.ATTENTION_BIAS is True
    assert model.ropeProperties() == {
        "rope_scaling_type": "yarn", "rope_scaling_factor": 32.0,
        "rope_scaling_max_position_embeddings": 4096, "rope_scaling_beta_fast": 32.0,
        "rope_scaling_beta_slow": 1.0, "rope_scaling_truncate": False}


@pytest.mark.parametrize("changes, needles", [
    ({"layer_types": ["sliding_attention", "full_attention"]}, ["layer_types", "3"]),
    ({"layer_types": ["sliding_attention", "global", "full_attention"]}, ["layer_types"]),
    ({"num_experts_per_tok": 5}, ["num_experts_per_tok", "num_local_experts"]),
    ({"num_local_experts": None}, ["num_local_experts"]),
    ({"sliding_window": None}, ["sliding_window", "null"]),
])
def test_config_errors_are_one_line(changes, needles):
    cfg, gen, nntr = load_model_configs(FOLDER)
    for key, value in changes.items():
        cfg[key] = value
    with pytest.raises(CausalLMError) as e:
        GptOssForCausalLM(cfg, gen, nntr)
    message = str(e.value)
    assert "\n" not in message and "config.json" in message
    assert all(n in message for n in needles), message


def test_checkpoint_with_other_expert_count_is_a_one_line_error():
    with pytest.raises(CausalLMError) as e:
        load(cfg_changes={"num_local_experts": 5})
    message = str(e.value)
    assert "\n" not in message and "mlp" in message, message


# ------------------------------------------------------------------ the .bin layout

def converter_bin(folder, n_layers, n_experts, qkv=("q", "k", "v")):
    """The bytes res/gpt-oss/weight_converter.py writes (docs/nntrainer.md, "What the C++ converters
    write"), from the safetensors: FC weights transposed, gate/up de-interleaved (odd columns up,
    even gate), per expert up, up bias, gate, gate bias, down, down bias; sinks after v; lm_head
    last."""
    ckpt = Checkpoint(folder)
    get = ckpt.get
    parts = [get("model.embed_tokens.weight")]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        parts.append(get(p + "input_layernorm.weight"))
        for proj in qkv:
            parts += [get(f"{p}self_attn.{proj}_proj.weight").T,
                      get(f"{p}self_attn.{proj}_proj.bias")]
        parts += [get(p + "self_attn.sinks"), get(p + "self_attn.o_proj.weight").T,
                  get(p + "self_attn.o_proj.bias"), get(p + "post_attention_layernorm.weight"),
                  get(p + "mlp.router.weight").T, get(p + "mlp.router.bias")]
        gate_up = get(p + "mlp.experts.gate_up_proj")
        gate_up_b = get(p + "mlp.experts.gate_up_proj_bias")
        down, down_b = get(p + "mlp.experts.down_proj"), get(p + "mlp.experts.down_proj_bias")
        for e in range(n_experts):
            parts += [gate_up[..., 1::2][e], gate_up_b[..., 1::2][e], gate_up[..., ::2][e],
                      gate_up_b[..., ::2][e], down[e], down_b[e]]
    parts += [get("model.norm.weight"), get("lm_head.weight").T]
    return b"".join(np.ascontiguousarray(a, dtype=np.float32).tobytes() for a in parts)


@pytest.mark.slow
@pytest.mark.parametrize("cls, qkv", [(GptOssForCausalLM, ("q", "k", "v")),
                                      (GptOssCachedSlimCausalLM, ("v", "k", "q"))])
def test_bin_is_the_converter_layout_and_loads_to_transformers_logits(cls, qkv, tmp_path):
    """hf_to_bin writes what the C++ converter writes (cached slim: v, k, q; docs/nntrainer.md,
    "Weight order from an old topological sort"), and the .bin runs to transformers' logits."""
    folder = tmp_path / "m"
    shutil.copytree(FOLDER, folder)
    if cls is GptOssCachedSlimCausalLM:
        cfg = json.loads((folder / "config.json").read_text())
        cfg["architectures"] = ["GptOssCachedSlimCausalLM"]
        (folder / "config.json").write_text(json.dumps(cfg))
    out = hf_to_bin.convert(str(folder), str(tmp_path / "m.bin"))
    assert (tmp_path / "m.bin").read_bytes() == converter_bin(FOLDER, 3, 4, qkv)
    model = load(cls, folder=str(folder), weights=out.path)
    assert_logits_close(prefill(model, REF["prompt_ids"]), REF["prefill_logits"], ".bin prefill")


def test_fp16_bin_keeps_router_fp32():
    """FP16-FP32: expert and attention projections are FP16; router, biases, sinks FP32."""
    cfg, gen, nntr = load_model_configs(FOLDER)
    nntr.update(model_tensor_type="FP16-FP32", init_seq_len=4, num_to_generate=4)
    model = GptOssForCausalLM(cfg, gen, nntr)
    model.initialize()
    dtypes = {s.full_name: s.dtype for s in model.model.getWeightSpecs()}
    assert dtypes["layer0_ffn_down:gate"] == dtypes["layer0_ffn_down:gate_bias"] == "FP32"
    assert dtypes["layer0_ffn_down:expert_up_3"] == "FP16"
    assert dtypes["layer0_ffn_down:expert_down_bias_3"] == "FP32"
    assert dtypes["layer0_attention:sink"] == "FP32" and dtypes["layer0_wq:weight"] == "FP16"


# ------------------------------------------------------------------ cached slim: experts on file

@pytest.mark.slow
@pytest.mark.parametrize("capacity", [1, 3, 0])
@pytest.mark.parametrize("source", ["safetensors", "bin"])
def test_cached_slim_reads_experts_on_demand(source, capacity, tmp_path):
    """Experts left in the file and read into an LRU of ``moe_expert_cache`` experts give
    transformers' tokens; the graph's own expert weights are never filled. 0 = all resident."""
    weights = None
    if source == "bin":
        weights = str(tmp_path / "m.bin")
        load(GptOssCachedSlimCausalLM, moe_expert_cache=0).save_weight(weights)
    model = load(GptOssCachedSlimCausalLM, weights=weights, moe_expert_cache=capacity)
    parity.check_greedy(model, REF)
    layers = model.moeLayers()
    assert [name for name, _ in layers] == [f"layer{i}_ffn_down" for i in range(3)]
    up0 = model.model.getWeight("layer1_ffn_down:expert_up_0")
    if capacity == 0:
        assert all(layer.expert_cache is None for _, layer in layers)
        assert np.abs(up0).max() > 0
        return
    for _, layer in layers:
        cache = layer.expert_cache
        assert len(cache) <= capacity and cache.misses > 4  # 4 experts, some read again
    assert not up0.any()  # never loaded: read from the file on demand instead
    out = tmp_path / "again.bin"  # experts on file are copied into a saved .bin
    model.save_weight(str(out))
    resident = tmp_path / "resident.bin"
    load(GptOssCachedSlimCausalLM, weights=weights, moe_expert_cache=0).save_weight(str(resident))
    assert out.read_bytes() == resident.read_bytes()


def test_cached_slim_insertion_order_is_v_k_q():
    model = load(GptOssCachedSlimCausalLM)
    names = [s.full_name.split(":")[0] for s in model.model.getWeightSpecs()]
    first = [n for n in dict.fromkeys(names) if n.startswith("layer0_")]
    assert first[:6] == ["layer0_attention_norm", "layer0_wv", "layer0_wk", "layer0_wq",
                         "layer0_attention", "layer0_attention_out"]


# ------------------------------------------------------------------ the CLI

def test_cli_gives_transformers_tokens():
    parity.check_cli(NAME, "GptOssForCausalLM", 24)
