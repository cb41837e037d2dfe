"""Make the GPT-OSS parity fixture under tests/fixtures/ with torch + transformers.

The folder is a Hugging Face GptOssForCausalLM folder with small random weights, the project
tokenizer (copied from tests/fixtures/llama-gqa3) and ``expected.npz`` as tools/make_fixtures.py
describes it (prompt, prompt_ids, prefill_logits, tokens, step_logits, full_logits_last,
transformers_version), computed by transformers in float32 with eager attention and the eager
experts loop (``GptOssExperts.forward``, the reference the grouped kernels must equal).

    gpt-oss-tiny   BF16, untied, hidden 64, 6 heads / 2 KV heads (GQA 3), head_dim 16
                   (6 * 16 != 64), q/k/v/o biases, attention sinks, 3 layers with
                   transformers' default layer_types (sliding, full, sliding), sliding_window 8
                   (prompt alone is 4x longer), yarn RoPE (theta 150000, factor 4, original 16,
                   beta 32 / 1, truncate false: every position past 16 is scaled), 4 experts,
                   top-2, intermediate 48 (!= hidden), swiglu_limit 7 with expert weights
                   large enough that the clamps bite (the fractions are printed).

Weights: N(0, 0.12^2) for attention, embedding and head; biases N(0, 0.1^2); RMSNorm gains
1 + N(0, 0.1^2); sinks N(0, 1); router N(0, 0.3^2); expert gate_up_proj N(0, 0.6^2), down_proj
N(0, 0.12^2); all rounded to BF16. A seed is kept only if every greedy step wins by >= 5e-3,
EOS never appears, the greedy tokens hold at least MIN_DISTINCT different ids and both clamps
are active on some entries. The written folder is reloaded by transformers (with its default
experts implementation) and must reproduce the expected logits.

Usage:  python tools/fixtures_gpt_oss.py [--out tests/fixtures]
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
                           greedy, last_logits, min_margin)

MIN_DISTINCT = 8
SINK_STD, ROUTER_STD, GATE_UP_STD = 1.0, 0.3, 0.6

TOKENIZER_DIR = os.path.join(ROOT, "tests", "fixtures", "llama-gqa3")
COMMON = dict(hidden_act="silu", initializer_range=0.02, attention_dropout=0.0, use_cache=True,
              bos_token_id=4001, eos_token_id=4002, vocab_size=4003)

FIXTURES = {
    "gpt-oss-tiny": dict(
        seed=8000, n_new=28, dtype="bfloat16",
        prompt="The while statement is used for repeated execution as long as an expression is "
               "true. It repeatedly tests the expression and, if it is true, executes the first "
               "suite.",
        config=dict(hidden_size=64, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                    intermediate_size=48, num_hidden_layers=3, num_local_experts=4,
                    num_experts_per_tok=2, tie_word_embeddings=False, rms_norm_eps=1e-5,
                    max_position_embeddings=256, sliding_window=8, attention_bias=True,
                    swiglu_limit=7.0,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                     "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                     "original_max_position_embeddings": 16}),
    ),
}


def random_model(spec: dict, seed: int):
    """A float32 GptOssForCausalLM with the fixture's random weights (rounded to the dtype),
    eager attention and the eager experts loop."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    c = {**spec["config"], "rope_parameters": dict(spec["config"]["rope_parameters"])}
    cfg = GptOssConfig(**COMMON, **c)
    torch.manual_seed(seed)
    model = GptOssForCausalLM(cfg).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                std, mean = NORM_STD, 1.0
            elif name.endswith("sinks"):
                std, mean = SINK_STD, 0.0
            elif name.endswith("router.weight"):
                std, mean = ROUTER_STD, 0.0
            elif name.endswith("gate_up_proj"):
                std, mean = GATE_UP_STD, 0.0
            elif name.endswith(("bias", "_bias")):
                std, mean = BIAS_STD, 0.0
            else:
                std, mean = WEIGHT_STD, 0.0
            p.copy_(mean + std * torch.randn(p.shape, generator=gen))
            p.copy_(p.to(_torch_dtype(spec["dtype"])).to(torch.float32))
    model.config._attn_implementation = "eager"
    model.config._experts_implementation = "eager"
    return model


def clamp_fractions(model, ids: np.ndarray) -> tuple[float, float]:
    """Fractions of expert gate entries above the limit and of up entries outside +-limit,
    over a no-cache forward of ids."""
    import torch
    from transformers.models.gpt_oss import modeling_gpt_oss as m

    seen = {"gate": 0, "up": 0, "n": 0}
    original = m.GptOssExperts._apply_gate

    def counting(self, gate_up):
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        seen["gate"] += int((gate > self.limit).sum())
        seen["up"] += int((up.abs() > self.limit).sum())
        seen["n"] += gate.numel()
        return original(self, gate_up)

    m.GptOssExperts._apply_gate = counting
    try:
        with torch.no_grad():
            model(torch.from_numpy(ids)[None], use_cache=False)
    finally:
        m.GptOssExperts._apply_gate = original
    return seen["gate"] / seen["n"], seen["up"] / seen["n"]


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
            clamps = clamp_fractions(model, np.concatenate([prompt_ids, tokens[:-1]]))
            if min(clamps) > 0:
                break
    else:
        raise SystemExit(f"{name}: no seed gave a greedy margin >= {MIN_MARGIN}, "
                         f"{MIN_DISTINCT} distinct tokens and active clamps")
    prefill = last_logits(model, prompt_ids)
    full_last = last_logits(model, np.concatenate([prompt_ids, tokens[:-1]]))
    assert np.allclose(prefill, step_logits[0], atol=1e-5), name
    assert np.allclose(full_last, step_logits[-1], atol=1e-4), name

    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    model.to(_torch_dtype(spec["dtype"])).save_pretrained(out)
    model.to(torch.float32)
    GenerationConfig(bos_token_id=COMMON["bos_token_id"], eos_token_id=eos, do_sample=False,
                     max_new_tokens=spec["n_new"]).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER_DIR, f), out)
    np.savez_compressed(
        os.path.join(out, "expected.npz"),
        prompt=np.array(spec["prompt"]), prompt_ids=prompt_ids, prefill_logits=step_logits[0],
        tokens=tokens, step_logits=step_logits, full_logits_last=full_last,
        transformers_version=np.array(transformers.__version__))

    # The folder as written, reloaded with transformers' default (grouped) experts, must give
    # the same logits as the eager loop that made them.
    back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                attn_implementation="eager").eval()
    seq = np.concatenate([prompt_ids, tokens[:-1]])
    err = float(np.abs(last_logits(back, prompt_ids) - step_logits[0]).max())
    err_full = float(np.abs(last_logits(back, seq) - full_last).max())
    assert max(err, err_full) < 1e-4, f"{name}: reloaded folder differs by {err}, {err_full}"
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        written = json.load(f)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return dict(name=name, seed=seed, prompt_len=len(prompt_ids), n_new=len(tokens),
                layer_types=written["layer_types"], sliding_window=written["sliding_window"],
                experts_implementation=back.config._experts_implementation,
                clamped_gate=round(clamps[0], 4), clamped_up=round(clamps[1], 4),
                margin=round(min_margin(step_logits), 4), distinct=len(set(tokens.tolist())),
                reload_err=max(err, err_full), bytes=size)


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
