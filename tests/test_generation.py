"""Token selection: penalties, temperature/top-k/top-p and the Sampler.

The references here are written differently from causallm.generation.sampler on purpose: plain
Python lists, ``sorted`` and ``math.exp``, following the Hugging Face logits processors.
"""

import math

import numpy as np
import pytest

from causallm.errors import CausalLMError
from causallm.generation.sampler import (
    Sampler,
    applyBadWordsPenalty,
    applyRepetitionPenalty,
    applyTKP,
    generate_multi_tokens,
)

NEG_INF = float("-inf")


def _f32(values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# ------------------------------------------------------------------------------ penalties

def test_repetition_penalty_hand_computed():
    logits = _f32([2.0, -1.0, 0.5, -3.0, 0.0, 4.0])
    applyRepetitionPenalty(logits, [0, 1, 1, 1, 4, 0], 2.0)
    # ids 0, 1, 4 seen (1 three times, penalised once): 2/2, -1*2, 0/2; others unchanged
    np.testing.assert_array_equal(logits, _f32([1.0, -2.0, 0.5, -3.0, 0.0, 4.0]))
    assert logits.dtype == np.float32


def test_repetition_penalty_below_one_rewards():
    logits = _f32([3.0, -3.0, 1.0])
    applyRepetitionPenalty(logits, np.array([0, 1]), 0.5)
    np.testing.assert_array_equal(logits, _f32([6.0, -1.5, 1.0]))


def test_repetition_penalty_one_and_empty_history_are_no_ops():
    logits = _f32([1.0, -2.0, 3.0])
    applyRepetitionPenalty(logits, [0, 1, 2], 1.0)
    applyRepetitionPenalty(logits, [], 1.3)
    np.testing.assert_array_equal(logits, _f32([1.0, -2.0, 3.0]))


@pytest.mark.parametrize("penalty", [0.0, -1.2, float("nan"), float("inf")])
def test_repetition_penalty_must_be_positive(penalty):
    with pytest.raises(CausalLMError, match="repetition_penalty"):
        applyRepetitionPenalty(_f32([1.0, 2.0]), [0], penalty)


def test_repetition_penalty_rejects_ids_outside_the_vocab():
    with pytest.raises(CausalLMError, match=r"token id 5 is outside the vocabulary \[0, 3\)"):
        applyRepetitionPenalty(_f32([1.0, 2.0, 3.0]), [0, 5], 1.5)


def test_bad_words_hand_computed():
    logits = _f32([1.0, 2.0, 3.0, 4.0])
    applyBadWordsPenalty(logits, [3, 1])
    np.testing.assert_array_equal(logits, _f32([1.0, NEG_INF, 3.0, NEG_INF]))
    applyBadWordsPenalty(logits, [])
    np.testing.assert_array_equal(logits, _f32([1.0, NEG_INF, 3.0, NEG_INF]))


@pytest.mark.parametrize("bad_id", [7, -1])
def test_bad_words_outside_the_vocab_is_one_line_error(bad_id):
    with pytest.raises(CausalLMError) as info:
        applyBadWordsPenalty(_f32([1.0, 2.0, 3.0, 4.0, 5.0]), [0, bad_id])
    assert str(info.value) == (f"bad_word_ids: token id {bad_id} is outside the vocabulary "
                               f"[0, 5)")


# ------------------------------------------------------------------------------- applyTKP

def _reference_tkp(values, temperature, top_k, top_p):
    """HF Temperature -> TopK -> TopP warpers, written with lists and sorted()."""
    x = [float(np.float32(v) / np.float32(temperature)) for v in values]
    vocab_size = len(x)
    if top_k != 0:
        k = min(max(top_k, 1), vocab_size)
        kth = sorted(x, reverse=True)[k - 1]
        x = [v if v >= kth else NEG_INF for v in x]
    if top_p < 1.0:
        order = sorted((i for i in range(vocab_size) if x[i] != NEG_INF), key=lambda i: (x[i], i))
        top = x[order[-1]]
        weights = [math.exp(x[i] - top) for i in order]
        running, cumulative = 0.0, []
        for w in weights:
            running += w
            cumulative.append(running)
        for rank, i in enumerate(order[:-1]):  # the largest is always kept
            if cumulative[rank] / running <= 1.0 - top_p:
                x[i] = NEG_INF
    return _f32(x)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.9])
@pytest.mark.parametrize("top_k", [0, 1, 3, 10, 50, 64, 1000])
@pytest.mark.parametrize("top_p", [1.0, 0.95, 0.8, 0.5, 0.1, 0.0])
def test_applyTKP_matches_reference_on_random_logits_with_ties(temperature, top_k, top_p):
    rng = np.random.default_rng(hash((temperature, top_k, top_p)) % 2**32)
    for logits in (rng.normal(0.0, 3.0, 64).astype(np.float32),
                   rng.integers(-3, 4, 64).astype(np.float32),  # many ties
                   np.full(64, 0.25, dtype=np.float32)):  # all tied
        expected = _reference_tkp(logits.tolist(), temperature, top_k, top_p)
        got = applyTKP(logits.copy(), temperature, top_k, top_p)
        np.testing.assert_array_equal(got, expected)


def test_applyTKP_is_in_place_and_returns_its_argument():
    logits = _f32([1.0, 2.0, 3.0])
    assert applyTKP(logits, 2.0, 2, 1.0) is logits
    np.testing.assert_array_equal(logits, _f32([NEG_INF, 1.0, 1.5]))


def test_top_k_keeps_ties_with_the_kth():
    logits = applyTKP(_f32([1.0, 3.0, 3.0, 2.0, 3.0]), top_k=2)
    np.testing.assert_array_equal(logits, _f32([NEG_INF, 3.0, 3.0, NEG_INF, 3.0]))


def test_top_p_hand_computed():
    probs = [0.5, 0.3, 0.2]
    logits = _f32([math.log(p) for p in probs])
    # ascending: id2 (c=0.2), id1 (c=0.5), id0 (c=1.0); remove c <= 1 - top_p
    kept = applyTKP(logits.copy(), top_p=0.75)  # 1 - 0.75 = 0.25: drops id2
    assert np.isfinite(kept).tolist() == [True, True, False]
    kept = applyTKP(logits.copy(), top_p=0.45)  # 0.55: drops id2 and id1
    assert np.isfinite(kept).tolist() == [True, False, False]
    kept = applyTKP(logits.copy(), top_p=0.0)  # removes all but the largest
    assert np.isfinite(kept).tolist() == [True, False, False]


def test_top_p_ignores_tokens_already_removed():
    logits = _f32([NEG_INF, 0.0, 0.0, NEG_INF])
    applyTKP(logits, top_p=0.4)  # each live token has p = 0.5 and 0.5 <= 0.6: drop the first
    np.testing.assert_array_equal(logits, _f32([NEG_INF, NEG_INF, 0.0, NEG_INF]))


@pytest.mark.parametrize("kwargs, key", [
    (dict(temperature=0.0), "temperature"), (dict(temperature=-1.0), "temperature"),
    (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"),
    (dict(top_p=1.5), "top_p"), (dict(top_p=-0.1), "top_p"), (dict(top_p=float("nan")), "top_p"),
])
def test_applyTKP_rejects_bad_settings(kwargs, key):
    with pytest.raises(CausalLMError, match=key):
        applyTKP(_f32([1.0, 2.0]), **kwargs)


# -------------------------------------------------------------------- generate_multi_tokens

def test_generate_multi_tokens_orders_by_logit_then_id():
    logits = _f32([0.5, 2.0, 1.0, 2.0, -1.0, 1.0])
    np.testing.assert_array_equal(generate_multi_tokens(logits.copy(), 1), [1])
    np.testing.assert_array_equal(generate_multi_tokens(logits.copy(), 4), [1, 3, 2, 5])
    np.testing.assert_array_equal(generate_multi_tokens(logits.copy(), 6), [1, 3, 2, 5, 0, 4])


def test_generate_multi_tokens_applies_penalties_in_place():
    logits = _f32([0.5, 2.0, 1.0, 2.0])
    top = generate_multi_tokens(logits, 2, penalty=4.0, input_ids=[1], bad_word_ids=[3])
    np.testing.assert_array_equal(top, [2, 0])
    np.testing.assert_array_equal(logits, _f32([0.5, 0.5, 1.0, NEG_INF]))
    with pytest.raises(CausalLMError, match="n must be in"):
        generate_multi_tokens(logits, 5)


# ---------------------------------------------------------------------------------- Sampler

def test_greedy_is_first_argmax_after_penalties():
    logits = _f32([[2.0, 1.5, 2.0], [0.0, 1.0, 1.0]])
    assert Sampler().select(logits, [[], []]).tolist() == [0, 1]
    # repetition penalty 2 on id 0 (2.0 -> 1.0): id 2 is now the first maximum
    assert Sampler(repetition_penalty=2.0).select(logits, [[0], [2]]).tolist() == [2, 1]
    assert Sampler(bad_word_ids=[0, 1]).select(logits, None).tolist() == [2, 2]


def test_select_does_not_modify_the_callers_logits():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 40)).astype(np.float32)
    before = logits.copy()
    sampler = Sampler(temperature=0.5, top_k=5, top_p=0.9, repetition_penalty=1.3,
                      bad_word_ids=[1, 2], seed=1, do_sample=True)
    for _ in range(3):
        sampler.select(logits, [[0, 3], [5], []])
    Sampler(repetition_penalty=1.3, bad_word_ids=[1]).select(logits, [[0], [1], [2]])
    np.testing.assert_array_equal(logits, before)


def test_same_seed_reproduces_and_other_seeds_differ():
    rng = np.random.default_rng(5)
    steps = [rng.normal(size=(2, 50)).astype(np.float32) for _ in range(30)]

    def run(seed):
        sampler = Sampler(temperature=1.3, top_k=20, top_p=0.95, seed=seed, do_sample=True)
        return np.concatenate([sampler.select(step, [[], []]) for step in steps])

    np.testing.assert_array_equal(run(42), run(42))
    assert not np.array_equal(run(42), run(43))


def test_top_k_one_is_greedy():
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(16, 100)).astype(np.float32)  # no ties
    histories = [rng.integers(0, 100, 5).tolist() for _ in range(16)]
    greedy = Sampler(repetition_penalty=1.2, bad_word_ids=[3]).select(logits, histories)
    sampled = Sampler(temperature=2.5, top_k=1, repetition_penalty=1.2, bad_word_ids=[3],
                      seed=0, do_sample=True).select(logits, histories)
    np.testing.assert_array_equal(sampled, greedy)


@pytest.mark.slow
def test_bad_words_are_never_chosen():
    logits = np.zeros((64, 6), dtype=np.float32)
    logits[:, [1, 4]] = 5.0  # the bad words would win otherwise
    sampler = Sampler(temperature=3.0, bad_word_ids=[1, 4], seed=3, do_sample=True)
    drawn = np.concatenate([sampler.select(logits) for _ in range(50)])
    assert not np.isin(drawn, [1, 4]).any()
    assert set(drawn.tolist()) == {0, 2, 3, 5}
    assert not np.isin(Sampler(bad_word_ids=[1, 4]).select(logits), [1, 4]).any()


def _chi_square(counts, probs):
    n = counts.sum()
    expected = n * np.asarray(probs)
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.slow
@pytest.mark.parametrize("kwargs, probs", [
    (dict(), [0.1, 0.2, 0.3, 0.4]),
    (dict(temperature=0.5), np.array([0.1, 0.2, 0.3, 0.4]) ** 2 / 0.3),  # p^(1/T), T = 0.5
    (dict(top_k=2), [0.0, 0.0, 3 / 7, 4 / 7]),
    (dict(top_p=0.65), [0.0, 0.0, 3 / 7, 4 / 7]),  # c = .1, .3, .6, 1: .1 and .3 <= .35
    (dict(top_p=0.75), [0.0, 2 / 9, 3 / 9, 4 / 9]),
])
def test_sampling_follows_the_distribution(kwargs, probs):
    """Fixed seed, 40 000 draws over 4 tokens: deterministic, far from any threshold."""
    logits = np.log(np.tile(_f32([0.1, 0.2, 0.3, 0.4]), (2000, 1)))
    sampler = Sampler(seed=2024, do_sample=True, **kwargs)
    drawn = np.concatenate([sampler.select(logits) for _ in range(20)])
    counts = np.bincount(drawn, minlength=4)
    probs = np.asarray(probs)
    assert (counts[probs == 0] == 0).all()
    live = probs > 0
    # chi-square with (live - 1) <= 3 degrees of freedom; 16.27 is the 0.999 quantile for df=3
    assert _chi_square(counts[live], probs[live]) < 16.27


def test_no_finite_logit_is_an_error():
    logits = _f32([[1.0, 2.0]])
    with pytest.raises(CausalLMError, match="row 0"):
        Sampler(bad_word_ids=[0, 1]).select(logits)
    with pytest.raises(CausalLMError, match="row 0"):
        Sampler(bad_word_ids=[0, 1], seed=0, do_sample=True).select(logits)
    with pytest.raises(CausalLMError, match="row 1"):
        Sampler(seed=0, do_sample=True).select(_f32([[1.0, 2.0], [np.nan, 1.0]]))


def test_sampler_settings_are_checked():
    with pytest.raises(CausalLMError, match="temperature"):
        Sampler(temperature=0.0, do_sample=True)
    Sampler(temperature=0.0, do_sample=False)  # greedy ignores the temperature, as HF does
    with pytest.raises(CausalLMError, match="top_k"):
        Sampler(top_k=-2)
    with pytest.raises(CausalLMError, match="repetition_penalty"):
        Sampler(repetition_penalty=0.0)
    with pytest.raises(CausalLMError, match="bad_word_ids: token id 9"):
        Sampler(bad_word_ids=[9]).select(_f32([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="histories"):
        Sampler().select(_f32([[1.0, 2.0]]), [[], []])


# ------------------------------------------------------------------------ logits processors
# each checked on a hand-made row against what transformers' processor does (its docstring)

from causallm.generation.processors import (  # noqa: E402
    ForcedBOS,
    ForcedEOS,
    MinLength,
    MinNewTokens,
    NoBadWords,
    NoRepeatNGram,
    Renormalize,
    RepetitionPenalty,
    build_processors,
)
from causallm.generation.settings import GenerationSettings  # noqa: E402


def _row(n=8):
    return np.arange(n, dtype=np.float32) * 0.5 - 1.0  # [-1.0, -0.5, 0.0, 0.5, ...]


def test_no_repeat_ngram_bans_what_would_repeat_an_ngram():
    scores = _row()
    NoRepeatNGram(2)([1, 2, 3, 1], scores)   # "1 2" seen: after 1, 2 is banned
    assert np.isneginf(scores[2]) and np.isfinite(np.delete(scores, 2)).all()
    scores = _row()
    NoRepeatNGram(3)([1, 2, 5, 1, 2], scores)  # "1 2 5" seen: after "1 2", 5 is banned
    assert np.isneginf(scores[5]) and np.isfinite(np.delete(scores, 5)).all()
    scores = _row()
    NoRepeatNGram(3)([1, 2], scores)          # shorter than n: nothing to ban
    assert np.isfinite(scores).all()


def test_bad_words_single_and_multi_token():
    scores = _row()
    NoBadWords([[4], [1, 2, 6]])([5, 1, 2], scores)  # 4 always; 6 after "1 2"
    assert np.isneginf(scores[[4, 6]]).all() and np.isfinite(np.delete(scores, [4, 6])).all()
    scores = _row()
    NoBadWords([[1, 2, 6]])([2, 1], scores)          # the prefix does not end the ids
    assert np.isfinite(scores).all()


def test_min_length_and_min_new_tokens_hold_back_eos():
    for processor, short, long in ((MinLength(4, [7]), [1, 2, 3], [1, 2, 3, 4]),
                                   (MinNewTokens(2, 2, [7]), [1, 2, 3], [1, 2, 3, 4])):
        scores = _row()
        processor(short, scores)
        assert np.isneginf(scores[7])
        scores = _row()
        processor(long, scores)
        assert np.isfinite(scores).all()


def test_forced_bos_at_length_one_and_forced_eos_at_the_last_step():
    scores = _row()
    ForcedBOS(3)([2], scores)
    assert scores[3] == 0 and np.isneginf(np.delete(scores, 3)).all()
    scores = _row()
    ForcedBOS(3)([2, 5], scores)
    assert np.isfinite(scores).all()
    scores = _row()
    ForcedEOS(5, [6, 7])([0, 1, 2, 3], scores)    # cur_len 4 = max_length - 1
    assert (scores[[6, 7]] == 0).all() and np.isneginf(scores[:6]).all()


def test_renormalize_makes_what_is_left_a_distribution():
    scores = _row()
    NoBadWords([[7]])([0], scores)
    Renormalize()([0], scores)
    kept = np.exp(_row()[:7].astype(np.float64))
    assert np.isneginf(scores[7])
    np.testing.assert_allclose(scores[:7], np.log(kept / kept.sum()), rtol=1e-6)


def test_processors_come_in_transformers_order():
    s = GenerationSettings(repetition_penalty=1.2, no_repeat_ngram_size=2, bad_words_ids=[[1]],
                           min_length=3, min_new_tokens=1, forced_bos_token_id=0,
                           forced_eos_token_id=[2], eos_token_id=[2], renormalize_logits=True)
    kinds = [type(p) for p in build_processors(s, prompt_len=1, max_length=10)]
    assert kinds == [RepetitionPenalty, NoRepeatNGram, NoBadWords, MinLength, MinNewTokens,
                     ForcedBOS, ForcedEOS, Renormalize]
    # forced EOS comes after the bad words, so it wins even over a banned EOS
    s = GenerationSettings(bad_words_ids=[[2]], forced_eos_token_id=[2], eos_token_id=[2])
    scores = _row()
    for p in build_processors(s, prompt_len=1, max_length=4):
        p([0, 5, 6], scores)
    assert scores[2] == 0 and np.isneginf(np.delete(scores, 2)).all()
