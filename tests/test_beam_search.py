"""Beam search (causallm/generation/beam.py) against transformers' generate(num_beams=...).

tests/fixtures/beams-{t5,llama,bart,marian}.json (tools/fixtures_beams.py, tools/fixtures_marian.py)
hold, per case,
a fixture folder, the prompt ids, the exact generate() keyword arguments (num_beams,
length_penalty, early_stopping true / false / "never", no_repeat_ngram_size, min_new_tokens,
num_return_sequences, an EOS override that ends some beams early) and transformers' returned
hypotheses (new tokens, cut at each one's length) with their scores. Every case was checked by
its maker to give the same sequences in float64, so no near-tie decides it.
"""

import dataclasses
import json
import os

import pytest
from cli import run_cli
from parity import FIXTURES, load_folder

CASES = []
for family in ("t5", "llama", "bart", "marian"):
    with open(os.path.join(FIXTURES, f"beams-{family}.json")) as f:
        data = json.load(f)
    CASES += data["cases"] if isinstance(data, dict) else data

OPTIONS = ("num_beams", "no_repeat_ngram_size", "min_new_tokens", "num_return_sequences")
"""The cases' generate() keywords that are generation options (causallm/generation/options.py);
length_penalty, early_stopping and eos_token_id are generation_config keys."""


def search(case):
    """Our beam search with the case's settings (set before the graph is built, one row per
    beam); the hypotheses and scores returned."""
    kwargs = case["generate"]
    model = load_folder(case["folder"], num_to_generate=kwargs["max_new_tokens"],
                        init_seq_len=max(64, len(case["prompt_ids"])), initialize=False)
    model.setGenerationOptions(**{k: kwargs[k] for k in OPTIONS if k in kwargs})
    config = {k: kwargs[k] for k in ("length_penalty", "early_stopping") if k in kwargs}
    if "eos_token_id" in kwargs:
        eos = kwargs["eos_token_id"]
        config["eos_token_id"] = eos if isinstance(eos, list) else [eos]
    model.setGenerationSettings(dataclasses.replace(model.generation, **config))
    model.initialize()
    model.load_weight()
    result = model.generate_tokens([case["prompt_ids"]], max_new_tokens=kwargs["max_new_tokens"],
                                   do_sample=False)
    return result.sequences[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_beam_search_gives_transformers_hypotheses(case):
    hyps = search(case)
    assert [h["generated_ids"] for h in hyps] == case["sequences"]
    for h, score in zip(hyps, case["scores"]):
        assert abs(h["score"] - score) <= 1e-4 * max(1.0, abs(score))


def test_some_cases_end_beams_early():
    """The cases cover EOS ending hypotheses before max_new_tokens, with each early_stopping."""
    early = [c for c in CASES if any(len(s) < c["generate"]["max_new_tokens"]
                                     for s in c["sequences"])]
    assert {str(c["generate"]["early_stopping"]) for c in early} >= {"True", "never"}
    assert {c["folder"].split("-")[0] for c in CASES} == {"t5", "llama", "bart", "marian"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["v11-plain", "forced-plain"])
def test_cli_beams_give_transformers_hypotheses(name):
    """``main.py <folder> PROMPT --num-beams 4 --num-return-sequences 4 -n 24 --json`` (T5, and
    BART with its forced BOS and EOS): every hypothesis printed, best first, once the search
    ends, and each with its score in the record (cases whose other settings are the folders'
    defaults)."""
    import numpy as np
    case = next(c for c in CASES if c["name"] == name)
    prompt = str(np.load(os.path.join(FIXTURES, case["folder"], "expected.npz"))["prompt"])
    p = run_cli(os.path.join("tests", "fixtures", case["folder"]), prompt, "--num-beams", "4",
                "--num-return-sequences", "4", "-n", "24", "--json")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.rstrip("\n").split("\n")
    record = json.loads(lines[-1])
    assert record["prompt_ids"] == case["prompt_ids"] and record["num_beams"] == 4
    assert [s["generated_ids"] for s in record["sequences"]] == case["sequences"]
    assert record["generated_ids"] == case["sequences"][0]
    # within the FP16 rounding of the KV cache a half checkpoint gets by default
    assert abs(record["score"] - case["scores"][0]) <= 1e-3
    # every hypothesis, best first, printed once the search ends
    assert lines[-5:-1] == [f"[{k}] ({h['score']:.4f}) {h['text']}"
                            for k, h in enumerate(record["sequences"], 1)]
    assert lines[-5].endswith(record["text"])
