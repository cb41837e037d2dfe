"""GPT-OSS from an MXFP4 checkpoint (expert weights as uint8 ``_blocks`` + ``_scales``, as
openai/gpt-oss-20b stores them) against Hugging Face transformers, and the MXFP4 reading of
causallm/io/mxfp4.py, causallm/io/safetensors.py (Checkpoint) and causallm/io/lazy_weights.py
(Mxfp4Slice) against a numpy twin of transformers' ``convert_moe_packed_tensors``.

tools/fixtures_gpt_oss_mxfp4.py built tests/fixtures/gpt-oss-mxfp4: gpt-oss-tiny's shape with
intermediate 64, experts quantized to MXFP4, everything else BF16, and expected.npz computed
by transformers in float32 on the weights its own dequantizer gives (transformers reloading
the folder gets them bit for bit). Nothing here imports torch or transformers.
"""

import json
import os
import shutil

import numpy as np
import orjson
import parity
import pytest
from cli import run_cli
from parity import FLOAT32_CACHE, assert_logits_close, prefill

from causallm.errors import CausalLMError
from causallm.io.config import load_model_configs
from causallm.io.lazy_weights import Mxfp4Slice, safetensors_slice
from causallm.io.mxfp4 import FP4_VALUES, convert_moe_packed_tensors, dequantize_rows
from causallm.io.safetensors import Checkpoint, SafetensorsFile, write_safetensors
from causallm.models.gpt_oss.gptoss_causallm import GptOssForCausalLM
from causallm.models.gpt_oss_cached_slim.gptoss_cached_slim_causallm import GptOssCachedSlimCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "gpt-oss-mxfp4"
FOLDER = os.path.join(ROOT, "tests", "fixtures", NAME)
REF = np.load(os.path.join(FOLDER, "expected.npz"))
F32 = np.float32
LAYERS, E, H, I = 3, 4, 64, 64
EXPERTS = "model.layers.{}.mlp.experts."


# ------------------------------------------------------------------ the numpy twin

def dequant_ref(blocks, scales):
    """transformers' convert_moe_packed_tensors, one value at a time in float64: value 2j of a
    group is the low nibble of byte j, 2j+1 the high one, times 2^(scale - 127); rows
    [E, R, 32G] then transposed to [E, 32G, R]; rounded to float32 once."""
    blocks, scales = np.asarray(blocks), np.asarray(scales)
    Ex, R, G, B = blocks.shape
    out = np.zeros((Ex, R, G, 2 * B), dtype=np.float64)
    table = FP4_VALUES.astype(np.float64)
    for j in range(B):
        out[..., 2 * j] = table[blocks[..., j] & 15]
        out[..., 2 * j + 1] = table[blocks[..., j] >> 4]
    out *= np.exp2(scales.astype(np.float64) - 127)[..., None]
    with np.errstate(over="ignore"):
        return out.reshape(Ex, R, 2 * B * G).transpose(0, 2, 1).astype(F32)


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(np.asarray(a, F32).view(np.uint32),
                                                 np.asarray(b, F32).view(np.uint32))


def test_hand_made_example():
    """Two rows of one expert, one group of 4 values (2 bytes) each:
    row 0, scale 128 (x2): 0x21 -> .5, 1; 0x9F -> -6 (code 15), -.5 (code 9)
    row 1, scale 125 (x1/4): 0x07 -> 6, 0; 0xE8 -> -0 (code 8), -4 (code 14)."""
    blocks = np.array([[[[0x21, 0x9F]], [[0x07, 0xE8]]]], dtype=np.uint8)  # [1, 2, 1, 2]
    scales = np.array([[[128], [125]]], dtype=np.uint8)                   # [1, 2, 1]
    rows = np.array([[1.0, 2.0, -12.0, -1.0], [1.5, 0.0, -0.0, -1.0]], F32)
    assert same_bits(dequantize_rows(blocks[0], scales[0]), rows)
    out = convert_moe_packed_tensors(blocks, scales)
    assert out.shape == (1, 4, 2) and out.flags.c_contiguous
    assert same_bits(out, rows.T[None])
    assert np.signbit(out[0, 2, 1]) and not np.signbit(out[0, 1, 1])  # -0 and +0 kept


def test_every_byte_and_scale_matches_the_twin():
    """All 256 bytes under all 256 scales, bit for bit, with transformers' (torch.ldexp) edge
    values: scale 255 is 2^128 (.5 -> 2^127, 1 -> inf), scale 0 is 2^-127 (.5 -> 2^-128)."""
    blocks = np.tile(np.arange(256, dtype=np.uint8), 256).reshape(1, 256, 16, 16)
    scales = np.repeat(np.arange(256, dtype=np.uint8).reshape(1, 256, 1), 16, axis=2)
    out = convert_moe_packed_tensors(blocks, scales)
    assert same_bits(out, dequant_ref(blocks, scales))
    assert out[0, 2, 255] == 2.0 ** 127 and out[0, 4, 255] == np.inf  # bytes 1: .5, 2: 1
    assert out[0, 2, 0] == 2.0 ** -128 and out[0, 14, 254] == np.inf  # byte 7 -> 6 * 2^127
    assert not np.isnan(out).any()


# ------------------------------------------------------------------ Checkpoint

def test_checkpoint_shows_each_pair_as_one_float_tensor():
    ckpt, raw = Checkpoint(FOLDER), SafetensorsFile(os.path.join(FOLDER, "model.safetensors"))
    names = ckpt.keys()
    assert not [n for n in names if n.endswith(("_blocks", "_scales"))]
    assert len(names) == len(raw.keys()) - 2 * LAYERS  # two pairs per layer, one name each
    for i in range(LAYERS):
        p = EXPERTS.format(i)
        for proj, shape in (("gate_up_proj", (E, H, 2 * I)), ("down_proj", (E, I, H))):
            assert p + proj in ckpt and p + proj + "_blocks" not in ckpt
            assert ckpt.dtype(p + proj) == "MXFP4" and ckpt.shape(p + proj) == shape
            got = ckpt.get(p + proj)
            assert got.shape == shape and got.dtype == F32 and not got.flags.writeable
            assert same_bits(got, dequant_ref(raw.get(p + proj + "_blocks"),
                                              raw.get(p + proj + "_scales")))
            assert ckpt.file_of(p + proj) == raw.path
    with pytest.raises(CausalLMError, match="no tensor named 'model.layers.0.mlp.experts."
                                            "down_proj_scales'"):
        ckpt.get(EXPERTS.format(0) + "down_proj_scales")


def test_unpaired_or_mismatched_parts(tmp_path):
    u8 = np.zeros((2, 3, 1, 16), np.uint8)
    write_safetensors(tmp_path / "model.safetensors", {"a_blocks": u8, "b.weight": np.ones(2)})
    ckpt = Checkpoint(tmp_path)  # blocks alone stay what they are
    assert ckpt.keys() == ["b.weight", "a_blocks"] and ckpt.dtype("a_blocks") == "U8"
    write_safetensors(tmp_path / "model.safetensors",
                      {"a_blocks": u8, "a_scales": np.zeros((2, 4, 1), np.uint8)})
    with pytest.raises(CausalLMError) as e:
        Checkpoint(tmp_path)
    assert "\n" not in str(e.value) and "a_scales" in str(e.value) and "(2, 3, 1)" in str(e.value)


# ------------------------------------------------------------------ one expert read on demand

def test_expert_slices_read_only_their_expert(tmp_path):
    """A slice of expert e gives ckpt.get(X)[e] (and its column parts) even when every other
    expert's bytes are garbage: it reads that expert's blocks and scales only."""
    ckpt = Checkpoint(FOLDER)
    path = str(tmp_path / "model.safetensors")
    shutil.copy(os.path.join(FOLDER, "model.safetensors"), path)
    name, e = EXPERTS.format(1) + "gate_up_proj", 2
    full = ckpt.get(name)
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = orjson.loads(f.read(n))
    data = bytearray(open(path, "rb").read())
    for part, per_expert in (("_blocks", 2 * I * (H // 32) * 16), ("_scales", 2 * I * (H // 32))):
        b0, b1 = header[name + part]["data_offsets"]
        keep = slice(8 + n + b0 + e * per_expert, 8 + n + b0 + (e + 1) * per_expert)
        saved = data[keep]
        data[8 + n + b0:8 + n + b1] = b"\xff" * (b1 - b0)
        data[keep] = saved
    with open(path, "wb") as f:
        f.write(data)

    whole = safetensors_slice(path, name)
    assert isinstance(whole, Mxfp4Slice) and whole.shape == (E, H, 2 * I)
    assert same_bits(whole.read()[e], full[e]) and np.isinf(whole.read()[e - 1]).any()
    one = safetensors_slice(path, name, (e,))
    got = one.read()
    assert one.shape == got.shape == (H, 2 * I) and same_bits(got, full[e])
    assert got.flags.f_contiguous and not got.flags.writeable  # [out, in] rows used as [in, out]
    for cols in (slice(0, None, 2), slice(1, None, 2), slice(5, 17)):
        part = safetensors_slice(path, name, (e, slice(None), cols))
        assert part.shape == full[e][:, cols].shape and same_bits(part.read(), full[e][:, cols])
    t = safetensors_slice(path, name, (e,), transpose=True).read()
    assert t.flags.c_contiguous and same_bits(t, full[e].T)
    assert same_bits(np.asarray(one), full[e])
    for bad in [(E,), (0, 1), (0, slice(None), slice(None, None, -1)), (0, slice(1, None))]:
        with pytest.raises(CausalLMError) as err:
            safetensors_slice(path, name, bad)
        assert "\n" not in str(err.value) and name in str(err.value)


def test_scales_in_another_shard(tmp_path):
    raw = SafetensorsFile(os.path.join(FOLDER, "model.safetensors"))
    name = EXPERTS.format(0) + "down_proj"
    first = {n: raw.get(n) for n in raw.keys() if not n.endswith("_scales")}
    second = {n: raw.get(n) for n in raw.keys() if n.endswith("_scales")}
    write_safetensors(tmp_path / "a.safetensors", first)
    write_safetensors(tmp_path / "b.safetensors", second)
    weight_map = {**{n: "a.safetensors" for n in first}, **{n: "b.safetensors" for n in second}}
    (tmp_path / "model.safetensors.index.json").write_bytes(orjson.dumps({"weight_map":
                                                                          weight_map}))
    ckpt = Checkpoint(tmp_path)
    want = Checkpoint(FOLDER).get(name)
    assert same_bits(ckpt.get(name), want)
    part = safetensors_slice(ckpt.file_of(name), name, (3,))
    assert part.scales_path.endswith("b.safetensors") and same_bits(part.read(), want[3])


# ------------------------------------------------------------------ the model

def load(cls=GptOssForCausalLM, **nntr):
    return parity.load(cls, NAME, **nntr)


def decode_logits(model):
    """Prefill logits, then every teacher-forced cached decode step's: (N, V)."""
    ids, tokens = REF["prompt_ids"], REF["tokens"]
    out = [prefill(model, ids)]
    for k in range(1, len(tokens)):
        pos = len(ids) + k - 1
        step = np.array([[tokens[k - 1]]], dtype=F32)
        out.append(model.model.incremental_inference(1, [step], None, 1, pos, pos + 1)[0][0])
    return np.stack(out)


VARIANTS = {"resident": (GptOssForCausalLM, {"moe_expert_cache": 0}),
            "default": (GptOssForCausalLM, {}),
            "cached_slim_lru1": (GptOssCachedSlimCausalLM, {"moe_expert_cache": 1})}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_and_cached_decode_match_transformers(variant):
    cls, nntr = VARIANTS[variant]
    logits = decode_logits(load(cls, **nntr))
    assert len(logits) >= 25
    for k, (ours, ref) in enumerate(zip(logits, REF["step_logits"])):
        assert_logits_close(ours, ref, f"{variant} step {k}")
        assert int(np.argmax(ours)) == REF["tokens"][k], f"{variant}: greedy token {k}"


@pytest.mark.slow
def test_one_shot_forward_matches_no_cache_reference():
    seq = np.concatenate([REF["prompt_ids"], REF["tokens"][:-1]])
    model = load(moe_expert_cache=0, init_seq_len=len(seq), num_to_generate=8)
    assert_logits_close(prefill(model, seq), REF["full_logits_last"], "one-shot forward")


def capacities(model):
    return [layer.cache_capacity for _, layer in model.moeLayers()]


@pytest.mark.slow
def test_mxfp4_turns_the_expert_cache_on_by_default(capsys):
    """GptOssForCausalLM keeps num_experts_per_tok experts per layer and says so on stderr;
    nntr_config moe_expert_cache wins; the cached slim model keeps its own default (16 -> E)."""
    model = load()
    assert capacities(model) == [2, 2, 2] and model.expertCacheOn()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "MXFP4" in err and "moe_expert_cache" in err, err
    assert capacities(load(moe_expert_cache=0)) == [0, 0, 0]
    assert capacities(load(moe_expert_cache=3)) == [3, 3, 3]
    assert capacities(load(GptOssCachedSlimCausalLM)) == [E, E, E]
    assert "MXFP4" not in capsys.readouterr().err


def test_other_quantization_is_a_one_line_error():
    cfg, gen, nntr = load_model_configs(FOLDER)
    cfg["quantization_config"] = {"quant_method": "bitsandbytes"}
    with pytest.raises(CausalLMError) as e:
        GptOssForCausalLM(cfg, gen, nntr)
    message = str(e.value)
    assert "\n" not in message and "config.json" in message and "bitsandbytes" in message


@pytest.mark.slow
@pytest.mark.parametrize("cls, capacity", [(GptOssForCausalLM, 1), (GptOssForCausalLM, 3),
                                           (GptOssCachedSlimCausalLM, None)])
def test_expert_cache_gives_identical_logits(cls, capacity, monkeypatch):
    """Experts read one at a time from the MXFP4 bytes give the logits of the experts
    dequantized whole at load, bit for bit; the whole tensors are never dequantized then, and
    the graph's own expert weights stay zeros."""
    resident = decode_logits(load(moe_expert_cache=0))

    def whole(*args):
        raise AssertionError("an MXFP4 tensor was dequantized whole")
    monkeypatch.setattr("causallm.io.safetensors.dequantize_mxfp4", whole)
    model = load(cls, **({} if capacity is None else {"moe_expert_cache": capacity}))
    assert np.array_equal(decode_logits(model), resident)
    for _, layer in model.moeLayers():
        cache = layer.expert_cache
        assert len(cache) <= layer.cache_capacity and cache.misses > 0
    gate, down = (model.expert_slices[f"layer1_ffn_down:expert_{w}_3"] for w in ("gate", "down"))
    assert isinstance(down, Mxfp4Slice) and down.rows == slice(None)
    assert isinstance(gate.source, Mxfp4Slice) and gate.source.rows == slice(0, None, 2)
    weight = model.model.getWeight  # placeholders: views of one zero buffer, never copies
    assert not weight("layer1_ffn_down:expert_up_0").any()
    assert np.shares_memory(weight("layer1_ffn_down:expert_gate_0"),
                            weight("layer2_ffn_down:expert_up_3"))


@pytest.mark.slow
def test_greedy_generation_gives_transformers_tokens():
    model = load()
    n = len(REF["tokens"])
    result = model.generate_tokens([REF["prompt_ids"].tolist()], max_new_tokens=n, do_sample=False)
    assert result.generated_ids[0] == REF["tokens"].tolist()


@pytest.mark.slow
def test_saved_bin_holds_the_dequantized_experts(tmp_path):
    """An MXFP4 model saved as an NNTrainer .bin (experts copied from the file one at a time)
    is the .bin of the resident model, and that .bin runs to transformers' logits."""
    on_file, resident = tmp_path / "a.bin", tmp_path / "b.bin"
    load().save_weight(str(on_file))
    load(moe_expert_cache=0).save_weight(str(resident))
    assert on_file.read_bytes() == resident.read_bytes()
    cfg, gen, nntr = load_model_configs(FOLDER)
    nntr.update(init_seq_len=64, num_to_generate=64, moe_expert_cache=0, **FLOAT32_CACHE)
    model = GptOssForCausalLM(cfg, gen, nntr)
    model.initialize()
    model.load_weight(str(on_file))
    assert_logits_close(prefill(model, REF["prompt_ids"]), REF["prefill_logits"], ".bin prefill")


@pytest.mark.slow
def test_cli_gives_transformers_tokens():
    p = run_cli(os.path.join("tests", "fixtures", NAME), str(REF["prompt"]), "--greedy", "-n",
                "24", "--json")
    assert p.returncode == 0, p.stderr
    assert "MXFP4 experts are read from the file" in p.stderr
    record = json.loads(p.stdout.rstrip("\n").rsplit("\n", 1)[1])
    assert record["architecture"] == "GptOssForCausalLM"
    assert record["prompt_ids"] == REF["prompt_ids"].tolist()
    assert record["generated_ids"] == REF["tokens"][:24].tolist()
