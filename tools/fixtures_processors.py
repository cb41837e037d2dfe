"""Record transformers' logits processors and warpers on fixed random scores:
tests/fixtures/processors.npz.

Each case is a set of generation settings (GenerationSettings field names, which are
GenerationConfig's). transformers builds its processor list for them with
``GenerationMixin._get_logits_processor`` (so its classes and its order: the processors, then,
with do_sample, temperature, top-k, top-p, min-p, typical-p) and runs it on ``logits`` with the
id histories ``ids``; the output is stored. Presence and frequency penalties are not a
transformers processor: they are the documented formula (OpenAI; llama.cpp's
``llama_sampler_penalties_apply``)

    x[i] -= presence_penalty * (c[i] > 0) + frequency_penalty * c[i]

with c[i] the count of i among the generated ids ``ids[:, prompt_len:]``, computed here in
float32 and inserted right after transformers' RepetitionPenaltyLogitsProcessor (first when
there is none), where the generator applies it.

File layout (np.load):

    logits          (R, V) float32: random normal * 2.5; row 1 has four tied maxima, row 2
                    two tokens already at -inf
    ids             (R, L) int64: each row's ids so far (prompt and generated), with repeated
                    n-grams; rows 0 and 3 end with the prefix of a multi-token bad word
    prompt_len      the prompt's length P (min_new_tokens and the penalties count ids[P:])
    eos             the EOS id (V - 1)
    cases           JSON: [{"name", "settings"}, ...]
    expected_<name> (R, V) float32: the scores after transformers' list for that case
    transformers_version

    python tools/fixtures_processors.py
"""

from __future__ import annotations

import json
import os
import types

import numpy as np
import torch
import transformers
from transformers import GenerationConfig
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
from transformers.generation.utils import GenerationMixin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "processors.npz")

R, V, L, P = 6, 48, 12, 6
EOS = V - 1
BAD = [[5], [EOS], [9, 17], [30, 31, 32]]   # [EOS] alone: transformers drops it (never banned)

SAMPLE = dict(do_sample=True, top_k=0, top_p=1.0)
CASES = [
    ("repetition", dict(repetition_penalty=1.3)),
    ("ngram2", dict(no_repeat_ngram_size=2)),
    ("ngram3", dict(no_repeat_ngram_size=3)),
    ("bad_words", dict(bad_words_ids=BAD)),
    ("min_length_on", dict(min_length=L + 1)),
    ("min_length_off", dict(min_length=L)),
    ("min_new_tokens_on", dict(min_new_tokens=L - P + 1)),
    ("min_new_tokens_off", dict(min_new_tokens=L - P)),
    ("temperature", dict(SAMPLE, temperature=0.7)),
    ("top_k", dict(SAMPLE, top_k=5)),
    ("top_p", dict(SAMPLE, top_p=0.8)),
    ("min_p_01", dict(SAMPLE, min_p=0.1)),
    ("min_p_03", dict(SAMPLE, min_p=0.3)),
    ("min_p_temperature", dict(SAMPLE, temperature=1.7, min_p=0.2)),
    ("typical_05", dict(SAMPLE, typical_p=0.5)),
    ("typical_09", dict(SAMPLE, typical_p=0.9)),
    ("typical_02_temperature", dict(SAMPLE, temperature=0.6, typical_p=0.2)),
    ("chain_sample", dict(do_sample=True, temperature=0.8, top_k=20, top_p=0.9, min_p=0.05,
                          typical_p=0.95, repetition_penalty=1.2, no_repeat_ngram_size=2,
                          bad_words_ids=BAD, min_new_tokens=L)),
    ("chain_greedy", dict(do_sample=False, temperature=0.5, top_k=3, top_p=0.5, min_p=0.5,
                          typical_p=0.5, repetition_penalty=0.8, no_repeat_ngram_size=3,
                          bad_words_ids=BAD, min_length=L + 2)),
    ("presence_frequency", dict(presence_penalty=0.5, frequency_penalty=0.3)),
    ("repetition_presence_frequency", dict(repetition_penalty=1.2, presence_penalty=-0.4,
                                           frequency_penalty=0.7)),
    ("penalties_sample", dict(do_sample=True, temperature=0.9, top_k=0, top_p=1.0, min_p=0.1,
                              presence_penalty=1.5, frequency_penalty=0.25,
                              no_repeat_ngram_size=2)),
]


def inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(20261125)
    logits = (rng.standard_normal((R, V)) * 1.2).astype(np.float32)
    logits[1, [3, 10, 11, 40]] = logits[1].max() + 1.0        # tied maxima
    logits[2, [7, 8]] = -np.inf                                # already removed
    ids = rng.integers(0, 24, size=(R, L), dtype=np.int64)     # small range: repeats
    ids[0, -1] = 9                                             # prefix of [9, 17]
    ids[3, -2:] = [30, 31]                                     # prefix of [30, 31, 32]
    ids[4, -2:] = ids[4, 3:5]                                  # ends with an earlier pair
    return logits, ids


def presence_frequency(ids: torch.Tensor, scores: torch.Tensor, presence: float,
                       frequency: float) -> torch.Tensor:
    """The documented formula, in float32, counting ids[:, P:]."""
    x = scores.numpy().copy()
    for r in range(x.shape[0]):
        counts = np.bincount(ids[r, P:].numpy(), minlength=V).astype(np.float32)
        x[r] -= np.float32(presence) * (counts > 0).astype(np.float32) \
            + np.float32(frequency) * counts
    return torch.from_numpy(x)


def run_case(settings: dict, logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    s = dict(settings)
    presence, frequency = s.pop("presence_penalty", 0.0), s.pop("frequency_penalty", 0.0)
    s.setdefault("do_sample", False)
    s.setdefault("top_k", 0)          # GenerationConfig's default is 50
    config = GenerationConfig(eos_token_id=EOS, **s)
    config._eos_token_tensor = torch.tensor([EOS])
    model = types.SimpleNamespace(config=types.SimpleNamespace(is_encoder_decoder=False),
                                  _merge_criteria_processor_list=lambda p, extra: p)
    processors = list(GenerationMixin._get_logits_processor(model, config,
                                                            input_ids_seq_length=P))
    if presence or frequency:
        at = next((k + 1 for k, p in enumerate(processors)
                   if isinstance(p, RepetitionPenaltyLogitsProcessor)), 0)
        processors.insert(at, lambda i, x: presence_frequency(i, x, presence, frequency))
    input_ids, scores = torch.from_numpy(ids), torch.from_numpy(logits.copy())
    for processor in processors:
        scores = processor(input_ids, scores)
    return scores.numpy().astype(np.float32)


def main() -> None:
    torch.set_num_threads(1)
    logits, ids = inputs()
    out = dict(logits=logits, ids=ids, prompt_len=np.int64(P), eos=np.int64(EOS),
               cases=np.array(json.dumps([{"name": n, "settings": s} for n, s in CASES])),
               transformers_version=np.array(transformers.__version__))
    for name, settings in CASES:
        expected = run_case(settings, logits, ids)
        out[f"expected_{name}"] = expected
        kept = np.isfinite(expected).sum(axis=1)
        print(f"{name:32s} kept per row {kept.tolist()}")
    np.savez_compressed(OUT, **out)
    print(f"wrote {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
