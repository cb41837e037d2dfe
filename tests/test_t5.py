"""T5 (models/t5/t5.py) on the staged engine against transformers' numbers.

Fixtures (tools/fixtures_t5.py; keys in its docstring): t5-relu-tied (original T5: relu, tied
and scaled head, 2 encoder / 3 decoder layers, a 153-token prompt past max_distance 128),
t5-v11-gated-untied (v1.1: gated-gelu, untied head in the real v1.1 file layout, 3 / 2 layers,
8 buckets and max_distance 20, so encoder and decoder buckets saturate), t5-flan-short (Flan
style with the CLI example prompt). The encoder output, the decoder logits at every one of 32
cached steps and no-cache recomputes: tests/test_seq2seq_parity.py; here the greedy tokens, the
stages and caches, .bin round trips, the CLI and bad configs.
"""

import json
import os
import sys

import numpy as np
import pytest
from cli import run_cli
from parity import (
    FIXTURES,
    ROOT,
    assert_logits_close,
    decoder_sequence,
    load_folder,
)

from causallm.errors import CausalLMError
from causallm.io.safetensors import Checkpoint
from causallm.factory import Factory

NAMES = ["t5-relu-tied", "t5-v11-gated-untied", "t5-flan-short"]


def expected(name):
    return np.load(os.path.join(FIXTURES, name, "expected.npz"))


load = load_folder


@pytest.fixture(scope="module", params=NAMES)
def case(request):
    return request.param, load(request.param), expected(request.param)


@pytest.mark.slow
def test_prompt_ids_are_the_tokenizers_with_its_eos(case):
    name, model, ref = case
    ids = model.tokenizer.Encode(str(ref["prompt"]))
    assert ids == ref["prompt_ids"].tolist() and ids[-1] == 1  # the post-processor's </s>


def test_every_step_is_the_argmax(case):
    """T5 forces nothing: each cached step's argmax is transformers' greedy token (the logits
    themselves: tests/test_seq2seq_parity.py)."""
    name, model, ref = case
    model.encode(ref["prompt_ids"][None])
    seq = decoder_sequence(ref)
    for k, token in enumerate(ref["tokens"]):
        assert int(np.argmax(model.decode(np.array([[seq[k]]]), k)[0])) == token


def test_greedy_generation(case):
    name, model, ref = case
    result = model.generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=len(ref["tokens"]),
                                   do_sample=False)
    assert result.generated_ids[0] == ref["tokens"].tolist()
    m = result.metrics
    assert (m.encode_tokens, m.prefill_tokens, m.generation_tokens) == (
        len(ref["prompt_ids"]), 1, len(ref["tokens"]) - 1)


def test_fixtures_reach_past_max_distance():
    """The buckets saturate: prompts (and for v1.1 the decoder) span more than max_distance."""
    for name in NAMES:
        cfg = json.load(open(os.path.join(FIXTURES, name, "config.json")))
        distance = cfg.get("relative_attention_max_distance", 128)
        ref = expected(name)
        if name != "t5-flan-short":
            assert len(ref["prompt_ids"]) > distance, name
    cfg = json.load(open(os.path.join(FIXTURES, "t5-v11-gated-untied", "config.json")))
    assert len(expected("t5-v11-gated-untied")["tokens"]) > cfg["relative_attention_max_distance"]


# ---------------------------------------------------------------------------------- the graph
@pytest.mark.slow
def test_stages_names_and_caches():
    model = load("t5-relu-tied")
    graph = model.model
    assert graph.getStageNames() == ["encoder", "decoder"]
    encoder = graph.getLayerNames("encoder")
    # the decoder's cross-attention K and V are projected by the encoder stage, once per prompt
    for i in range(model.NUM_DECODER_LAYERS):
        assert f"decoder_layer{i}_cross_wk" in encoder and f"decoder_layer{i}_cross_wv" in encoder
        assert f"decoder_layer{i}_cross_wq" in graph.getLayerNames("decoder")
    assert "encoder_layer1_ffn_down" in encoder and "encoder_output_norm" in encoder
    cross = graph.getKVCaches("cross")
    assert [c.owner for c in cross] == [f"decoder_layer{i}_cross_attention"
                                        for i in range(model.NUM_DECODER_LAYERS)]
    # the encoder's attention (bidirectional, no RoPE) reads its K and V directly: no cache
    assert [c.stage for c in graph.getKVCaches("self")] == ["decoder"] * 3
    ref = expected("t5-relu-tied")
    model.encode(ref["prompt_ids"][None])
    assert all(c.length == len(ref["prompt_ids"]) for c in cross)


@pytest.mark.slow
def test_weights_bin_round_trip_and_export(tmp_path):
    """save_weight writes a .bin in graph order (the shared embedding once); loading it gives
    the same logits; bin_to_hf writes back the checkpoint's tensors under their names."""
    name = "t5-v11-gated-untied"
    model = load(name)
    path = str(tmp_path / "t5.bin")
    model.save_weight(path)
    n = sum(int(np.prod(s.shape)) for s in model.model.getWeightSpecs())
    assert os.path.getsize(path) == 4 * n
    again = load(name, weights=path)
    ref = expected(name)
    for m in (model, again):
        m.encode(ref["prompt_ids"][None])
    # the same weights, laid out [in, out] in the .bin: the kernels sum in another order
    assert_logits_close(again.decode(np.array([[0]]), 0)[0], model.decode(np.array([[0]]), 0)[0],
                        ".bin vs safetensors", rtol=1e-5)

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import bin_to_hf
    out = tmp_path / "hf"
    bin_to_hf.export(os.path.join(FIXTURES, name), path, str(out))
    original, written = Checkpoint(os.path.join(FIXTURES, name)), Checkpoint(str(out))
    copies = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
    assert set(written.keys()) == set(original.keys()) - copies
    for key in written.keys():
        np.testing.assert_array_equal(written.get(key), original.get(key), err_msg=key)


@pytest.mark.slow
def test_tied_checkpoint_has_no_head_and_untied_one_reads_its_own():
    tied, untied = load("t5-relu-tied"), load("t5-flan-short")
    assert "lm_head.weight" not in tied.getHFWeightMap() and tied.LM_HEAD_SCALE == 64 ** -0.5
    (head,) = untied.getHFWeightMap()["lm_head.weight"]
    assert head.target == "output_of_encoder_decoder:weight" and untied.LM_HEAD_SCALE == 1.0


# ---------------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize("name", NAMES)
def test_cli_greedy_json(name):
    """``main.py <T5 folder> PROMPT --greedy -n 24 --json`` gives transformers' tokens; the
    metrics report the encoder pass apart from the decoder's prefill and steps."""
    ref = expected(name)
    p = run_cli(os.path.join("tests", "fixtures", name), str(ref["prompt"]), "--greedy", "-n", 24,
                "--json")
    assert p.returncode == 0, p.stderr
    *text, last = p.stdout.rstrip("\n").split("\n")
    record = json.loads(last)
    assert record["architecture"] == "T5ForConditionalGeneration"
    assert record["prompt_ids"] == ref["prompt_ids"].tolist()
    assert record["generated_ids"] == ref["tokens"][:24].tolist()
    assert "\n".join(text) == record["text"] and record["finish_reason"] == "length"
    assert record["encode"]["tokens"] == len(ref["prompt_ids"])
    assert record["prefill"]["tokens"] == 1 and record["generation"]["tokens"] == 23
    assert "encode: " in p.stderr and "prefill: 1 tokens" in p.stderr


def test_cli_example_prompt():
    assert str(expected("t5-flan-short")["prompt"]) == \
        "translate English to German: The house is small."


def test_batch_rows_decode_alike():
    name = "t5-v11-gated-untied"
    ref = expected(name)
    model = load(name, batch_size=2)
    result = model.generate_tokens([ref["prompt_ids"].tolist()] * 2, max_new_tokens=12,
                                   do_sample=False)
    assert result.generated_ids == [ref["tokens"][:12].tolist()] * 2


def test_long_prompt_is_a_one_line_error():
    p = run_cli(os.path.join("tests", "fixtures", "t5-relu-tied"), "word " * 2100, "-n", 4)
    assert p.returncode == 2
    assert p.stderr.startswith("error: the prompt has ") and "init_seq_len" in p.stderr
    assert p.stderr.count("\n") == 1


def test_bad_feed_forward_proj_is_a_one_line_error(tmp_path):
    import shutil
    folder = tmp_path / "t5"
    shutil.copytree(os.path.join(FIXTURES, "t5-flan-short"), folder)
    cfg = json.load(open(folder / "config.json"))
    cfg["feed_forward_proj"] = "gated-fancy"
    json.dump(cfg, open(folder / "config.json", "w"))
    with pytest.raises(CausalLMError, match="'feed_forward_proj' must be 'ACT' or 'gated-ACT'"):
        Factory.Instance().createFromFolder(str(folder))
