"""Make the Gemma 3 parity fixtures under tests/fixtures/ with torch + transformers.

Each folder is a Hugging Face Gemma3ForCausalLM (model_type gemma3_text) folder with small
random weights, the project tokenizer (copied from tests/fixtures/llama-gqa3) and
``expected.npz`` as tools/make_fixtures.py describes it (prompt, prompt_ids, prefill_logits,
tokens, step_logits, full_logits_last, transformers_version), computed by transformers in
float32 with eager attention. Weights N(0, 0.12^2); every Gemma RMSNorm weight w (the gain is
1 + w, q/k norms included) N(0, 0.1^2); all rounded to the fixture's dtype. A seed is kept
only if every greedy step wins by >= 5e-3, EOS never appears and the greedy tokens hold at
least MIN_DISTINCT (14) different ids.

    gemma3-swa-tied   F32, tied, hidden 32, 4 heads / 1 KV head (GQA 4), head_dim 16,
                      query_pre_attn_scalar 24, 4 layers; transformers-4 style config (no
                      layer_types, no rope_parameters): sliding_window_pattern 2 (layers 0, 2
                      slide, 1, 3 are global), sliding_window 8, rope_local_base_freq 1000,
                      rope_theta 10000 with rope_scaling linear factor 2 (global layers only);
                      prompt 30+ tokens, 56+ positions in all.
    gemma3-softcap    BF16, untied head, hidden 48, 6 heads / 2 KV (GQA 3), head_dim 16
                      (6 * 16 != 48), query_pre_attn_scalar 20, 3 layers with explicit
                      layer_types [sliding, full, sliding], sliding_window 6, nested
                      transformers-5 rope_parameters (local 1e4, global 1e6),
                      final_logit_softcapping 3.0 and attn_logit_softcapping 1.0 (which
                      transformers' Gemma 3 does not apply).

Each folder, once written, is reloaded by transformers and must reproduce the prefill logits.

Usage:  python tools/fixtures_gemma3.py [--out tests/fixtures] [--only NAME ...]
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
from make_fixtures import (MIN_MARGIN, NORM_STD, WEIGHT_STD, _torch_dtype,  # noqa: E402
                           greedy, last_logits, min_margin, write_json)

MIN_DISTINCT = 14  # greedy tokens must not settle into a short loop

TOKENIZER_DIR = os.path.join(ROOT, "tests", "fixtures", "llama-gqa3")
COMMON = dict(hidden_activation="gelu_pytorch_tanh", initializer_range=0.02, attention_dropout=0.0,
              use_cache=True, bos_token_id=4001, eos_token_id=4002, pad_token_id=0,
              vocab_size=4003, rms_norm_eps=1e-6, max_position_embeddings=512)

FIXTURES = {
    "gemma3-swa-tied": dict(
        seed=7000, n_new=28, dtype="float32", v4_config=True,
        prompt="The import statement combines two operations; it searches for the named module, "
               "then it binds the results of that search to a name in the local scope.",
        config=dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                    intermediate_size=64, num_hidden_layers=4, tie_word_embeddings=True,
                    query_pre_attn_scalar=24, sliding_window=8, sliding_window_pattern=2,
                    rope_theta=10000.0, rope_local_base_freq=1000.0,
                    rope_scaling={"rope_type": "linear", "factor": 2.0}),
    ),
    "gemma3-softcap": dict(
        seed=8000, n_new=26, dtype="bfloat16", v4_config=False,
        prompt="The while statement is used for repeated execution as long as an expression "
               "is true.",
        config=dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                    intermediate_size=96, num_hidden_layers=3, tie_word_embeddings=False,
                    query_pre_attn_scalar=20, sliding_window=6,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    rope_parameters={"sliding_attention": {"rope_type": "default",
                                                           "rope_theta": 10000.0},
                                     "full_attention": {"rope_type": "default",
                                                        "rope_theta": 1000000.0}},
                    final_logit_softcapping=3.0, attn_logit_softcapping=1.0),
    ),
}

V4_KEYS = ("rope_theta", "rope_local_base_freq", "rope_scaling", "sliding_window_pattern")
"""Keys of a transformers-4 Gemma 3 config.json that transformers 5 folds into rope_parameters
and layer_types (the v4-style writer puts them back in their place)."""


def random_model(spec: dict, seed: int):
    """A float32 Gemma3ForCausalLM with the fixture's random weights (rounded to spec dtype)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(**COMMON, **json.loads(json.dumps(spec["config"])))
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(cfg).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = NORM_STD if "norm" in name else WEIGHT_STD
            p.copy_(std * torch.randn(p.shape, generator=gen))
            p.copy_(p.to(_torch_dtype(spec["dtype"])).to(torch.float32))
    model.config._attn_implementation = "eager"
    return model


def v4_style_config(path: str, spec: dict) -> None:
    """Rewrite a saved config.json as transformers 4.5x wrote Gemma 3's: flat rope keys and
    sliding_window_pattern instead of rope_parameters and layer_types."""
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    for key in ("rope_parameters", "layer_types", "_sliding_window_pattern"):
        cfg.pop(key, None)
    cfg.update({k: spec["config"][k] for k in V4_KEYS})
    cfg["torch_dtype"] = cfg.pop("dtype", spec["dtype"])
    write_json(path, dict(sorted(cfg.items())))


def make_fixture(name: str, spec: dict, out_root: str) -> dict:
    """Write one fixture folder and return a summary dict."""
    import torch
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json"))
    prompt_ids = np.array(tok.encode(spec["prompt"]).ids, dtype=np.int64)
    eos = COMMON["eos_token_id"]
    for seed in range(spec["seed"], spec["seed"] + 300):
        model = random_model(spec, seed)
        tokens, step_logits = greedy(model, prompt_ids, spec["n_new"])
        if (min_margin(step_logits) >= MIN_MARGIN and eos not in tokens
                and len(set(tokens.tolist())) >= MIN_DISTINCT):
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
    model.to(_torch_dtype(spec["dtype"])).save_pretrained(out)
    model.to(torch.float32)
    if spec["v4_config"]:
        v4_style_config(os.path.join(out, "config.json"), spec)
    GenerationConfig(bos_token_id=COMMON["bos_token_id"], eos_token_id=eos, do_sample=False,
                     max_new_tokens=spec["n_new"]).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER_DIR, f), out)
    np.savez_compressed(
        os.path.join(out, "expected.npz"),
        prompt=np.array(spec["prompt"]), prompt_ids=prompt_ids, prefill_logits=step_logits[0],
        tokens=tokens, step_logits=step_logits, full_logits_last=full_last,
        transformers_version=np.array(transformers.__version__))

    # The folder as written (config.json included) must reproduce the logits when reloaded.
    back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                attn_implementation="eager").eval()
    assert type(back).__name__ == "Gemma3ForCausalLM", type(back).__name__
    assert back.config.layer_types == model.config.layer_types, name
    assert back.config.rope_parameters == model.config.rope_parameters, name
    err = float(np.abs(last_logits(back, prompt_ids) - step_logits[0]).max())
    assert err < 1e-5, f"{name}: reloaded folder differs by {err}"
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return dict(name=name, seed=seed, prompt_len=len(prompt_ids), n_new=len(tokens),
                layer_types=model.config.layer_types, margin=round(min_margin(step_logits), 4),
                distinct=len(set(tokens.tolist())), reload_err=err, bytes=size)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures"))
    ap.add_argument("--only", nargs="*", choices=list(FIXTURES), help="fixtures to make")
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
