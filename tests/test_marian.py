"""Marian (models/marian/marian.py) against transformers' numbers.

Fixtures (tools/fixtures_marian.py; its tokenizer.json made by tools/marian_tokenizer.py from
the folder's source.spm and vocab.json): marian-positions-in-file (F32, the position tables in
the file as converted opus-mt checkpoints hold them, a 46-token prompt with characters the
normalizer rewrites and a target-only piece) and marian-no-positions (BF16, no position tables,
as transformers saves, a language code in the prompt, <pad> biased to be the raw argmax at six
steps). Both: encoder 2 / decoder 3 layers with their own ffn widths, swish, <pad> as decoder
start masked by bad_words_ids, forced EOS, renormalize_logits and num_beams 4 in
generation_config.json as opus-mt ships them. The encoder output, the raw decoder logits at 32
cached steps and no-cache recomputes: tests/test_seq2seq_parity.py; here the tokenizer, the
positions, greedy tokens, the CLI, .bin round trips and bad folders.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from cli import run_cli
from parity import FIXTURES, ROOT, load_folder

from causallm.errors import CausalLMError
from causallm.io.safetensors import Checkpoint, write_safetensors
from causallm.factory import Factory
from causallm.layers.sinusoidal_embedding import sinusoid_table

NAMES = ["marian-positions-in-file", "marian-no-positions"]


def expected(name):
    return np.load(os.path.join(FIXTURES, name, "expected.npz"))


@pytest.fixture(scope="module", params=NAMES)
def case(request):
    name = request.param
    return name, load_folder(name), expected(name)


def test_prompt_ids_are_marian_tokenizers(case):
    name, model, ref = case
    ids = model.tokenizer.Encode(str(ref["prompt"]))
    assert ids == ref["prompt_ids"].tolist() and ids[-1] == 0  # </s> appended


def test_positions_are_transformers_sinusoid(case):
    name, model, ref = case
    table = sinusoid_table(model.MAX_POSITION_EMBEDDINGS, model.DIM)
    np.testing.assert_array_equal(table, ref["positions"])


def test_greedy_tokens_mask_pad_and_force_eos(case):
    name, model, ref = case
    result = model.generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=32,
                                   do_sample=False)
    assert result.generated_ids[0] == ref["tokens"].tolist()
    assert result.generated_ids[0][-1] == 0 and 1253 not in result.generated_ids[0]
    if name == "marian-no-positions":  # the pad bias makes <pad> the raw argmax at some steps
        assert (np.argmax(ref["step_logits"], axis=1) == 1253).sum() >= 1


def test_a_wrong_position_table_in_the_file_is_an_error(tmp_path):
    folder = tmp_path / "marian"
    shutil.copytree(os.path.join(FIXTURES, "marian-positions-in-file"), folder)
    path = folder / "model.safetensors"
    ckpt = Checkpoint(str(folder))
    tensors = {n: np.array(ckpt.get(n)) for n in ckpt.keys()}
    name = "model.decoder.embed_positions.weight"
    tensors[name] *= np.float32(0.5)  # transformers would load it halved, as stored
    del ckpt
    write_safetensors(str(path), tensors)
    model = Factory.Instance().createFromFolder(str(folder), init_seq_len=64)
    model.initialize()
    with pytest.raises(CausalLMError, match=f"'{name}' differs from the sinusoidal positions"):
        model.load_weight()


@pytest.mark.slow
def test_a_folder_without_tokenizer_json_names_the_converter_and_it_works(tmp_path):
    name = "marian-no-positions"
    folder = tmp_path / "opus-mt"
    shutil.copytree(os.path.join(FIXTURES, name), folder)
    os.remove(folder / "tokenizer.json")
    with pytest.raises(CausalLMError, match="tokenizer file not found.*tools/marian_tokenizer.py"):
        Factory.Instance().createFromFolder(str(folder))
    p = run_cli(folder, "Hello")
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1
    assert p.stderr.startswith("error: ") and "tools/marian_tokenizer.py" in p.stderr
    p = subprocess.run([sys.executable, os.path.join("tools", "marian_tokenizer.py"),
                        str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    with open(folder / "tokenizer.json", "rb") as a, \
            open(os.path.join(FIXTURES, name, "tokenizer.json"), "rb") as b:
        assert a.read() == b.read()
    model = Factory.Instance().createFromFolder(str(folder))
    ref = expected(name)
    assert model.tokenizer.Encode(str(ref["prompt"])) == ref["prompt_ids"].tolist()


def test_separate_vocabularies_are_a_one_line_error(tmp_path):
    folder = tmp_path / "marian"
    shutil.copytree(os.path.join(FIXTURES, "marian-no-positions"), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["share_encoder_decoder_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CausalLMError, match="'share_encoder_decoder_embeddings'"):
        Factory.Instance().createFromFolder(str(folder))


def cli_record(name, *options):
    """``main.py tests/fixtures/<name> PROMPT *options --json``: the record of its last line."""
    p = run_cli(os.path.join(FIXTURES, name), str(expected(name)["prompt"]), *options, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.rstrip("\n").rsplit("\n", 1)[-1])


def test_cli_greedy():
    record = cli_record("marian-no-positions", "--greedy", "-n", "32")
    assert record["architecture"] == "MarianMTModel"
    assert record["generated_ids"] == expected("marian-no-positions")["tokens"].tolist()
    assert record["finish_reason"] == "eos"


@pytest.mark.slow
def test_cli_searches_the_beams_generation_config_asks_for():
    with open(os.path.join(FIXTURES, "beams-marian.json")) as f:
        cases = json.load(f)
    cases = cases["cases"] if isinstance(cases, dict) else cases
    beam = next(c for c in cases if c["name"] == "beam4-defaults")
    assert beam["generate"]["num_beams"] == 4 and beam["generate"]["max_new_tokens"] == 24
    record = cli_record(beam["folder"], "-n", "24")
    assert record["num_beams"] == 4
    assert record["generated_ids"] == beam["sequences"][0]
    assert abs(record["score"] - beam["scores"][0]) <= 1e-4 * abs(beam["scores"][0])


@pytest.mark.slow
def test_weights_bin_round_trip_and_export(tmp_path):
    """.bin and back: the tensors under their names (position tables left out, as transformers
    saves), the tokenizer files beside them, the same greedy tokens."""
    name = "marian-positions-in-file"
    model = load_folder(name)
    path = str(tmp_path / "marian.bin")
    model.save_weight(path)
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import bin_to_hf
    out = tmp_path / "hf"
    bin_to_hf.export(os.path.join(FIXTURES, name), path, str(out))
    original, written = Checkpoint(os.path.join(FIXTURES, name)), Checkpoint(str(out))
    positions = {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}
    assert set(written.keys()) == set(original.keys()) - positions
    for key in written.keys():
        np.testing.assert_array_equal(written.get(key), original.get(key), err_msg=key)
    assert {"source.spm", "target.spm", "vocab.json", "tokenizer.json"} <= set(os.listdir(out))
    ref = expected(name)
    result = load_folder(str(out)).generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=32,
                                               do_sample=False)
    assert result.generated_ids[0] == ref["tokens"].tolist()
