"""BART (models/bart/bart.py) against transformers' numbers.

Fixtures (tools/fixtures_bart.py): bart-forced (F32, encoder 4 heads / decoder 6 heads, so
head_dim differs between the stacks, ffn 96 / 80, 2 / 3 layers, forced BOS and EOS, a 48-token
prompt) and bart-scaled (BF16, scale_embedding, the embedding copies in the file, forced EOS, an
11-token prompt); random final_logits_bias in both. The encoder output, the raw decoder logits
at 32 cached steps and no-cache recomputes: tests/test_seq2seq_parity.py; here transformers'
greedy tokens (forced ones included), the stacks' shapes, the CLI and bad configs.
"""

import json
import os
import shutil

import numpy as np
import pytest
from cli import run_cli
from parity import (
    FIXTURES,
    load_folder,
)

from causallm.errors import CausalLMError
from causallm.factory import Factory

NAMES = ["bart-forced", "bart-scaled"]


def expected(name):
    return np.load(os.path.join(FIXTURES, name, "expected.npz"))


@pytest.fixture(scope="module", params=NAMES)
def case(request):
    return request.param, load_folder(request.param), expected(request.param)


def test_prompt_ids_are_the_tokenizers(case):
    name, model, ref = case
    ids = model.tokenizer.Encode(str(ref["prompt"]))
    assert ids == ref["prompt_ids"].tolist() and ids[0] == 0 and ids[-1] == 2  # <s> ... </s>


def test_greedy_tokens_with_forced_bos_and_eos(case):
    name, model, ref = case
    result = model.generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=32,
                                   do_sample=False)
    assert result.generated_ids[0] == ref["tokens"].tolist()
    assert result.generated_ids[0][-1] == 2  # forced EOS at the last step
    if name == "bart-forced":  # forced BOS: the raw argmax of step 0 is another token
        assert model.generation.forced_bos_token_id == 0 and result.generated_ids[0][0] == 0
        assert int(np.argmax(ref["step_logits"][0])) != 0


def test_stacks_have_their_own_heads_and_widths():
    model = load_folder("bart-forced")
    assert (model.ENCODER_NUM_HEADS, model.DECODER_NUM_HEADS) == (4, 6)
    assert (model.ENCODER_HEAD_DIM, model.DECODER_HEAD_DIM) == (12, 8)
    shapes = {s.full_name: s.shape for s in model.model.getWeightSpecs()}
    assert shapes["encoder_layer0_ffn_up:weight"] == (48, 96)
    assert shapes["decoder_layer0_ffn_up:weight"] == (48, 80)
    assert shapes["encoder_position_embedding:Embedding"] == (66, 48)  # 64 positions + offset 2
    assert shapes["final_logits_bias:bias"] == (2501,)
    names = model.model.getLayerNames()
    assert "encoder_output_norm" not in names and "decoder_layer2_decoder_output" in names


def test_cli_greedy_json():
    name = "bart-forced"
    ref = expected(name)
    p = run_cli(os.path.join("tests", "fixtures", name), str(ref["prompt"]), "--greedy", "-n",
                "32", "--json")
    assert p.returncode == 0, p.stderr
    record = json.loads(p.stdout.rstrip("\n").rsplit("\n", 1)[-1])
    assert record["architecture"] == "BartForConditionalGeneration"
    assert record["generated_ids"] == ref["tokens"].tolist()
    assert record["finish_reason"] == "eos"


def test_untied_bart_is_a_one_line_error(tmp_path):
    folder = tmp_path / "bart"
    shutil.copytree(os.path.join(FIXTURES, "bart-scaled"), folder)
    cfg = json.load(open(folder / "config.json"))
    cfg["tie_word_embeddings"] = False
    json.dump(cfg, open(folder / "config.json", "w"))
    with pytest.raises(CausalLMError, match="'tie_word_embeddings' must be true"):
        Factory.Instance().createFromFolder(str(folder))
