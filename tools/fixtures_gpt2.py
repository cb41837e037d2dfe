"""Make the GPT-2 parity fixtures under tests/fixtures/ with torch + transformers.

Each folder is a Hugging Face GPT2LMHeadModel folder (config.json, generation_config.json,
model.safetensors, tokenizer.json, tokenizer_config.json) with small random weights and the
project tokenizer (vocab 4003, BOS 4001, EOS 4002), plus ``expected.npz`` with what
transformers computes in float32 (keys as in tools/make_fixtures.py: prompt, prompt_ids,
prefill_logits, tokens, step_logits, full_logits_last, transformers_version).

    gpt2-tied      the OpenAI checkpoint layout on the Hub: tensor names without the
                   ``transformer.`` prefix, the ``h.{i}.attn.bias`` causal-mask buffers (F32
                   tril), a config.json in the Hub's style (n_ctx, no tie_word_embeddings key, so
                   tied), gelu_new; n_embd 64, 4 heads, 2 layers, n_positions 128; BF16 weights
    gpt2-untied-scaled
                   as transformers 5 saves it (``transformer.*``), an untied lm_head,
                   scale_attn_by_inverse_layer_idx, n_inner 80, exact gelu, eps 1e-4;
                   n_embd 48, 3 heads (head_dim 16), 3 layers, n_positions 96; F16 weights

Weights ~ N(0, 0.12^2), biases N(0, 0.1^2), LayerNorm gains 1 + N(0, 0.1^2), rounded to the
stored dtype before anything is computed. A seed is kept only if every greedy step wins by at
least MIN_MARGIN and EOS never appears. The written folder is reloaded with transformers and
must reproduce the prefill logits.

Usage:  python tools/fixtures_gpt2.py [--only NAME ...] [--out tests/fixtures]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import (  # noqa: E402
    BIAS_STD, MIN_MARGIN, NORM_STD, WEIGHT_STD, _torch_dtype, greedy, last_logits, min_margin,
    write_json,
)

BOS, EOS, VOCAB = 4001, 4002, 4003

FIXTURES = {
    "gpt2-tied": dict(
        seed=4000, n_new=32, dtype="bfloat16", hub_style=True,
        prompt="The with statement is used to wrap the execution of a block with methods "
               "defined by a context manager.",
        config=dict(n_embd=64, n_head=4, n_layer=2, n_positions=128, n_inner=None,
                    activation_function="gelu_new", layer_norm_epsilon=1e-5,
                    tie_word_embeddings=True),
    ),
    "gpt2-untied-scaled": dict(
        seed=5000, n_new=32, dtype="float16", hub_style=False,
        prompt="A class definition is an executable statement. The inheritance list usually "
               "gives a list of base classes.",
        config=dict(n_embd=48, n_head=3, n_layer=3, n_positions=96, n_inner=80,
                    activation_function="gelu", layer_norm_epsilon=1e-4,
                    scale_attn_by_inverse_layer_idx=True, tie_word_embeddings=False),
    ),
}


def random_model(spec: dict, seed: int):
    """A float32 GPT2LMHeadModel with the fixture's random weights (rounded to spec dtype)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, bos_token_id=BOS, eos_token_id=EOS, **spec["config"])
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(cfg).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name and name.endswith(".weight"):
                p.copy_(1.0 + NORM_STD * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(WEIGHT_STD * torch.randn(p.shape, generator=gen))
            p.copy_(p.to(_torch_dtype(spec["dtype"])).to(torch.float32))
    model.config._attn_implementation = "eager"
    return model


def hub_style_config(model) -> dict:
    """config.json as the OpenAI GPT-2 folders on the Hub have it (n_ctx, summary_*, no
    tie_word_embeddings key: transformers' default, tied, applies)."""
    c = model.config
    return {
        "activation_function": c.activation_function, "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1, "bos_token_id": BOS, "embd_pdrop": 0.1, "eos_token_id": EOS,
        "initializer_range": 0.02, "layer_norm_epsilon": c.layer_norm_epsilon,
        "model_type": "gpt2", "n_ctx": c.n_positions, "n_embd": c.n_embd, "n_head": c.n_head,
        "n_layer": c.n_layer, "n_positions": c.n_positions, "resid_pdrop": 0.1,
        "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
        "summary_type": "cls_index", "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": c.vocab_size,
    }


def to_hub_layout(folder: str, n_layer: int, n_positions: int) -> None:
    """Rewrite model.safetensors with the OpenAI names (no ``transformer.`` prefix) and the
    ``h.{i}.attn.bias`` buffers, [1, 1, n_positions, n_positions] F32 lower triangles."""
    import torch
    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    assert all(k.startswith("transformer.") for k in tensors), sorted(tensors)
    out = {k[len("transformer."):]: v for k, v in tensors.items()}
    mask = torch.tril(torch.ones(n_positions, n_positions)).view(1, 1, n_positions, n_positions)
    for i in range(n_layer):
        out[f"h.{i}.attn.bias"] = mask.clone()
    save_file(out, path, metadata={"format": "pt"})


def make_fixture(name: str, spec: dict, tokenizer_path: str, out_root: str) -> dict:
    """Write one fixture folder and return a summary dict."""
    import torch
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = Tokenizer.from_file(tokenizer_path)
    prompt_ids = np.array(tok.encode(spec["prompt"]).ids, dtype=np.int64)
    assert len(prompt_ids) + spec["n_new"] <= spec["config"]["n_positions"], name
    for seed in range(spec["seed"], spec["seed"] + 200):
        model = random_model(spec, seed)
        tokens, step_logits = greedy(model, prompt_ids, spec["n_new"])
        if min_margin(step_logits) >= MIN_MARGIN and EOS not in tokens:
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
    cfg = spec["config"]
    if spec["hub_style"]:
        write_json(os.path.join(out, "config.json"), hub_style_config(model))
        to_hub_layout(out, cfg["n_layer"], cfg["n_positions"])
    GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, do_sample=False,
                     max_new_tokens=spec["n_new"]).save_pretrained(out)
    tok.save(os.path.join(out, "tokenizer.json"), pretty=False)
    shutil.copy(os.path.join(os.path.dirname(tokenizer_path), "tokenizer_config.json"), out)
    np.savez_compressed(
        os.path.join(out, "expected.npz"),
        prompt=np.array(spec["prompt"]), prompt_ids=prompt_ids, prefill_logits=step_logits[0],
        tokens=tokens, step_logits=step_logits, full_logits_last=full_last,
        transformers_version=np.array(transformers.__version__))

    # The folder as written must reproduce the expected logits when transformers reloads it.
    back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                attn_implementation="eager").eval()
    assert type(back).__name__ == "GPT2LMHeadModel", type(back)
    err = float(np.abs(last_logits(back, prompt_ids) - step_logits[0]).max())
    assert err < 1e-5, f"{name}: reloaded folder differs by {err}"
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return dict(name=name, seed=seed, prompt_len=len(prompt_ids), n_new=len(tokens),
                margin=round(min_margin(step_logits), 4), distinct=len(set(tokens.tolist())),
                reload_err=err, bytes=size)


def main(argv=None) -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default=os.path.join(here, "tests", "fixtures", "llama-gqa3",
                                                      "tokenizer.json"))
    ap.add_argument("--out", default=os.path.join(here, "tests", "fixtures"))
    ap.add_argument("--only", nargs="*", help="fixture names to make (default: all)")
    args = ap.parse_args(argv)

    import torch
    import transformers
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    for name in args.only or list(FIXTURES):
        print(json.dumps(make_fixture(name, FIXTURES[name], args.tokenizer, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
