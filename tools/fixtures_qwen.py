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
                      the window (the C++ applies it to every layer:
                      docs/nntrainer.md, "Qwen2 window on every layer").
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

Each folder, once written, is reloaded by transformers and must reproduce the prefill and
full-sequence logits.

Usage:  python tools/fixtures_qwen.py [--out tests/fixtures] [--only NAME ...]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import (COMMON, check_reload, random_model, run_cli, search,  # noqa: E402
                            summary, write_folder, write_json)

MIN_DISTINCT = 8  # greedy tokens must not settle into a short loop

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


def build(spec: dict, seed: int):
    """A float32 Qwen2/Qwen3 ForCausalLM with the fixture's random weights (rounded to dtype)."""
    return random_model(*hf_classes(spec["family"]), spec, seed, **COMMON)


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
    run = search(name, spec, build, min_distinct=MIN_DISTINCT)
    out = write_folder(name, spec, run, out_root)
    if spec["v4_config"]:
        write_json(os.path.join(out, "config.json"), v4_style_config(spec))
    back, err = check_reload(name, out, run)
    return summary(name, run, out, err, layer_types=list(back.config.layer_types),
                   sliding_window=back.config.sliding_window)


def main(argv=None) -> int:
    return run_cli(__doc__, FIXTURES,
                   lambda name, args: make_fixture(name, FIXTURES[name], args.out), argv)


if __name__ == "__main__":
    sys.exit(main())
