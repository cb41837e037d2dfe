"""The generator: one loop that drives any language model, decoder-only or encoder-decoder.

A model only has to start and step (``Generative``):

- ``start(prompt_ids, start_pos, context_ids, metrics) -> Start``: run what comes before the
  first new token (a decoder-only model prefills the prompt at ``[start_pos, start_pos + P)``;
  an encoder-decoder encodes it and prefills its decoder with ``decoder_start_token_id``),
  timing each phase in ``metrics``; return the first token's logits, the ids each row's
  penalties count, and how many new tokens its caches allow;
- ``step(tokens) -> logits``: feed one token per row at the next position.

The generator owns the rest, the same for every model: token selection (``Sampler``: greedy or
sampling, the processors and warpers; with a response format, each row's ``JsonConstraint``
masks the tokens its grammar refuses and is advanced by the token chosen), stop rules (an EOS
id ends its row, ``eos``; a stop string in its text, or the row's JSON value complete,
``stop``; ``max_new_tokens``, ``length``; the caches' capacity, ``cache_full``), streaming text
(a UTF-8-safe ``StreamDecoder`` per row, EOS and stop strings never printed, row 0 written to
``stream``) and the metrics (``PerformanceMetrics``: encode, prefill and generation phases,
peak memory).

Fixed against the C++ loop: every token, the first included, goes through the same selection;
every token is streamed and recorded, EOS is neither printed nor followed; streamed text never
splits a UTF-8 character; rows stop independently (docs/nntrainer.md, "First token always
greedy", "Sampling settings ignored", "First token dropped at a full buffer", "Streaming and
EOS", "Batch rows mixed up").
"""

from __future__ import annotations

import resource
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Protocol
from typing import Sequence as Sequence_

import numpy as np

from causallm.errors import CausalLMError
from causallm.generation.processors import build_processors
from causallm.generation.sampler import Sampler
from causallm.generation.settings import GenerationSettings
from causallm.tokenizer import StreamDecoder


def peak_memory_kb() -> int:
    """Peak resident set size of this process, in KB (getrusage ``ru_maxrss``)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


@dataclass
class PerformanceMetrics:
    """models/performance_metrics.h, with the phases of a run: ``vision`` (a vision tower over
    the images, its tokens the image patches), ``encode`` (an encoder-decoder's encoder pass),
    ``prefill`` and ``generation`` (the one-token steps)."""

    vision_tokens: int = 0
    vision_duration_ms: float = 0.0
    encode_tokens: int = 0
    encode_duration_ms: float = 0.0
    prefill_tokens: int = 0
    prefill_duration_ms: float = 0.0
    generation_tokens: int = 0
    generation_duration_ms: float = 0.0
    total_duration_ms: float = 0.0
    initialization_duration_ms: float = 0.0
    peak_memory_kb: int = 0

    @contextmanager
    def phase(self, name: str, tokens: int):
        """Time the block as phase ``name`` ("vision", "encode", "prefill" or "generation")
        over ``tokens`` tokens (added to what the phase has)."""
        t0 = time.perf_counter()
        yield
        ms = (time.perf_counter() - t0) * 1e3
        setattr(self, f"{name}_tokens", getattr(self, f"{name}_tokens") + tokens)
        setattr(self, f"{name}_duration_ms", getattr(self, f"{name}_duration_ms") + ms)

    def phases(self) -> list[tuple[str, int, float]]:
        """(name, tokens, ms) of each phase that ran (vision only with images, encode only
        for an encoder-decoder)."""
        out = [(name, getattr(self, f"{name}_tokens"), getattr(self, f"{name}_duration_ms"))
               for name in ("vision", "encode") if getattr(self, f"{name}_tokens")]
        return out + [("prefill", self.prefill_tokens, self.prefill_duration_ms),
                      ("generation", self.generation_tokens, self.generation_duration_ms)]

    def print(self, stream) -> None:
        """The NNTrainer metrics block."""
        def tps(n: int, ms: float) -> str:
            return f"{n / ms * 1000:.2f}" if ms > 0 else "inf"

        stream.write("==================[ LLM with NNTrainer ]===================\n")
        for name, n, ms in self.phases():
            stream.write(f"{name}: {n} tokens, {ms:.0f} ms, {tps(n, ms)} TPS\n")
        stream.write(f"total: {self.total_duration_ms:.0f} ms\n"
                     f"peak memory: {self.peak_memory_kb} KB\n")
        stream.flush()

    def record(self) -> dict:
        """The phases as JSON fields: {name: {"tokens", "ms", "tps"}} and ``peak_memory_kb``."""
        def rate(n, ms):
            return round(n / ms * 1000, 3) if ms > 0 else None

        out = {name: {"tokens": n, "ms": round(ms, 3), "tps": rate(n, ms)}
               for name, n, ms in self.phases()}
        out["peak_memory_kb"] = self.peak_memory_kb
        return out


@dataclass
class Start:
    """What a model's ``start`` returns."""

    logits: np.ndarray               # (B, V): the logits of the first new token
    history: list[list[int]]         # per row: the ids the repetition penalty counts so far
    capacity: int                    # new tokens the caches allow, the first included


class Generative(Protocol):
    """What the generator needs of a model (see the module docstring)."""

    BATCH_SIZE: int

    def start(self, prompt_ids: np.ndarray, start_pos: int, context_ids: Sequence_[int],
              metrics: PerformanceMetrics) -> Start: ...

    def step(self, tokens: np.ndarray) -> np.ndarray: ...


@dataclass
class GenerationResult:
    """What one generation produced, per batch row."""

    prompt_ids: list = field(default_factory=list)      # [B][P]
    generated_ids: list = field(default_factory=list)   # [B][n], new tokens only (EOS included)
    texts: list = field(default_factory=list)           # [B] decoded new text (no special tokens)
    finish_reasons: list = field(default_factory=list)  # [B] "eos" | "stop" | "length" |
                                                        # "cache_full"
    do_sample: bool = False
    metrics: PerformanceMetrics = field(default_factory=PerformanceMetrics)
    num_beams: int = 1
    sequences: list = field(default_factory=list)       # beams: [B][num_return_sequences]
                                                        # {generated_ids, score, text}, best first

    def record(self) -> dict:
        """The CLI's --json fields of this result (row 0, plus every row when B > 1; with
        beams the best hypothesis, its score, and every returned one when there are several)."""
        out = {"prompt_ids": self.prompt_ids[0], "generated_ids": self.generated_ids[0],
               "text": self.texts[0] if self.texts else "",
               "finish_reason": self.finish_reasons[0], "do_sample": self.do_sample,
               **self.metrics.record()}
        if self.num_beams > 1:
            out["num_beams"] = self.num_beams
            out["score"] = self.sequences[0][0]["score"]
            if len(self.sequences[0]) > 1:
                out["sequences"] = self.sequences[0]
        if len(self.generated_ids) > 1:
            out["batch"] = [{"generated_ids": g, "text": t, "finish_reason": r} for g, t, r in
                            zip(self.generated_ids, self.texts, self.finish_reasons)]
        return out


class StopText:
    """One row's text passed through its stop strings (llama.cpp's and OpenAI's ``stop``).

    ``feed(chunk) -> (text, stopped)``: with ``held`` the text kept back so far and
    t = held + chunk, if a stop string occurs in t, return the text before its first
    occurrence (the earliest start; the longest string there) and True; else return t without
    its longest suffix that is a proper prefix of a stop string (that suffix becomes ``held``)
    and False. ``release()`` returns what is held (at the end, when it turned out not to be a
    stop string). So the emitted text never contains a stop string nor anything after one,
    even when one spans several tokens; no occurrence can start in text already emitted, since
    a suffix that could begin one is always held back.
    """

    def __init__(self, stop_strings: Sequence_[str]) -> None:
        self.stops = list(stop_strings)
        self.held = ""

    def feed(self, chunk: str) -> tuple[str, bool]:
        text = self.held + chunk
        found = [(i, -len(stop)) for stop in self.stops if (i := text.find(stop)) >= 0]
        if found:
            self.held = ""
            return text[:min(found)[0]], True
        keep = max((k for stop in self.stops for k in range(min(len(stop) - 1, len(text)), 0, -1)
                    if text.endswith(stop[:k])), default=0)
        self.held = text[len(text) - keep:]
        return text[:len(text) - keep], False

    def release(self) -> str:
        held, self.held = self.held, ""
        return held


def cut_at_stop(text: str, stop_strings: Sequence_[str]) -> tuple[str, bool]:
    """``text`` up to the first occurrence of any stop string, and whether one occurred."""
    cut, stopped = StopText(stop_strings).feed(text)
    return (cut, True) if stopped else (text, False)


def check_prompts(prompt_ids: list[list[int]], batch: int, max_new_tokens: int) -> None:
    """What a generation needs of its prompts: ``batch`` rows of one non-zero length, and at
    least one new token."""
    if len(prompt_ids) != batch:
        raise CausalLMError(f"generate: got {len(prompt_ids)} prompts for batch_size {batch}")
    length = len(prompt_ids[0])
    if length == 0:
        raise CausalLMError("generate: the prompt encodes to no tokens")
    if any(len(row) != length for row in prompt_ids):
        raise CausalLMError("generate: the prompts of a batch must have the same token length")
    if max_new_tokens < 1:
        raise CausalLMError(f"generate: max_new_tokens must be at least 1, got {max_new_tokens}")


def new_token_limit(settings: GenerationSettings, max_new_tokens: int, prompt_len: int) -> int:
    """The new tokens a generation may make: ``max_new_tokens``, and with a ``max_length`` at
    most ``max_length - prompt_len`` (``prompt_len``: the ids before the new ones, a decoder's
    start token included), which must leave one, as transformers requires."""
    if settings.max_length is None:
        return max_new_tokens
    if prompt_len >= settings.max_length:
        raise CausalLMError(f"the prompt has {prompt_len} tokens but generation_config.json's "
                            f"max_length, prompt and new tokens together, is "
                            f"{settings.max_length}: raise it, or give the number of new "
                            f"tokens (-n, max_new_tokens)")
    return min(max_new_tokens, settings.max_length - prompt_len)


class Sequence:
    """One sequence's new tokens as they come: its ids, its text through a UTF-8-safe
    ``StreamDecoder`` and its stop strings (``StopText``), its response format's
    ``constraint`` (None without one: the sampler masks with it), and why it ended.
    ``take(token)`` records a chosen token: an EOS id ends it ("eos", neither decoded nor
    shown); a stop string in its text ends it ("stop", the text cut before it), and so does its
    JSON value complete ("stop"); ``on_text(piece)`` sees the text as it is decided.
    ``finish()`` flushes the decoder at the end. ``history`` is what the penalties count: the ids
    before the new ones (``context``: a cached system prompt, then the prompt) and the new
    ones."""

    def __init__(self, prompt_ids: Sequence_[int], settings: GenerationSettings,
                 tokenizer=None, on_text: Callable[[str], None] | None = None,
                 context: Sequence_[int] = (), skip_special_tokens: bool = True) -> None:
        self.prompt = [int(t) for t in prompt_ids]
        self.settings = settings
        self.history = [int(t) for t in context] + self.prompt
        self.generated: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.eos = set(settings.eos_token_id)
        self.decoder = (StreamDecoder(tokenizer, skip_special_tokens)
                        if tokenizer is not None else None)
        self.stops = StopText(settings.stop_strings)
        self.on_text = on_text
        self.cut = False  # the text ended at a stop string
        self.constraint = None if settings.response_format is None else \
            settings.response_format.constraint(settings.eos_token_id)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def take(self, token: int) -> None:
        token = int(token)
        self.generated.append(token)
        self.history.append(token)
        if token in self.eos:
            self.finish_reason = "eos"
            return
        if self.constraint is not None:
            self.constraint.advance(token)
        if self.decoder is not None:
            self._show(self.decoder.step(token))
        if self.constraint is not None and self.constraint.done and not self.finished:
            self.finish_reason = "stop"  # the JSON value is complete

    @property
    def masking(self):
        """The constraint the sampler masks this sequence's next token with (None: none)."""
        return None if self.finished else self.constraint

    def finish(self, reason: str = "length") -> None:
        """End the sequence (``reason`` unless it already ended), its held text shown."""
        if not self.cut and self.decoder is not None:
            self._show(self.decoder.flush(), last=True)
        if self.finish_reason is None:
            self.finish_reason = reason

    def _show(self, chunk: str, last: bool = False) -> None:
        text, stopped = self.stops.feed(chunk)
        if stopped:
            self.finish_reason = "stop"
            self.cut = True
        elif last:
            text += self.stops.release()
        self.text += text
        if text and self.on_text is not None:
            self.on_text(text)


def _writer(stream) -> Callable[[str], None]:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()
    return write


class Generator:
    """Generates with ``model`` (a ``Generative``) as ``settings`` say (greedy or sampling: one
    row per prompt), stopping a row at an EOS id. With a ``tokenizer``, the new text of every
    row is decoded as it comes (``GenerationResult.texts``) and row 0's is written to
    ``stream``."""

    def __init__(self, model: Generative, settings: GenerationSettings, tokenizer=None,
                 stream=None) -> None:
        self.model = model
        self.settings = settings
        self.eos = set(settings.eos_token_id)
        self.tokenizer = tokenizer
        self.stream = stream

    def generate(self, prompt_ids: list[list[int]], max_new_tokens: int, start_pos: int = 0,
                 context_ids: Sequence_[int] = (),
                 on_token: Callable[[int, int], None] | None = None) -> GenerationResult:
        """Start ``model`` on ``prompt_ids`` (one equal-length list per batch row) and generate
        up to ``max_new_tokens`` new tokens per row. ``on_token(b, token_id)`` is called for
        every new token of a running row. ``context_ids`` are tokens before ``start_pos`` (a
        loaded system prompt), which the repetition penalty counts too."""
        B = self.model.BATCH_SIZE
        check_prompts(prompt_ids, B, max_new_tokens)
        metrics = PerformanceMetrics()
        s = self.settings
        result = GenerationResult(prompt_ids=[list(r) for r in prompt_ids],
                                  do_sample=s.do_sample, metrics=metrics)
        if s.stop_strings and self.tokenizer is None:
            raise CausalLMError("generate: stop strings need a tokenizer to decode the text")
        t0 = time.perf_counter()
        start = self.model.start(np.asarray(prompt_ids, dtype=np.float32), start_pos,
                                 list(context_ids), metrics)
        stream = self.stream
        rows = [Sequence(prompt_ids[b], s, self.tokenizer,
                         _writer(stream) if b == 0 and stream is not None else None)
                for b in range(B)]
        for row, history in zip(rows, start.history):
            row.history = history  # the model's: a beam's rows, a cached system prompt
        prompt_len = len(start.history[0])
        limit = new_token_limit(s, max_new_tokens, prompt_len)
        n_new = min(limit, start.capacity)
        sampler = Sampler.fromSettings(s, build_processors(s, prompt_len, prompt_len + n_new))

        def emit(tokens: np.ndarray) -> None:
            for b, row in enumerate(rows):
                if row.finished:
                    continue
                if on_token is not None:  # before the token's text is shown
                    on_token(b, int(tokens[b]))
                row.take(tokens[b])

        def masks() -> list | None:
            return None if s.response_format is None else [r.masking for r in rows]

        with metrics.phase("prefill", 0):  # choosing the first token belongs to the prefill
            emit(sampler.select(start.logits, [r.history for r in rows], masks()))
        steps = 0
        tokens = np.zeros(B, dtype=np.float32)
        with metrics.phase("generation", 0):
            while steps + 1 < n_new and not all(r.finished for r in rows):
                tokens[:] = [r.history[-1] for r in rows]
                logits = self.model.step(tokens)
                steps += 1
                emit(sampler.select(logits, [r.history for r in rows], masks()))
        metrics.generation_tokens = steps
        for row in rows:
            row.finish("length" if n_new == limit else "cache_full")
        if stream is not None:
            stream.flush()
        result.generated_ids = [r.generated for r in rows]
        result.texts = [r.text for r in rows]
        result.finish_reasons = [r.finish_reason for r in rows]
        metrics.total_duration_ms = (time.perf_counter() - t0) * 1e3
        metrics.peak_memory_kb = peak_memory_kb()
        return result
