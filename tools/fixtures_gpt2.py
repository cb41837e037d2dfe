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
must reproduce the prefill and full-sequence logits.

Usage:  python tools/fixtures_gpt2.py [--only NAME ...] [--out tests/fixtures]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import (  # noqa: E402
    BIAS_STD, BOS, EOS, NORM_STD, TOKENIZER_JSON, VOCAB, WEIGHT_STD, check_reload, encode,
    random_model, run_cli, search, summary, write_folder, write_json,
)

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


def gpt2_init(name: str) -> tuple[float, float]:
    """(mean, std): LayerNorm gains 1 + N(0, 0.1^2), biases N(0, 0.1^2), the rest N(0, 0.12^2)."""
    if ".ln_" in name and name.endswith(".weight"):
        return 1.0, NORM_STD
    if name.endswith(".bias"):
        return 0.0, BIAS_STD
    return 0.0, WEIGHT_STD


def build(spec: dict, seed: int):
    """A float32 GPT2LMHeadModel with the fixture's random weights (rounded to spec dtype)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    return random_model(GPT2Config, GPT2LMHeadModel, spec, seed, gpt2_init, vocab_size=VOCAB,
                        bos_token_id=BOS, eos_token_id=EOS)


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
    n_prompt = len(encode(tokenizer_path, spec["prompt"]))
    assert n_prompt + spec["n_new"] <= spec["config"]["n_positions"], name
    run = search(name, spec, build, tokenizer_path)
    out = write_folder(name, spec, run, out_root, tokenizer_path)
    cfg = spec["config"]
    if spec["hub_style"]:
        write_json(os.path.join(out, "config.json"), hub_style_config(run.model))
        to_hub_layout(out, cfg["n_layer"], cfg["n_positions"])
    back, err = check_reload(name, out, run)
    assert type(back).__name__ == "GPT2LMHeadModel", type(back)
    return summary(name, run, out, err)


def main(argv=None) -> int:
    return run_cli(__doc__, FIXTURES,
                   lambda name, args: make_fixture(name, FIXTURES[name], args.tokenizer, args.out),
                   argv, tokenizer=TOKENIZER_JSON)


if __name__ == "__main__":
    sys.exit(main())
