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

Each folder, once written, is reloaded by transformers and must reproduce the prefill and
full-sequence logits.

Usage:  python tools/fixtures_gemma3.py [--out tests/fixtures] [--only NAME ...]
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import (BOS, EOS, NORM_STD, VOCAB, WEIGHT_STD, check_reload,  # noqa: E402
                            random_model, run_cli, search, summary, write_folder, write_json)

MIN_DISTINCT = 14  # greedy tokens must not settle into a short loop

COMMON = dict(hidden_activation="gelu_pytorch_tanh", initializer_range=0.02, attention_dropout=0.0,
              use_cache=True, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0,
              vocab_size=VOCAB, rms_norm_eps=1e-6, max_position_embeddings=512)

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


def gemma_init(name: str) -> tuple[float, float]:
    """(mean, std): Gemma's RMSNorm weights w (the gain is 1 + w) N(0, 0.1^2), the rest
    N(0, 0.12^2)."""
    return 0.0, (NORM_STD if "norm" in name else WEIGHT_STD)


def build(spec: dict, seed: int):
    """A float32 Gemma3ForCausalLM with the fixture's random weights (rounded to spec dtype)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    return random_model(Gemma3TextConfig, Gemma3ForCausalLM, spec, seed, gemma_init, **COMMON)


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
    run = search(name, spec, build, min_distinct=MIN_DISTINCT, tries=300)
    out = write_folder(name, spec, run, out_root)
    if spec["v4_config"]:
        v4_style_config(os.path.join(out, "config.json"), spec)
    # The folder as written (config.json included) must reproduce the logits when reloaded.
    back, err = check_reload(name, out, run)
    assert type(back).__name__ == "Gemma3ForCausalLM", type(back).__name__
    assert back.config.layer_types == run.model.config.layer_types, name
    assert back.config.rope_parameters == run.model.config.rope_parameters, name
    return summary(name, run, out, err, layer_types=run.model.config.layer_types)


def main(argv=None) -> int:
    return run_cli(__doc__, FIXTURES,
                   lambda name, args: make_fixture(name, FIXTURES[name], args.out), argv)


if __name__ == "__main__":
    sys.exit(main())
