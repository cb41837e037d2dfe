"""Generation controls: the processors and warpers against transformers' own classes
(tests/fixtures/processors.npz, tools/fixtures_processors.py), stop strings on the generator
with the embedded model's tokenizer and through the CLI, and the warnings for
generation_config.json keys that are not applied.
"""

import io
import json
import os
import shutil

import numpy as np
import pytest
from cli import run_cli

from causallm.generation.generator import Generator, Start, StopText
from causallm.generation.processors import build_processors
from causallm.generation.settings import GenerationSettings
from causallm.generation.sampler import Sampler
from causallm.tokenizer import StreamDecoder, Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "res", "tiny-llama")
REF = np.load(os.path.join(ROOT, "tests", "fixtures", "processors.npz"))
CASES = {c["name"]: c["settings"] for c in json.loads(str(REF["cases"]))}
P, EOS = int(REF["prompt_len"]), int(REF["eos"])


def sampler_for(settings: dict, seed=None) -> Sampler:
    s = GenerationSettings(**settings, eos_token_id=[EOS], seed=seed)
    return Sampler(s.temperature, s.top_k, s.top_p, seed=s.seed, do_sample=s.do_sample,
                   processors=build_processors(s, P, P + 100), min_p=s.min_p,
                   typical_p=s.typical_p)


# ----------------------------------------------------------- processors against transformers

@pytest.mark.parametrize("name", list(CASES))
def test_processors_and_warpers_match_transformers(name):
    logits, ids, expected = REF["logits"], REF["ids"], REF[f"expected_{name}"]
    sampler = sampler_for(CASES[name])
    for r in range(logits.shape[0]):
        ours = sampler.process(logits[r].copy(), ids[r].tolist())
        np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(expected[r]),
                                      err_msg=f"{name}, row {r}: the -inf masks differ")
        live = np.isfinite(expected[r])
        np.testing.assert_allclose(ours[live], expected[r][live], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name}, row {r}")


@pytest.mark.parametrize("name", [n for n in CASES if not n.endswith("_off")])
def test_each_fixture_case_changes_the_scores(name):
    """Not vacuous: transformers changed these scores (the "_off" cases are the boundaries
    where min_length / min_new_tokens stop holding the EOS back)."""
    assert not np.array_equal(REF[f"expected_{name}"], REF["logits"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["min_p_03", "typical_05", "typical_02_temperature",
                                  "chain_sample", "penalties_sample"])
def test_sampling_never_draws_a_token_transformers_removes(name):
    logits, ids, expected = REF["logits"], REF["ids"], REF[f"expected_{name}"]
    allowed = [set(np.flatnonzero(np.isfinite(row))) for row in expected]
    drawn = [set() for _ in allowed]
    for seed in range(300):
        chosen = sampler_for(CASES[name], seed).select(logits, ids.tolist())
        for r, token in enumerate(chosen):
            drawn[r].add(int(token))
    for r in range(len(allowed)):
        assert drawn[r] <= allowed[r], f"row {r} drew removed tokens {drawn[r] - allowed[r]}"
        # with 300 draws, every kept token of mass >= 5 % shows up
        p = np.exp(expected[r][list(allowed[r])].astype(np.float64))
        p /= p.sum()
        frequent = {t for t, q in zip(allowed[r], p) if q >= 0.05}
        assert frequent <= drawn[r]


# ------------------------------------------------------------------------------ stop strings

TOKENIZER = Tokenizer.FromFile(os.path.join(TINY, "tokenizer.json"))
TEXT = "The little cat sat on the warm mat, and the dog looked at the cat."


class Scripted:
    """A Generative that makes the row b choose ``scripts[b][i]`` at step i (one-hot logits)."""

    BATCH_SIZE = 1

    def __init__(self, *scripts, vocab=4003):
        self.scripts, self.vocab, self.i = scripts, vocab, 0
        self.BATCH_SIZE = len(scripts)

    def logits(self):
        out = np.zeros((len(self.scripts), self.vocab), dtype=np.float32)
        for b, script in enumerate(self.scripts):
            out[b, script[min(self.i, len(script) - 1)]] = 1.0
        return out

    def start(self, prompt_ids, start_pos, context_ids, metrics):
        self.i = 0
        return Start(self.logits(), [list(map(int, r)) for r in prompt_ids], 1000)

    def step(self, tokens):
        self.i += 1
        return self.logits()


def pieces(ids):
    """The text each token adds, as the generator's stream decoder gives it."""
    decoder = StreamDecoder(TOKENIZER)
    return [decoder.step(t) for t in ids]


def generate(scripts, stop_strings, n, on_token=None):
    stream = io.StringIO()
    settings = GenerationSettings(stop_strings=stop_strings, eos_token_id=[4002])
    result = Generator(Scripted(*scripts), settings, TOKENIZER, stream).generate(
        [[1]] * len(scripts), n, on_token=on_token)
    return result, stream.getvalue()


def test_stop_string_spanning_tokens_ends_generation_and_is_never_shown():
    ids = TOKENIZER.Encode(TEXT)
    texts = pieces(ids)
    k = next(i for i in range(1, len(ids) - 1) if len(texts[i]) >= 3 and len(texts[i + 1]) >= 3)
    stop = texts[k][-2:] + texts[k + 1][:2]          # the end of one token, the start of the next
    full = "".join(texts)
    assert full.find(stop) == len("".join(texts[:k])) + len(texts[k]) - 2  # first occurs there
    result, streamed = generate([ids], [stop], len(ids))
    assert result.finish_reasons == ["stop"]
    assert result.generated_ids[0] == ids[:k + 2]    # the token that completed it ends the row
    assert result.texts[0] == full[:full.find(stop)]
    assert streamed == result.texts[0]  # the stream carries the text alone


def test_a_held_prefix_is_released_when_no_stop_string_follows():
    ids = TOKENIZER.Encode(TEXT)
    texts = pieces(ids)
    k = next(i for i in range(1, len(ids)) if len(texts[i]) >= 3)
    stop = texts[k] + "\u2603"                       # starts like token k's text, never completed
    seen = []
    stream = io.StringIO()

    def snapshot(b, token):
        seen.append(stream.getvalue())

    settings = GenerationSettings(stop_strings=[stop], eos_token_id=[4002])
    result = Generator(Scripted(ids), settings, TOKENIZER, stream).generate(
        [[1]], len(ids), on_token=snapshot)
    before_k = "".join(texts[:k])
    # on_token runs before the token's text is shown: seen[k + 1] is the stream after token k
    assert seen[k + 1] == before_k                   # token k's text is held back ...
    assert result.texts[0] == "".join(texts)         # ... then released
    assert stream.getvalue() == "".join(texts)
    assert result.finish_reasons == ["length"]


def test_stop_strings_per_batch_row():
    a = TOKENIZER.Encode(TEXT)
    b = TOKENIZER.Encode("A sunny day in the quiet park by the lake, where the children played "
                         "and the birds sang all afternoon long.")
    n = len(a)
    assert len(b) >= n
    result, _ = generate([a[:n], b[:n]], ["the dog", "xyz"], n)
    full_a = "".join(pieces(a[:n]))
    assert "the dog" in full_a
    assert result.finish_reasons == ["stop", "length"]
    assert result.texts[0] == full_a[:full_a.find("the dog")]
    assert result.texts[1] == "".join(pieces(b[:n]))
    assert len(result.generated_ids[0]) < n == len(result.generated_ids[1])


def test_stop_text_earliest_occurrence_and_overlaps():
    stop = StopText(["aab", "b"])
    assert stop.feed("xa") == ("x", False)           # "a" may start "aab"
    assert stop.feed("a") == ("", False)             # "aa" too
    assert stop.feed("ab") == ("a", True)            # "aaab": "aab" at 1 (before the "b" at 3)
    stop = StopText(["END"])
    assert stop.feed("the E") == ("the ", False)
    assert stop.feed("ND and more") == ("", True)
    stop = StopText(["<|x|>"])
    assert stop.feed("a <|") == ("a ", False)
    assert stop.feed("y") == ("<|y", False)          # not a stop string after all
    assert stop.release() == ""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.path.join(TINY, "model.safetensors")),
                    reason="res/tiny-llama/model.safetensors is not there")
def test_cli_stop_ends_before_the_stop_string():
    base = run_cli(TINY, "Once upon a time", "--greedy", "-n", 40, "--json")
    assert base.returncode == 0, base.stderr
    text = json.loads(base.stdout.splitlines()[-1])["text"]
    assert len(text) >= 30, text
    stop = text[20:26]                               # surely occurs: the greedy run wrote it
    p = run_cli(TINY, "Once upon a time", "--greedy", "-n", 40, "--json", "--stop", stop,
                "--stop", "\u2603never")
    assert p.returncode == 0, p.stderr
    streamed, line = p.stdout[:-1].rsplit("\n", 1)
    record = json.loads(line)
    assert record["finish_reason"] == "stop"
    assert record["text"] == streamed == text[:text.find(stop)]
    assert stop not in p.stdout.replace(line, "")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.path.join(TINY, "model.safetensors")),
                    reason="res/tiny-llama/model.safetensors is not there")
def test_beam_search_cuts_each_hypothesis_at_the_stop_string(capsys):
    from causallm import main
    def beams(*extra):
        capsys.readouterr()
        rc = main.main([TINY, "Once upon a time", "--num-beams", "3", "--num-return-sequences",
                        "2", "-n", "16", "--json", *extra])
        out, err = capsys.readouterr()
        assert rc == 0, err
        return json.loads(out.splitlines()[-1])

    base = beams()
    text = base["text"]
    assert len(text) >= 13, text
    stop = text[8:13]
    record = beams("--stop", stop)
    assert record["finish_reason"] == "stop"
    assert record["text"] == text[:text.find(stop)]
    assert record["generated_ids"] == base["generated_ids"]   # the search is the same
    for ours, theirs in zip(record["sequences"], base["sequences"]):
        cut = theirs["text"].find(stop)
        assert ours["text"] == (theirs["text"] if cut < 0 else theirs["text"][:cut])


# ---------------------------------------------------------------- generation_config warnings

@pytest.mark.slow
def test_unapplied_generation_config_keys_warn_once_each(tmp_path, capsys):
    from causallm import main
    folder = tmp_path / "tiny"
    shutil.copytree(TINY, folder)
    path = folder / "generation_config.json"
    config = json.loads(path.read_text())
    config.update(guidance_scale=1.5, epsilon_cutoff=0.01, pad_token_id=0, min_p=0.05,
                  stop_strings="###", _from_model_config=True)
    path.write_text(json.dumps(config))
    capsys.readouterr()
    assert main.main([str(folder), "Once upon a time", "-n", "3", "--temp", "0.8"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert sorted(warnings) == [
        "warning: generation_config.json: 'epsilon_cutoff' is not applied",
        "warning: generation_config.json: 'guidance_scale' is not applied"]


def test_generation_config_controls_are_read(tmp_path):
    from causallm.factory import Factory

    folder = tmp_path / "tiny"
    shutil.copytree(TINY, folder, ignore=shutil.ignore_patterns("model.safetensors"))
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "min_p": 0.05,
                                "typical_p": 0.9, "stop_strings": "###"}))
    settings = Factory.Instance().createFromFolder(str(folder)).generationSettings()
    assert (settings.min_p, settings.typical_p, settings.stop_strings) == (0.05, 0.9, ["###"])


@pytest.mark.slow
def test_max_new_tokens_is_the_default_length(tmp_path, capsys):
    """generation_config's max_new_tokens gives the number of new tokens when nntr_config sets
    no num_to_generate (transformers' default for the folder); -n still wins."""
    from causallm import main
    folder = tmp_path / "tiny"
    shutil.copytree(TINY, folder)
    nntr = json.loads((folder / "nntr_config.json").read_text())
    del nntr["num_to_generate"]
    (folder / "nntr_config.json").write_text(json.dumps(nntr))
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_new_tokens": 5}))
    for extra, n in (((), 5), (("-n", "7"), 7)):
        capsys.readouterr()
        assert main.main([str(folder), "Strings are", "--greedy", "--json", *extra]) == 0
        out, err = capsys.readouterr()
        record = json.loads(out.splitlines()[-1])
        assert (len(record["generated_ids"]), record["finish_reason"]) == (n, "length")
        assert "max_new_tokens" not in err


# ------------------------------------------------------------------------------- CLI flags

@pytest.mark.parametrize("flag, value", [
    ("--min-p", "1.5"), ("--min-p", "-0.1"), ("--typical-p", "0"), ("--typical-p", "1.2"),
    ("--presence-penalty", "nan"), ("--frequency-penalty", "inf"),
    ("--no-repeat-ngram-size", "-1"), ("--min-new-tokens", "-2"), ("--stop", "")])
def test_bad_control_flags_are_one_error_line(capsys, flag, value):
    from causallm import main
    capsys.readouterr()
    rc = main.main([TINY, "hi", flag, value])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], err
