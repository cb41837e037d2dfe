"""Make the GPT-OSS MXFP4 fixture (tests/fixtures/gpt-oss-mxfp4) with torch + transformers.

The folder is laid out as openai/gpt-oss-20b is: every expert projection stored as MXFP4
(``mlp.experts.gate_up_proj_blocks`` [E, 2I, H/32, 16] and ``_scales`` [E, 2I, H/32],
``down_proj_blocks`` [E, H, I/32, 16] and ``_scales`` [E, H, I/32], uint8; layout in
causallm/io/mxfp4.py), everything else BF16, and config.json's ``quantization_config``
``{"quant_method": "mxfp4", "modules_to_not_convert": [...]}``.

    gpt-oss-mxfp4  tools/fixtures_gpt_oss.py's gpt-oss-tiny (hidden 64, GQA 3, head_dim 16,
                   sinks, biases, sliding 8 / full / sliding 8, yarn, 4 experts top-2, active
                   clamps) with intermediate_size 64: MXFP4 groups 32 values, so I and H must
                   be multiples of 32.

Each seed's random model (fixtures_gpt_oss.build) has its experts quantized by
:func:`quantize_mxfp4` (numpy: per 32 consecutive inputs of an output row, the E8M0 scale
2^ceil(log2(amax / 6)) and each value rounded to the nearest e2m1 value, ties to the even
code) and replaced by transformers' own dequantization of those bytes
(``transformers.integrations.mxfp4.convert_moe_packed_tensors``, float32); expected.npz is what
that float32 model computes (eager attention, eager experts). The maker checks that
causallm.io.mxfp4 dequantizes the bytes bit for bit as transformers does, and that
transformers, loading the written folder (``Mxfp4Config(dequantize=True)``: on CPU it
dequantizes), gets the same expert weights and logits.

Usage:  python tools/fixtures_gpt_oss_mxfp4.py [--out tests/fixtures]
"""

from __future__ import annotations

import copy
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from fixture_common import (check_reload, load_reference, run_cli, search, summary,  # noqa: E402
                            write_folder, write_json)
from fixtures_gpt_oss import FIXTURES as GPT_OSS_FIXTURES  # noqa: E402
from fixtures_gpt_oss import MIN_DISTINCT, build, clamp_fractions, clamps_active  # noqa: E402

from causallm.io.mxfp4 import FP4_VALUES, convert_moe_packed_tensors  # noqa: E402
from causallm.io.safetensors import SafetensorsFile, write_safetensors  # noqa: E402

QUANTIZED = ("gate_up_proj", "down_proj")  # mlp.experts tensors stored as MXFP4
QUANTIZATION_CONFIG = {  # as openai/gpt-oss-20b's config.json has it
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                               "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4"}


def _spec() -> dict:
    spec = copy.deepcopy(GPT_OSS_FIXTURES["gpt-oss-tiny"])
    spec["seed"] = 8500
    spec["config"]["intermediate_size"] = 64
    return spec


FIXTURES = {"gpt-oss-mxfp4": _spec()}

_E2M1 = FP4_VALUES[:8].astype(np.float64)  # magnitudes of codes 0..7: 0 .5 1 1.5 2 3 4 6


def quantize_mxfp4(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """rows [..., K] (K % 32 == 0) -> (blocks uint8 [..., K/32, 16], scales uint8 [..., K/32]).

    Group g = rows[..., 32g:32g+32] gets exponent s = ceil(log2(amax / 6)) clipped to
    [-127, 127] (-127 for an all-zero group), so |x| / 2^s <= 6; each x / 2^s is rounded to
    the nearest e2m1 magnitude (ties to the even code), its sign in bit 3 (kept only for
    nonzero codes). Value 2j of a group goes to the low nibble of byte j, 2j+1 to the high.
    """
    *lead, K = rows.shape
    if K % 32:
        raise ValueError(f"MXFP4 needs a multiple of 32 values per row, got {K}")
    g = np.asarray(rows, dtype=np.float64).reshape(*lead, K // 32, 32)
    amax = np.abs(g).max(axis=-1)
    with np.errstate(divide="ignore"):
        exp = np.where(amax > 0, np.ceil(np.log2(amax / 6.0)), -127.0)
    exp = np.clip(exp, -127, 127)
    m = np.minimum(np.abs(g) / np.exp2(exp)[..., None], 6.0)
    lo = np.clip(np.searchsorted(_E2M1, m, side="right") - 1, 0, 7)
    hi = np.minimum(lo + 1, 7)
    d_lo, d_hi = m - _E2M1[lo], _E2M1[hi] - m
    code = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo).astype(np.uint8)
    code |= ((g < 0) & (code > 0)).astype(np.uint8) << 3
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks.astype(np.uint8), (exp + 127).astype(np.uint8)


def quantize_experts(model) -> dict:
    """Quantize every expert gate_up_proj [E, H, 2I] / down_proj [E, I, H] of ``model`` (its
    stored rows are the transposes [E, 2I, H] / [E, H, I]) and replace the weight with
    transformers' dequantization of the bytes. Returns {checkpoint name: (blocks, scales)}."""
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors as hf_convert

    packed = {}
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for proj in QUANTIZED:
                p = getattr(layer.mlp.experts, proj)
                blocks, scales = quantize_mxfp4(p.numpy().transpose(0, 2, 1))
                w = hf_convert(torch.from_numpy(blocks), torch.from_numpy(scales),
                               dtype=torch.float32)
                assert tuple(w.shape) == tuple(p.shape), (proj, w.shape, p.shape)
                ours = convert_moe_packed_tensors(blocks, scales)
                assert np.array_equal(ours.view(np.uint32), w.numpy().view(np.uint32)), proj
                p.copy_(w)
                packed[f"model.layers.{i}.mlp.experts.{proj}"] = (blocks, scales)
    model._mxfp4 = packed
    return packed


def build_mxfp4(spec: dict, seed: int):
    model = build(spec, seed)
    quantize_experts(model)
    return model


def write_mxfp4(out: str, packed: dict) -> None:
    """Replace the written BF16 experts of out/model.safetensors by their MXFP4 blocks and
    scales (BF16 holds the dequantized values exactly: checked) and add quantization_config."""
    path = os.path.join(out, "model.safetensors")
    f = SafetensorsFile(path)
    tensors = {}
    for name in f.keys():
        if name in packed:
            blocks, scales = packed[name]
            assert np.array_equal(f.get(name), convert_moe_packed_tensors(blocks, scales)), name
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        else:
            tensors[name] = f.get(name)
    metadata = dict(f.metadata)
    del f
    write_safetensors(path, tensors, metadata=metadata, dtype="BF16")
    cfg_path = os.path.join(out, "config.json")
    with open(cfg_path, encoding="utf-8") as fh:
        cfg = json.load(fh)
    cfg["quantization_config"] = QUANTIZATION_CONFIG
    write_json(cfg_path, cfg)


def check_mxfp4_reload(name: str, out: str, run, tol: float = 1e-4):
    """transformers loads the MXFP4 folder (dequantizing on CPU): its experts must equal the
    model's exactly and its prefill / full-sequence logits the expected ones to tol."""
    import torch
    from transformers import AutoModelForCausalLM, Mxfp4Config

    back = load_reference(AutoModelForCausalLM, out,
                          quantization_config=Mxfp4Config(dequantize=True))
    ours = dict(run.model.named_parameters())
    for pname, p in back.named_parameters():
        assert torch.equal(p, ours[pname]), f"{name}: reloaded {pname} differs"
    return check_reload(name, out, run, tol, back=back)


def make_fixture(name: str, spec: dict, out_root: str) -> dict:
    run = search(name, spec, build_mxfp4, min_distinct=MIN_DISTINCT, accept=clamps_active)
    out = write_folder(name, spec, run, out_root)
    write_mxfp4(out, run.model._mxfp4)
    _, err = check_mxfp4_reload(name, out, run)
    clamps = clamp_fractions(run.model, run.seq)
    scales = np.concatenate([s.ravel() for _, s in run.model._mxfp4.values()])
    return summary(name, run, out, err, clamped_gate=round(clamps[0], 4),
                   clamped_up=round(clamps[1], 4),
                   scale_exponents=[int(scales.min()) - 127, int(scales.max()) - 127])


def main(argv=None) -> int:
    return run_cli(__doc__, FIXTURES,
                   lambda name, args: make_fixture(name, FIXTURES[name], args.out), argv)


if __name__ == "__main__":
    sys.exit(main())
