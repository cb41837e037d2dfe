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

Usage:  python tools/fixtures_gpt_oss.py [--out tests/fixtures] [--only NAME ...]
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import (BIAS_STD, COMMON, NORM_STD, WEIGHT_STD, check_reload,  # noqa: E402
                            random_model, run_cli, search, summary, write_folder)

MIN_DISTINCT = 8
SINK_STD, ROUTER_STD, GATE_UP_STD = 1.0, 0.3, 0.6

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


def gpt_oss_init(name: str) -> tuple[float, float]:
    """(mean, std) of parameter ``name``: RMSNorm gains 1 + N(0, 0.1^2), sinks N(0, 1), router
    N(0, 0.3^2), expert gate_up_proj N(0, 0.6^2), biases N(0, 0.1^2), the rest N(0, 0.12^2)."""
    if name.endswith("norm.weight"):
        return 1.0, NORM_STD
    if name.endswith("sinks"):
        return 0.0, SINK_STD
    if name.endswith("router.weight"):
        return 0.0, ROUTER_STD
    if name.endswith("gate_up_proj"):
        return 0.0, GATE_UP_STD
    if name.endswith(("bias", "_bias")):
        return 0.0, BIAS_STD
    return 0.0, WEIGHT_STD


def build(spec: dict, seed: int):
    """A float32 GptOssForCausalLM with the fixture's random weights (rounded to the dtype),
    eager attention and the eager experts loop."""
    from transformers import GptOssConfig, GptOssForCausalLM

    model = random_model(GptOssConfig, GptOssForCausalLM, spec, seed, gpt_oss_init, **COMMON)
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


def clamps_active(model, prompt_ids: np.ndarray, tokens: np.ndarray) -> bool:
    return min(clamp_fractions(model, np.concatenate([prompt_ids, tokens[:-1]]))) > 0


def make_fixture(name: str, spec: dict, out_root: str) -> dict:
    """Write one fixture folder and return a summary dict."""
    run = search(name, spec, build, min_distinct=MIN_DISTINCT, accept=clamps_active)
    out = write_folder(name, spec, run, out_root)
    # The folder as written, reloaded with transformers' default (grouped) experts, must give
    # the same logits as the eager loop that made them.
    back, err = check_reload(name, out, run, tol=1e-4)
    with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
        written = json.load(f)
    clamps = clamp_fractions(run.model, run.seq)
    return summary(name, run, out, err, layer_types=written["layer_types"],
                   sliding_window=written["sliding_window"],
                   experts_implementation=back.config._experts_implementation,
                   clamped_gate=round(clamps[0], 4), clamped_up=round(clamps[1], 4))


def main(argv=None) -> int:
    return run_cli(__doc__, FIXTURES,
                   lambda name, args: make_fixture(name, FIXTURES[name], args.out), argv)


if __name__ == "__main__":
    sys.exit(main())
