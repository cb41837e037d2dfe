"""Continuous batching: many sequences decoded together, a step at a time, over one model whose
KV caches hold ``slots`` sequences (nntr_config ``slots``; batch_size 1).

Each step the scheduler gathers rows: one token for every sequence that is decoding (its last
new token, at its next position), then chunks of the prompts still to prefill, up to
``max_rows`` rows in all, so a long prompt is spread over several steps and never stalls the
sequences already decoding. The rows run as one step of several sequences (each row's cache
slot and position: runtime/runner.StageState.set_rows); the head computes the logits of each
sequence whose last pending token was in the step; each such sequence then chooses its next
token with its own sampler and settings. A sequence leaves the step it finishes in (EOS, a
stop string, its max_new_tokens, the cache's end) or the step after its request was cancelled,
and its slot is free for the next request at once.

Prefix reuse: a slot keeps the tokens its cache holds after its sequence ends. A new request
takes the free slot whose tokens share the longest prefix with its prompt (the least recently
used among equals) and prefills only the rest: the same system prompt, or a conversation's
earlier turns resent in full, cost nothing the second time. The cache is bounded by the slots;
the least recently used slot's tokens are the first overwritten.

Every sequence's tokens are those it gets alone: its rows see only its own slot's keys, at its
own positions (tested against transformers, tests/test_scheduler.py).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Sequence as Sequence_

import numpy as np

from causallm.errors import CausalLMError
from causallm.generation.generator import Sequence, new_token_limit
from causallm.generation.processors import build_processors, log_softmax
from causallm.generation.sampler import Sampler
from causallm.generation.settings import GenerationSettings


def token_logprobs(logits: np.ndarray, token: int, k: int):
    """(token, log p(token), [(id, log p)] of the k most likely, most likely first) for one
    row of logits (V,): p = softmax(logits)."""
    lp = log_softmax(logits)
    top = np.argpartition(-lp, k)[:k] if 0 < k < lp.shape[0] else np.arange(min(k, lp.shape[0]))
    top = top[np.argsort(-lp[top], kind="stable")]
    return token, float(lp[token]), [(int(i), float(lp[i])) for i in top]


class QueueFull(CausalLMError):
    """The scheduler's queue holds ``max_queue`` requests already."""


class Request(Sequence):
    """A sequence to generate (``Sequence``: its tokens, text and finish reason) and its place
    in the engine: the slot it decodes in and how many of its tokens the cache holds (``fed``).
    ``cached`` counts the prompt tokens found in the slot (prefix reuse). With ``logprobs`` k
    (0 or more), ``token_logprobs`` gets, for each new token before its text is shown, (token,
    its log-probability, the k most likely tokens and theirs): the model's distribution,
    log_softmax of the logits before any processor or sampling setting. ``done`` is set when
    it has finished; ``error`` holds what ended it abnormally. Timestamps (perf_counter):
    ``submitted``, ``first_token``, ``ended``."""

    def __init__(self, prompt_ids: Sequence_[int], settings: GenerationSettings,
                 max_new_tokens: int, tokenizer=None,
                 on_text: Callable[[str], None] | None = None,
                 on_token: Callable[["Request", int], None] | None = None,
                 logprobs: int | None = None, skip_special_tokens: bool = True) -> None:
        if not prompt_ids:
            raise CausalLMError("generate: the prompt encodes to no tokens")
        if max_new_tokens < 1:
            raise CausalLMError(f"generate: max_new_tokens must be at least 1, got "
                                f"{max_new_tokens}")
        max_new_tokens = new_token_limit(settings, max_new_tokens, len(prompt_ids))
        super().__init__(prompt_ids, settings, tokenizer, on_text,
                         skip_special_tokens=skip_special_tokens)
        self.max_new_tokens = max_new_tokens
        self.on_token = on_token
        self.logprobs = logprobs
        self.token_logprobs: list[tuple[int, float, list[tuple[int, float]]]] = []
        self.on_done: Callable[["Request"], None] | None = None  # called once it is done
        self.sampler = Sampler.fromSettings(settings, build_processors(
            settings, len(self.prompt), len(self.prompt) + max_new_tokens))
        self.slot: _Slot | None = None
        self.fed = 0
        self.cached = 0
        self.cancelled = False
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.submitted = time.perf_counter()
        self.first_token: float | None = None
        self.ended: float | None = None

    @property
    def tokens(self) -> list[int]:
        """Every token of the sequence: the prompt, then the new ones."""
        return self.prompt + self.generated

    def cancel(self) -> None:
        """Stop at the next step (the slot is freed then)."""
        self.cancelled = True


class _Slot:
    """A row of the KV caches: the tokens it holds at positions [0, len), and when last used."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.tokens: list[int] = []
        self.used = 0.0
        self.busy = False


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


STEP_ROWS = 256
"""Rows a step takes at most by default (``max_rows``): a long prompt is prefilled 256 tokens a
step, so the sequences decoding beside it wait one such step per token, not the whole
prompt."""


class Scheduler:
    """Decodes the requests ``submit`` gives it in steps of several sequences (module
    docstring). ``step()`` runs one step; ``run(stop)`` steps whenever there is work until
    ``stop`` is set (a server's worker thread); ``generate(requests)`` submits and steps until
    they are done (one caller's batch). ``max_queue`` bounds the requests waiting for a slot
(beyond those holding one)."""

    def __init__(self, model, max_rows: int | None = None, max_queue: int = 64) -> None:
        graph = model.model
        self.model = model
        self.n_slots = graph.getKVCaches("self")[0].key.shape[0] if graph.getKVCaches("self") \
            else 1
        if model.BATCH_SIZE != 1 or model.rowsPerPrompt() != 1:
            raise CausalLMError("the scheduler needs a model of batch_size 1 and one beam "
                                "(its sequences are slots, not batch rows)")
        self.slots = [_Slot(i) for i in range(self.n_slots)]
        self.capacity = model.MAX_SEQ_LEN
        self.max_rows = min(max_rows or STEP_ROWS, model.INIT_SEQ_LEN)
        self.max_queue = max_queue
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.cond = threading.Condition()
        self.stats = {"requests": 0, "finished": 0, "cancelled": 0, "prompt_tokens": 0,
                      "cached_tokens": 0, "generated_tokens": 0, "steps": 0, "step_rows": 0,
                      "ttft_sum": 0.0, "ttft_count": 0}

    # -- requests ---------------------------------------------------------------------------
    def submit(self, request: Request) -> Request:
        """Queue ``request``; QueueFull when ``max_queue`` wait already, an error when its
        prompt cannot fit the cache."""
        if len(request.prompt) >= self.capacity:
            raise CausalLMError(f"prompt has {len(request.prompt)} tokens but the KV cache holds "
                                f"{self.capacity} (prompt and new tokens together)")
        with self.cond:
            if not self._room():
                raise QueueFull(f"the server is busy: its {self.n_slots} slots are decoding and "
                                f"{len(self.waiting)} requests wait for one")
            self.waiting.append(request)
            self.stats["requests"] += 1
            self.cond.notify()
        return request

    def _room(self) -> bool:
        """Whether one more request may wait: fewer than the slots and the queue hold."""
        return len(self.waiting) + len(self.running) < self.n_slots + self.max_queue

    @property
    def queued(self) -> int:
        return len(self.waiting)

    @property
    def busy_slots(self) -> int:
        return len(self.running)

    def generate(self, requests: list[Request]) -> list[Request]:
        """Submit ``requests`` (beyond the queue's bound, as slots free up) and step until every
        one is done; they decode side by side, as many at a time as there are slots."""
        todo = deque(requests)
        while todo or not all(r.done.is_set() for r in requests):
            while todo and self._room():
                self.submit(todo.popleft())
            self.step()
        for r in requests:
            if r.error is not None:
                raise r.error
        return requests

    def run(self, stop: threading.Event) -> None:
        """Step while there is work, wait for it otherwise, until ``stop`` is set."""
        while not stop.is_set():
            with self.cond:
                while not (self.waiting or self.running) and not stop.is_set():
                    self.cond.wait(0.5)
            if not stop.is_set():
                try:
                    self.step()
                except Exception:  # its requests have their error; the loop goes on
                    pass
                time.sleep(0)  # the GIL to other threads between steps (a server's loop)

    def forget(self) -> None:
        """Drop what the free slots hold (their caches were written by other means)."""
        with self.cond:
            for slot in self.slots:
                if not slot.busy:
                    slot.tokens.clear()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    # -- one step ---------------------------------------------------------------------------
    def _admit(self) -> None:
        """Give free slots to waiting requests, each the free slot sharing the longest prefix
        with its prompt (least recently used among equals)."""
        with self.cond:
            while self.waiting and len(self.running) < self.n_slots:
                request = self.waiting.popleft()
                if request.cancelled:
                    self._end(request, "cancelled")
                    continue
                free = [s for s in self.slots if not s.busy]
                slot = max(free, key=lambda s: (min(_common(s.tokens, request.prompt),
                                                    len(request.prompt) - 1), -s.used))
                reuse = min(_common(slot.tokens, request.prompt), len(request.prompt) - 1)
                del slot.tokens[reuse:]
                slot.busy = True
                request.slot, request.fed, request.cached = slot, reuse, reuse
                self.stats["prompt_tokens"] += len(request.prompt)
                self.stats["cached_tokens"] += reuse
                self.running.append(request)

    def _end(self, request: Request, reason: str) -> None:
        if reason == "cancelled":
            self.stats["cancelled"] += 1
            if request.finish_reason is None:
                request.finish_reason = "cancelled"
        else:
            request.finish(reason)
            self.stats["finished"] += 1
        if request.slot is not None:
            request.slot.busy = False
            request.slot.used = time.perf_counter()
        request.ended = time.perf_counter()
        request.done.set()
        if request.on_done is not None:
            try:
                request.on_done(request)
            except Exception:  # a caller's callback must not stop the engine
                pass

    def step(self) -> bool:
        """One step of every running sequence (module docstring); False when there was
        nothing to run. A step that fails ends every running request with its error (their
        slots' caches are then unknown: forgotten) and raises it."""
        try:
            return self._step()
        except BaseException as e:
            for r in list(self.running):
                r.error = e
                r.finish_reason = "error"
                r.slot.tokens.clear()
                self.running.remove(r)
                self._end(r, "error")
            raise

    def _step(self) -> bool:
        self._admit()
        for r in [r for r in self.running if r.cancelled]:
            self.running.remove(r)
            self._end(r, "cancelled")
        if not self.running:
            return False
        ids: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        last: list[int] = []
        owners: list[Request] = []
        # decoding sequences first (one row each), then prompt chunks in the room left
        order = sorted(self.running, key=lambda r: len(r.tokens) - r.fed > 1)
        for r in order:
            tokens = r.tokens
            room = self.max_rows - len(ids)
            if room <= 0:
                break
            chunk = tokens[r.fed:r.fed + room]
            n = len(chunk)
            ids += chunk
            slots += [r.slot.index] * n
            positions += range(r.fed, r.fed + n)
            r.slot.tokens += chunk
            r.fed += n
            if r.fed == len(tokens):
                last.append(len(ids) - 1)
                owners.append(r)
        n = len(ids)
        model = self.model
        logits = model.model.incremental_inference(
            1, model.stageInputs(np.asarray([ids], dtype=np.float32), 0), None, n, 0, n,
            stage=model.TEXT_STAGE,
            rows=(np.asarray([slots]), np.asarray([positions]), np.asarray([last or [n - 1]])))[0]
        self.stats["steps"] += 1
        self.stats["step_rows"] += n
        logits = logits.reshape(self.n_slots, -1)
        for k, r in enumerate(owners):
            try:
                token = int(r.sampler.select(logits[k:k + 1], [r.history],
                                             None if r.constraint is None else [r.masking])[0])
                if r.logprobs is not None:
                    r.token_logprobs.append(token_logprobs(logits[k], token, r.logprobs))
                if r.first_token is None:
                    r.first_token = time.perf_counter()
                    self.stats["ttft_sum"] += r.first_token - r.submitted
                    self.stats["ttft_count"] += 1
                r.take(token)
                self.stats["generated_tokens"] += 1
                if r.on_token is not None:
                    r.on_token(r, token)
            except BaseException as e:  # a failing callback ends its own request only
                r.error = e
                r.finish_reason = "error"
            if r.finished:
                reason = r.finish_reason
            elif len(r.generated) >= r.max_new_tokens:
                reason = "length"
            elif len(r.tokens) > self.capacity:  # its last token has no position left
                reason = "cache_full"
            else:
                continue
            self.running.remove(r)
            self._end(r, reason)
        return True
