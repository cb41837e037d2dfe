"""Qwen2ForCausalLM and Qwen3ForCausalLM against Hugging Face transformers, on committed fixtures.

tools/fixtures_qwen.py built each folder with transformers 5 (tiny random weights, the project
tokenizer) and stored what transformers computed (see tests/fixtures/README.md for the keys):

    qwen2-gqa4       GQA 4, untied, q/k/v biases; use_sliding_window false with a 4-token window
                     in config.json that transformers ignores (the C++ applies it:
                     docs/nntrainer.md, "Qwen2 window on every layer")
    qwen2-swa8       window 8 on layers >= max_window_layers (1): layers 1, 2 slide, 0 does not
    qwen3-hd80       head_dim 80 with hidden 48 (3 heads), GQA 3, tied, q/k norms
    qwen3-swa6-bias  attention_bias (q/k/v/o), window 6, explicit layer_types [slide, full, slide]

Prompt + generation is far longer than every window. Nothing here imports torch or
transformers; the expected sliding-window rules below were read off transformers 5.23's
Qwen2Config / Qwen3Config.
"""

import os
import sys

import numpy as np
import parity
import pytest
from parity import FIXTURES, ROOT, assert_logits_close, expected, full_sequence, prefill

from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig, load_model_configs
from causallm.io.safetensors import Checkpoint
from causallm.runtime.properties import UINT_MAX
from causallm.models.qwen2.qwen2_causallm import Qwen2CausalLM, Qwen2Transformer, readQwenLayerTypes
from causallm.models.qwen3.qwen3_causallm import Qwen3CausalLM, Qwen3Transformer

sys.path.insert(0, os.path.join(ROOT, "tools"))
import hf_to_bin  # noqa: E402

CLASSES = {"qwen2-gqa4": Qwen2CausalLM, "qwen2-swa8": Qwen2CausalLM,
           "qwen3-hd80": Qwen3CausalLM, "qwen3-swa6-bias": Qwen3CausalLM}
QWEN_FIXTURES = list(CLASSES)
SLIDING = {"qwen2-swa8": 8, "qwen3-swa6-bias": 6}
# mha_core sliding_window per layer, as transformers decides it for each fixture
WINDOWS = {"qwen2-gqa4": [UINT_MAX] * 2, "qwen2-swa8": [UINT_MAX, 8, 8],
           "qwen3-hd80": [UINT_MAX] * 2, "qwen3-swa6-bias": [6, UINT_MAX, 6]}


def load(name, cfg_changes=None, weights=None, **nntr):
    return parity.load(CLASSES[name], name, cfg_changes, weights, **nntr)


def sliding_windows(model):
    """The ``sliding_window`` of every mha_core layer, in graph order."""
    found = []
    model.model.forEachLayer(lambda layer, ctx, out: out.append(layer.props["sliding_window"])
                             if layer.type == "mha_core" else None, found)
    return found


# ----------------------------------------------------------------------- parity with transformers

@pytest.mark.slow
@pytest.mark.parametrize("name", QWEN_FIXTURES)
def test_prefill_and_cached_decode_match_transformers(name):
    ref = expected(name)
    model = load(name)
    parity.check_prompt_ids(model, ref)
    assert len(ref["tokens"]) >= 25
    parity.check_prefill_and_cached_decode(model, ref)


@pytest.mark.slow
@pytest.mark.parametrize("name", QWEN_FIXTURES)
def test_greedy_generation_gives_transformers_tokens(name):
    parity.check_greedy(load(name), expected(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", QWEN_FIXTURES)
def test_one_shot_forward_matches_no_cache_reference(name):
    """Prefill of prompt + tokens[:-1] in one step (longer than every window) equals
    transformers' no-cache forward."""
    ref = expected(name)
    parity.check_one_shot(load(name, init_seq_len=len(full_sequence(ref)), num_to_generate=8), ref)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLIDING))
@pytest.mark.parametrize("chunk", [3, 7])
def test_chunked_prefill_across_the_window(name, chunk):
    """A prompt prefilled in chunks shorter than the window (and not dividing the prompt) gives
    transformers' tokens."""
    parity.check_chunked_prefill(load(name, init_seq_len=chunk), expected(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2-swa8", "qwen3-hd80"])  # one per architecture
def test_greedy_cli_gives_transformers_tokens(name):
    arch = "Qwen2ForCausalLM" if name.startswith("qwen2") else "Qwen3ForCausalLM"
    parity.check_cli(name, arch, 24)


# ------------------------------------------------------------------------------- sliding windows

@pytest.mark.parametrize("name", QWEN_FIXTURES)
def test_graph_gets_transformers_sliding_windows(name):
    assert sliding_windows(load(name)) == WINDOWS[name]


@pytest.mark.parametrize("name, change", [
    ("qwen2-gqa4", {"use_sliding_window": True}),    # the C++ behaviour: window 4 on every layer
    ("qwen2-swa8", {"use_sliding_window": False}),   # no window at all
    ("qwen2-swa8", {"max_window_layers": 0}),        # window on layer 0 too
    ("qwen3-swa6-bias", {"layer_types": None}),      # max_window_layers 1 instead of the list
])
def test_fixtures_tell_the_window_rules_apart(name, change):
    """Each of these other readings of the config changes the prompt's logits well beyond the
    parity tolerance, so the parity tests above pin the rule transformers uses."""
    ref = expected(name)
    seq = full_sequence(ref)
    model = load(name, change, init_seq_len=len(seq), num_to_generate=8)
    diff = float(np.abs(prefill(model, seq) - ref["full_logits_last"]).max())
    assert diff > 0.05, diff


def cfg_of(**keys):
    return JsonConfig(keys, "config.json")


@pytest.mark.parametrize("keys, layers, window, types", [
    # sliding_window is ignored while use_sliding_window is false (the default)
    (dict(sliding_window=4, max_window_layers=0), 3, UINT_MAX, "FFF"),
    (dict(use_sliding_window=False, sliding_window=4, max_window_layers=0), 3, UINT_MAX, "FFF"),
    # layers i >= max_window_layers slide
    (dict(use_sliding_window=True, sliding_window=8, max_window_layers=1), 3, 8, "FSS"),
    (dict(use_sliding_window=True, sliding_window=8, max_window_layers=3), 3, 8, "FFF"),
    # defaults: sliding_window 4096, max_window_layers 28
    (dict(use_sliding_window=True), 30, 4096, "F" * 28 + "SS"),
    # a null window means no sliding layers
    (dict(use_sliding_window=True, sliding_window=None, max_window_layers=0), 3, UINT_MAX, "FFF"),
    # explicit layer_types win over max_window_layers
    (dict(use_sliding_window=True, sliding_window=5, max_window_layers=0,
          layer_types=["full_attention", "sliding_attention", "full_attention"]), 3, 5, "FSF"),
    (dict(use_sliding_window=False, sliding_window=None, layer_types=["full_attention"] * 3),
     3, UINT_MAX, "FFF"),
])
def test_layer_types_follow_transformers(keys, layers, window, types):
    got_window, got_types = readQwenLayerTypes(cfg_of(**keys), layers)
    assert got_window == window
    assert "".join(t[0].upper() for t in got_types) == types


@pytest.mark.parametrize("keys, words", [
    (dict(use_sliding_window=False, sliding_window=5,
          layer_types=["full_attention", "sliding_attention", "full_attention"]),
     ["layer_types", "sliding_attention", "use_sliding_window"]),
    (dict(use_sliding_window=True, layer_types=["full_attention"] * 2), ["layer_types", "3"]),
    (dict(use_sliding_window=True, layer_types=["full_attention"] * 2 + ["chunked_attention"]),
     ["layer_types", "sliding_attention"]),
    (dict(use_sliding_window=True, sliding_window=0), ["sliding_window", ">= 1"]),
    (dict(use_sliding_window="yes"), ["use_sliding_window", "true or false"]),
])
def test_bad_window_configs_fail_in_one_line(keys, words):
    with pytest.raises(CausalLMError) as e:
        readQwenLayerTypes(cfg_of(**keys), 3)
    msg = str(e.value)
    assert "\n" not in msg and "config.json" in msg
    for w in words:
        assert w in msg, msg


# ------------------------------------------------------------------------- graph and weight layout

def build(cls, name, **changes):
    cfg, gen, nntr = load_model_configs(os.path.join(FIXTURES, name))
    cfg.update(changes)
    nntr.update(init_seq_len=4, num_to_generate=4)
    model = cls(cfg, gen, nntr)
    model.initialize()
    return model


def spec_names(model):
    return [s.full_name for s in model.model.getWeightSpecs()]


def block_names(i, qwen3, qkv_bias, o_bias):
    fc = lambda n, b: [f"layer{i}_{n}:weight"] + ([f"layer{i}_{n}:bias"] if b else [])  # noqa: E731
    names = [f"layer{i}_attention_norm:gamma"]
    names += fc("wq", qkv_bias) + ([f"layer{i}_q_norm:gamma"] if qwen3 else [])
    names += fc("wk", qkv_bias) + ([f"layer{i}_k_norm:gamma"] if qwen3 else [])
    names += fc("wv", qkv_bias) + fc("attention_out", o_bias)
    names += [f"layer{i}_ffn_norm:gamma", f"layer{i}_ffn_up:weight", f"layer{i}_ffn_gate:weight",
              f"layer{i}_ffn_down:weight"]
    return names


@pytest.mark.parametrize("name", QWEN_FIXTURES)
def test_weight_order_is_the_cpp_graph_order(name):
    """docs/nntrainer.md, "Block order by family": Qwen2 q/k/v carry a bias, o does not; Qwen3
    puts q_norm after wq and k_norm after wk (and its q/k/v/o biases, with attention_bias, after
    their weight)."""
    model = build(CLASSES[name], name)
    qwen3 = name.startswith("qwen3")
    qkv_bias = not qwen3 or name == "qwen3-swa6-bias"
    o_bias = name == "qwen3-swa6-bias"
    want = ["embedding0:Embedding"]
    for i in range(model.NUM_LAYERS):
        want += block_names(i, qwen3, qkv_bias, o_bias)
    want += ["output_norm:gamma"] + ([] if model.TIE_WORD_EMBEDDINGS
                                     else ["output_of_causallm:weight"])
    assert spec_names(model) == want


def test_qwen2_ignores_attention_bias_and_mlp_bias_keys():
    """HF Qwen2 hard-codes its biases (q/k/v yes, o and MLP no)."""
    plain = spec_names(build(Qwen2CausalLM, "qwen2-gqa4"))
    assert spec_names(build(Qwen2CausalLM, "qwen2-gqa4", attention_bias=True,
                            mlp_bias=True)) == plain


def test_qwen3_biases_follow_attention_bias_only():
    biased = spec_names(build(Qwen3CausalLM, "qwen3-swa6-bias", mlp_bias=True))
    assert "layer0_attention_out:bias" in biased and "layer0_ffn_up:bias" not in biased
    plain = spec_names(build(Qwen3CausalLM, "qwen3-swa6-bias", attention_bias=False))
    assert not any(n.endswith(":bias") for n in plain)


def test_qwen3_head_dim_defaults_to_128_as_in_transformers():
    model = build(Qwen3CausalLM, "qwen3-swa6-bias", head_dim=None)
    assert model.HEAD_DIM == 128
    shapes = {s.full_name: s.shape for s in model.model.getWeightSpecs()}
    assert shapes["layer0_wq:weight"] == (32, 4 * 128)
    assert shapes["layer0_q_norm:gamma"] == (128,)


def test_transformer_classes_stay_free_of_causallm():
    """Qwen2Embedding / Qwen3Embedding build on the Transformer classes."""
    for cls in (Qwen2Transformer, Qwen3Transformer):
        assert not any(c.__name__ == "CausalLM" for c in cls.__mro__)
    for causal, base in ((Qwen2CausalLM, Qwen2Transformer), (Qwen3CausalLM, Qwen3Transformer)):
        assert [c.__name__ for c in causal.__mro__[:5]] == [
            causal.__name__, "CausalLM", "LanguageModel", base.__name__, "Transformer"]


def converter_bin(path, folder, qwen3, tied):
    """The C++ weight_converter.py layout, written with numpy from the safetensors
    (docs/nntrainer.md, "What the C++ converters write"): embed; per layer input_layernorm, q^T
    (+q bias) [q_norm], k^T (+bias) [k_norm], v^T (+bias), o^T (+bias),
    post_attention_layernorm, up^T, gate^T, down^T; final norm;
    lm_head^T when untied (the Qwen2 converter omits it: docs/nntrainer.md, "Qwen2 converter
    without lm_head")."""
    ckpt = Checkpoint(folder)
    n_layers = 1 + max(int(k.split(".")[2]) for k in ckpt.keys() if k.startswith("model.layers."))

    def save(name, transpose=False):
        a = np.asarray(ckpt.get(name), dtype=np.float32)
        (a.T if transpose else a).astype(np.float32).tofile(f)
        bias = name[:-len("weight")] + "bias"
        if transpose and bias in ckpt:
            np.asarray(ckpt.get(bias), dtype=np.float32).tofile(f)

    with open(path, "wb") as f:
        save("model.embed_tokens.weight")
        for i in range(n_layers):
            p = f"model.layers.{i}."
            save(p + "input_layernorm.weight")
            for proj in ("q", "k", "v"):
                save(f"{p}self_attn.{proj}_proj.weight", True)
                if qwen3 and proj != "v":
                    save(f"{p}self_attn.{proj}_norm.weight")
            save(f"{p}self_attn.o_proj.weight", True)
            save(p + "post_attention_layernorm.weight")
            for proj in ("up_proj", "gate_proj", "down_proj"):
                save(f"{p}mlp.{proj}.weight", True)
        save("model.norm.weight")
        if not tied:
            save("lm_head.weight", True)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2-gqa4", "qwen3-swa6-bias"])
def test_bin_is_the_converter_layout_and_loads_to_transformers_logits(name, tmp_path):
    folder = os.path.join(FIXTURES, name)
    theirs = tmp_path / "converter.bin"
    converter_bin(theirs, folder, name.startswith("qwen3"),
                  load_model_configs(folder)[0]["tie_word_embeddings"])
    ours = hf_to_bin.convert(folder, str(tmp_path / "ours.bin")).path
    assert theirs.read_bytes() == open(ours, "rb").read()
    ref = expected(name)
    model = load(name, weights=str(theirs))
    assert_logits_close(prefill(model, ref["prompt_ids"]), ref["prefill_logits"], "prefill")
