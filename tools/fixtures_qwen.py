"""Make the Qwen2 / Qwen3 parity fixtures under tests/fixtures/ with torch + transformers.

Each folder is a Hugging Face Qwen2ForCausalLM / Qwen3ForCausalLM folder with small random
weights, the project tokenizer (copied from tests/fixtures/llama-gqa3) and ``expected.npz``
as tools/make_fixtures.py describes it (prompt, prompt_ids, prefill_logits, tokens,
step_logits, full_logits_last, transformers_version), computed by transformers in float32
with eager attention. Weights: N(0, 0.12^2), biases N(0, 0.1^2), RMSNorm gains (q/k norms
included) 1 + N(0, 0.1^2), rounded to the fixture's dtype. A seed is kept only if every
greedy step wins by >= 5e-3, EOS never appears and the greedy tokens hold at least
MIN_DISTINCT different ids.

    qwen2-gqa4        BF16, untied, q/k/v biases, 8 heads / 2 KV heads (GQA 4), head_dim 6;
                      transformers-4 style config with use_sliding_window false but
                      sliding_window 4 < prompt and max_window_layers 0: transformers ignores
                      the window (the C++ applies it to every layer, spec G13).
    qwen2-swa8        BF16, tied, 6 heads / 2 KV (GQA 3), head_dim 8, 3 layers; use_sliding_window true,
                      sliding_window 8, max_window_layers 1 (layers 1, 2 slide, layer 0 does
                      not); transformers-4 style config (no layer_types), so the layer types
                      come from max_window_layers; prompt + generation >> 8.
    qwen3-hd80        BF16, tied, hidden 48, 3 heads / 1 KV head (GQA 3), head_dim 80
                      (3 * 80 != 48), no biases, transformers-5 config.
    qwen3-swa6-bias   F32, tied, attention_bias true (q/k/v/o), 4 heads / 2 KV, head_dim 16
                      (!= 32 / 4), sliding_window 6 with explicit non-monotonic
                      layer_types [sliding, full, sliding] (they override max_window_layers),
                      theta 1e6, transformers-5 config.

Each folder, once written, is reloaded by transformers and must reproduce the prefill logits.

Usage:  python tools/fixtures_qwen.py [--out tests/fixtures] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from make_fixtures import (BIAS_STD, MIN_MARGIN, NORM_STD, WEIGHT_STD, _torch_dtype,  # noqa: E402
                           greedy, last_logits, min_margin, write_json)

MIN_DISTINCT = 8  # greedy tokens must not settle into a short loop

TOKENIZER_DIR = os.path.join(ROOT, "tests", "fixtures", "llama-gqa3")
COMMON = dict(hidden_act="silu", initializer_range=0.02, attention_dropout=0.0, use_cache=True,
              bos_token_id=4001, eos_token_id=4002, vocab_size=4003)

FIXTURES = {
    "qwen2-gqa4": dict(
        family="qwen2", seed=4000, n_new=26, dtype="bfloat16", v4_config=True,
        prompt="The with statement is used to wrap the execution of a block with methods "
               "defined by a context manager.",
        config=dict(hidden_size=48, num_attention_heads=8, num_key_value_heads=2,
                    intermediate_size=96, num_hidden_layers=2, tie_word_embeddings=False,
                    rms_norm_eps=1e-6, max_position_embeddings=256, use_sliding_window=False,
                    sliding_window=4, max_window_layers=0,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    ),
    "qwen2-swa8": dict(
        family="qwen2", seed=5000, n_new=28, dtype="bfloat16", v4_config=True,
        prompt="A class definition is an executable statement. The inheritance list usually "
               "gives a list of base classes.",
        config=dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
                    intermediate_size=96, num_hidden_layers=3, tie_word_embeddings=True,
                    rms_norm_eps=1e-6, max_position_embeddings=256, use_sliding_window=True,
                    sliding_window=8, max_window_layers=1,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    ),
    "qwen3-hd80": dict(
        family="qwen3", seed=6000, n_new=26, dtype="bfloat16", v4_config=False,
        prompt="Exceptions are raised by the raise statement and handled by the try statement "
               "with its except clauses.",
        config=dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=1, head_dim=80,
                    intermediate_size=96, num_hidden_layers=2, tie_word_embeddings=True,
                    rms_norm_eps=1e-6, max_position_embeddings=256, attention_bias=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    ),
    "qwen3-swa6-bias": dict(
        family="qwen3", seed=7000, n_new=26, dtype="float32", v4_config=False,
        prompt="The import statement finds a module, loads and initializes it if necessary, "
               "and defines a name in the local namespace.",
        config=dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=64, num_hidden_layers=3, tie_word_embeddings=True,
                    rms_norm_eps=1e-6, max_position_embeddings=256, attention_bias=True,
                    use_sliding_window=True, sliding_window=6, max_window_layers=1,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    ),
}


def hf_classes(family: str):
    import transformers
    if family == "qwen2":
        return transformers.Qwen2Config, transformers.Qwen2ForCausalLM
    return transformers.Qwen3Config, transformers.Qwen3ForCausalLM


def random_model(spec: dict, seed: int):
    """A float32 Qwen2/Qwen3 ForCausalLM with the fixture's random weights (rounded to dtype)."""
    import torch

    config_cls, model_cls = hf_classes(spec["family"])
    c = {**spec["config"], "rope_parameters": dict(spec["config"]["rope_parameters"])}
    if "layer_types" in c:
        c["layer_types"] = list(c["layer_types"])
    cfg = config_cls(**COMMON, **c)
    torch.manual_seed(seed)
    model = model_cls(cfg).to(torch.float32).eval()
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


def v4_style_config(spec: dict) -> dict:
    """config.json as transformers 4.x wrote it for Qwen2 (flat rope_theta, rope_scaling null,
    sliding_window kept even when use_sliding_window is false, max_window_layers, no
    layer_types, torch_dtype)."""
    import transformers
    c = spec["config"]
    rope = c["rope_parameters"]
    assert rope["rope_type"] == "default" and "layer_types" not in c
    out = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **COMMON,
           **{k: v for k, v in c.items() if k != "rope_parameters"},
           "rope_scaling": None, "rope_theta": float(rope["rope_theta"]),
           "torch_dtype": spec["dtype"], "transformers_version": transformers.__version__}
    return dict(sorted(out.items()))


def make_fixture(name: str, spec: dict, out_root: str) -> dict:
    """Write one fixture folder and return a summary dict."""
    import torch
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json"))
    prompt_ids = np.array(tok.encode(spec["prompt"]).ids, dtype=np.int64)
    eos = COMMON["eos_token_id"]
    for seed in range(spec["seed"], spec["seed"] + 200):
        model = random_model(spec, seed)
        tokens, step_logits = greedy(model, prompt_ids, spec["n_new"])
        if (min_margin(step_logits) >= MIN_MARGIN and eos not in tokens
                and len(set(tokens.tolist())) >= MIN_DISTINCT):
            break
    else:
        raise SystemExit(f"{name}: no seed gave a greedy margin >= {MIN_MARGIN} and "
                         f"{MIN_DISTINCT} distinct tokens")
    prefill = last_logits(model, prompt_ids)
    full_last = last_logits(model, np.concatenate([prompt_ids, tokens[:-1]]))
    assert np.allclose(prefill, step_logits[0], atol=1e-5), name
    assert np.allclose(full_last, step_logits[-1], atol=1e-4), name

    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    model.to(_torch_dtype(spec["dtype"])).save_pretrained(out)
    model.to(torch.float32)
    if spec["v4_config"]:
        write_json(os.path.join(out, "config.json"), v4_style_config(spec))
    GenerationConfig(bos_token_id=COMMON["bos_token_id"], eos_token_id=eos, do_sample=False,
                     max_new_tokens=spec["n_new"]).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER_DIR, f), out)
    np.savez_compressed(
        os.path.join(out, "expected.npz"),
        prompt=np.array(spec["prompt"]), prompt_ids=prompt_ids, prefill_logits=step_logits[0],
        tokens=tokens, step_logits=step_logits, full_logits_last=full_last,
        transformers_version=np.array(transformers.__version__))

    # The folder as written must reproduce the expected logits when transformers reloads it.
    back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                attn_implementation="eager").eval()
    err = float(np.abs(last_logits(back, prompt_ids) - step_logits[0]).max())
    assert err < 1e-5, f"{name}: reloaded folder differs by {err}"
    err_full = float(np.abs(last_logits(back, np.concatenate([prompt_ids, tokens[:-1]]))
                            - full_last).max())
    assert err_full < 1e-5, f"{name}: reloaded folder differs by {err_full} over the full sequence"
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return dict(name=name, seed=seed, prompt_len=len(prompt_ids), n_new=len(tokens),
                layer_types=list(back.config.layer_types), sliding_window=back.config.sliding_window,
                margin=round(min_margin(step_logits), 4), distinct=len(set(tokens.tolist())),
                reload_err=err, bytes=size)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures"))
    ap.add_argument("--only", nargs="*", help="fixture names to make (default: all)")
    args = ap.parse_args(argv)

    import torch
    import transformers
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    for name in args.only or list(FIXTURES):
        print(json.dumps(make_fixture(name, FIXTURES[name], args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
