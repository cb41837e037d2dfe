"""Make the Qwen3-MoE parity fixtures under tests/fixtures/ with torch + transformers.

Each folder is a Hugging Face Qwen3MoeForCausalLM folder with small random weights, the
project tokenizer (copied from tests/fixtures/llama-gqa3) and ``expected.npz`` as
tools/make_fixtures.py describes it (prompt, prompt_ids, prefill_logits, tokens, step_logits,
full_logits_last, transformers_version), computed by transformers in float32 with eager
attention. Weights: N(0, 0.12^2) (router and experts included), RMSNorm gains (q/k norms
included) 1 + N(0, 0.1^2), rounded to the fixture's dtype. A seed is kept only if every greedy
step wins by >= 5e-3, EOS never appears, the greedy tokens hold at least MIN_DISTINCT ids, and
every expert of every MoE layer is chosen by some token of the run.

    qwen3moe-e8k2-dense   BF16, untied, 8 experts, top-2, norm_topk_prob true, 3 layers with
                          mlp_only_layers [1] (layer 1 is a dense SwiGLU MLP of width 96),
                          4 heads / 1 KV head (GQA 4), head_dim 16; the Hub's per-expert
                          tensors (``mlp.experts.{e}.{gate,up,down}_proj.weight``) and a
                          Hub-style config (``num_experts``, flat ``rope_theta``).
    qwen3moe-e8k3-fused   F32, tied, 8 experts, top-3, norm_topk_prob false, 4 layers with
                          decoder_sparse_step 2 (layers 1 and 3 are MoE, 0 and 2 dense),
                          6 heads / 2 KV heads (GQA 3), head_dim 8; use_sliding_window with
                          sliding_window 8 (every layer slides; prompt + generation >> 8);
                          transformers 5's fused tensors (``mlp.experts.gate_up_proj``
                          [E, 2I, H], ``mlp.experts.down_proj`` [E, H, I]) and its config
                          (``num_local_experts``).

Each folder, once written, is reloaded by transformers and must reproduce the logits; the
fused folder's tensors are checked against the per-expert format of the same model.

Usage:  python tools/fixtures_qwen3_moe.py [--out tests/fixtures] [--only NAME ...]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from fixture_common import (  # noqa: E402
    COMMON,
    check_reload,
    random_model,
    run_cli,
    search,
    summary,
    write_folder,
    write_json,
)

MIN_DISTINCT = 8  # greedy tokens must not settle into a short loop

FIXTURES = {
    "qwen3moe-e8k2-dense": dict(
        seed=8000, n_new=26, dtype="bfloat16", fused=False, hub_config=True,
        prompt="A generator function returns an iterator; each yield expression suspends the "
               "function and hands a value to the caller.",
        config=dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                    intermediate_size=96, moe_intermediate_size=48, num_experts=8,
                    num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                    mlp_only_layers=[1], num_hidden_layers=3, tie_word_embeddings=False,
                    rms_norm_eps=1e-6, max_position_embeddings=256, attention_bias=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    ),
    "qwen3moe-e8k3-fused": dict(
        seed=9000, n_new=26, dtype="float32", fused=True, hub_config=False,
        prompt="The while statement is used for repeated execution as long as an expression "
               "is true; a break statement ends the loop.",
        config=dict(hidden_size=24, num_attention_heads=6, num_key_value_heads=2, head_dim=8,
                    intermediate_size=64, moe_intermediate_size=40, num_experts=8,
                    num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2,
                    mlp_only_layers=[], num_hidden_layers=4, tie_word_embeddings=True,
                    rms_norm_eps=1e-6, max_position_embeddings=256, attention_bias=False,
                    use_sliding_window=True, sliding_window=8,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    ),
}


def build(spec: dict, seed: int):
    """A float32 Qwen3MoeForCausalLM with the fixture's random weights (rounded to dtype)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    return random_model(Qwen3MoeConfig, Qwen3MoeForCausalLM, spec, seed, **COMMON)


def experts_used(model, ids: np.ndarray) -> list[set]:
    """The experts each MoE layer routes some token of ``ids`` to (no-cache forward)."""
    import torch
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    used, hooks = [], []
    for module in model.modules():
        if isinstance(module, Qwen3MoeTopKRouter):
            used.append(set())
            hooks.append(module.register_forward_hook(
                lambda m, args, out, s=used[-1]: s.update(out[2].flatten().tolist())))
    with torch.no_grad():
        model(torch.from_numpy(ids)[None], use_cache=False)
    for h in hooks:
        h.remove()
    return used


def hub_style_config(path: str, spec: dict) -> None:
    """Rewrite config.json as the Hub's Qwen3-MoE configs read (transformers 4.x): ``num_experts``
    instead of ``num_local_experts``, flat ``rope_theta`` / ``rope_scaling``."""
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["num_experts"] = cfg.pop("num_local_experts")
    rope = cfg.pop("rope_parameters")
    assert rope["rope_type"] == "default"
    cfg.update(rope_theta=float(rope["rope_theta"]), rope_scaling=None, torch_dtype=spec["dtype"])
    write_json(path, dict(sorted(cfg.items())))


def check_fused_layout(model, out: str, spec: dict) -> None:
    """The fused folder's gate_up_proj[e] is [gate_e; up_e] and down_proj[e] is down_e, as the
    per-expert (Hub) save of the same model has them."""
    from causallm.io.safetensors import Checkpoint

    fused = Checkpoint(out)
    I = spec["config"]["moe_intermediate_size"]
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        hub = Checkpoint(tmp)
        n = 0
        for name in fused.keys():
            if not name.endswith(".mlp.experts.gate_up_proj"):
                continue
            prefix = name[: -len("gate_up_proj")]
            gate_up, down = fused.get(name), fused.get(prefix + "down_proj")
            for e in range(gate_up.shape[0]):
                assert np.array_equal(gate_up[e, :I], hub.get(f"{prefix}{e}.gate_proj.weight"))
                assert np.array_equal(gate_up[e, I:], hub.get(f"{prefix}{e}.up_proj.weight"))
                assert np.array_equal(down[e], hub.get(f"{prefix}{e}.down_proj.weight"))
                n += 1
        assert n, "no fused expert tensors found"


def every_expert_used(model, prompt_ids: np.ndarray, tokens: np.ndarray) -> bool:
    used = experts_used(model, np.concatenate([prompt_ids, tokens]))
    return all(len(u) == model.config.num_experts for u in used)


def make_fixture(name: str, spec: dict, out_root: str) -> dict:
    """Write one fixture folder and return a summary dict."""
    run = search(name, spec, build, min_distinct=MIN_DISTINCT, accept=every_expert_used)
    out = write_folder(name, spec, run, out_root, save_original_format=not spec["fused"])
    if spec["hub_config"]:
        hub_style_config(os.path.join(out, "config.json"), spec)
    if spec["fused"]:
        check_fused_layout(run.model, out, spec)
    back, err = check_reload(name, out, run)
    used = experts_used(run.model, np.concatenate([run.prompt_ids, run.tokens]))
    return summary(name, run, out, err, sliding_window=back.config.sliding_window,
                   mlp_only_layers=back.config.mlp_only_layers,
                   experts_used=[len(u) for u in used],
                   weight_files=sorted(f for f in os.listdir(out) if f.endswith(".safetensors")))


def main(argv=None) -> int:
    return run_cli(__doc__, FIXTURES,
                   lambda name, args: make_fixture(name, FIXTURES[name], args.out), argv)


if __name__ == "__main__":
    sys.exit(main())
