"""Logits processors with transformers' semantics, applied to one row at a time.

Each processor is called as ``processor(ids, scores)``: ``ids`` is the row's sequence so far (the
decoder-only model's prompt and new tokens, a cached system prompt included; the
encoder-decoder's decoder ids from ``decoder_start_token_id``), ``scores`` its (V,) float32
scores, changed in place. ``cur_len`` below is ``len(ids)``, transformers' ``input_ids.shape[-1]``.
``build_processors`` lists them in the order ``GenerationMixin._get_logits_processor`` does:

    RepetitionPenalty(p)         x[i] = x[i] * p if x[i] < 0 else x[i] / p, each distinct i in ids
    PresenceFrequencyPenalty(P, a, f)
                                 x[i] -= a * (c[i] > 0) + f * c[i], c[i] = count of i in the
                                 generated ids ids[P:] (OpenAI's and llama.cpp's penalties; not
                                 a transformers processor, so placed as llama.cpp does: right
                                 after the repetition penalty)
    NoRepeatNGram(n)             a token that would repeat an n-gram of ids gets -inf
    NoBadWords(words, eos)       -inf for a single-token word; for a longer one, its last token
                                 when ids end with the rest of it; a word that is one EOS id
                                 alone is dropped (never banned), as transformers does;
                                 the words are nntr_config's bad_word_ids (each a word of one
                                 token) and bad_words_ids
    MinLength(m, eos)            the EOS ids get -inf while cur_len < m
    MinNewTokens(p, m, eos)      the EOS ids get -inf while cur_len - p < m (p: the prompt's length)
    ForcedBOS(bos)               at cur_len == 1 every token but bos gets -inf, bos 0
    ForcedEOS(max_length, eos)   at cur_len == max_length - 1 every token but the EOS ids gets
                                 -inf, they 0
    Renormalize()                x = log_softmax(x) after all the others (renormalize_logits:
                                 beam scores then count only the tokens left unmasked)

Greedy and sampling apply them to the logits, beam search to the log-softmax (as transformers);
sampling then applies the warpers (causallm/generation/sampler.py: temperature, top-k, top-p,
min-p, typical-p) before its draw.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from causallm.generation.sampler import penalize_repetitions
from causallm.generation.settings import GenerationSettings

NEG_INF = np.float32(-np.inf)


def log_softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32: x - max - log(sum(exp(x - max)))."""
    x = x.astype(np.float32, copy=True)
    x -= x.max(axis=-1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=-1, keepdims=True, dtype=np.float32))
    return x


class RepetitionPenalty:
    def __init__(self, penalty: float) -> None:
        self.penalty = penalty

    def __call__(self, ids: Sequence[int], scores: np.ndarray) -> None:
        penalize_repetitions(scores, ids, self.penalty)


class PresenceFrequencyPenalty:
    """OpenAI's presence and frequency penalties (llama.cpp's ``penalty_present`` and
    ``penalty_freq``): ``x[i] -= presence * (c[i] > 0) + frequency * c[i]``, where c[i] counts
    token i among the *generated* ids, ``ids[prompt_len:]`` (the prompt and a cached system
    prompt are not counted; llama.cpp counts its last ``penalty_last_n`` sampled tokens, we
    count every generated one)."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len = prompt_len
        self.presence, self.frequency = np.float32(presence), np.float32(frequency)

    def __call__(self, ids: Sequence[int], scores: np.ndarray) -> None:
        seen, counts = np.unique(np.asarray(ids[self.prompt_len:], dtype=np.int64),
                                 return_counts=True)
        if seen.size:
            scores[seen] -= self.presence + self.frequency * counts.astype(np.float32)


class NoRepeatNGram:
    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, ids: Sequence[int], scores: np.ndarray) -> None:
        n, cur_len = self.n, len(ids)
        if cur_len < n:
            return
        prefix = tuple(ids[cur_len + 1 - n:])
        banned = {ids[i + n - 1] for i in range(cur_len - n + 1)
                  if tuple(ids[i:i + n - 1]) == prefix}
        if banned:
            scores[list(banned)] = NEG_INF


class NoBadWords:
    def __init__(self, words: Sequence[Sequence[int]], eos: Sequence[int] = ()) -> None:
        words = [w for w in words if not (len(w) == 1 and w[0] in eos)]
        self.single = np.array([w[0] for w in words if len(w) == 1], dtype=np.int64)
        self.longer = [tuple(w) for w in words if len(w) > 1]

    def __call__(self, ids: Sequence[int], scores: np.ndarray) -> None:
        if self.single.size:
            scores[self.single] = NEG_INF
        for word in self.longer:
            if len(ids) >= len(word) - 1 and tuple(ids[len(ids) - len(word) + 1:]) == word[:-1]:
                scores[word[-1]] = NEG_INF


class MinLength:
    def __init__(self, min_length: int, eos: Sequence[int]) -> None:
        self.min_length, self.eos = min_length, list(eos)

    def __call__(self, ids: Sequence[int], scores: np.ndarray) -> None:
        if len(ids) < self.min_length:
            scores[self.eos] = NEG_INF


class MinNewTokens:
    def __init__(self, prompt_len: int, min_new_tokens: int, eos: Sequence[int]) -> None:
        self.prompt_len, self.min_new_tokens, self.eos = prompt_len, min_new_tokens, list(eos)

    def __call__(self, ids: Sequence[int], scores: np.ndarray) -> None:
        if len(ids) - self.prompt_len < self.min_new_tokens:
            scores[self.eos] = NEG_INF


class ForcedBOS:
    def __init__(self, bos: int) -> None:
        self.bos = bos

    def __call__(self, ids: Sequence[int], scores: np.ndarray) -> None:
        if len(ids) == 1:
            scores[:] = NEG_INF
            scores[self.bos] = 0


class ForcedEOS:
    def __init__(self, max_length: int, eos: Sequence[int]) -> None:
        self.max_length, self.eos = max_length, list(eos)

    def __call__(self, ids: Sequence[int], scores: np.ndarray) -> None:
        if len(ids) == self.max_length - 1:
            scores[:] = NEG_INF
            scores[self.eos] = 0


class Renormalize:
    def __call__(self, ids: Sequence[int], scores: np.ndarray) -> None:
        scores[:] = log_softmax(scores)


def build_processors(s: GenerationSettings, prompt_len: int, max_length: int) -> list:
    """The processors ``s`` asks for, in transformers' order. ``prompt_len`` is the length of
    each row's ids when generation starts, ``max_length`` that plus the new tokens allowed."""
    out = []
    if s.repetition_penalty != 1.0:
        out.append(RepetitionPenalty(s.repetition_penalty))
    if s.presence_penalty != 0.0 or s.frequency_penalty != 0.0:
        out.append(PresenceFrequencyPenalty(prompt_len, s.presence_penalty, s.frequency_penalty))
    if s.no_repeat_ngram_size > 0:
        out.append(NoRepeatNGram(s.no_repeat_ngram_size))
    words = [[t] for t in s.banned_token_ids] + list(s.bad_words_ids)
    if words:
        out.append(NoBadWords(words, s.eos_token_id))
    if s.min_length > 0 and s.eos_token_id:
        out.append(MinLength(s.min_length, s.eos_token_id))
    if s.min_new_tokens > 0 and s.eos_token_id:
        out.append(MinNewTokens(prompt_len, s.min_new_tokens, s.eos_token_id))
    if s.forced_bos_token_id is not None:
        out.append(ForcedBOS(s.forced_bos_token_id))
    if s.forced_eos_token_id:
        out.append(ForcedEOS(max_length, s.forced_eos_token_id))
    if s.renormalize_logits:
        out.append(Renormalize())
    return out
