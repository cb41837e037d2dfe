"""Weight precision settings (causallm/io/weights.py) against transformers and ggml's quantizers.

The ``*-fc-q8_0`` and ``*-embd-q4_0`` folders (tools/fixtures_precision.py) are an existing
fixture's model under an nntr_config.json that sets ``fc_layer_dtype`` or ``embedding_dtype``;
their reference is the base fixture's expected.npz (transformers in float32). A held block
matrix must be, byte for byte, what gguf-py's quantizer (ggml's reference rounding) makes of the
checkpoint tensor, read here without our loader; the logits must stay within the quantized
bounds of parity.py. The precedence, ``--dtype`` over nntr_config over the checkpoint, is
checked through the CLI and ``causallm.load``.
"""

import json
import os

import gguf
import numpy as np
import parity
import pytest
from cli import run_cli

import causallm
from causallm.errors import CausalLMError
from causallm.factory import Factory
from causallm.kernels.packed import PackedMatrix
from causallm.layers.fully_connected import FullyConnectedLayer

BASE = {"llama-gqa3-fc-q8_0": "llama-gqa3", "qwen3-swa6-fc-q8_0": "qwen3-swa6-bias",
        "llama-gqa3-embd-q4_0": "llama-gqa3"}
HF_PROJECTIONS = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
                  "attention_out": "self_attn.o_proj", "ffn_up": "mlp.up_proj",
                  "ffn_gate": "mlp.gate_proj", "ffn_down": "mlp.down_proj"}
"""Our projection names -> Llama's / Qwen3's Hugging Face modules (model.layers.{i}.*)."""


def projections(model) -> dict:
    """{HF tensor name: held weight} of every fully_connected layer of a Llama-like model."""
    names = []
    model.model.forEachLayer(lambda layer, ctx, _: names.append(ctx.getName())
                             if isinstance(layer, FullyConnectedLayer) else None)
    out = {}
    for name in names:
        i, kind = name[len("layer"):].split("_", 1)
        out[f"model.layers.{i}.{HF_PROJECTIONS[kind]}.weight"] = \
            model.model.getWeight(f"{name}:weight")
    return out


def quantized(rows, fmt):
    """gguf-py's ggml blocks of float rows (R, C)."""
    return gguf.quants.quantize(np.ascontiguousarray(rows), gguf.GGMLQuantizationType[fmt])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-gqa3-fc-q8_0", "qwen3-swa6-fc-q8_0"])
def test_fc_layer_dtype_holds_every_projection_and_stays_close_to_transformers(name):
    """fc_layer_dtype Q8_0 on a Llama and a Qwen3 folder: every projection is ggml's Q8_0 of
    its checkpoint tensor, the embedding stays float32 (embedding_dtype FP32), the cache is
    FP16 (the weights are quantized), and the steps stay within the Q8_0 bounds."""
    model = parity.from_folder(name)
    hf = parity.read_hf(BASE[name])
    held = projections(model)
    assert len(held) == 7 * model.NUM_LAYERS
    for tensor, w in held.items():
        assert isinstance(w, PackedMatrix) and w.format == "Q8_0", tensor
        np.testing.assert_array_equal(w.data, quantized(hf[tensor], "Q8_0"), err_msg=tensor)
    np.testing.assert_array_equal(model.model.getWeight("embedding0:Embedding"),
                                  hf["model.embed_tokens.weight"])
    assert {c.key.dtype for c in model.model.getKVCaches("self")} == {np.dtype(np.uint16)}
    parity.check_quantized(model, parity.expected(BASE[name]), "Q8_0", f"{name}")


@pytest.mark.slow
def test_embedding_dtype_holds_the_embedding_and_the_head_it_defaults():
    """embedding_dtype Q4_0: the embedding table and the untied head (lmhead_dtype follows the
    embedding's) are ggml's Q4_0 of their tensors; the projections stay float32."""
    name = "llama-gqa3-embd-q4_0"
    model = parity.from_folder(name)
    hf = parity.read_hf(BASE[name])
    table, head = (model.model.getWeight(w) for w in ("embedding0:Embedding",
                                                      "output_of_causallm:weight"))
    assert (table.format, table.transposed, head.format) == ("Q4_0", False, "Q4_0")
    np.testing.assert_array_equal(table.data, quantized(hf["model.embed_tokens.weight"], "Q4_0"))
    np.testing.assert_array_equal(head.data, quantized(hf["lm_head.weight"], "Q4_0"))
    for tensor, w in projections(model).items():
        np.testing.assert_array_equal(w, hf[tensor].T, err_msg=tensor)
    parity.check_quantized(model, parity.expected(BASE[name]), "Q4_0", name)


FAMILIES = ["llama-gqa3", "qwen2-gqa4", "qwen3-hd80", "qwen3moe-e8k2-dense", "gemma3-softcap",
            "gemma3-vision", "gpt-oss-tiny", "gpt2-untied-scaled", "bert-st-pool-dense",
            "qwen3-embedding", "embeddinggemma", "t5-v11-gated-untied", "bart-forced",
            "marian-positions-in-file", "t5gemma2-image"]
"""A folder of every family (with a vision tower, a Dense module, an untied head where one
exists)."""


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_dtype_keys_reach_every_familys_layers(name):
    """fc_layer_dtype is the dtype of every fully_connected weight (attention, MLP, a
    sentence-transformers Dense, a vision tower and its projector), embedding_dtype of every
    token embedding, lmhead_dtype of an untied head: the dtype a .bin holds them in and, when
    not FP32, the one they are held in."""
    model = Factory.Instance().createFromFolder(
        os.path.join(parity.FIXTURES, name), init_seq_len=8, num_to_generate=8,
        fc_layer_dtype="Q8_0", embedding_dtype="FP16", lmhead_dtype="Q4_0")
    model.initialize()
    kinds = {}
    model.model.forEachLayer(lambda layer, ctx, _: kinds.setdefault(ctx.getName(),
                                                                    type(layer).type))
    seen = set()
    for spec in model.model.getWeightSpecs():
        if not spec.packable:
            continue
        scope, weight = spec.full_name.split(":")
        want = {"fully_connected": "Q8_0", "lm_head": "Q4_0"}.get(kinds[scope], "FP16")
        assert spec.dtype == want, spec.full_name
        seen.add(kinds[scope] if weight != "Embedding" else "embedding")
    assert {"fully_connected", "embedding"} <= seen


# ------------------------------------------------------------------------------ precedence
@pytest.mark.slow
def test_dtype_comes_before_the_nntr_config_keys_and_they_before_the_file():
    """causallm.load: the folder's fc_layer_dtype Q8_0 over its F32 file; dtype= FP32 over
    the key (every weight the checkpoint's float32, transformers' logits to float32
    rounding); on a BF16 checkpoint, fc_layer_dtype FP16 holds the projections as F16 and the
    embedding keeps the file's BF16, and dtype= Q4_0 holds all as Q4_0."""
    q8 = causallm.load(os.path.join(parity.FIXTURES, "llama-gqa3-fc-q8_0"))
    assert q8.model.loader.heldTypes() == {"F32": 2, "Q8_0": 21}
    fp32 = causallm.load(os.path.join(parity.FIXTURES, "llama-gqa3-fc-q8_0"), dtype="fp32",
                         init_seq_len=64, num_to_generate=64)
    assert fp32.model.loader.heldTypes() == {"F32": 23}
    parity.check_prefill_and_cached_decode(fp32.model, parity.expected("llama-gqa3"))

    bf16 = os.path.join(parity.FIXTURES, "llama-hd80-bf16-sharded")
    hf = parity.read_hf("llama-hd80-bf16-sharded")
    assert causallm.load(bf16).model.loader.heldTypes() == {"BF16": 15}  # tied: no head
    f16 = causallm.load(bf16, fc_layer_dtype="FP16").model
    assert f16.loader.heldTypes() == {"BF16": 1, "F16": 14}
    w = f16.model.getWeight("layer1_ffn_down:weight")
    np.testing.assert_array_equal(
        w.toFloat(), hf["model.layers.1.mlp.down_proj.weight"].T.astype(np.float16)
        .astype(np.float32))
    q4 = causallm.load(bf16, dtype="Q4_0", fc_layer_dtype="FP16").model
    assert q4.loader.heldTypes() == {"Q4_0": 15}


def cli_record(name, *flags):
    """main.py on fixture ``name`` with its base's prompt, 8 greedy tokens, --json: the
    record."""
    prompt = str(parity.expected(BASE[name])["prompt"])
    p = run_cli(os.path.join(parity.FIXTURES, name), prompt, "--greedy", "-n", "8", "--json",
                *flags)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.rstrip("\n").rsplit("\n", 1)[-1])


@pytest.mark.slow
def test_cli_dtype_overrides_the_folders_fc_layer_dtype():
    """The --json record's weight_types: the folder's Q8_0 projections, all float32 with
    --dtype FP32 (then transformers' tokens), all Q4_0 with --dtype q4_0."""
    ref = parity.expected("llama-gqa3")
    assert cli_record("llama-gqa3-fc-q8_0")["weight_types"] == {"F32": 2, "Q8_0": 21}
    record = cli_record("llama-gqa3-fc-q8_0", "--dtype", "FP32")
    assert record["weight_types"] == {"F32": 23}
    assert record["generated_ids"] == ref["tokens"][:8].tolist()
    assert cli_record("llama-gqa3-fc-q8_0", "--dtype", "q4_0")["weight_types"] == \
        {"Q4_0": 23}


@pytest.mark.parametrize("key", ["fc_layer_dtype", "embedding_dtype", "lmhead_dtype"])
def test_a_dtype_key_we_cannot_hold_is_a_one_line_error(key, tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    for file in ("config.json", "tokenizer.json"):
        (folder / file).write_bytes(open(os.path.join(parity.FIXTURES, "llama-gqa3", file),
                                         "rb").read())
    (folder / "nntr_config.json").write_text(json.dumps({key: "Q3_K"}))
    with pytest.raises(CausalLMError) as e:
        Factory.Instance().createFromFolder(str(folder))
    assert str(e.value) == (f"{folder / 'nntr_config.json'}: '{key}' must be one of FP32, BF16, "
                            f"FP16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, got 'Q3_K'")
