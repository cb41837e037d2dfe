"""Gemma3ForCausalLM (models/gemma3) against Hugging Face transformers, on committed fixtures.

tools/fixtures_gemma3.py built each folder with transformers 5.23 (tiny random weights, the
project tokenizer) and stored what transformers computed (see tools/make_fixtures.py for the
expected.npz keys). Both fixtures run prompts and generations far longer than their sliding
window (8 and 6), prefilled in one step and in chunks:

    gemma3-swa-tied  F32, tied, GQA 4, query_pre_attn_scalar 24 != head_dim 16, transformers-4
                     config: sliding_window_pattern 2, rope_local_base_freq 1000, global
                     rope_theta 1e4 with linear scaling (factor 2)
    gemma3-softcap   BF16, untied, GQA 3, query_pre_attn_scalar 20, layer_types
                     [sliding, full, sliding], nested rope_parameters, final_logit_softcapping 3
                     (and attn_logit_softcapping 1, which transformers' Gemma 3 ignores)

Also: the config reading against values transformers 5.23 derives, the .bin order and round
trip, the logit_softcapping layer and kernel, the FunctionGemma template and the CLI.
Nothing here imports torch or transformers.
"""

import json
import math
import os
import shutil

import numpy as np
import parity
import pytest
from parity import FIXTURES, expected

from causallm import main
from causallm.api import createLayer, createModel, withKey
from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.kernels.softcap import softcap
from causallm.runtime.properties import UINT_MAX
from causallm.tokenizer import Tokenizer
from causallm.models.gemma3.function import apply_function_gemma_template, function_gemma_prompt
from causallm.models.gemma3.gemma3_causallm import Gemma3CausalLM, Gemma3Transformer

GEMMA3_FIXTURES = ["gemma3-swa-tied", "gemma3-softcap"]
S, F = "sliding_attention", "full_attention"


def load(name, **nntr):
    return parity.load(Gemma3CausalLM, name, **nntr)


# ------------------------------------------------------------------------------ parity
@pytest.mark.parametrize("name", GEMMA3_FIXTURES)
def test_prompt_ids_match_tokenizer_json(name):
    parity.check_prompt_ids(load(name), expected(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", GEMMA3_FIXTURES)
def test_prefill_and_cached_decode_match_transformers(name):
    ref = expected(name)
    model = load(name)
    assert len(ref["prompt_ids"]) > model.SLIDING_WINDOW  # one prefill step longer than the window
    assert len(ref["tokens"]) >= 24
    parity.check_prefill_and_cached_decode(model, ref)


@pytest.mark.parametrize("name", GEMMA3_FIXTURES)
def test_greedy_generation_gives_transformers_tokens(name):
    parity.check_greedy(load(name), expected(name))


@pytest.mark.parametrize("name", GEMMA3_FIXTURES)
def test_one_shot_forward_matches_no_cache_reference(name):
    """prompt + tokens[:-1] (several windows long) in one step = transformers' no-cache forward."""
    ref = expected(name)
    model = load(name, init_seq_len=len(parity.full_sequence(ref)), num_to_generate=8)
    parity.check_one_shot(model, ref)


@pytest.mark.parametrize("name,chunk", [("gemma3-swa-tied", 5), ("gemma3-softcap", 11)])
def test_chunked_prefill_gives_transformers_tokens(name, chunk):
    """Prompt chunks shorter (5) and longer (11) than the window leave the same cache."""
    parity.check_chunked_prefill(load(name, init_seq_len=chunk), expected(name))


def test_cli_greedy_json_gives_transformers_tokens():
    parity.check_cli("gemma3-softcap", "Gemma3ForCausalLM", 24)


# ------------------------------------------------------------------------------ graph, weights
@pytest.mark.slow
def test_graph_names_and_bin_order_follow_the_cpp():
    """Insertion order = .bin order (docs/nntrainer.md, "Block order by family", "Weight order from
    an old topological sort"): q, k, v, q_norm, k_norm, o, the sandwich norms, gate, up, down; the
    C++ names `layer{i}pre_ffn_norm`/`post_ffn_norm` are kept."""
    model = load("gemma3-softcap", init_seq_len=8, num_to_generate=8)
    names = [s.full_name for s in model.model.getWeightSpecs()]
    assert names[:14] == [
        "embedding0:Embedding", "layer0_attention_norm:gamma", "layer0_wq:weight",
        "layer0_wk:weight", "layer0_wv:weight", "layer0_q_norm:gamma", "layer0_k_norm:gamma",
        "layer0_attention_out:weight", "layer0_post_attention_norm:gamma",
        "layer0pre_ffn_norm:gamma", "layer0_ffn_gate:weight", "layer0_ffn_up:weight",
        "layer0_ffn_down:weight", "layer0post_ffn_norm:gamma"]
    assert names[-2:] == ["output_norm:gamma", "output_of_causallm:weight"]
    assert len(names) == 1 + 13 * 3 + 2


@pytest.mark.slow
def test_bin_round_trip_and_hf_map_inverse(tmp_path):
    """save_weight -> load_weight of the .bin gives the same logits; gamma holds 1 + w."""
    ref = expected("gemma3-swa-tied")
    model = load("gemma3-swa-tied", num_to_generate=8)
    path = str(tmp_path / "gemma3.bin")
    model.save_weight(path)
    again = load("gemma3-swa-tied", weights=path, num_to_generate=8)
    parity.assert_logits_close(parity.prefill(again, ref["prompt_ids"]), ref["prefill_logits"],
                               "prefill from .bin")
    # tied: the head adds no bytes; every gamma is stored as 1 + w
    n_floats = sum(int(np.prod(s.shape)) for s in again.model.getWeightSpecs()
                   if s.full_name != "output_of_causallm:Embedding")
    assert os.path.getsize(path) == 4 * n_floats
    (entry,) = again.getHFWeightMap()["model.layers.0.pre_feedforward_layernorm.weight"]
    assert entry.target == "layer0pre_ffn_norm:gamma" and entry.offset == 1.0


@pytest.mark.slow
def test_final_logit_softcapping_layer_only_when_set():
    tied = load("gemma3-swa-tied", init_seq_len=8, num_to_generate=8)
    capped = load("gemma3-softcap", init_seq_len=8, num_to_generate=8)
    names = lambda m: [n.getName() for n in m.model._nodes]  # noqa: E731
    assert "output_softcapping" not in names(tied)
    assert names(capped)[-2:] == ["output_of_causallm", "output_softcapping"]


# ------------------------------------------------------------------------------ config
def config(**keys):
    base = dict(architectures=["Gemma3ForCausalLM"], vocab_size=4003, hidden_size=32,
                intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=1, head_dim=16)
    path = os.path.join(FIXTURES, "gemma3-swa-tied", "config.json")  # for the tokenizer
    return JsonConfig({**base, **keys}, path)


def make(cfg, **nntr):
    empty = JsonConfig({}, os.path.join(os.path.dirname(cfg.path), "generation_config.json"),
                       exists=False)
    nntr_cfg = JsonConfig({**nntr}, os.path.join(os.path.dirname(cfg.path), "nntr_config.json"),
                          exists=bool(nntr))
    return Gemma3CausalLM(cfg, empty, nntr_cfg)


# (config.json rope keys, {layer type: (rope_type, theta, factor)}) as transformers 5.23's
# Gemma3TextConfig resolves them (printed from its rope_parameters)
ROPE_CASES = {
    "none": ({}, {F: ("default", 1e6, None), S: ("default", 1e4, None)}),
    "v4": (dict(rope_theta=5e4, rope_local_base_freq=5e3,
                rope_scaling={"rope_type": "linear", "factor": 8.0}),
           {F: ("linear", 5e4, 8.0), S: ("default", 5e3, None)}),
    "v4 legacy 'type' is not read": (dict(rope_theta=5e4, rope_scaling={"type": "linear",
                                                                        "factor": 8.0}),
                                     {F: ("default", 5e4, 8.0), S: ("default", 1e4, None)}),
    "nested": (dict(rope_parameters={F: {"rope_type": "linear", "factor": 2.0,
                                         "rope_theta": 1e5},
                                     S: {"rope_type": "default", "rope_theta": 1e4}}),
               {F: ("linear", 1e5, 2.0), S: ("default", 1e4, None)}),
    "nested, theta from rope_theta": (dict(rope_parameters={F: {"rope_type": "linear",
                                                                "factor": 2.0}},
                                           rope_theta=3e5),
                                      {F: ("linear", 3e5, 2.0), S: ("default", 1e4, None)}),
    "nested 'type'": (dict(rope_parameters={F: {"type": "linear", "factor": 4.0}}),
                      {F: ("linear", 1e6, 4.0), S: ("default", 1e4, None)}),
    "flat rope_parameters are not read": (
        dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5}),
        {F: ("default", 1e6, None), S: ("default", 1e4, None)}),
}


@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_rope_parameters_as_transformers_reads_them(case):
    keys, want = ROPE_CASES[case]
    got = Gemma3Transformer.readRopeParameters(config(**keys))
    for layer_type, (rope_type, theta, factor) in want.items():
        g_theta, g_params = got[layer_type]
        assert (g_params["rope_type"], g_theta, g_params.get("factor")) == \
            (rope_type, theta, factor), layer_type


def test_layer_kinds_windows_and_thetas_per_layer():
    model = make(config(sliding_window=8, sliding_window_pattern=2, rope_theta=5e4,
                        rope_local_base_freq=500.0,
                        rope_scaling={"rope_type": "linear", "factor": 8.0}))
    assert model.layer_types == [S, F, S, F]
    model.initialize()
    props = {}
    model.model.forEachLayer(lambda layer, ctx, _: props.__setitem__(ctx.getName(), layer.props)
                             if layer.getType() == "mha_core" else None)
    assert [props[f"layer{i}_attention"]["sliding_window"] for i in range(4)] == \
        [8, UINT_MAX, 8, UINT_MAX]
    assert [props[f"layer{i}_attention"]["rope_theta"] for i in range(4)] == [500.0, 5e4] * 2
    assert [props[f"layer{i}_attention"]["rope_scaling_type"] for i in range(4)] == \
        ["default", "linear"] * 2
    assert props["layer1_attention"]["rope_scaling_factor"] == 8.0
    assert props["layer0_attention"]["query_pre_attn_scalar"] == 256.0  # transformers' default
    assert all(p["attn_logit_softcapping"] == 0.0 for p in props.values())


def test_transformers_defaults_for_missing_keys():
    cfg = config()
    del cfg["head_dim"]
    model = make(cfg)
    assert model.layer_types == [S] * 4  # sliding_window_pattern 6: layer 5 would be the first F
    assert (model.HEAD_DIM, model.SLIDING_WINDOW, model.QUERY_PRE_ATTN_SCALAR) == (256, 4096, 256)
    assert model.TIE_WORD_EMBEDDINGS is True and model.FINAL_LOGIT_SOFTCAPPING == 0.0
    assert model.HIDDEN_ACT == "tanh_gelu"
    assert model.EMBEDDING_SCALE == float(np.float32(math.sqrt(32)))
    assert make(config(sliding_window=None)).SLIDING_WINDOW == UINT_MAX
    assert make(config(hidden_act="silu", hidden_activation="gelu")).HIDDEN_ACT == "gelu"
    assert make(config(num_hidden_layers=12)).layer_types == ([S] * 5 + [F]) * 2


def test_embedding_scale_is_rounded_to_the_embedding_dtype():
    model = make(config(hidden_size=640, num_attention_heads=4), embedding_dtype="FP16")
    assert model.EMBEDDING_SCALE == float(np.float16(math.sqrt(640))) != math.sqrt(640)


@pytest.mark.parametrize("keys,needles", [
    (dict(layer_types=[S, F]), ["layer_types", "4"]),
    (dict(layer_types=[S, F, S, "chunked_attention"]), ["layer_types"]),
    (dict(hidden_activation="relu"), ["hidden_activation", "gelu_pytorch_tanh"]),
    (dict(rope_parameters={F: {"rope_type": "dynamic", "factor": 2.0}}), ["dynamic"]),
    (dict(rope_parameters={S: {"rope_theta": "big"}}), ["rope_theta", "sliding_attention"]),
    (dict(query_pre_attn_scalar=0), ["query_pre_attn_scalar"]),
    (dict(final_logit_softcapping=-1.0), ["final_logit_softcapping"]),
])
def test_bad_config_is_one_line_error(keys, needles):
    with pytest.raises(CausalLMError) as e:
        make(config(**keys))
    message = str(e.value)
    assert "\n" not in message and "config.json" in message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("model_type,ok", [("CausalLM", True), ("Model", True),
                                           ("causallm", True), ("embedding", False)])
def test_nntr_model_type(model_type, ok):
    if ok:
        make(config(), model_type=model_type)
    else:
        with pytest.raises(CausalLMError, match="model_type"):
            make(config(), model_type=model_type)


# ------------------------------------------------------------------------------ softcapping
def softcap_twin(x, cap):
    """numpy twin of the softcap kernel."""
    return np.tanh(x.astype(np.float64) / cap) * cap


def test_softcap_kernel_against_numpy_twin():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 5, 37)) * 20).astype(np.float32)
    y = np.full_like(x, 7.0)
    softcap(x, y, 3, 30.0)
    np.testing.assert_allclose(y[:, :3], softcap_twin(x[:, :3], 30.0), rtol=2e-6, atol=2e-6)
    assert (y[:, 3:] == 7.0).all()  # rows past nrows untouched
    want = softcap_twin(x, 2.5)
    softcap(x, x, 5, 2.5)  # in place
    np.testing.assert_allclose(x, want, rtol=2e-6, atol=2e-6)
    assert np.abs(x).max() <= 2.5


def test_logit_softcapping_layer_against_formula():
    from causallm.api import registerFactory
    from causallm.layers.logit_softcapping import LogitSoftcappingLayer
    registerFactory(LogitSoftcappingLayer)
    model = createModel()
    model.addLayer(createLayer("input", [withKey("name", "x"), withKey("input_shape", "1:1:9")]))
    model.addLayer(createLayer("logit_softcapping", [withKey("name", "cap"),
                                                     withKey("softcapping", 4.0)]))
    model.compile()
    model.initialize()
    x = np.linspace(-30, 30, 9, dtype=np.float32)[None]
    out = model.incremental_inference(1, [x], None, None, 5, 6)[0]
    np.testing.assert_allclose(out[0], softcap_twin(x[0], 4.0), rtol=2e-6, atol=2e-6)
    bad = createModel()
    bad.addLayer(createLayer("input", [withKey("name", "x"), withKey("input_shape", "1:1:9")]))
    bad.addLayer(createLayer("logit_softcapping", [withKey("name", "cap"),
                                                   withKey("softcapping", 0.0)]))
    with pytest.raises(CausalLMError, match="'cap'.*softcapping must be positive"):
        bad.compile()
        bad.initialize()


# ------------------------------------------------------------------------------ FunctionGemma
CHAT_INPUT = {  # Applications/CausalLM/res/gemma3/function/nntr_config.json
    "tools": [{"type": "function", "function": {
        "name": "get_current_temperature",
        "description": "Gets the current temperature for a given location.",
        "parameters": {"type": "object",
                       "properties": {"location": {"type": "string",
                                                   "description": "The city name, e.g. San Francisco"}},
                       "required": ["location"]}}}],
    "messages": [
        {"role": "developer",
         "content": "You are a model that can do function calling with the following functions"},
        {"role": "user", "content": "What's the temperature in London?"}],
}
CHAT_PROMPT = (
    "<bos><start_of_turn>developer\nYou are a model that can do function calling with the "
    "following functions<start_function_declaration>declaration:get_current_temperature,"
    "description:<escape>Gets the current temperature for a given location.<escape>,"
    "parameters:{properties:{location:{description:<escape>The city name, e.g. San Francisco"
    "<escape>,type:<escape>STRING<escape>}},required:[<escape>location<escape>],"
    "type:<escape>OBJECT<escape>}<end_function_declaration><end_of_turn>\n"
    "<start_of_turn>user\nWhat's the temperature in London?<end_of_turn>\n"
    "<start_of_turn>model\n")


def test_function_gemma_template_of_the_cpp_example():
    assert apply_function_gemma_template(CHAT_INPUT) == CHAT_PROMPT


def test_function_gemma_template_calls_responses_and_nesting():
    chat = {
        "tools": [{"function": {"name": "f", "parameters": {"properties": {
            "b": {"type": "object", "properties": {"z": {"type": "number"}, "a": {"type": "string"}},
                  "required": ["a"]},
            "a": {"description": "first"}}}}}, {"type": "no function here"}],
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"function": {"name": "f", "arguments": {"y": [1, 2], "x": "str", "n": {"k": 1.5}}}},
                {"function": {"name": "g", "arguments": "raw"}}]},
            {"role": "tool", "name": "f", "content": {"t": 15, "s": "sunny"}},
            {"role": "tool", "name": "g", "content": "plain"},
            {"role": "developer", "content": "tools only once"}],
    }
    assert apply_function_gemma_template(chat) == (
        "<bos><start_of_turn>system\nsys"
        "<start_function_declaration>declaration:f,description:<escape><escape>,parameters:{"
        "properties:{a:{description:<escape>first<escape>},b:{type:<escape>OBJECT<escape>,"
        "properties:{a:{type:<escape>STRING<escape>},z:{type:<escape>NUMBER<escape>}},"
        "required:[<escape>a<escape>]}},}<end_function_declaration>"
        "<start_function_declaration><end_function_declaration><end_of_turn>\n"
        "<start_of_turn>model\n<start_function_call>call:f{n:{\"k\":1.5},x:str,y:[1,2]}"
        "<end_function_call><start_function_call>call:g{raw}<end_function_call><end_of_turn>\n"
        "<start_function_response>response:f{value:{\"s\":\"sunny\",\"t\":15}}"
        "<end_function_response>"
        "plain<start_function_response>response:g{value:plain}<end_function_response>"
        "<start_of_turn>developer\ntools only once<end_of_turn>\n<start_of_turn>model\n")


@pytest.mark.parametrize("chat", [
    {}, {"messages": "hi"}, {"messages": [{"role": 3}]},
    {"messages": [{"role": "system"}], "tools": [{"function": {"name": "f", "description": 5}}]},
    {"messages": [{"role": "model", "tool_calls": [{"function": {"arguments": {}}}]}]},
])
def test_function_gemma_template_bad_input_is_one_line_error(chat):
    with pytest.raises(CausalLMError, match="chat_input") as e:
        apply_function_gemma_template(chat)
    assert "\n" not in str(e.value)


class _FakeTokenizer:
    """Encode("") -> [bos] when the tokenizer adds one; "<bos>" is one special token."""

    def __init__(self, adds_bos):
        self.adds_bos = adds_bos

    def Encode(self, text, add_special_tokens=True):
        ids = [2] if add_special_tokens and self.adds_bos else []
        return ids + ([2] if text == "<bos>" else [7] * len(text))


def test_function_gemma_prompt_keeps_one_bos():
    assert function_gemma_prompt(CHAT_INPUT, _FakeTokenizer(True)) == CHAT_PROMPT[len("<bos>"):]
    assert function_gemma_prompt(CHAT_INPUT, _FakeTokenizer(False)) == CHAT_PROMPT


@pytest.mark.slow
def test_cli_chat_input_uses_the_function_gemma_template(tmp_path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(os.path.join(FIXTURES, "gemma3-softcap"), folder)
    (folder / "nntr_config.json").write_text(json.dumps(
        {"init_seq_len": 256, "num_to_generate": 4, "chat_input": CHAT_INPUT}))
    capsys.readouterr()
    rc = main.main([str(folder), "--greedy", "-n", "2", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    record = json.loads(out.splitlines()[-1])
    assert record["prompt"] == CHAT_PROMPT  # this tokenizer has no <bos> token: kept as text
    tok = Tokenizer.FromFile(str(folder / "tokenizer.json"))
    assert record["prompt_ids"] == tok.Encode(CHAT_PROMPT)
    assert len(record["generated_ids"]) == 2
