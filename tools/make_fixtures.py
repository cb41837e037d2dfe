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

Usage:  python tools/make_fixtures.py [--tokenizer res/tiny-llama/tokenizer.json] [--out tests/fixtures]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import numpy as np

MIN_MARGIN = 5e-3
WEIGHT_STD = 0.12
BIAS_STD = 0.1
NORM_STD = 0.1

COMMON = dict(hidden_act="silu", initializer_range=0.02, attention_dropout=0.0, pretraining_tp=1,
              use_cache=True, bos_token_id=4001, eos_token_id=4002, vocab_size=4003)

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


def _torch_dtype(name: str):
    import torch
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def random_model(spec: dict, seed: int):
    """Build a float32 LlamaForCausalLM with the fixture's random weights (rounded to spec dtype)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**COMMON, **{**spec["config"], "rope_parameters": dict(spec["config"]["rope_parameters"])})
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + NORM_STD * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(WEIGHT_STD * torch.randn(p.shape, generator=gen))
            p.copy_(p.to(_torch_dtype(spec["dtype"])).to(torch.float32))
    model.config._attn_implementation = "eager"
    return model


def greedy(model, prompt_ids: np.ndarray, n_new: int):
    """Greedy decode n_new tokens with the KV cache; return (tokens (N,), step_logits (N, V))."""
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(prompt_ids)[None], use_cache=True)
        logits, cache = out.logits[0, -1], out.past_key_values
        tokens, steps = [], []
        for _ in range(n_new):
            tok = int(torch.argmax(logits))
            tokens.append(tok)
            steps.append(logits.numpy().astype(np.float32))
            out = model(torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
            logits, cache = out.logits[0, -1], out.past_key_values
    return np.array(tokens, dtype=np.int64), np.stack(steps)


def last_logits(model, ids: np.ndarray) -> np.ndarray:
    """No-cache forward over ids (L,); return float32 logits (V,) of the last position."""
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(ids)[None], use_cache=False).logits[0, -1].numpy().astype(np.float32)


def min_margin(step_logits: np.ndarray) -> float:
    """Smallest (top1 - top2) logit gap over the greedy steps."""
    top2 = np.sort(step_logits, axis=1)[:, -2:]
    return float((top2[:, 1] - top2[:, 0]).min())


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


def write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def make_model_fixture(name: str, spec: dict, tokenizer_path: str, out_root: str) -> dict:
    """Write one fixture folder and return a summary dict."""
    import torch
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = Tokenizer.from_file(tokenizer_path)
    prompt_ids = np.array(tok.encode(spec["prompt"]).ids, dtype=np.int64)
    eos = COMMON["eos_token_id"]
    seed = spec["seed"]
    for seed in range(spec["seed"], spec["seed"] + 200):
        model = random_model(spec, seed)
        tokens, step_logits = greedy(model, prompt_ids, spec["n_new"])
        if min_margin(step_logits) >= MIN_MARGIN and eos not in tokens:
            break
    else:
        raise SystemExit(f"{name}: no seed gave a greedy margin >= {MIN_MARGIN}")
    prefill = last_logits(model, prompt_ids)
    full_last = last_logits(model, np.concatenate([prompt_ids, tokens[:-1]]))
    assert np.allclose(prefill, step_logits[0], atol=1e-5), name
    assert np.allclose(full_last, step_logits[-1], atol=1e-4), name

    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    save_kwargs = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
    model.to(_torch_dtype(spec["dtype"])).save_pretrained(out, **save_kwargs)
    model.to(torch.float32)
    if spec["v4_config"]:
        write_json(os.path.join(out, "config.json"), v4_style_config(model))
    GenerationConfig(bos_token_id=COMMON["bos_token_id"], eos_token_id=eos, do_sample=False,
                     max_new_tokens=spec["n_new"]).save_pretrained(out)
    tok.save(os.path.join(out, "tokenizer.json"), pretty=False)
    shutil.copy(os.path.join(os.path.dirname(tokenizer_path), "tokenizer_config.json"), out)
    np.savez_compressed(
        os.path.join(out, "expected.npz"),
        prompt=np.array(spec["prompt"]), prompt_ids=prompt_ids, prefill_logits=step_logits[0],
        tokens=tokens, step_logits=step_logits, full_logits_last=full_last,
        transformers_version=np.array(transformers.__version__))

    # The folder as written must reproduce the expected logits when transformers reloads it.
    back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    err = float(np.abs(last_logits(back, prompt_ids) - step_logits[0]).max())
    assert err < 1e-5, f"{name}: reloaded folder differs by {err}"
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    if spec["shard"]:
        assert len(files) == 2 and os.path.exists(os.path.join(out, "model.safetensors.index.json")), files
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return dict(name=name, seed=seed, prompt_len=len(prompt_ids), n_new=len(tokens),
                vocab=step_logits.shape[1], margin=round(min_margin(step_logits), 4),
                distinct=len(set(tokens.tolist())), reload_err=err, weight_files=files, bytes=size)


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


def main(argv=None) -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default=os.path.join(here, "res", "tiny-llama", "tokenizer.json"))
    ap.add_argument("--out", default=os.path.join(here, "tests", "fixtures"))
    ap.add_argument("--only", nargs="*", help="fixture names to make (default: all, plus rope)")
    args = ap.parse_args(argv)

    import torch
    import transformers
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    names = args.only if args.only else list(FIXTURES) + ["rope"]
    for name in names:
        if name == "rope":
            os.makedirs(os.path.join(args.out, "rope"), exist_ok=True)
            entries = rope_entries()
            write_json(os.path.join(args.out, "rope", "hf_rope.json"), entries)
            print(f"rope: {len(entries)} cases")
        else:
            print(json.dumps(make_model_fixture(name, FIXTURES[name], args.tokenizer, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
