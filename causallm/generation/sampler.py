"""Choosing the next token: NNTrainer's ``llm_util`` with Hugging Face semantics.

The functions keep the C++ names (``applyRepetitionPenalty``, ``applyBadWordsPenalty``,
``applyTKP``, ``generate_multi_tokens``) and work in place on the float32 logits of one row,
shape (V,). Their math is that of the Hugging Face ``transformers`` logits processors, and
everything asked for is applied; the C++ ignores ``top_k``/``top_p`` and never applies the
repetition penalty (docs/nntrainer.md, "Sampling settings ignored"), which is not copied.

Order, as in ``transformers`` ``generate()``:

1. repetition penalty (``RepetitionPenaltyLogitsProcessor``) over the ids seen so far;
2. bad words (``NoBadWordsLogitsProcessor`` for single-token entries): logit = -inf;
3. a grammar's mask when the row has one (causallm/generation/constraint.py: structured
   output), tokens it refuses at -inf;
4. greedy: the first maximum. Sampling: temperature, then top-k, then top-p, then min-p, then
   typical-p (``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``,
   ``MinPLogitsWarper``, ``TypicalLogitsWarper``, in the order ``_get_logits_processor`` adds
   them), then one draw from softmax(logits) computed in float64.

Removed tokens get logit -inf (``filter_value``), so their probability is exactly 0.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from causallm.errors import CausalLMError
from causallm.generation.options import check


def _token_ids(ids: Iterable[int], vocab_size: int, what: str) -> np.ndarray:
    """``ids`` as int64, each checked to lie in [0, vocab_size)."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise CausalLMError(f"{what}: token id {int(bad[0])} is outside the vocabulary "
                            f"[0, {vocab_size})")
    return ids


def _check_penalty(penalty: float) -> None:
    check("repetition_penalty", penalty)


def _check_warpers(temperature: float, top_k: int, top_p: float, min_p: float = 0.0,
                   typical_p: float = 1.0) -> None:
    """The warpers' values by the options' rules (causallm/generation/options.py); sampling
    needs a temperature above 0 (0 is greedy decoding, chosen before a sampler is made)."""
    if not (math.isfinite(temperature) and temperature > 0):
        raise CausalLMError(f"temperature must be > 0 when sampling, got {temperature!r}")
    for name, value in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p),
                        ("typical_p", typical_p)):
        check(name, value)


def applyRepetitionPenalty(logits: np.ndarray, input_ids: Iterable[int], penalty: float) -> None:
    """Penalise every id already seen, in place; logits (V,).

    For each *distinct* id i in ``input_ids``: ``x[i] = x[i] * p if x[i] < 0 else x[i] / p``
    (CTRL, arXiv 1909.05858; HF ``RepetitionPenaltyLogitsProcessor``). An id seen twice is
    penalised once (the C++ divides again for each repeat). ``p == 1`` changes nothing.
    """
    _check_penalty(penalty)
    penalize_repetitions(logits, input_ids, penalty)


def penalize_repetitions(logits: np.ndarray, input_ids: Iterable[int], penalty: float) -> None:
    """``applyRepetitionPenalty`` with ``penalty`` checked already (a settings' value)."""
    if penalty == 1.0:
        return
    ids = np.unique(_token_ids(input_ids, logits.shape[0], "repetition penalty"))
    if ids.size == 0:
        return
    p = logits.dtype.type(penalty)
    seen = logits[ids]
    logits[ids] = np.where(seen < 0, seen * p, seen / p)


def applyBadWordsPenalty(logits: np.ndarray, bad_word_ids: Iterable[int]) -> None:
    """Set ``logits[i] = -inf`` for every i in ``bad_word_ids``, in place; logits (V,).

    An id outside [0, V) is an error naming the id and V.
    """
    ids = _token_ids(bad_word_ids, logits.shape[0], "bad_word_ids")
    logits[ids] = -np.inf


def applyTKP(logits: np.ndarray, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0) -> np.ndarray:
    """Temperature, top-k and top-p, in place and in that order; logits (V,). Returns ``logits``.

    - temperature T > 0: ``x = x / T`` (T = 1 changes nothing);
    - top-k (0 = off): with t the k-th largest value, every ``x < t`` becomes -inf (so tokens
      tied with the k-th are all kept, as HF's ``scores < topk(scores, k)[..., -1]``);
    - top-p (1 = off): sort ascending (ties by ascending id), p = softmax of the sorted values,
      c = cumsum(p); remove the tokens with ``c <= 1 - top_p``, but never the last (largest)
      one. Tokens already at -inf have p = 0 and stay removed, so only the live ones are
      sorted. The cumulative sum is taken in float64 (HF: float32).
    """
    _check_warpers(temperature, top_k, top_p)
    return _tkp(logits, temperature, top_k, top_p)


def _tkp(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """``applyTKP`` with its values checked already (a settings' values)."""
    if temperature != 1.0:
        logits /= logits.dtype.type(temperature)
    vocab_size = logits.shape[0]
    if 0 < top_k < vocab_size:
        kth_largest = np.partition(logits, vocab_size - top_k)[vocab_size - top_k]
        logits[logits < kth_largest] = -np.inf
    if top_p < 1.0:
        live = np.flatnonzero(logits > -np.inf)
        if live.size:
            ascending = live[np.argsort(logits[live], kind="stable")]
            sorted_logits = logits[ascending].astype(np.float64)
            cumulative = np.cumsum(np.exp(sorted_logits - sorted_logits[-1]))
            cumulative /= cumulative[-1]
            remove = cumulative <= 1.0 - top_p
            remove[-1] = False
            logits[ascending[remove]] = -np.inf
    return logits


def applyMinP(logits: np.ndarray, min_p: float) -> np.ndarray:
    """Min-p, in place; logits (V,). Returns ``logits``.

    With p = softmax(x): every token with ``p[i] < min_p * max(p)`` becomes -inf, i.e.
    ``exp(x[i] - max(x)) < min_p`` (computed in float64); the most likely token always stays
    (transformers' ``MinPLogitsWarper``, min_tokens_to_keep 1). ``min_p = 0`` changes nothing.
    """
    if min_p > 0.0:
        ratio = np.exp(logits.astype(np.float64) - np.float64(logits.max()))
        logits[ratio < min_p] = -np.inf
    return logits


def applyTypicalP(logits: np.ndarray, mass: float) -> np.ndarray:
    """Locally typical sampling (Meister et al., arXiv 2202.00666), in place; logits (V,).

    With l = log_softmax(x), p = exp(l) and the entropy H = -sum(p * l) (tokens at -inf add
    nothing): order the tokens by ``d[i] = |-l[i] - H|`` ascending, take the cumulative
    probability c along that order, let j = the number of tokens with ``c < mass`` (at most
    V - 1) and remove every token with ``d[i] > d[order[j]]``, never the first in the order
    (transformers' ``TypicalLogitsWarper``, min_tokens_to_keep 1). Float64 throughout
    (transformers: float32). ``mass = 1`` changes nothing. Returns ``logits``.
    """
    if mass >= 1.0:
        return logits
    x = logits.astype(np.float64)
    log_p = x - x.max()
    log_p -= np.log(np.exp(log_p).sum())
    p = np.exp(log_p)
    live = p > 0
    entropy = -(log_p[live] * p[live]).sum()
    distance = np.abs(-log_p - entropy)            # +inf for tokens already removed
    order = np.argsort(distance, kind="stable")
    cumulative = np.cumsum(p[order])
    last = min(int((cumulative < mass).sum()), order.size - 1)
    remove = distance > distance[order[last]]
    remove[order[0]] = False
    logits[remove] = -np.inf
    return logits


def generate_multi_tokens(logits: np.ndarray, n: int = 1, penalty: float = 1.0,
                          input_ids: Iterable[int] = (),
                          bad_word_ids: Iterable[int] = ()) -> np.ndarray:
    """The ``n`` ids with the largest logits, largest first; logits (V,) -> (n,) int64.

    Applies the repetition penalty over ``input_ids`` and the bad words first, in place, as
    the C++ does. Equal logits are ordered by ascending id (the C++ ``partial_sort`` leaves
    their order unspecified). ``n = 1`` is greedy decoding.
    """
    vocab_size = logits.shape[0]
    if not 1 <= n <= vocab_size:
        raise CausalLMError(f"generate_multi_tokens: n must be in [1, {vocab_size}], got {n}")
    applyRepetitionPenalty(logits, input_ids, penalty)
    applyBadWordsPenalty(logits, bad_word_ids)
    nth_largest = np.partition(logits, vocab_size - n)[vocab_size - n]
    candidates = np.flatnonzero(logits >= nth_largest)
    best = candidates[np.argsort(-logits[candidates], kind="stable")][:n]
    if best.size < n:
        raise CausalLMError("generate_multi_tokens: the logits contain NaN")
    return best.astype(np.int64)


class Sampler:
    """Picks the next token of each batch row: greedy, or sampling with a seeded generator.

    ``select(logits (B, V), histories)`` returns B int64 ids. Per row: the logits are copied
    once into a scratch buffer (the caller's array is never modified), penalised (repetition
    over ``histories[b]``, bad words; or, when ``processors`` are given, by those, in order:
    causallm/generation/processors.py, which the generator builds), then

    - ``do_sample=False``: argmax, the first maximum (HF greedy search);
    - ``do_sample=True``: :func:`applyTKP`, :func:`applyMinP`, :func:`applyTypicalP`, then one
      draw from softmax in float64 by inverse CDF with ``u ~ U[0, 1)`` from
      ``np.random.Generator(PCG64(seed))``; rows draw in order 0..B-1, so a seed reproduces a
      run. ``seed=None`` takes fresh OS entropy.

    ``process(row, history)`` is that selection's scores without the choice.

    The temperature is checked only when sampling (greedy ignores it, as in HF).
    """

    def __init__(self, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 repetition_penalty: float = 1.0, bad_word_ids: Iterable[int] = (),
                 seed: int | None = None, do_sample: bool = False, processors=None,
                 min_p: float = 0.0, typical_p: float = 1.0):
        _check_penalty(repetition_penalty)
        _check_warpers(temperature if do_sample else 1.0, top_k, top_p, min_p, typical_p)
        self._setup(temperature, top_k, top_p, repetition_penalty, bad_word_ids, seed,
                    do_sample, processors, min_p, typical_p)

    @classmethod
    def fromSettings(cls, settings, processors) -> "Sampler":
        """The sampler of a generation's ``settings`` (GenerationSettings.resolved: their
        values were checked where they came in, causallm/generation/settings.py, and are not
        checked again), choosing after ``processors`` (build_processors of the same
        settings)."""
        s = settings
        sampler = cls.__new__(cls)
        sampler._setup(s.temperature, s.top_k, s.top_p, 1.0, (), s.seed, s.do_sample,
                       processors, s.min_p, s.typical_p)
        return sampler

    def _setup(self, temperature, top_k, top_p, repetition_penalty, bad_word_ids, seed,
               do_sample, processors, min_p, typical_p) -> None:
        self.processors = processors
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self.min_p = float(min_p)
        self.typical_p = float(typical_p)
        self.repetition_penalty = float(repetition_penalty)
        self.bad_word_ids = np.asarray(bad_word_ids, dtype=np.int64).reshape(-1)
        self.seed = seed
        self.do_sample = bool(do_sample)
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._row = np.empty(0, dtype=np.float32)  # scratch logits of one row, (V,)
        self._cdf = np.empty(0, dtype=np.float64)  # scratch cumulative weights, (V,)

    def select(self, logits: np.ndarray,
               histories: Sequence[Iterable[int]] | None = None,
               constraints: Sequence | None = None) -> np.ndarray:
        """Next ids for logits (B, V); ``histories[b]`` = ids row b has seen (prompt + output);
        ``constraints[b]``: row b's grammar (a ``JsonConstraint``, or None), whose ``mask``
        runs after the processors and before the warpers (``process``)."""
        if logits.ndim != 2:
            raise ValueError(f"Sampler.select expects logits of shape (B, V), got {logits.shape}")
        batch, vocab_size = logits.shape
        if histories is not None and len(histories) != batch:
            raise ValueError(f"Sampler.select: {len(histories)} histories for {batch} rows")
        if constraints is not None and len(constraints) != batch:
            raise ValueError(f"Sampler.select: {len(constraints)} constraints for {batch} rows")
        if self._row.shape[0] != vocab_size:
            self._row = np.empty(vocab_size, dtype=np.float32)
            self._cdf = np.empty(vocab_size, dtype=np.float64)
        row = self._row
        chosen = np.empty(batch, dtype=np.int64)
        for b in range(batch):
            np.copyto(row, logits[b], casting="same_kind")
            self.process(row, None if histories is None else histories[b],
                         None if constraints is None else constraints[b])
            if self.do_sample:
                chosen[b] = self._draw(row, b)
            else:
                chosen[b] = np.argmax(row)
                if not row[chosen[b]] > -np.inf:  # NaN, or every token banned
                    raise CausalLMError(f"Sampler: row {b} has no finite logit (NaN, or every "
                                        f"token is a bad word or refused by the grammar)")
        return chosen

    def process(self, row: np.ndarray, history: Iterable[int] | None,
                constraint=None) -> np.ndarray:
        """The scores ``select`` chooses from, in place on ``row`` (V,): the processors (or the
        repetition penalty over ``history`` and the bad words), then the ``constraint``'s mask
        (the tokens its grammar refuses at -inf), then, when sampling, the warpers. Returns
        ``row``."""
        if self.processors is not None:
            for processor in self.processors:
                processor(history, row)
        else:
            if history is not None:
                penalize_repetitions(row, history, self.repetition_penalty)
            if self.bad_word_ids.size:
                applyBadWordsPenalty(row, self.bad_word_ids)
        if constraint is not None:
            constraint.mask(row)
        if self.do_sample:
            _tkp(row, self.temperature, self.top_k, self.top_p)
            applyMinP(row, self.min_p)
            applyTypicalP(row, self.typical_p)
        return row

    def _draw(self, row: np.ndarray, b: int) -> int:
        """One id from softmax(row): ``cdf = cumsum(exp(row - max))``, first i with
        ``cdf[i] > u * cdf[-1]``. Tokens with probability 0 (-inf) are never drawn."""
        top = row.max()
        if not np.isfinite(top):
            raise CausalLMError(f"Sampler: row {b} has no finite maximum logit "
                                f"(NaN or inf in the logits, or every token removed)")
        cdf = self._cdf
        cdf[:] = row
        cdf -= top
        np.exp(cdf, out=cdf)
        np.cumsum(cdf, out=cdf)
        total = cdf[-1]
        index = int(np.searchsorted(cdf, self._rng.random() * total, side="right"))
        # u * total can round up to total; the last token with non-zero probability is then
        # the one whose cdf first reaches total.
        return min(index, int(np.searchsorted(cdf, total, side="left")))
