"""NNTrainer .bin weights both ways: tools/hf_to_bin.py and tools/bin_to_hf.py.

The reference for every model is what transformers computed (expected.npz, see
test_llama_parity.py). The independent converter below reads the safetensors with plain numpy
and writes the .bin in the order NNTrainer's C++ weight_converter.py scripts use for a Llama
decoder (res/qwen3/qwen3-4b without q/k norms): embed; per layer input_layernorm, q^T, k^T, v^T,
o^T, post_attention_layernorm, up^T, gate^T, down^T; final norm; lm_head^T. It shares no code
with our graph, so a match proves our loader reads NNTrainer's layout, not just our own.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import parity
import pytest
from parity import (assert_logits_close, expected, prefill, read_hf, read_hf_raw,
                    read_safetensors_raw)

from causallm.errors import CausalLMError
from causallm.io.config import load_model_configs
from causallm.models.causal_lm import CausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import bin_to_hf  # noqa: E402
import hf_to_bin  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
LLAMA_FIXTURES = ["llama-gqa3", "llama-hd80-bf16-sharded", "llama-f16-yarn-bias"]
FC = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "gate_proj", "down_proj")


# ----------------------------------------------------------------------- independent helpers

def converter_bin(path, params, n_layers, fc_dtype=np.float32):
    """The C++ converters' layout for a Llama decoder; FC weights as fc_dtype, the rest FP32
    (fc_dtype=float16 is model_tensor_type FP16-FP32). Biases, if any, follow their weight."""
    def save(name, transpose=False, dtype=np.float32):
        a = params[name]
        np.asarray(a.T if transpose else a, dtype=dtype).tofile(f)
        bias = name[:-len("weight")] + "bias"
        if transpose and bias in params:
            np.asarray(params[bias], dtype=np.float32).tofile(f)

    with open(path, "wb") as f:
        save("model.embed_tokens.weight")
        for i in range(n_layers):
            p = f"model.layers.{i}."
            save(p + "input_layernorm.weight")
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                save(f"{p}self_attn.{proj}.weight", True, fc_dtype)
            save(p + "post_attention_layernorm.weight")
            for proj in ("up_proj", "gate_proj", "down_proj"):
                save(f"{p}mlp.{proj}.weight", True, fc_dtype)
        save("model.norm.weight")
        if "lm_head.weight" in params:
            save("lm_head.weight", True)


# ----------------------------------------------------------------------------------- running

def load(name, weights, **nntr):
    return parity.load(CausalLM, name, weights=str(weights), **nntr)


def greedy(model, ref):
    n = len(ref["tokens"])
    result = model.generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=n, do_sample=False)
    return result.generated_ids[0]


def no_temp_files(folder):
    return [f for f in os.listdir(folder) if "tmp" in f]


# ----------------------------------------------------------------------------------- hf -> bin

@pytest.mark.slow
@pytest.mark.parametrize("name", LLAMA_FIXTURES)
def test_hf_to_bin_gives_transformers_logits_and_tokens(name, tmp_path):
    folder = os.path.join(FIXTURES, name)
    out = tmp_path / "model.bin"
    r = hf_to_bin.convert(folder, str(out))
    params = read_hf(folder)
    tied = load_model_configs(folder)[0]["tie_word_embeddings"]
    # FP32: 4 bytes per element of every checkpoint tensor; a tied head adds nothing
    assert ("lm_head.weight" in params) != tied
    assert os.path.getsize(out) == r.nbytes == sum(4 * a.size for a in params.values())
    assert r.tensors == len(params) and r.model_tensor_type == "FP32-FP32"
    assert no_temp_files(tmp_path) == []

    ref = expected(name)
    model = load(name, out)
    head = [s for s in model.model.getWeightSpecs() if s.full_name.startswith("output_of")]
    assert bool(head) != tied
    assert_logits_close(prefill(model, ref["prompt_ids"]), ref["prefill_logits"], "prefill", 2e-4)
    assert greedy(load(name, out), ref) == ref["tokens"].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("fc_dtype", ["FP32", "FP16"])
def test_independent_converter_layout_loads_to_transformers_logits(fc_dtype, tmp_path):
    """llama-gqa3 written by the numpy converter (C++ order) loads to transformers' logits, and
    our tool writes exactly the same bytes."""
    name = "llama-gqa3"
    folder = os.path.join(FIXTURES, name)
    params = read_hf(folder)
    theirs = tmp_path / "converter.bin"
    converter_bin(theirs, params, 3, np.float16 if fc_dtype == "FP16" else np.float32)
    ours = hf_to_bin.convert(folder, str(tmp_path / "ours.bin"), fc_dtype).path
    assert theirs.read_bytes() == open(ours, "rb").read()

    ref = expected(name)
    model = load(name, theirs, model_tensor_type=f"{fc_dtype}-FP32")
    logits = prefill(model, ref["prompt_ids"])
    if fc_dtype == "FP32":
        assert_logits_close(logits, ref["prefill_logits"], "prefill", 2e-4)
        assert greedy(load(name, theirs), ref) == ref["tokens"].tolist()
    else:  # weights rounded to FP16 (relative error <= 2**-11)
        assert_logits_close(logits, ref["prefill_logits"], "prefill, FP16 weights", 5e-3)
        assert int(np.argmax(logits)) == ref["tokens"][0]


@pytest.mark.slow
def test_fp16_bin_layout_is_fc_fp16_rest_fp32(tmp_path):
    """FP16-FP32: only the FC weights are 2 bytes an element; norms, biases, the embedding and
    the LM head stay FP32 (llama-f16-yarn-bias has q/k/v/o and MLP biases)."""
    name = "llama-f16-yarn-bias"
    folder = os.path.join(FIXTURES, name)
    r = hf_to_bin.convert(folder, str(tmp_path / "m.bin"), "FP16")
    params = read_hf(folder)
    fc = {k for k in params if k.endswith(".weight") and any(p in k for p in FC)}
    assert any(k.endswith("_proj.bias") for k in params)
    size = sum((2 if k in fc else 4) * a.size for k, a in params.items())
    assert r.nbytes == size and r.model_tensor_type == "FP16-FP32"

    model = load(name, r.path, model_tensor_type="FP16-FP32")
    dtypes = {s.full_name: s.dtype for s in model.model.getWeightSpecs()}
    hf_map = model.getHFWeightMap()
    for hf_name, (entry,) in hf_map.items():
        assert dtypes[entry.target] == ("FP16" if hf_name in fc else "FP32"), hf_name
    # this fixture's weights are F16 values already: FP16 storage is exact, so the logits are
    # the FP32 .bin's to float32 rounding (a prompt multiplies F16 rows in registers, the
    # FP32 .bin's [in, out] weights through BLAS: the sums' order differs), and transformers'
    # tokens come out
    ref = expected(name)
    fp32 = load(name, hf_to_bin.convert(folder, str(tmp_path / "m32.bin")).path)
    np.testing.assert_allclose(prefill(model, ref["prompt_ids"]),
                               prefill(fp32, ref["prompt_ids"]), rtol=0, atol=5e-5)
    assert greedy(load(name, r.path, model_tensor_type="FP16-FP32"), ref) == ref["tokens"].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("fc,embd,head", [("Q8_0", "Q8_0", "Q8_0"), ("Q4_0", "Q4_0", "FP32"),
                                          ("Q4_0", "FP16", "FP16")])
def test_quantized_bin_holds_the_blocks_quantizing_at_load_gives(fc, embd, head, tmp_path):
    """hf_to_bin --dtype Q8_0 / Q4_0 (nntr_quantize's keys in nntr_config.json): the FC weights
    take 34 / 18 bytes per 32 values, the embedding and head their own dtypes, the rest FP32;
    the folder then runs on the .bin with the logits and tokens of the same checkpoint
    quantized at load, and within quantization error of transformers' logits."""
    name = "llama-gqa3"
    folder = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), folder)
    r = hf_to_bin.convert(str(folder), None, fc, True, embd, head)
    assert os.path.basename(r.path) == f"nntr_llama_gqa3_{fc.lower().replace('_', '')}_embd" \
        f"{embd.lower().replace('_', '')}.bin"
    per32 = {"Q8_0": 34, "Q4_0": 18, "FP16": 64, "FP32": 128}
    params = read_hf(str(folder))
    size = 0
    for k, a in params.items():
        kind = fc if any(p in k for p in FC) else embd if "embed" in k else \
            head if "lm_head" in k else "FP32"
        size += a.size // 32 * per32[kind] if kind != "FP32" else 4 * a.size
    assert r.nbytes == size and r.model_tensor_type == f"{fc}-FP32"
    config = json.loads((folder / "nntr_config.json").read_text())
    dtypes = {"fc_layer_dtype": fc, "embedding_dtype": embd, "lmhead_dtype": head}
    defaults = {"fc_layer_dtype": "FP32", "embedding_dtype": "FP32", "lmhead_dtype": embd}
    assert config == {"model_file_name": os.path.basename(r.path),
                      "model_tensor_type": f"{fc}-FP32",
                      **{k: v for k, v in dtypes.items() if v != defaults[k]}}

    ref = expected(name)
    from_bin = load(str(folder), r.path)  # with the folder's nntr_config.json
    at_load = parity.load(CausalLM, name, model_tensor_type=f"{fc}-FP32",
                          embedding_dtype=embd, lmhead_dtype=head)
    for spec in from_bin.model.getWeightSpecs():
        scope = spec.full_name.split(":")[0]
        want = embd if scope == "embedding0" else head if scope == "output_of_causallm" else \
            fc if spec.packable else "FP32"
        assert spec.dtype == want, spec.full_name
    logits = prefill(from_bin, ref["prompt_ids"])
    np.testing.assert_allclose(logits, prefill(at_load, ref["prompt_ids"]), rtol=0, atol=1e-5)
    # against transformers' float32: this tiny random model (hidden 96) loses much to Q4_0
    # (KL 0.22-0.28, cosine 0.78-0.83); unrelated logits of the same values give KL 1.3
    kl = float(parity.kl_divergence(ref["prefill_logits"][None], logits[None])[0])
    assert kl < parity.QUANTIZED_KL[fc], kl
    if fc == "Q8_0":
        assert int(np.argmax(logits)) == ref["tokens"][0]
    n = len(ref["tokens"])
    generate = [m.generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=n,
                                  do_sample=False).generated_ids[0]
                for m in (load(str(folder), r.path), at_load)]
    assert generate[0] == generate[1]


@pytest.mark.slow
def test_q6_k_tied_embedding_bin_runs_the_default_model(tmp_path):
    """The embedded model (hidden 256) with its tied embedding in Q6_K, as nntr_quantize
    --embd_dtype Q6_K and NNTrainer's tied embedding write it: 210 bytes per 256 values of
    plain block_q6_K rows, read back as the bytes quantizing at load makes, used as both the
    table and the head; the greedy text follows transformers' float32 run."""
    folder = tmp_path / "tiny"
    shutil.copytree(os.path.join(ROOT, "res", "tiny-llama"), folder)
    r = hf_to_bin.convert(str(folder), None, "FP32", True, "Q6_K")
    params = read_hf(str(folder))
    table = params["model.embed_tokens.weight"]
    rest = sum(a.size for k, a in params.items() if k != "model.embed_tokens.weight")
    assert r.nbytes == table.size // 256 * 210 + 4 * rest
    config = json.loads((folder / "nntr_config.json").read_text())
    assert config["embedding_dtype"] == "Q6_K" and config["model_tensor_type"] == "FP32-FP32"
    from causallm.factory import Factory
    model = Factory.Instance().createFromFolder(str(folder), init_seq_len=32,
                                                num_to_generate=16)
    model.initialize()
    model.load_weight()
    held = model.model.getWeight("embedding0:Embedding")
    assert held.format == "Q6_K" and not held.transposed
    from causallm.kernels.packed import PackedMatrix
    np.testing.assert_array_equal(held.data, PackedMatrix.fromFloat("Q6_K", table,
                                                                    transposed=False).data)
    ref = json.loads(open(os.path.join(FIXTURES, "tiny-llama-default.json")).read())
    got = model.generate_tokens([ref["prompt_ids"]], max_new_tokens=16, do_sample=False)
    assert got.generated_ids[0] == ref["generated_ids"][:16]


# ----------------------------------------------------------------------------- save and load

@pytest.mark.parametrize("fc_dtype", ["FP32", "FP16"])
def test_save_load_round_trip_is_byte_identical(fc_dtype, tmp_path):
    """The numpy converter's .bin of the sharded BF16 checkpoint (widened to FP32, or FC weights
    rounded to FP16), loaded and saved again, gives the converter's bytes back; hf_to_bin
    writes them too."""
    name = "llama-hd80-bf16-sharded"
    theirs = tmp_path / "converter.bin"
    converter_bin(theirs, read_hf(os.path.join(FIXTURES, name)), 2,
                  np.float16 if fc_dtype == "FP16" else np.float32)
    model = load(name, theirs, model_tensor_type=f"{fc_dtype}-FP32")
    model.save_weight(str(tmp_path / "saved.bin"))
    assert (tmp_path / "saved.bin").read_bytes() == theirs.read_bytes()
    ours = hf_to_bin.convert(os.path.join(FIXTURES, name), str(tmp_path / "ours.bin"), fc_dtype)
    assert open(ours.path, "rb").read() == theirs.read_bytes()
    assert no_temp_files(tmp_path) == []


@pytest.mark.slow
def test_fp16_reload_is_within_fp16_rounding(tmp_path):
    name = "llama-gqa3"
    folder = os.path.join(FIXTURES, name)
    hf_to_bin.convert(folder, str(tmp_path / "m16.bin"), "FP16")
    m32 = load(name, folder)
    m16 = load(name, tmp_path / "m16.bin", model_tensor_type="FP16-FP32")
    for spec in m16.model.getWeightSpecs():
        w32, w16 = m32.model.getWeight(spec.full_name), m16.model.getWeight(spec.full_name)
        if spec.packable and spec.dtype == "FP16":  # kept in FP16: its logical matrix
            assert w16.format == "F16"
            w16 = w16.toFloat()
        if spec.dtype == "FP32":
            np.testing.assert_array_equal(w16, w32, err_msg=spec.full_name)
        else:  # round to nearest: half an ulp, 2**-11 relative (2**-25 absolute if subnormal)
            bound = np.maximum(np.abs(w32) * 2.0 ** -11, 2.0 ** -25)
            assert np.all(np.abs(w16 - w32) <= bound), spec.full_name
            np.testing.assert_array_equal(w16, w32.astype(np.float16).astype(np.float32))
    ref = expected(name)
    assert_logits_close(prefill(m16, ref["prompt_ids"]), ref["prefill_logits"], "FP16", 5e-3)


@pytest.mark.parametrize("delta", [-1, -4, 1, 4])
def test_size_errors_are_one_line_and_name_the_bytes(delta, tmp_path):
    name = "llama-gqa3"
    path = hf_to_bin.convert(os.path.join(FIXTURES, name), str(tmp_path / "m.bin")).path
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        if delta < 0:
            f.truncate(size + delta)
        else:
            f.seek(0, 2)
            f.write(b"\0" * delta)
    with pytest.raises(CausalLMError) as e:
        load(name, path)
    message = str(e.value)
    assert "\n" not in message and path in message
    assert f"expected {size} bytes" in message and f"found {size + delta}" in message


@pytest.mark.slow
def test_bad_dtypes_are_one_line_errors(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(os.path.join(FIXTURES, "llama-gqa3"), folder)
    (folder / "nntr_config.json").write_text('{"embedding_dtype": "Q3_K"}')
    with pytest.raises(CausalLMError, match=r"nntr_config.json: 'embedding_dtype' must be one of "
                                            r".*, got 'Q3_K'$"):
        hf_to_bin.convert(str(folder), str(tmp_path / "m.bin"))
    (folder / "nntr_config.json").write_text('{"embedding_dtype": "Q6_K"}')  # rows of 96 values
    with pytest.raises(CausalLMError, match=r"weight 'embedding0:Embedding' \(4003, 96\) cannot "
                                            r"be Q6_K: it needs rows of a multiple of 256"):
        hf_to_bin.convert(str(folder), str(tmp_path / "m.bin"))
    (folder / "nntr_config.json").write_text('{"embedding_dtype": "BF16"}')  # held, not written
    with pytest.raises(CausalLMError, match=r"embedding0:Embedding.*BF16.*FP32, FP16, Q8_0, Q4_0"):
        hf_to_bin.convert(str(folder), str(tmp_path / "m.bin"))
    with pytest.raises(CausalLMError, match="--dtype"):
        hf_to_bin.convert(str(folder), str(tmp_path / "m.bin"), "Q6_K")
    with pytest.raises(CausalLMError, match="--embd-dtype"):
        hf_to_bin.convert(str(folder), str(tmp_path / "m.bin"), "Q8_0", embd_dtype="int4")
    # a vocabulary of 4003 outputs cannot be repacked in Q4_0's groups of 8 rows
    with pytest.raises(CausalLMError, match=r"^weight 'output_of_causallm:weight' \(96, 4003\) "
                                            r"cannot be Q4_0: .*multiple of 8 outputs$"):
        hf_to_bin.convert(str(folder), str(tmp_path / "m.bin"), "Q4_0", embd_dtype="Q4_0")
    with pytest.raises(CausalLMError, match=r"^weight 'layer0_wq:weight' \(48, 48\) cannot be "
                                            r"Q8_0: .*multiple of 32 values along its input$"):
        hf_to_bin.convert(os.path.join(FIXTURES, "qwen2-gqa4"), str(tmp_path / "m.bin"), "Q8_0")
    assert not (tmp_path / "m.bin").exists()


# ------------------------------------------------------------------------ config and the CLI

@pytest.mark.slow
def test_output_in_a_missing_folder_is_one_line_before_converting(tmp_path):
    """-o must name a file in an existing folder (a mistyped path creates nothing)."""
    def run(out):
        return subprocess.run([sys.executable, os.path.join("tools", "hf_to_bin.py"),
                               os.path.join(FIXTURES, "llama-gqa3"), "-o", str(out)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    missing = tmp_path / "no-such-folder" / "m.bin"
    p = run(missing)
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == f"error: {missing}: no folder {missing.parent} to write it in " \
                       f"(create it first)\n"
    p = run(tmp_path)
    assert p.returncode == 2
    assert p.stderr == f"error: {tmp_path}: is a folder; give the path of the .bin to write\n"
    assert os.listdir(tmp_path) == []


def test_write_nntr_config_then_the_cli_runs_the_bin(tmp_path, capsys):
    from causallm import main
    name = "llama-f16-yarn-bias"
    folder = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), folder)
    before = {"sample_input": "unused", "model_tensor_type": "FP32-FP32", "init_seq_len": 64,
              "num_to_generate": 8}
    (folder / "nntr_config.json").write_text(json.dumps(before))
    assert hf_to_bin.main([str(folder), "--dtype", "fp16", "--write-nntr-config"]) == 0
    line = capsys.readouterr().out.strip()
    bin_name = "nntr_llama_f16_yarn_bias_fp16.bin"
    assert line == (f"wrote {folder / bin_name}: 35 tensors, {os.path.getsize(folder / bin_name)} "
                    f"bytes, model_tensor_type FP16-FP32")
    after = json.loads((folder / "nntr_config.json").read_text())
    assert list(after) == list(before) + ["model_file_name", "fc_layer_dtype"]
    assert after == {**before, "model_tensor_type": "FP16-FP32", "model_file_name": bin_name,
                     "fc_layer_dtype": "FP16"}
    assert no_temp_files(folder) == []

    os.remove(folder / "model.safetensors")  # the CLI must take the .bin
    ref = expected(name)
    assert main.main([str(folder), str(ref["prompt"]), "--greedy", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["prompt_ids"] == ref["prompt_ids"].tolist()
    assert record["generated_ids"] == ref["tokens"][:8].tolist()


def test_model_file_name_outside_the_folder_is_absolute(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(os.path.join(FIXTURES, "llama-gqa3"), folder)
    out = tmp_path / "elsewhere" / "w.bin"
    out.parent.mkdir()
    hf_to_bin.convert(str(folder), str(out), write_nntr_config=True)
    config = json.loads((folder / "nntr_config.json").read_text())
    assert config == {"model_file_name": str(out.resolve()), "model_tensor_type": "FP32-FP32"}


# ----------------------------------------------------------------------------------- bin -> hf

@pytest.mark.slow
@pytest.mark.parametrize("name,dtype", [("llama-gqa3", "F32"), ("llama-hd80-bf16-sharded", "BF16"),
                                        ("llama-f16-yarn-bias", "F16")])
def test_bin_to_hf_round_trip(name, dtype, tmp_path):
    """.bin -> safetensors in the checkpoint's own dtype gives back the checkpoint's tensors
    bit for bit, and our safetensors loader then gives the same logits."""
    folder = os.path.join(FIXTURES, name)
    bin_path = hf_to_bin.convert(folder, str(tmp_path / "m.bin")).path
    out = tmp_path / "hf"
    assert bin_to_hf.main([folder, bin_path, "-o", str(out), "--dtype", dtype.lower()]) == 0

    source, written = read_hf_raw(folder), read_safetensors_raw(out / "model.safetensors")
    assert sorted(written) == sorted(source)  # a tied checkpoint gets no lm_head.weight back
    for k, (st_dtype, shape, raw) in source.items():
        assert written[k] == (st_dtype, shape, raw), k
    with open(out / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert header["__metadata__"] == {"format": "pt"}  # transformers refuses a file without it
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / f).read_bytes() == open(os.path.join(folder, f), "rb").read()
    assert no_temp_files(out) == []

    ref = expected(name)
    from_bin, from_hf = load(name, bin_path), load(name, out)
    logits = prefill(from_hf, ref["prompt_ids"])
    # same weights; only the kernel's loop order differs ([out, in] views vs [in, out] arrays)
    assert_logits_close(logits, prefill(from_bin, ref["prompt_ids"]), "hf vs bin", 1e-5)
    assert_logits_close(logits, ref["prefill_logits"], "prefill", 2e-4)


@pytest.mark.slow
def test_bin_to_hf_fp16_bin_and_errors(tmp_path):
    name = "llama-gqa3"
    folder = os.path.join(FIXTURES, name)
    bin16 = hf_to_bin.convert(folder, str(tmp_path / "m16.bin"), "FP16").path
    # the folder's nntr_config (none: FP32-FP32) does not fit; the error says which layout does
    with pytest.raises(CausalLMError, match=r"found \d+ .*fits --model-tensor-type FP16-FP32"):
        bin_to_hf.export(folder, bin16, str(tmp_path / "hf"))
    r = bin_to_hf.export(folder, bin16, str(tmp_path / "hf"), model_tensor_type="FP16-FP32")
    assert r.tensors == 30
    written = read_hf(tmp_path / "hf")
    for k, a in read_hf(folder).items():
        expected_w = a.astype(np.float16).astype(np.float32) if any(p in k for p in FC) else a
        np.testing.assert_array_equal(written[k], expected_w, err_msg=k)
    with pytest.raises(CausalLMError, match="must differ from MODEL_DIR"):
        bin_to_hf.export(folder, bin16, folder)
    with pytest.raises(CausalLMError, match="no such .bin file"):
        bin_to_hf.export(folder, str(tmp_path / "missing.bin"), str(tmp_path / "x"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt-oss-tiny", "qwen3moe-e8k3-fused", "gpt2-tied",
                                  "gemma3-softcap"])
def test_bin_to_hf_rebuilds_fused_split_and_offset_tensors(name, tmp_path):
    """Families whose checkpoint tensors are fused (gpt-oss gate_up_proj, GPT-2 c_attn), split
    per expert, or offset ((1+w) norms) export back to tensors that load to the same weights."""
    folder = os.path.join(FIXTURES, name)
    r = hf_to_bin.convert(folder, str(tmp_path / "m.bin"))
    out = tmp_path / "hf"
    bin_to_hf.export(folder, r.path, str(out))
    a, b = hf_to_bin.build_model(folder), hf_to_bin.build_model(str(out))
    a.load_weight(r.path)
    b.load_weight(str(out))
    for spec in a.model.getWeightSpecs():
        np.testing.assert_array_equal(a.model.getWeight(spec.full_name),
                                      b.model.getWeight(spec.full_name), err_msg=spec.full_name)
