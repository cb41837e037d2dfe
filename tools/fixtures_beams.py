"""Record transformers' beam search on existing fixture folders: tests/fixtures/beams-*.json.

No model is made here: each case loads a folder that tools/fixtures_t5.py,
tools/fixtures_bart.py or tools/make_fixtures.py already wrote
(``from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")``, eval mode, no
grad, one torch thread), runs
``model.generate(torch.tensor([prompt_ids]), **case["generate"], return_dict_in_generate=True,
output_scores=True)`` and stores what comes back.

    beams-t5.json     T5ForConditionalGeneration folders (decoding starts from
                      decoder_start_token_id 0, so decoder_prompt_len is 1)
    beams-llama.json  LlamaForCausalLM folders (decoder only: decoder_prompt_len is the prompt
                      length, and the prompt's n-grams count for no_repeat_ngram_size)
    beams-bart.json   BartForConditionalGeneration folders (decoding starts from
                      decoder_start_token_id 2; their generation configs force the EOS 2 at
                      max length and, for bart-forced, the BOS 0 at the first step, so each
                      hypothesis runs to max_new_tokens and ends on the forced EOS)

File layout: {"transformers_version": str, "cases": [case, ...]}, each case

    name                a short label
    folder              the fixture folder under tests/fixtures/
    prompt_from         where prompt_ids come from (text)
    prompt_ids          the encoder input (T5) or the prompt (Llama): the folder's
                        expected.npz prompt_ids, their first n ids, or the first n words of its
                        expected.npz prompt encoded with its tokenizer.json (tokenizers library,
                        ``</s>`` appended)
    generate            the exact keyword arguments given to model.generate besides the prompt,
                        the two output flags and (T5) the cache below: num_beams,
                        max_new_tokens, length_penalty, early_stopping (true, false or
                        "never"), no_repeat_ngram_size (0 = off), min_new_tokens (0 = off),
                        num_return_sequences, do_sample false and, where overridden,
                        eos_token_id (a list)
    decoder_prompt_len  the decoder input length when decoding starts (T5 1, Llama P)
    eos_token_id        the EOS id(s) in effect: the override, else the folder's (T5 1, Llama
                        4002; these random models never emit them)
    sequences           one list per returned hypothesis, best first: its NEW token ids (T5:
                        without the decoder start token; Llama: without the prompt), cut at
                        the hypothesis' own length (its count of output.beam_indices >= 0), i.e.
                        without the filler generate() pads shorter ones with (eos_token_id[0]
                        for both families: pad_token_id is None for Llama and 0, falsy, for T5);
                        a hypothesis that ended on EOS has it last
    scores              output.sequences_scores: sum over the hypothesis' tokens (EOS included)
                        of log_softmax(float32 logits)[token], divided by len(hypothesis) **
                        length_penalty (checked against a no-cache forward, rescore())
    eos_ended           per hypothesis, whether it ended on an EOS id (the others ran to
                        max_new_tokens)
    steps               how many decoding steps generate() ran (len(output.scores)); fewer
                        than max_new_tokens when the search stopped early

Cases, num_beams 4 and max_new_tokens 24 unless stated (printed, with their margins, by the
script):

    T5                                      Llama
    v11-plain, v11-beams2, v11-beams5       yarn-plain, yarn-beams2, yarn-beams5
      (1) and (7): length_penalty 1.0, early_stopping false, num_beams 4 / 2 / 5, every beam
      returned
    flan-lp2                                yarn-lp2
      (2) length_penalty 2.0, 3 returned
    relu-lp05-ngram2                        yarn-lp05-ngram3
      (3) length_penalty 0.5, no_repeat_ngram_size 2 / 3 (it changes the result)
    flan-eos-early                          gqa3-eos-early
      (4) EOS override, early_stopping true, 4 returned: all end on EOS, at different lengths
      (T5 3, 11, 4, 1; Llama 11, 18, 16, 3), the search stops once 4 are finished
    flan-eos-lp13                           gqa3-eos-lp13
      (5) the same override, early_stopping false, length_penalty 1.3, 4 returned (T5: one
      ended on EOS; Llama: none can, see below, but the override changes the result)
    flan-eos-never-min6                     gqa3-eos-never-min6
      (6) the same override, early_stopping "never", length_penalty 1.5, min_new_tokens 6, 4
      returned (T5: min_new_tokens removes a 3-token hypothesis; Llama: no effect)
                                            gqa3-eos-never-lp05-min6
      (6b) as (6) with length_penalty 0.5, where min_new_tokens matters for Llama too
                                            gqa3-eos2-stop, gqa3-eos2-never
      (8) another override: early_stopping false's heuristic ends the search at step 18 with
      4 EOS-ended hypotheses, "never" goes on and returns better ones

    BART: forced-plain (as (1), 4 returned), forced-lp05-ngram2 (length_penalty 0.5,
    no_repeat_ngram_size 2, 2 returned; the ban changes the result), scaled-lp2 (bart-scaled,
    length_penalty 2.0, 3 returned). A forced token's log-probability after the processors is
    0, so it adds nothing to the score (rescore() leaves it out).

The EOS overrides are tokens the beams produce early (found by inspecting the plain runs);
the real EOS is kept in the Llama lists. On these random Llama models every next-token
distribution is close to uniform (best log-probability -2 to -5), so with length_penalty > 1
a short EOS-ended hypothesis can never beat the 24-token ones: hence no EOS-ended result in
gqa3-eos-lp13 and no min_new_tokens effect in gqa3-eos-never-min6, and the extra case (6b).
Without EOS all hypotheses have max_new_tokens tokens and length_penalty only rescales the
scores (yarn-lp2 returns yarn-plain's first three hypotheses).

Checks (the script fails otherwise): each case is re-run with the model in float64
(model.double(), same inputs; generate() still takes a float32 log_softmax) and must return the
same sequences with scores within F64_TOL; each score must be reproduced by rescore(); each
hypothesis either ran to max_new_tokens or ended on EOS after min_new_tokens; and each case's
"checks" (see check()) hold: an EOS-ended hypothesis, different lengths, or a different result
with early_stopping / eos_token_id / no_repeat_ngram_size / min_new_tokens changed.

Margins (printed, not stored; float32 run, log-probability units, null where the decision never
came up): topk = smallest gap between the num_beams-th and (num_beams+1)-th best accumulated
candidate (beam score + next-token log-probability, over beams x vocab) at any step; running =
the same among the candidates that do not end a hypothesis (the beams kept alive; last step
excluded); finished = between the num_beams-th and (num_beams+1)-th finished candidate when
both are real; stop = distance of the early-stop heuristic from flipping at the checks made
once num_beams hypotheses are finished; order = smallest gap between consecutive returned
scores. Length-normalised gaps are multiplied back by length ** length_penalty. Every case has
topk and running >= 1.5e-3 (most >= 3e-3).

Prompts: t5-relu-tied's case uses the first 109 words of its prompt (144 tokens, still past
max_distance 128; with all 153 tokens the smallest gap is 5e-4); the Llama cases use prefixes
of the prompt ids (yarn 31 and 9, gqa3 16) with wider gaps or, for no_repeat_ngram_size 3, a
repeated trigram to ban.

T5 note (transformers 5.23): generate() sizes its cache from config.num_layers (the encoder's
depth) and fails when num_decoder_layers is larger (t5-relu-tied: 2 / 3), so every T5 call
passes past_key_values=EncoderDecoderCache of two DynamicCache(config=model.decoder.config)
(fixture_common.generate, which tools/fixtures_t5.py's generate() check uses too).

Usage:  python tools/fixtures_beams.py [--only t5 llama bart] [--out tests/fixtures]
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import FIXTURES_DIR, beam_search, load_reference, run_cli  # noqa: E402

F64_TOL = 1e-4
"""Largest |float32 score - float64 score| accepted."""
RESCORE_TOL = 1e-4
"""Largest |score - rescore()| accepted."""

BASE = dict(num_beams=4, max_new_tokens=24, length_penalty=1.0, early_stopping=False,
            no_repeat_ngram_size=0, min_new_tokens=0, num_return_sequences=1, do_sample=False)
"""generate() keywords every case starts from."""


def case(name: str, folder: str, checks=(), words: int | None = None,
         prefix: int | None = None, **gen) -> dict:
    """A case spec: generate() keywords BASE updated with gen; the prompt is the folder's
    prompt_ids, their first ``prefix`` ids, or the first ``words`` words of its prompt text
    encoded; ``checks`` name what the case must show (see check())."""
    return dict(name=name, folder=folder, words=words, prefix=prefix, checks=list(checks),
                generate={**BASE, **gen})


RELU_WORDS = 109
"""t5-relu-tied's case encodes the first 109 words of its prompt (144 tokens, still past
max_distance 128): the full prompt's search has a 5e-4 candidate gap, this one 4e-3."""
T5_EOS = [2239, 147]
"""The T5 EOS override (t5-flan-short): 2239 is the third token of every plain beam, 147 a
candidate from step 3 on; beams end on them at lengths 1 to 11."""
LLAMA_EOS = [4002, 3812, 3303]
"""The Llama EOS override (llama-gqa3, first 16 prompt ids): the real EOS (never emitted) and
two tokens the beams produce."""
LLAMA_EOS2 = [4002, 146, 1845]
"""Another Llama override (same prompt) with which early_stopping false's heuristic ends the
search at step 18 while "never" goes on to better hypotheses."""

CASES = {
    "t5": [
        case("v11-plain", "t5-v11-gated-untied", num_return_sequences=4),
        case("v11-beams2", "t5-v11-gated-untied", num_beams=2, num_return_sequences=2),
        case("v11-beams5", "t5-v11-gated-untied", num_beams=5, num_return_sequences=5),
        case("flan-lp2", "t5-flan-short", length_penalty=2.0, num_return_sequences=3),
        case("relu-lp05-ngram2", "t5-relu-tied", ["no_repeat_ngram_size"],
             words=RELU_WORDS, length_penalty=0.5, no_repeat_ngram_size=2),
        case("flan-eos-early", "t5-flan-short", ["eos_ended", "lengths_differ", "early_stopping"],
             early_stopping=True, num_return_sequences=4, eos_token_id=T5_EOS),
        case("flan-eos-lp13", "t5-flan-short", ["eos_ended", "eos_token_id"],
             length_penalty=1.3, num_return_sequences=4, eos_token_id=T5_EOS),
        case("flan-eos-never-min6", "t5-flan-short", ["min_new_tokens", "eos_token_id"],
             early_stopping="never", length_penalty=1.5, min_new_tokens=6,
             num_return_sequences=4, eos_token_id=T5_EOS),
    ],
    "llama": [
        case("yarn-plain", "llama-f16-yarn-bias", prefix=31, num_return_sequences=4),
        case("yarn-beams2", "llama-f16-yarn-bias", prefix=31, num_beams=2,
             num_return_sequences=2),
        case("yarn-beams5", "llama-f16-yarn-bias", prefix=31, num_beams=5,
             num_return_sequences=5),
        case("yarn-lp2", "llama-f16-yarn-bias", prefix=31, length_penalty=2.0,
             num_return_sequences=3),
        case("yarn-lp05-ngram3", "llama-f16-yarn-bias", ["no_repeat_ngram_size"], prefix=9,
             length_penalty=0.5, no_repeat_ngram_size=3),
        case("gqa3-eos-early", "llama-gqa3", ["eos_ended", "lengths_differ", "early_stopping"],
             prefix=16, early_stopping=True, num_return_sequences=4, eos_token_id=LLAMA_EOS),
        case("gqa3-eos-lp13", "llama-gqa3", ["eos_token_id"], prefix=16, length_penalty=1.3,
             num_return_sequences=4, eos_token_id=LLAMA_EOS),
        case("gqa3-eos-never-min6", "llama-gqa3", ["eos_token_id"], prefix=16,
             early_stopping="never", length_penalty=1.5, min_new_tokens=6,
             num_return_sequences=4, eos_token_id=LLAMA_EOS),
        case("gqa3-eos-never-lp05-min6", "llama-gqa3", ["eos_ended", "min_new_tokens"],
             prefix=16, early_stopping="never", length_penalty=0.5, min_new_tokens=6,
             num_return_sequences=4, eos_token_id=LLAMA_EOS),
        case("gqa3-eos2-stop", "llama-gqa3", ["eos_ended", "early_stopping"], prefix=16,
             num_return_sequences=4, eos_token_id=LLAMA_EOS2),
        case("gqa3-eos2-never", "llama-gqa3", ["eos_ended", "lengths_differ"], prefix=16,
             early_stopping="never", num_return_sequences=4, eos_token_id=LLAMA_EOS2),
    ],
    "bart": [
        case("forced-plain", "bart-forced", num_return_sequences=4),
        case("forced-lp05-ngram2", "bart-forced", ["no_repeat_ngram_size"], length_penalty=0.5,
             no_repeat_ngram_size=2, num_return_sequences=2),
        case("scaled-lp2", "bart-scaled", length_penalty=2.0, num_return_sequences=3),
    ],
}


def load(folder: str, float64: bool = False):
    """The fixture folder's model in float32 (or float64), eager attention, eval mode."""
    from transformers import (
        AutoModelForCausalLM,
        BartForConditionalGeneration,
        T5ForConditionalGeneration,
    )

    cls = {"t5": T5ForConditionalGeneration, "bart": BartForConditionalGeneration}.get(
        folder.split("-")[0], AutoModelForCausalLM)
    model = load_reference(cls, os.path.join(FIXTURES_DIR, folder))
    return model.double() if float64 else model


def prompt_ids(spec: dict) -> tuple[list[int], str]:
    """(ids, where they come from): the folder's expected.npz prompt_ids (their first
    spec["prefix"] if given), or the first spec["words"] words of its expected.npz prompt text
    encoded by its tokenizer.json."""
    folder = os.path.join(FIXTURES_DIR, spec["folder"])
    expected = np.load(os.path.join(folder, "expected.npz"))
    if spec["words"] is None:
        ids = expected["prompt_ids"].tolist()
        if spec["prefix"] is None:
            return ids, "expected.npz prompt_ids"
        return ids[:spec["prefix"]], f"expected.npz prompt_ids[:{spec['prefix']}]"
    from tokenizers import Tokenizer
    text = " ".join(str(expected["prompt"]).split()[:spec["words"]])
    ids = Tokenizer.from_file(os.path.join(folder, "tokenizer.json")).encode(text).ids
    return ids, f"tokenizer.json encoding of the first {spec['words']} words of expected.npz prompt"


def eos_ids(model, gen: dict) -> list[int]:
    """The EOS ids generate() uses: gen's override or the folder's generation config's."""
    eos = gen.get("eos_token_id", model.generation_config.eos_token_id)
    return [eos] if isinstance(eos, int) else list(eos)


class Probe:
    """Wraps the model's beam-search helpers (instance attributes shadowing the
    GenerationMixin methods) to record the margins described in the module docstring."""

    def __init__(self, model, gen: dict, eos: list[int]):
        self.model, self.k, self.eos = model, gen["num_beams"], eos
        self.max_new = gen["max_new_tokens"]
        self.m = dict(topk=None, running=None, finished=None, stop=None)

    def _min(self, key: str, value: float) -> None:
        if np.isfinite(value):
            old = self.m[key]
            self.m[key] = value if old is None else min(old, value)

    def __enter__(self):
        import torch

        cls, k = type(self.model), self.k

        def top_k(**kw):
            acc = kw["accumulated_log_probs"][0]
            top = torch.topk(acc, k + 1).values
            if top[k] > -1e8:
                self._min("topk", float(top[k - 1] - top[k]))
            if kw["cur_len"] - kw["decoder_prompt_len"] < self.max_new - 1:
                alive = acc.view(k, -1).clone()
                alive[:, self.eos] = -float("inf")
                top = torch.topk(alive.view(-1), k + 1).values
                if top[k] > -1e8:
                    self._min("running", float(top[k - 1] - top[k]))
            return cls._get_top_k_continuations(self.model, **kw)

        def finished(**kw):
            out = cls._update_finished_beams(self.model, **kw)
            _, scores, beams, _ = cls._update_finished_beams(self.model,
                                                             **{**kw, "num_beams": k + 1})
            if scores[0, k] > -1e8:
                length = int((beams[0, k - 1:k + 1] >= 0).sum(-1).min())
                self._min("finished", float(scores[0, k - 1] - scores[0, k])
                          * length ** kw["length_penalty"])
            return out

        def stop(**kw):
            running = float(kw["running_beam_scores"][0, 0])
            if (bool(kw["is_early_stop_heuristic_unsatisfied"].all())
                    and bool(kw["is_sent_finished"].all()) and running > -1e8):
                lp, es = kw["length_penalty"], kw["early_stopping"]
                length = (kw["max_length"] if es == "never" and lp > 0.0 else kw["cur_len"]) \
                    - kw["decoder_prompt_len"]
                best = running / length ** lp
                self._min("stop", abs(best - float(kw["beam_scores"].min())) * length ** lp)
            return cls._check_early_stop_heuristic(**kw)

        self.model._get_top_k_continuations = top_k
        self.model._update_finished_beams = finished
        self.model._check_early_stop_heuristic = stop
        return self

    def __exit__(self, *exc):
        for name in ("_get_top_k_continuations", "_update_finished_beams",
                     "_check_early_stop_heuristic"):
            delattr(self.model, name)


def generate(model, ids: list[int], gen: dict, probe: bool = False):
    """beam_search(model, ids, **gen) (fixture_common; T5 with the cache of the note above) as
    a dict: decoder_prompt_len, eos_token_id (as in effect), sequences (new ids, each cut at its
    own length), scores, eos_ended, steps, and margins if probe."""
    eos = eos_ids(model, gen)
    p = Probe(model, gen, eos)
    with p if probe else contextlib.nullcontext():
        found = beam_search(model, ids, **gen)
    seqs, scores = found["sequences"], found["scores"]
    assert len(seqs) == gen["num_return_sequences"] and scores == sorted(scores, reverse=True)
    eos_in_effect = gen.get("eos_token_id", model.generation_config.eos_token_id)
    res = dict(decoder_prompt_len=found["decoder_prompt_len"], eos_token_id=eos_in_effect,
               sequences=seqs, scores=scores, eos_ended=[bool(s) and s[-1] in eos for s in seqs],
               steps=found["steps"])
    if probe:
        lens = [len(q) for q in seqs]
        gaps = [(a - b) * min(la, lb) ** gen["length_penalty"]
                for a, b, la, lb in zip(scores, scores[1:], lens, lens[1:])]
        res["margins"] = {**p.m, "order": min(gaps) if gaps else None}
    return res


def differs(model, ids: list[int], gen: dict, res: dict, **change) -> bool:
    """Whether generate() with gen updated by change (None: key removed) returns other
    sequences or scores than res."""
    other = {**gen, **change}
    other = {k: v for k, v in other.items() if v is not None}
    alt = generate(model, ids, other)
    return (alt["sequences"], alt["scores"]) != (res["sequences"], res["scores"])


def check(spec: dict, res: dict, model, ids: list[int]) -> None:
    """Always: each hypothesis ran to max_new_tokens or ended on EOS, and EOS never comes
    within min_new_tokens. Then spec["checks"]:

        eos_ended             a returned hypothesis ended on EOS before max_new_tokens
        lengths_differ        the returned hypotheses do not all have one length
        early_stopping        early_stopping false (if false: "never") gives another result
        eos_token_id          the folder's own EOS gives another result
        no_repeat_ngram_size  no_repeat_ngram_size 0 gives another result
        min_new_tokens        min_new_tokens 0 gives another result
    """
    gen, name = spec["generate"], spec["name"]
    lens = [len(s) for s in res["sequences"]]
    for n, e in zip(lens, res["eos_ended"]):
        assert e or n == gen["max_new_tokens"], (name, lens)
        assert n > gen["min_new_tokens"] or not e, (name, lens)
    for what in spec["checks"]:
        if what == "eos_ended":
            ok = any(e and n < gen["max_new_tokens"] for n, e in zip(lens, res["eos_ended"]))
        elif what == "lengths_differ":
            ok = len(set(lens)) > 1
        elif what == "early_stopping":
            other = "never" if gen["early_stopping"] is False else False
            ok = differs(model, ids, gen, res, early_stopping=other)
        elif what == "eos_token_id":
            ok = differs(model, ids, gen, res, eos_token_id=None)
        else:
            ok = differs(model, ids, gen, res, **{what: 0})
        assert ok, (name, "fails check", what, lens)


def rescore(model, ids: list[int], seq: list[int], length_penalty: float,
            max_new_tokens: int) -> float:
    """A hypothesis' score recomputed with one no-cache forward: the sum over its tokens of
    log_softmax(float32 logits)[token] (0 for a token the generation config forces), divided by
    len(seq) ** length_penalty."""
    import torch

    with torch.no_grad():
        if model.config.is_encoder_decoder:
            start = model.generation_config.decoder_start_token_id
            logits = model(input_ids=torch.tensor([ids]),
                           decoder_input_ids=torch.tensor([[start] + seq[:-1]])).logits[0]
        else:
            logits = model(torch.tensor([ids + seq[:-1]])).logits[0, len(ids) - 1:]
    logp = torch.log_softmax(logits.float(), dim=-1)
    per_token = logp[torch.arange(len(seq)), torch.tensor(seq)]
    config = model.generation_config
    if config.forced_bos_token_id is not None:
        per_token[0] = 0.0   # the forced token's log-probability after ForcedBOS
    if config.forced_eos_token_id is not None and len(seq) == max_new_tokens:
        per_token[-1] = 0.0  # the same for ForcedEOS at the last step
    return float(per_token.sum()) / len(seq) ** length_penalty


def run_case(spec: dict, models: dict) -> tuple[dict, dict]:
    """Run one case in float32 (stored) and float64 (compared) and check it; return (the
    stored dict, dict(margins, f64_err, rescore_err))."""
    folder, gen = spec["folder"], spec["generate"]
    if folder not in models:
        models[folder] = (load(folder), load(folder, float64=True))
    m32, m64 = models[folder]
    ids, source = prompt_ids(spec)
    res = generate(m32, ids, gen, probe=True)
    res64 = generate(m64, ids, gen)
    assert (res64["sequences"], res64["steps"]) == (res["sequences"], res["steps"]), (
        spec["name"], "float64 differs", res["sequences"], res64["sequences"])
    f64_err = max(abs(a - b) for a, b in zip(res["scores"], res64["scores"]))
    assert f64_err < F64_TOL, (spec["name"], f64_err)
    check(spec, res, m32, ids)
    rescore_err = max(
        abs(rescore(m32, ids, q, gen["length_penalty"], gen["max_new_tokens"]) - score)
        for q, score in zip(res["sequences"], res["scores"]))
    assert rescore_err < RESCORE_TOL, (spec["name"], "rescored", rescore_err)
    margins = res.pop("margins")
    out = dict(name=spec["name"], folder=folder, prompt_from=source, prompt_ids=ids,
               generate=gen, **res)
    return out, dict(margins=margins, f64_err=f64_err, rescore_err=rescore_err)


def summary_line(out: dict, extra: dict) -> dict:
    """What the script prints for a case: its settings besides BASE, hypothesis lengths, EOS
    endings, steps, scores, the float64 and rescoring errors and the margins."""
    g = out["generate"]
    return dict(name=out["name"], folder=out["folder"],
                settings={k: v for k, v in g.items() if BASE.get(k, object()) != v},
                lengths=[len(s) for s in out["sequences"]], eos_ended=out["eos_ended"],
                steps=out["steps"], scores=[round(s, 5) for s in out["scores"]],
                f64_err=float(f"{extra['f64_err']:.2g}"),
                rescore_err=float(f"{extra['rescore_err']:.2g}"),
                margins={k: (None if v is None else float(f"{v:.3g}"))
                         for k, v in extra["margins"].items()})


def write_cases(path: str, cases: list[dict]) -> None:
    """{"transformers_version", "cases"} as JSON, one case key per line (lists inline)."""
    import transformers

    body = ",\n".join("  {\n" + ",\n".join(f"   {json.dumps(k)}: {json.dumps(v)}"
                                            for k, v in c.items()) + "\n  }" for c in cases)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'{{\n "transformers_version": {json.dumps(transformers.__version__)},\n'
                f' "cases": [\n{body}\n ]\n}}\n')


def make_family(family: str, out_root: str) -> dict:
    """Run a family's cases (printing each case's summary line) and write
    out_root/beams-<family>.json; return the file's summary."""
    import transformers

    models, cases = {}, []
    for spec in CASES[family]:
        out, extra = run_case(spec, models)
        cases.append(out)
        print(json.dumps(summary_line(out, extra)), flush=True)
    os.makedirs(out_root, exist_ok=True)
    path = os.path.join(out_root, f"beams-{family}.json")
    write_cases(path, cases)
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == dict(transformers_version=transformers.__version__, cases=cases)
    return dict(file=os.path.relpath(path), cases=len(cases), bytes=os.path.getsize(path))


def main(argv=None) -> int:
    return run_cli(__doc__, CASES, lambda family, args: make_family(family, args.out), argv)


if __name__ == "__main__":
    sys.exit(main())
