"""Several sequences decoded together (causallm/generation/scheduler.py) give each sequence what
transformers gives it alone (tests/fixtures/sequences.npz, tools/fixtures_sequences.py): the
logits of every step, teacher-forced, and the greedy tokens; with fewer slots than requests,
prompts chunked over steps beside decoding sequences, requests arriving mid-way, and a slot's
cached prefix reused."""

import os

import numpy as np
import pytest

from causallm.errors import CausalLMError
from causallm.generation.settings import GenerationSettings
from causallm.generation.scheduler import QueueFull, Request, Scheduler
from parity import FIXTURES, assert_logits_close, load_folder

REF = np.load(os.path.join(FIXTURES, "sequences.npz"))
FOLDERS = ["llama-gqa3", "qwen3-swa6-bias", "gemma3-swa-tied", "gpt2-tied"]
N_PROMPTS = 4


def reference(folder, k):
    key = folder.replace("-", "_")
    return (REF[f"{key}/prompt_{k}"].tolist(), REF[f"{key}/tokens_{k}"].tolist(),
            REF[f"{key}/step_logits_{k}"])


class Forced:
    """A sampler that records the logits it is given and chooses transformers' token
    (teacher forcing: every step is compared, whatever a near-tie would have chosen)."""

    def __init__(self, tokens):
        self.tokens = list(tokens)
        self.seen = []

    def select(self, logits, histories, constraints=None):
        self.seen.append(logits[0].copy())
        return np.array([self.tokens[len(self.seen) - 1]])


def engine(folder, slots=3, rows=8):
    model = load_folder(folder, init_seq_len=rows, num_to_generate=40, slots=slots)
    return model, Scheduler(model)


def forced_request(model, folder, k):
    prompt, tokens, _ = reference(folder, k)
    r = Request(prompt, GenerationSettings(eos_token_id=[]), len(tokens), model.tokenizer)
    r.sampler = Forced(tokens)
    return r


@pytest.mark.slow
@pytest.mark.parametrize("folder", FOLDERS)
def test_every_sequence_gets_its_own_logits(folder):
    """Four prompts (3 to 17 tokens) on 3 slots, 8 rows a step: the 17-token prompt is
    prefilled over three steps beside the others' decoding, the fourth request waits for a
    slot, and two arrive after the first steps."""
    model, scheduler = engine(folder)
    first = [forced_request(model, folder, k) for k in range(2)]
    later = [forced_request(model, folder, k) for k in range(2, N_PROMPTS)]
    for r in first:
        scheduler.submit(r)
    for _ in range(3):
        scheduler.step()
    scheduler.generate(later)
    while not all(r.done.is_set() for r in first):
        scheduler.step()
    assert scheduler.stats["steps"] > 12  # interleaved, not one request after the other
    for k, r in enumerate(first + later):
        _, tokens, logits = reference(folder, k)
        assert r.finish_reason == "length" and r.generated == tokens
        assert len(r.sampler.seen) == len(tokens)
        for step, row in enumerate(r.sampler.seen):
            assert_logits_close(row, logits[step], f"{folder} prompt {k} step {step}")


@pytest.mark.slow
@pytest.mark.parametrize("folder", ["llama-gqa3", "gemma3-swa-tied"])
def test_greedy_tokens_batched_are_the_tokens_alone(folder):
    """The real sampler (greedy): transformers' tokens wherever its choice is decided."""
    model, scheduler = engine(folder, slots=4, rows=16)
    settings = model.generationSettings(do_sample=False)
    requests = [Request(reference(folder, k)[0], settings, 12, model.tokenizer)
                for k in range(N_PROMPTS)]
    scheduler.generate(requests)
    for k, r in enumerate(requests):
        _, tokens, logits = reference(folder, k)
        top2 = np.sort(logits, axis=1)[:, -2:]
        decided = next((i for i, m in enumerate(top2[:, 1] - top2[:, 0]) if m < 1e-3),
                       len(tokens))
        assert r.generated[:decided] == tokens[:decided], f"prompt {k}"


def test_a_cached_prefix_is_reused_and_gives_the_same_logits():
    """A request whose prompt a free slot already holds prefills only its last token; a
    longer prompt that starts with a finished sequence's tokens reuses them too."""
    folder = "llama-gqa3"
    model, scheduler = engine(folder, slots=2)
    a = forced_request(model, folder, 3)
    scheduler.generate([a])
    again = forced_request(model, folder, 3)
    scheduler.generate([again])
    prompt, tokens, logits = reference(folder, 3)
    assert again.cached == len(prompt) - 1
    for step, row in enumerate(again.sampler.seen):
        assert_logits_close(row, logits[step], f"reused prefix, step {step}")
    # a different prompt on the other (empty) slot, then one sharing a's whole sequence
    other = forced_request(model, folder, 0)
    scheduler.generate([other])
    assert other.cached == 0
    longer = Request(prompt + tokens[:5], GenerationSettings(eos_token_id=[]), 4,
                     model.tokenizer)
    longer.sampler = Forced(tokens[5:9])
    scheduler.generate([longer])
    assert longer.cached == len(prompt) + 5 - 1
    for step, row in enumerate(longer.sampler.seen):
        assert_logits_close(row, logits[5 + step], f"continued sequence, step {step}")


def test_cancelled_requests_free_their_slot_and_the_queue_is_bounded():
    model = load_folder("llama-gqa3", init_seq_len=8, num_to_generate=40, max_seq_len=48,
                        slots=1)
    scheduler = Scheduler(model, max_queue=1)
    settings = model.generationSettings(do_sample=False)
    prompt = reference("llama-gqa3", 0)[0]
    a, b = Request(prompt, settings, 30), Request(prompt, settings, 3)
    scheduler.submit(a)
    scheduler.submit(b)
    with pytest.raises(QueueFull):
        scheduler.submit(Request(prompt, settings, 3))  # 1 slot + 1 waiting
    scheduler.step()
    scheduler.step()
    a.cancel()
    scheduler.generate([])
    while not b.done.is_set():
        scheduler.step()
    assert a.finish_reason == "cancelled" and len(a.generated) < 30
    assert b.finish_reason == "length" and len(b.generated) == 3
    with pytest.raises(CausalLMError, match="KV cache holds 48"):
        scheduler.submit(Request(list(range(4, 52)), settings, 1))


@pytest.mark.slow
def test_the_head_projects_only_rows_asked_for():
    """A step whose rows are all prompt chunks still runs (no logits wanted)."""
    model, scheduler = engine("llama-gqa3", slots=2, rows=4)
    r = forced_request(model, "llama-gqa3", 3)   # 17 tokens: five steps of 4 rows
    scheduler.generate([r])
    _, tokens, logits = reference("llama-gqa3", 3)
    assert_logits_close(r.sampler.seen[0], logits[0], "first token after a chunked prefill")


def test_logprobs_are_the_models_distribution():
    """Each new token's log-probability and the top 3 are log_softmax of transformers'
    logits for that step."""
    folder = "qwen3-swa6-bias"
    model, scheduler = engine(folder)
    r = forced_request(model, folder, 1)
    r.logprobs = 3
    scheduler.generate([r])
    _, tokens, logits = reference(folder, 1)
    for step, (token, lp, top) in enumerate(r.token_logprobs):
        row = logits[step].astype(np.float64)
        want = row - row.max() - np.log(np.exp(row - row.max()).sum())
        assert token == tokens[step]
        assert abs(lp - want[token]) < 1e-3
        assert [i for i, _ in top] == list(np.argsort(-want, kind="stable")[:3])
        np.testing.assert_allclose([v for _, v in top], np.sort(want)[::-1][:3], atol=1e-3)


def test_a_failing_step_ends_its_requests_with_the_error_and_the_engine_goes_on():
    """A step that raises (here: a token id outside the vocabulary, which the embedding
    refuses) ends the requests it carried with that error; the next request is served."""
    model, scheduler = engine("llama-gqa3", slots=2)
    settings = model.generationSettings(do_sample=False)
    bad = Request([5, 6, 10 ** 6], settings, 4)
    with pytest.raises(CausalLMError, match="out of range"):
        scheduler.generate([bad])
    assert bad.done.is_set() and bad.finish_reason == "error" and not scheduler.running
    r = forced_request(model, "llama-gqa3", 0)
    scheduler.generate([r])
    _, tokens, logits = reference("llama-gqa3", 0)
    for step, row in enumerate(r.sampler.seen):
        assert_logits_close(row, logits[step], f"after a failed step, step {step}")
