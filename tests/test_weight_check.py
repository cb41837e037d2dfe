"""Weights that cannot be right are an error at load, naming the tensor (causallm/io/
weight_check.py), not a sampler error at the first token.

The .bin files are made from res/tiny-llama by tools/hf_to_bin.py (FP32; FP16 with a Q8_0
embedding, the one weight of this model whose rows fit Q8_0 blocks) and then damaged: a
zero-filled file (the right size), a NaN or an infinity in one weight (a float, an FP16 value,
a Q8_0 block's scale), an end never written. A fully connected, embedding or head matrix of
zeros is an error; a norm of zeros is not (the rule in weight_check's docstring). The
safetensors (single or sharded) and GGUF readers check the same: NaN and infinities, and a
matrix of zeros.
"""

import json
import os
import re
import shutil
import struct
import sys

import gguf
import numpy as np
import pytest

from causallm import main
from causallm.errors import CausalLMError
from causallm.io.nntr_bin import bin_nbytes
from causallm.io.weight_check import scan
from causallm.io.weight_check import max_magnitude_bits
from causallm.factory import Factory
from causallm.kernels.packed import PackedMatrix
from causallm.kernels.quant import QTYPES
from ggml_reference import random_blocks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import hf_to_bin  # noqa: E402

TINY = os.path.join(ROOT, "res", "tiny-llama")
GGUF_Q8 = os.path.join(ROOT, "tests", "fixtures", "gguf-llama-q8_0", "model.gguf")
PROMPT = "Strings are"


@pytest.fixture(scope="module")
def bins(tmp_path_factory):
    """{kind: folder} of tiny-llama converted to an FP32 .bin and to an FP16 .bin with a Q8_0
    embedding, each folder's nntr_config.json naming its .bin (hf_to_bin --write-nntr-config)."""
    out = {}
    for kind, embedding in (("FP32", "FP32"), ("FP16", "Q8_0")):
        folder = tmp_path_factory.mktemp(kind) / "tiny-llama"
        shutil.copytree(TINY, folder)
        os.unlink(folder / "model.safetensors")  # only the .bin is read
        hf_to_bin.convert(TINY, str(folder / "model.bin"), kind, False, embedding)
        config = json.loads((folder / "nntr_config.json").read_text())
        config.update(model_file_name="model.bin", model_tensor_type=f"{kind}-FP32",
                      fc_layer_dtype=kind, embedding_dtype=embedding)
        (folder / "nntr_config.json").write_text(json.dumps(config))
        out[kind] = folder
    return out


@pytest.fixture
def copy(bins, tmp_path):
    """A fresh copy of one of the bins' folders, to damage."""
    def make(kind):
        folder = tmp_path / kind
        shutil.copytree(bins[kind], folder)
        return folder
    return make


def model_of(folder):
    model = Factory.Instance().createFromFolder(str(folder), init_seq_len=16, num_to_generate=4)
    model.initialize()
    return model


def layout(folder):
    """{weight: (offset, bytes, dtype)} of the folder's .bin, in graph order."""
    out, offset = {}, 0
    for spec in model_of(folder).model.getWeightSpecs():
        nb = bin_nbytes(spec.shape, spec.dtype)
        out[spec.full_name] = (offset, nb, spec.dtype)
        offset += nb
    return out


def poke(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def load_error(folder):
    model = model_of(folder)
    with pytest.raises(CausalLMError) as e:
        model.load_weight()
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.slow
def test_the_bins_load_and_generate(bins):
    for folder in bins.values():
        model = model_of(folder)
        model.load_weight()
        ids = model.tokenizer.Encode(PROMPT)
        result = model.generate_tokens([ids], max_new_tokens=4, do_sample=False)
        assert len(result.generated_ids[0]) == 4


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["FP32", "FP16"])
def test_a_zero_filled_bin_names_its_first_matrix(copy, kind):
    folder = copy(kind)
    path = folder / "model.bin"
    path.write_bytes(bytes(os.path.getsize(path)))
    assert load_error(folder) == (
        f"{path}: weight 'embedding0:Embedding' at offset 0 is all zeros (the file is "
        f"zero-filled or was not written to the end)")


@pytest.mark.slow
def test_a_bin_whose_end_was_not_written_names_the_first_zero_matrix(copy):
    folder = copy("FP32")
    path = folder / "model.bin"
    where = layout(folder)
    start = where["layer5_ffn_gate:weight"][0]
    poke(path, start, bytes(os.path.getsize(path) - start))
    assert load_error(folder) == (
        f"{path}: weight 'layer5_ffn_gate:weight' at offset {start} is all zeros (the file is "
        f"zero-filled or was not written to the end)")


@pytest.mark.slow
def test_a_norm_of_zeros_is_not_an_error(copy):
    folder = copy("FP32")
    offset, nb, _ = layout(folder)["layer2_ffn_norm:gamma"]
    poke(folder / "model.bin", offset, bytes(nb))
    model = model_of(folder)
    model.load_weight()
    assert not model.model.getWeight("layer2_ffn_norm:gamma").any()


@pytest.mark.slow
@pytest.mark.parametrize("kind,weight,dtype,at,bits", [
    ("FP32", "layer3_wv:weight", "FP32", 4 * 37, struct.pack("<f", float("nan"))),
    ("FP32", "layer0_attention_norm:gamma", "FP32", 4 * 5, struct.pack("<f", float("-inf"))),
    ("FP16", "layer3_wv:weight", "FP16", 2 * 37, struct.pack("<H", 0x7E00)),
    ("FP16", "layer4_ffn_down:weight", "FP16", 2 * 600, struct.pack("<H", 0xFC00)),
    ("FP16", "embedding0:Embedding", "Q8_0", 34 * 9, struct.pack("<H", 0x7C00)),  # block 9's d
], ids=["fp32-nan", "fp32-norm-minus-inf", "fp16-nan", "fp16-minus-inf", "q8_0-scale-inf"])
def test_a_non_finite_value_names_its_weight(copy, kind, weight, dtype, at, bits):
    folder = copy(kind)
    offset, _, stored = layout(folder)[weight]
    assert stored == dtype
    poke(folder / "model.bin", offset + at, bits)
    assert load_error(folder) == (
        f"{folder / 'model.bin'}: weight '{weight}' at offset {offset} holds NaN or infinite "
        f"values (the file is damaged or was converted wrongly)")


@pytest.mark.slow
def test_the_cli_says_it_in_one_line(copy, capsys):
    folder = copy("FP32")
    path = folder / "model.bin"
    path.write_bytes(bytes(os.path.getsize(path)))
    assert main.main([str(folder), PROMPT, "-n", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: {path}: weight 'embedding0:Embedding' at offset 0 is all zeros "
                       f"(the file is zero-filled or was not written to the end)")


# ------------------------------------------------------------------- safetensors and GGUF

def test_a_nan_in_a_safetensors_checkpoint_names_the_tensor(tmp_path):
    folder = tmp_path / "tiny-llama"
    shutil.copytree(TINY, folder)
    path = folder / "model.safetensors"
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    entry = json.loads(blob[8:8 + n])["model.layers.1.mlp.up_proj.weight"]
    assert entry["dtype"] == "BF16"
    poke(path, 8 + n + entry["data_offsets"][0] + 2 * 100, struct.pack("<H", 0x7FC0))
    assert load_error(folder) == (
        f"{path}: tensor 'model.layers.1.mlp.up_proj.weight' holds NaN or infinite values (the "
        f"file is damaged or was converted wrongly)")


@pytest.mark.slow
def test_an_infinite_scale_in_a_gguf_names_the_tensor(tmp_path):
    path = tmp_path / "model.gguf"
    shutil.copy(GGUF_Q8, path)
    tensor = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "blk.1.attn_v.weight")
    assert tensor.tensor_type.name == "Q8_0"
    poke(path, tensor.data_offset + 34 * 3, struct.pack("<H", 0x7C00))  # block 3's scale
    assert load_error(path) == (f"{path}: tensor 'blk.1.attn_v.weight' holds NaN or infinite "
                                f"values (the file is damaged or was converted wrongly)")


def zero_data(path, start):
    """Zeros over ``path`` from byte ``start`` to its end (the size kept)."""
    poke(path, start, bytes(os.path.getsize(path) - start))


def safetensors_data_start(path):
    return 8 + int.from_bytes(open(path, "rb").read(8), "little")


@pytest.mark.slow
def test_a_zero_filled_safetensors_names_its_first_matrix(tmp_path, capsys):
    """A safetensors file whose data is zeros loads as a .bin of zeros does: an error naming
    the first fully connected, embedding or head tensor, in the Python API and the CLI (rc 2),
    before anything runs."""
    folder = tmp_path / "tiny-llama"
    shutil.copytree(TINY, folder)
    path = folder / "model.safetensors"
    zero_data(path, safetensors_data_start(path))
    want = (f"{path}: tensor 'model.embed_tokens.weight' is all zeros (the file is zero-filled "
            f"or was not written to the end)")
    model = model_of(folder)
    with pytest.raises(CausalLMError) as e:
        model.load_weight()
    assert str(e.value) == want
    with pytest.raises(CausalLMError, match=r"load_weight\(\) was not called"):
        model.run(PROMPT, log_output=False)  # the failed load left no weights to run on
    assert main.main([str(folder), PROMPT, "-n", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {want}"


@pytest.mark.slow
def test_a_safetensors_norm_of_zeros_is_not_an_error(tmp_path):
    folder = tmp_path / "tiny-llama"
    shutil.copytree(TINY, folder)
    path = folder / "model.safetensors"
    start = safetensors_data_start(path)
    blob = path.read_bytes()
    entry = json.loads(blob[8:start])["model.layers.2.post_attention_layernorm.weight"]
    begin, end = entry["data_offsets"]
    poke(path, start + begin, bytes(end - begin))
    model = model_of(folder)
    model.load_weight()
    assert not model.model.getWeight("layer2_ffn_norm:gamma").any()


def test_a_zero_filled_shard_names_a_matrix_of_it(tmp_path):
    folder = tmp_path / "sharded"
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "llama-hd80-bf16-sharded"), folder)
    path = folder / "model-00002-of-00002.safetensors"
    zero_data(path, safetensors_data_start(path))
    assert re.fullmatch(rf"{re.escape(str(path))}: tensor 'model\.layers\.0\.mlp\.\w+_proj\."
                        rf"weight' is all zeros \(the file is zero-filled or was not written to "
                        rf"the end\)", load_error(folder))


@pytest.mark.slow
def test_a_zero_filled_gguf_names_its_first_matrix(tmp_path):
    path = tmp_path / "model.gguf"
    shutil.copy(GGUF_Q8, path)
    zero_data(path, min(t.data_offset for t in gguf.GGUFReader(str(path)).tensors))
    assert load_error(path) == (f"{path}: tensor 'token_embd.weight' is all zeros (the file is "
                                f"zero-filled or was not written to the end)")


# --------------------------------------------------------------------------------- the scan

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_scan_against_numpy(dtype):
    """(all finite, any nonzero) as numpy says, for finite, NaN, +-inf, the largest finite
    values, zeros and negative zeros, in arrays of odd sizes and strides."""
    rng = np.random.default_rng(0)
    big = np.finfo(dtype).max
    for values in ([0.0], [-0.0, 0.0], [1e-7, -0.0], [big, -big], [np.nan], [-np.inf, 1.0],
                   [np.inf], list(rng.standard_normal(1001))):
        a = np.array(values * 3, dtype=dtype)
        for view in (a, a[::2], a.reshape(3, -1).T):
            assert scan(view) == (bool(np.isfinite(view).all()), bool(view.any())), view
    bits = rng.integers(0, 2**16, 777, dtype=np.uint16)
    assert max_magnitude_bits(bits, np.uint16(0x7FFF)) == (bits & 0x7FFF).max()
    assert max_magnitude_bits(bits[:0], np.uint16(0x7FFF)) == 0


def test_scan_in_chunks_sees_every_chunk(monkeypatch):
    from causallm.io import weight_check
    monkeypatch.setattr(weight_check, "CHUNK", 100)
    bits = np.zeros(777, np.uint32)
    for at in (0, 99, 100, 699, 700, 776):  # either side of each boundary, and the short tail
        bits[:] = 0
        bits[at] = 0x7F800000 | 0x80000000  # -inf
        assert max_magnitude_bits(bits, np.uint32(0x7FFFFFFF)) == 0x7F800000, at


def test_scan_of_packed_matrices():
    rows = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    for fmt in ("BF16", "F16"):
        packed = PackedMatrix.fromFloat(fmt, rows)
        assert scan(packed) == (True, True)
        assert scan(PackedMatrix.fromFloat(fmt, rows * 0)) == (True, False)
        bits = packed.data.copy()
        bits.flat[7] = 0x7F80 if fmt == "BF16" else 0x7C00  # an infinity
        assert scan(PackedMatrix(fmt, bits)) == (False, True)


@pytest.mark.parametrize("fmt", list(QTYPES))
def test_scan_of_ggml_blocks_reads_every_scale(fmt):
    """A block type: finite and nonzero by its fp16 scales and mins; an infinity or a NaN in any
    of them, in any block, is found; all scales zero is a zero matrix."""
    qt = QTYPES[fmt]
    data = random_blocks(fmt, 5, 512, seed=2)
    assert scan(PackedMatrix(fmt, data)) == (True, True)
    zero = data.copy().reshape(-1, qt.nbytes)
    for o in qt.halves:
        zero[:, o:o + 2] = 0
    assert scan(PackedMatrix(fmt, zero.reshape(data.shape))) == (True, False)
    for o in qt.halves:
        for block, bad in ((0, 0x7C00), (zero.shape[0] - 1, 0xFE00)):  # +inf, a negative NaN
            poked = data.copy().reshape(-1, qt.nbytes)
            poked[block, o:o + 2] = np.array([bad], np.uint16).view(np.uint8)
            assert scan(PackedMatrix(fmt, poked.reshape(data.shape))) == (False, True)
