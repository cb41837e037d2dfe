"""Make the committed parity fixtures under tests/fixtures/ with torch + transformers.

Each model fixture ``tests/fixtures/<name>/`` is a real Hugging Face folder (config.json,
generation_config.json, safetensors weights, tokenizer.json, tokenizer_config.json) holding a
small randomly initialised LlamaForCausalLM, plus ``expected.npz`` with what transformers
computes from it in float32:

    prompt               0-d unicode     the prompt text
    prompt_ids           int64 (P,)      tokenizer.json encoding of the prompt (BOS first)
    prefill_logits       float32 (V,)    logits at the last prompt position
    tokens               int64 (N,)      greedy tokens, decoded with the KV cache, no EOS stop
    step_logits          float32 (N, V)  logits that chose tokens[i]; step_logits[0] == prefill_logits
    full_logits_last     float32 (V,)    no-cache forward over prompt_ids + tokens[:-1], last position
    transformers_version 0-d unicode     transformers.__version__ that computed the above

Weights are drawn from N(0, std^2) with std ~0.12 (biases std 0.1, RMSNorm gains 1 + N(0, 0.1^2))
so that logits are far from flat and greedy tokens vary. Half-precision fixtures round the
weights to BF16/F16 first and compute from the rounded values widened to float32. A seed is
kept only if every greedy step wins by a logit margin of at least MIN_MARGIN (so a faithful
float32 port picks the same tokens) and EOS never appears; otherwise the next seed is tried.

Also writes ``tests/fixtures/rope/hf_rope.json``: inv_freq and attention_scaling from
transformers' RoPE init functions for a list of rope-parameter dicts (see ROPE_CASES).

The steps every maker shares (seed search, folder writing, reload check) are in
tools/fixture_common.py.

Usage:  python tools/make_fixtures.py [--tokenizer res/tiny-llama/tokenizer.json] [--out tests/fixtures]
                                      [--only NAME ...]
"""

from __future__ import annotations

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fixture_common import (COMMON, ROOT, check_reload, random_model, run_cli,  # noqa: E402
                            search, summary, write_folder, write_json)

LLAMA_COMMON = {**COMMON, "pretraining_tp": 1}

FIXTURES = {
    "llama-gqa3": dict(
        seed=1000, n_new=32, dtype="float32", shard=None, v4_config=True,
        prompt="The assert statement is a convenient way to insert debugging assertions into a program.",
        config=dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                    intermediate_size=160, num_hidden_layers=3, tie_word_embeddings=False,
                    rms_norm_eps=1e-5, max_position_embeddings=256, attention_bias=False, mlp_bias=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    ),
    "llama-hd80-bf16-sharded": dict(
        seed=2000, n_new=32, dtype="bfloat16", shard="1500KB", v4_config=False,
        prompt="A function definition is an executable statement. Its execution binds the function "
               "name in the current local namespace to a function object.",
        config=dict(hidden_size=160, num_attention_heads=2, num_key_value_heads=1, head_dim=80,
                    intermediate_size=256, num_hidden_layers=2, tie_word_embeddings=True,
                    rms_norm_eps=1e-5, max_position_embeddings=256, attention_bias=False, mlp_bias=False,
                    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 32}),
    ),
    "llama-f16-yarn-bias": dict(
        seed=3000, n_new=48, dtype="float16", shard=None, v4_config=False,
        prompt="The for statement is used to iterate over the elements of a sequence (such as a string, "
               "tuple or list) or other iterable object. The expression list is evaluated once.",
        config=dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=4, head_dim=32,
                    intermediate_size=224, num_hidden_layers=2, tie_word_embeddings=False,
                    rms_norm_eps=1e-6, max_position_embeddings=256, attention_bias=True, mlp_bias=True,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 64}),
    ),
}

# (rope parameters as they appear in a config.json, head_dims to evaluate them at)
LLAMA3_SMALL = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
LLAMA31 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
ROPE_CASES = [
    ({"rope_type": "default", "rope_theta": 10000.0}, (16, 80, 128)),
    ({"rope_type": "default", "rope_theta": 500000.0}, (16, 80, 128)),
    ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, (16, 80, 128)),
    (LLAMA3_SMALL, (16, 80, 128)),
    (LLAMA31, (16, 80, 128)),
    (YARN, (16, 80, 128)),
    ({**YARN, "truncate": False}, (16, 80, 128)),
    # DeepSeek-V3's values (mscale == mscale_all_dim gives attention_scaling 1) and unequal ones.
    ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}, (16, 80, 128)),
    ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.707}, (16, 80, 128)),
    # gpt-oss (its real head_dim is 64).
    ({"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "original_max_position_embeddings": 4096,
      "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}, (16, 64, 80, 128)),
]


def build(spec: dict, seed: int):
    """A float32 LlamaForCausalLM with the fixture's random weights (rounded to spec dtype)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    return random_model(LlamaConfig, LlamaForCausalLM, spec, seed, **LLAMA_COMMON)


def v4_style_config(model) -> dict:
    """config.json as transformers 4.x wrote it for Llama: flat rope_theta, rope_scaling, torch_dtype."""
    c = model.config
    rope = c.rope_parameters
    assert rope["rope_type"] == "default", "v4-style writer only handles default RoPE"
    keys = ["attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim", "hidden_act",
            "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings", "mlp_bias",
            "model_type", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pretraining_tp",
            "rms_norm_eps"]
    out = {"architectures": ["LlamaForCausalLM"], **{k: getattr(c, k) for k in keys}}
    out.update(rope_scaling=None, rope_theta=float(rope["rope_theta"]),
               tie_word_embeddings=c.tie_word_embeddings, torch_dtype="float32",
               transformers_version=__import__("transformers").__version__, use_cache=True,
               vocab_size=c.vocab_size)
    return dict(sorted(out.items()))


def make_model_fixture(name: str, spec: dict, tokenizer_path: str, out_root: str) -> dict:
    """Write one fixture folder and return a summary dict."""
    run = search(name, spec, build, tokenizer_path)
    save_kwargs = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
    out = write_folder(name, spec, run, out_root, tokenizer_path, **save_kwargs)
    if spec["v4_config"]:
        write_json(os.path.join(out, "config.json"), v4_style_config(run.model))
    _, err = check_reload(name, out, run)
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    if spec["shard"]:
        assert len(files) == 2 and os.path.exists(os.path.join(out, "model.safetensors.index.json")), files
    return summary(name, run, out, err, vocab=run.step_logits.shape[1], weight_files=files)


def rope_entries() -> list:
    """[{"case", "head_dim", "inv_freq", "attention_scaling"}] from transformers' RoPE init functions."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    entries = []
    for case, head_dims in ROPE_CASES:
        for head_dim in head_dims:
            cfg = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, num_key_value_heads=2,
                              head_dim=head_dim, max_position_embeddings=131072, rope_parameters=dict(case))
            kind = case["rope_type"]
            fn = LlamaRotaryEmbedding.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
            inv_freq, scaling = fn(cfg)
            inv = inv_freq.numpy().astype(np.float32)
            assert inv.shape == (head_dim // 2,), (case, inv.shape)
            entries.append({"case": dict(case), "head_dim": head_dim,
                            "inv_freq": [float(x) for x in inv], "attention_scaling": float(scaling)})
    return entries


def make(name: str, args) -> dict:
    if name != "rope":
        return make_model_fixture(name, FIXTURES[name], args.tokenizer, args.out)
    os.makedirs(os.path.join(args.out, "rope"), exist_ok=True)
    entries = rope_entries()
    write_json(os.path.join(args.out, "rope", "hf_rope.json"), entries)
    return dict(name="rope", cases=len(entries))


def main(argv=None) -> int:
    return run_cli(__doc__, list(FIXTURES) + ["rope"], make, argv,
                   tokenizer=os.path.join(ROOT, "res", "tiny-llama", "tokenizer.json"))


if __name__ == "__main__":
    sys.exit(main())
