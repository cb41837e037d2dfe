"""An OpenAI-compatible HTTP server for one loaded model (``causallm serve MODEL_DIR``).

    POST /v1/chat/completions   messages -> the folder's chat template -> generation
    POST /v1/completions        a prompt string (or token ids) -> generation
    POST /v1/embeddings         texts -> embeddings (an embedding model only)
    GET  /v1/models             the one model served
    GET  /health                {"status": "ok", "model", "generations_stopped", "slots", ...}
    GET  /metrics               counters and gauges in Prometheus' text format

Starlette and uvicorn (the optional ``serve`` extra). Requests are checked here, before any
work: a malformed body, a field of the wrong type or out of range, or what the model cannot do
is a 400 with OpenAI's error body ``{"error": {"message", "type": "invalid_request_error",
"param", "code"}}``; so is a CausalLMError the model raises before its first token (a prompt
longer than the KV cache). The ``model`` field may name anything: there is one model, and
responses carry its id.

A decoder-only text model serves many requests at once: its KV caches hold ``--parallel`` N
sequences (slots) and one worker thread runs the scheduler (causallm/generation/scheduler.py),
which decodes every running request in the same step and prefills a new one's prompt in chunks
between them; a request whose prompt starts with what a free slot holds (the same system prompt,
a conversation's earlier turns) prefills only the rest (``usage.prompt_tokens_details.
cached_tokens``). Up to ``--queue`` requests wait for a slot; beyond that a request is answered
503 with ``Retry-After``. Other models (encoder-decoders, vision) generate one request at a time
in one worker thread, in arrival order. A streamed answer is sent as server-sent events
(``data: {chunk}``, then ``data: [DONE]``) as the text is decoded; a client that goes away (its
stream closed, or a non-streamed request's connection dropped) stops its generation at the next
step and frees its slot, and a request still waiting its turn is skipped (``GET /health``
counts these as ``generations_stopped``; the log has one info line each).

A request is checked before it waits for anything (its prompt against what the model takes
too); its error messages show the model's id where the server's model path would be. The
address is taken before the model loads (``bind``). The first SIGINT or SIGTERM stops the
generations in flight and ends the server; a second ends the process at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import logging
import logging.config
import math
import os
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from causallm.errors import CausalLMError, utf8
from causallm.generation.options import OPTIONS, Options, check
from causallm.generation.scheduler import QueueFull
from causallm.loader import LoadedModel, Stopped, completion_of

log = logging.getLogger("causallm.server")

UNSUPPORTED = {"functions": (None, []), "function_call": (None, "none"), "suffix": (None, ""),
               "best_of": (None, 1), "echo": (None, False)}
"""Fields this server cannot honour -> the values that ask for nothing (accepted)."""

MAX_CHOICES = 16
"""The largest ``n``: choices of one request, each a sequence of its own."""

MAX_IMAGE_PIXELS = 1 << 24
"""The largest image a request may carry, in pixels (4096 x 4096; refused from its header,
before it is decoded)."""


class BadRequest(Exception):
    """A request the server refuses: 400 (or ``status``) with OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 status: int = 400, kind: str = "invalid_request_error",
                 headers: dict | None = None) -> None:
        super().__init__(message)
        self.param, self.code, self.status, self.kind = param, code, status, kind
        self.headers = headers

    def body(self, public=str) -> dict:
        """OpenAI's error body; ``public`` rewrites the message for the client (the server's
        paths hidden)."""
        return {"error": {"message": public(str(self)), "type": self.kind, "param": self.param,
                          "code": self.code}}

    def response(self, public=str) -> Response:
        r = _json(self.body(public), self.status)
        r.headers.update(self.headers or {})
        return r


def _json(data, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


# -- request fields --------------------------------------------------------------------------
def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def integer(body: dict, name: str, low: int, high: int | None = None):
    """``body[name]``: absent or null -> None, else an integer in [low, high]."""
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v) or v < low or (high is not None and v > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise BadRequest(f"'{name}' must be an integer {bound}, got {orjson.dumps(v).decode()}",
                         name)
    return v


def boolean(body: dict, name: str, default: bool = False, where: str | None = None) -> bool:
    """``body[name]``: absent or null -> ``default``, else true or false (``where``: the
    field's name in messages, when the body is an object inside the request)."""
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        where = where or name
        raise BadRequest(f"'{where}' must be true or false, got {orjson.dumps(v).decode()}",
                         where)
    return v


def option(body: dict, name: str, field: str | None = None):
    """Generation option ``name`` (causallm/generation/options.py) from the request's field of
    the same name (or ``field``): absent or null -> None; a bad value is a 400 naming the
    field, by the option's one rule."""
    field = field or OPTIONS[name].field
    try:
        return check(name, body.get(field), "field", field)
    except CausalLMError as e:
        raise BadRequest(str(e), field) from None


def request_settings(body: dict, loaded: LoadedModel):
    """(the request's settings, its options): its generation fields (every option with a
    request field in causallm/generation/options.py; docs/server.md has the table), each
    checked by its option's rule, over the model's settings (generation_config.json's and
    load()'s: an absent field leaves the model's value), a copy
    (GenerationSettings.withOptions, where a response format is compiled)."""
    if "model" in body and not isinstance(body["model"], str):
        raise BadRequest("'model' must be a string", "model")
    for name, (absent, off) in UNSUPPORTED.items():
        if body.get(name) not in (absent, off):
            raise BadRequest(f"'{name}' is not supported by this server", name)
    options = {name: option(body, name) for name, o in OPTIONS.items()
               if o.field is not None and name not in ("max_new_tokens", "response_format")}
    max_tokens = [option(body, "max_new_tokens", field)
                  for field in ("max_completion_tokens", "max_tokens")]
    options["max_new_tokens"] = max_tokens[0] or max_tokens[1]
    limit = loaded.context_length
    for field, value in zip(("max_completion_tokens", "max_tokens"), max_tokens):
        if value is not None and limit is not None and value > limit:
            raise BadRequest(f"'{field}' {value} is more than the context: {limit} "
                             f"positions, shared by the prompt and the new tokens", field)
    options["response_format"] = body.get("response_format")  # its compiler checks it
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict) or not all(_is_number(v) for v in bias.values()):
            raise BadRequest("'logit_bias' must map token ids to numbers", "logit_bias")
        if any(v != -100 for v in bias.values()):
            raise BadRequest("'logit_bias' supports only -100 (the token is never chosen)",
                             "logit_bias")
        try:
            banned = [[int(k)] for k in bias]
        except ValueError:
            raise BadRequest("'logit_bias' keys must be token ids", "logit_bias") from None
        if any(not 0 <= t[0] < loaded.model.NUM_VOCAB for t in banned):
            raise BadRequest(f"'logit_bias' token ids must be in [0, "
                             f"{loaded.model.NUM_VOCAB})", "logit_bias")
        if banned:
            options["bad_words_ids"] = list(loaded.model.generation.bad_words_ids) + banned
    options = Options((k, v) for k, v in options.items() if v is not None)
    try:  # checked here, before the request queues: a 400 naming the field
        settings = loaded.model.generation.withOptions(options, loaded.model.tokenizer)
    except CausalLMError as e:  # the response format's: the other fields cannot fail here
        raise BadRequest(str(e), "response_format") from None
    return settings, options


def logprobs_option(body: dict, chat: bool) -> int | None:
    """How many alternatives each token's log-probability comes with, or None for none: chat's
    ``logprobs`` (true/false) and ``top_logprobs`` (0 to 20, only with logprobs), completions'
    ``logprobs`` (an integer 0 to 5, or null)."""
    if not chat:
        return integer(body, "logprobs", 0, 5)
    top = integer(body, "top_logprobs", 0, 20)
    if not boolean(body, "logprobs"):
        if top is not None:
            raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    return top or 0


ROLES = ("system", "developer", "user", "assistant", "tool")
"""OpenAI's message roles; "developer" (its newer name for system) reaches the template as
"system"."""


def _dumps(v) -> str:
    return orjson.dumps(v).decode()


def chat_messages(body: dict, max_images: int | None = None) -> tuple[list[dict], list]:
    """``messages``: a non-empty list of {"role": one of ROLES, "content": str or parts}, and
    the images their parts carry, in order. Content may be null (or absent) only in an
    assistant message with ``tool_calls``, as OpenAI's. Parts are ``{"type": "text", "text":
    ...}`` and, in a user message, ``{"type": "image_url", "image_url": {"url":
    "data:image/...;base64,..."}}``: a message of text parts has their texts joined; one with
    images keeps its parts in Hugging Face's form (``{"type": "image"}`` where an image goes,
    which a vision model's chat template renders as its image placeholder). More images than
    ``max_images`` are refused before any is decoded."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {\"role\", \"content\"} "
                         "objects", "messages")
    out, images = [], []  # images: (the image file's bytes, where) until all are counted
    for k, m in enumerate(messages):
        where = f"messages[{k}]"
        if not isinstance(m, dict):
            raise BadRequest(f"'{where}' must be an object {{\"role\", \"content\"}}, got "
                             f"{_dumps(m)[:40]}", where)
        role = m.get("role")
        if role not in ROLES:
            raise BadRequest(f"'{where}.role' must be one of {', '.join(ROLES)}, got "
                             f"{_dumps(role)[:40]}", f"{where}.role")
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise BadRequest(f"'{where}.name' must be a string", f"{where}.name")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                at = f"{where}.content[{j}]"
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    parts.append({"type": "text", "text": part["text"]})
                elif kind == "image_url" and role == "user":
                    images.append((data_uri_bytes(part.get("image_url"), f"{at}.image_url"),
                                   f"{at}.image_url"))
                    parts.append({"type": "image"})
                elif kind == "image_url":
                    raise BadRequest(f"'{at}': images go in user messages, not {role}", at)
                else:
                    raise BadRequest(f"'{at}': a part must be {{\"type\": \"text\", \"text\": "
                                     f"...}} or {{\"type\": \"image_url\", \"image_url\": "
                                     f"{{\"url\": ...}}}}", f"{where}.content")
            content = parts if any(p["type"] == "image" for p in parts) else \
                "".join(p["text"] for p in parts)
        elif not isinstance(content, str) and not (
                content is None and role == "assistant" and m.get("tool_calls")):
            raise BadRequest(f"'{where}.content' must be a string or a list of parts (null only "
                             f"in an assistant message with tool_calls), got "
                             f"{_dumps(content)[:40]}", f"{where}.content")
        out.append({**m, "role": "system" if role == "developer" else role,
                    "content": content})
    if max_images is not None and len(images) > max_images:
        raise BadRequest("this model takes no images (it has no vision tower)" if not max_images
                         else f"'messages' holds {len(images)} images; the model takes at most "
                         f"{max_images} (their tokens fill its context)", "messages")
    return out, [data_uri_image(data, where) for data, where in images]


def data_uri_bytes(value, where: str) -> bytes:
    """The image file's bytes of an ``image_url`` ``{"url": "data:image/<type>;base64,<data>"}``
    (the server reads no URL of the network)."""
    url = value.get("url") if isinstance(value, dict) else None
    if not isinstance(url, str) or not url.startswith("data:"):
        raise BadRequest(f"{where}: must be {{\"url\": \"data:image/...;base64,...\"}} (the "
                         f"server fetches no URLs)", where)
    head, _, data = url.partition(",")
    try:
        if not head.endswith(";base64") or not data:
            raise ValueError("a data URL of base64 data expected")
        return base64.b64decode(data, validate=True)
    except ValueError as e:  # binascii.Error is a ValueError
        raise BadRequest(f"{where}: {e}", where) from None


def data_uri_image(data: bytes, where: str):
    """The Pillow image of an image file's bytes, at most MAX_IMAGE_PIXELS pixels."""
    from causallm.io.images import decode_image

    try:
        return decode_image(data, where, MAX_IMAGE_PIXELS)
    except CausalLMError as e:
        raise BadRequest(str(e), where) from None


def completion_prompt(body: dict):
    """``prompt``: a string, a list of token ids, or a list holding one of either."""
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str) and p:
        return p
    if isinstance(p, list) and p and all(_is_int(t) for t in p):
        return p
    raise BadRequest("'prompt' must be a non-empty string or list of token ids (one prompt "
                     "per request)", "prompt")


# -- the app ---------------------------------------------------------------------------------
GONE = "the client went away"
SHUTDOWN = "the server is shutting down"
"""Why a generation is stopped early (``_Job.cancel``)."""


class _Job:
    """One choice's generation; its events go to ``events``, an asyncio queue a request's
    choices share, as (index, kind, value): ("text", (piece, logprob entries)) when streamed,
    ("done", Completion), ("error", exception). ``stats`` counts the generations stopped
    because their client went away; ``why`` says why a cancelled one stopped."""

    def __init__(self, events: asyncio.Queue, index: int, stats: dict) -> None:
        self.loop = asyncio.get_running_loop()
        self.events, self.index = events, index
        self.cancelled = False
        self.why = GONE
        self.stats = stats

    def put(self, kind: str, value) -> None:
        """Hand an event to the request (from any thread; dropped once the loop is closed)."""
        with contextlib.suppress(RuntimeError):  # the server has ended
            self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, kind, value))

    def cancel(self, why: str = GONE) -> None:
        if not self.cancelled:
            self.cancelled, self.why = True, why

    def stopped(self) -> None:
        """The generation has stopped early: counted and logged when its client went away."""
        if self.why == GONE:
            self.stats["generations_stopped"] += 1
            log.info("generation stopped: the client went away")


class _WorkerJob(_Job):
    """A generation on the one worker thread, through ``LoadedModel.complete``."""

    def __init__(self, events, index, stats, loaded: LoadedModel, executor, prompt,
                 settings, options: dict, stream: bool) -> None:
        super().__init__(events, index, stats)
        on_text = (lambda t: self.put("text", (t, []))) if stream else None
        options = {k: v for k, v in options.items() if k != "skip_special_tokens"}
        self.loop.run_in_executor(executor, self._work, loaded, prompt, on_text, settings,
                                  options)

    def _work(self, loaded: LoadedModel, prompt, on_text, settings, options: dict) -> None:
        try:
            done = loaded.complete(prompt, on_text=on_text, should_stop=lambda: self.cancelled,
                                   settings=settings, **options)
            self.put("done", done)
        except Stopped:
            self.stopped()
        except BaseException as e:
            self.put("error", e)


class _ScheduledJob(_Job):
    """A generation decoded beside others by the scheduler (``LoadedModel.request``); its
    prompt and options are checked, and the queue's room, before this returns. A streamed
    text piece carries the log-probabilities of the tokens since the last piece."""

    def __init__(self, events, index, stats, loaded: LoadedModel, prompt, settings,
                 options: dict, stream: bool) -> None:
        super().__init__(events, index, stats)
        self.sent = 0
        self.request = loaded.request(prompt, on_text=self._text if stream else None,
                                      settings=settings, **options)
        self.request.on_done = self._done
        loaded.scheduler.submit(self.request)

    def _text(self, piece: str) -> None:
        entries = self.request.token_logprobs[self.sent:]
        self.sent += len(entries)
        self.put("text", (piece, entries))

    def _done(self, request) -> None:
        if request.finish_reason == "cancelled":
            self.stopped()
        elif request.error is not None:
            self.put("error", request.error)
        else:
            self.put("done", completion_of(request))

    def cancel(self, why: str = GONE) -> None:
        super().cancel(why)
        self.request.cancel()


class _Jobs:
    """A request's choices (``n``): their jobs, and their events in the order they come. While
    it runs it is in ``live`` (the server's requests in flight, which a shutdown ends:
    ``shut``)."""

    def __init__(self, live: set) -> None:
        self.events: asyncio.Queue = asyncio.Queue()
        self.jobs: list[_Job] = []
        self.live = live
        live.add(self)

    def cancel(self, why: str = GONE) -> None:
        """Stop every choice (at its next token) and leave ``live``."""
        for job in self.jobs:
            job.cancel(why)
        self.live.discard(self)

    def shut(self) -> None:
        """The server is shutting down: stop every choice, and end the request with a
        ("shutdown") event."""
        self.cancel(SHUTDOWN)
        self.events.put_nowait((None, "shutdown", None))

    async def next(self, request: Request):
        """The next (index, kind, value); None when the client went away meanwhile (every
        choice is cancelled)."""
        while True:
            try:
                return await asyncio.wait_for(self.events.get(), 0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    self.cancel()
                    return None


def _error_of(e: BaseException, param: str | None) -> BadRequest:
    """The response's error for what ended a request: a CausalLMError is the request's fault
    (400), anything else the server's (500, logged with its traceback; its message stays in
    the log, which the client cannot read)."""
    if isinstance(e, BadRequest):
        return e
    if isinstance(e, CausalLMError):
        code = "context_length_exceeded" if "KV cache holds" in str(e) else None
        return BadRequest(str(e), param, code)
    log.error("generation failed: %s: %s", type(e).__name__, e, exc_info=e)
    return BadRequest(f"internal error ({type(e).__name__}; the server's log has the details)",
                      None, None, 500, "server_error")


def _shutting_down() -> BadRequest:
    return BadRequest(SHUTDOWN, None, "server_shutdown", 503, "server_error")


class _ToolCalls:
    """A chat request's ``tools`` and ``tool_choice`` (causallm/tool_calls.py): the messages
    prepared for the template (their calls and tool results in the template's form), the
    options that render the tools and keep the template's call markers in the decoded text, and
    whether and how the answer's calls are read (``family``)."""

    def __init__(self, body: dict, messages: list[dict], loaded: LoadedModel) -> None:
        from causallm.tool_calls import (
            ToolRequestError, check_tools, detect_family, prepare_messages, tool_call_schema)

        try:
            self.tools, self.choice = check_tools(body)
            history = any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)
            self.family = None
            if self.tools is not None or history:
                self.family = detect_family(loaded.chat_template())
            self.messages = prepare_messages(messages, self.family)
        except ToolRequestError as e:
            raise BadRequest(str(e), e.param) from None
        except CausalLMError as e:
            raise BadRequest(str(e), "messages") from None
        self.parse = self.tools is not None and self.choice != "none"
        if self.parse and self.family is None:
            raise BadRequest("this model's chat template writes tool calls in a form the server "
                             "does not read (known: Hermes/Qwen <tool_call>, Llama 3.1 JSON, "
                             "Mistral [TOOL_CALLS])", "tools")
        self.options = {}
        if self.tools is not None:
            self.options = {"tools": self.tools, "skip_special_tokens": not self.parse}
        self.forced = None
        if self.parse and self.choice != "auto":  # "required" or a named function
            self.forced = tool_call_schema(self.tools, self.choice, self.family)
            if self.forced is None:
                raise BadRequest(f"'tool_choice' \"required\" over several tools cannot be "
                                 f"forced in this template's call format ({self.family}): name "
                                 f"one function, or use \"auto\"", "tool_choice")
            if body.get("response_format") is not None:
                raise BadRequest("'response_format' does not go with a forced 'tool_choice'",
                                 "response_format")
            # the reply starts with the call's marker and is held to the call's JSON
            self.options.update(reply_prefix=self.forced.prefix)


class _Answer:
    """One choice of a response, in OpenAI's shapes: ``whole(completion)`` when not streamed;
    streamed, ``piece(text, logprob entries)`` and ``last(completion)`` give its chunks'
    choices. With tools, the text goes through a ToolCallStream: content as soon as it cannot
    be a call, calls when complete, finish_reason "tool_calls" when the answer made some."""

    def __init__(self, chat: bool, stream: bool, index: int, calls: _ToolCalls | None,
                 loaded: LoadedModel) -> None:
        from causallm.tool_calls import ToolCallStream

        self.chat, self.stream, self.index = chat, stream, index
        self.tokenizer = loaded.model.tokenizer
        self.calls = calls if calls is not None and calls.parse else None
        self.reader = (ToolCallStream(self.calls.family, self.calls.tools)
                       if self.calls is not None and stream else None)
        forced = self.calls.forced if self.calls is not None else None
        self.prefix, self.suffix = (forced.prefix, forced.suffix) if forced else ("", "")
        self.held = []  # the reader's first deltas (the forced prefix: held, not content)
        if self.reader is not None and self.prefix:
            self.held = self.reader.feed(self.prefix)
        self.logprobs = None  # entries not yet sent (a streamed answer)
        self.sent = 0
        self.offset = 0

    # -- log-probabilities ------------------------------------------------------------------
    def _token(self, token_id: int) -> str:
        return self.tokenizer.Decode([token_id], skip_special_tokens=False)

    def _chat_logprobs(self, entries) -> dict:
        def one(token_id, lp):
            text = self._token(token_id)
            return {"token": text, "logprob": lp, "bytes": list(text.encode())}
        return {"content": [{**one(t, lp), "top_logprobs": [one(i, v) for i, v in top]}
                            for t, lp, top in entries]}

    def _completion_logprobs(self, entries) -> dict:
        tokens = [self._token(t) for t, _, _ in entries]
        offsets = []
        for text in tokens:
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [{self._token(i): v for i, v in top} for _, _, top in entries],
                "text_offset": offsets}

    def _logprobs(self, entries):
        if entries is None:
            return None
        return self._chat_logprobs(entries) if self.chat else self._completion_logprobs(entries)

    @staticmethod
    def _entries(done):
        request = done.result
        return getattr(request, "token_logprobs", None) if getattr(request, "logprobs", None) \
            is not None else None

    # -- shapes -----------------------------------------------------------------------------
    def whole(self, done) -> dict:
        from causallm.tool_calls import finish_reason, parse_tool_calls

        entries = self._entries(done)
        logprobs = self._logprobs(entries)
        if not self.chat:
            return {"index": self.index, "text": done.text, "logprobs": logprobs,
                    "finish_reason": done.finish_reason}
        message = {"role": "assistant", "content": done.text}
        finish = done.finish_reason
        if self.calls is not None:
            content, calls = parse_tool_calls(self.prefix + done.text + self.suffix,
                                              self.calls.family, self.calls.tools)
            message["content"] = content
            if calls:
                message["tool_calls"] = calls
            finish = finish_reason(calls, finish)
        return {"index": self.index, "message": message, "logprobs": logprobs,
                "finish_reason": finish}

    def _part(self, delta_or_text, entries, finish=None) -> dict:
        logprobs = self._logprobs(entries) if entries else None
        if self.chat:
            return {"index": self.index, "delta": delta_or_text, "logprobs": logprobs,
                    "finish_reason": finish}
        return {"index": self.index, "text": delta_or_text, "logprobs": logprobs,
                "finish_reason": finish}

    def piece(self, text: str, entries: list) -> list[dict]:
        self.sent += len(entries)
        if self.reader is None:
            return [self._part({"content": text} if self.chat else text, entries)]
        deltas, self.held = self.held + self.reader.feed(text), []
        parts = [self._part(delta, None) for delta in deltas]
        if entries:
            self.logprobs = (self.logprobs or []) + list(entries)
        if parts and self.logprobs:
            parts[0]["logprobs"] = self._logprobs(self.logprobs)
            self.logprobs = None
        return parts

    def last(self, done) -> list[dict]:
        from causallm.tool_calls import finish_reason

        entries = self._entries(done)
        rest = (self.logprobs or []) + list(entries[self.sent:] if entries else [])
        parts = []
        finish = done.finish_reason
        if self.reader is not None:
            deltas = self.held + self.reader.feed(self.suffix) + self.reader.finish()
            parts = [self._part(delta, None) for delta in deltas]
            finish = finish_reason(self.reader.calls, finish)
        if rest:
            parts.append(self._part({} if self.chat else "", rest))
        parts.append(self._part({} if self.chat else "", None, finish))
        return parts


class _CancellingStream(StreamingResponse):
    """A StreamingResponse that cancels its jobs however the response ends (a client that
    disconnects ends it early)."""

    def __init__(self, content, jobs: _Jobs) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self.jobs = jobs

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.jobs.cancel()


MAX_BODY = 64 << 20
"""The largest request body the server reads, in bytes (images come inside as base64); a
larger one is refused (413) before it is read."""

MAX_INPUTS = 2048
"""The most texts one embeddings request holds (OpenAI's bound)."""


class _ClientGone(Exception):
    """The client closed its connection before its request was read."""


def private_paths(path: str) -> list[str]:
    """The ways the server's model path may appear in a message (as given, absolute, with
    links resolved, and the folder of a .gguf file), longest first."""
    paths = {path, os.path.abspath(path), os.path.realpath(path)}
    paths |= {os.path.dirname(p) for p in list(paths) if os.path.isfile(p)}
    return sorted((p for p in paths if p and p not in (".", os.sep)), key=len, reverse=True)


def build_app(loaded: LoadedModel, model_id: str, queue: int = 64) -> Starlette:
    """The Starlette app serving ``loaded`` under the name ``model_id``; ``queue`` requests
    may wait for a slot (a model that ``batches``). ``app.state.close()`` (on the event loop's
    thread) starts a shutdown: ``serve`` calls it on the first SIGINT or SIGTERM."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="causallm-worker")
    created = int(time.time())
    stats = {"generations_stopped": 0}
    scheduler = loaded.scheduler if loaded.batches else None
    stop = threading.Event()
    if scheduler is not None:
        scheduler.max_queue = queue
    live: set[_Jobs] = set()  # the requests generating now
    max_images = 0  # what a request's images' tokens leave room for
    if getattr(loaded.model, "VISION", None) is not None:
        max_images = (loaded.prompt_limit or 0) // loaded.model.MM_TOKENS_PER_IMAGE
    paths = private_paths(loaded.path)
    loaded.no_template_hint = "send a prompt string to /v1/completions instead"

    def public(message: str) -> str:
        """``message`` with the server's model path written as the model's id."""
        for path in paths:
            message = message.replace(path, model_id)
        return message

    def close() -> None:
        """Shut down now: no generation starts any more, the running ones stop at their next
        token, and their requests end (a 503, or a stream's error event); the scheduler's
        thread stops after its step."""
        if stop.is_set():
            return
        stop.set()
        if scheduler is not None:
            scheduler.wake()
        if live:
            log.info("shutting down: %d request(s) in flight stopped", len(live))
        for jobs in list(live):
            jobs.shut()

    async def read_body(request: Request) -> dict:
        too_large = BadRequest(f"the request body is over {MAX_BODY >> 20} MiB", None,
                               "request_too_large", 413)
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY:
            raise too_large
        data = bytearray()
        try:
            async for chunk in request.stream():
                data += chunk
                if len(data) > MAX_BODY:
                    raise too_large
        except ClientDisconnect:
            raise _ClientGone() from None
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            try:
                utf8(bytes(data), "the request body")
            except CausalLMError as bad:  # named by its first bad byte, not orjson's words
                raise BadRequest(str(bad)) from None
            raise BadRequest(f"the request body is not valid JSON ({e})") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return body

    def check_model(body: dict) -> None:
        if "model" in body and not isinstance(body["model"], str):
            raise BadRequest("'model' must be a string", "model")

    def usage(done: list) -> dict:
        """OpenAI's usage of a request's choices: the prompt once, every choice's tokens."""
        prompt = done[0].prompt_tokens
        completion = sum(d.completion_tokens for d in done)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": done[0].cached_tokens}}

    def check_prompt(prompt, options: dict, param: str) -> None:
        """Refuse now, not after the generations queued ahead of it, a prompt the model cannot
        take (the one worker's models: the scheduler's ``submit`` checks its own)."""
        ids = loaded.encode(prompt, options.get("tools"), options.get("reply_prefix", ""),
                            images=len(options.get("images") or ()))
        limit = loaded.prompt_limit
        if limit is not None and len(ids) > limit:
            raise BadRequest(f"the prompt has {len(ids)} tokens but the model takes at most "
                             f"{limit}", param, "context_length_exceeded")

    async def generate(request: Request, chat: bool) -> Response:
        body = await read_body(request)
        if not loaded.generates:
            raise BadRequest(f"model '{model_id}' does not generate text (it is an embedding "
                             f"model: use /v1/embeddings)", "model", "model_not_supported")
        prompt, images = chat_messages(body, max_images) if chat else \
            (completion_prompt(body), [])
        param = "messages" if chat else "prompt"
        settings, given = request_settings(body, loaded)
        options = {}  # the calls' other keywords
        if images:
            options["images"] = images
        n = integer(body, "n", 1, MAX_CHOICES) or 1
        top = logprobs_option(body, chat)
        if top is not None:
            if scheduler is None:
                raise BadRequest(f"'logprobs' needs a model that decodes several requests "
                                 f"together ({loaded.architecture} does not)", "logprobs")
            options["logprobs"] = top
        calls = _ToolCalls(body, prompt, loaded) if chat else None
        if calls is not None:
            prompt = calls.messages
            options.update(calls.options)
            if calls.forced is not None:  # the reply held to the call's JSON
                try:
                    settings = settings.withOptions(Options(json_schema=calls.forced.schema),
                                                    loaded.model.tokenizer)
                except CausalLMError as e:
                    raise _error_of(e, param) from None
        stream = boolean(body, "stream")
        stream_options = body.get("stream_options")
        if stream_options is not None and not (isinstance(stream_options, dict) and stream):
            raise BadRequest("'stream_options' must be an object, and only with stream: true",
                             "stream_options")
        include_usage = boolean(stream_options or {}, "include_usage",
                                where="stream_options.include_usage")
        if scheduler is None:
            try:
                check_prompt(prompt, options, param)
            except CausalLMError as e:
                raise _error_of(e, param) from None
        if stop.is_set():
            raise _shutting_down()
        kind = "chat.completion" if chat else "text_completion"
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        head = {"id": rid, "object": kind + (".chunk" if chat and stream else ""),
                "created": int(time.time()), "model": model_id}

        jobs = _Jobs(live)
        for i in range(n):
            try:
                seeded = settings if given.get("seed") is None else settings.withOptions(
                    Options.check({"seed": given["seed"] + i}))  # n samples, n draws
                if scheduler is None:
                    job = _WorkerJob(jobs.events, i, stats, loaded, executor, prompt, seeded,
                                     options, stream)
                else:
                    job = _ScheduledJob(jobs.events, i, stats, loaded, prompt, seeded, options,
                                        stream)
            except QueueFull as e:
                jobs.cancel()
                raise BadRequest(str(e), None, "server_busy", 503, "server_error",
                                 {"Retry-After": "1"}) from None
            except CausalLMError as e:
                jobs.cancel()
                raise _error_of(e, param) from None
            jobs.jobs.append(job)
        if not stream:
            try:
                return await answer(request, jobs, n, chat, calls, head, param)
            finally:
                jobs.cancel()
        try:  # the first event decides on a 400, before the response starts
            first = await jobs.next(request)
        except BaseException:
            jobs.cancel()
            raise
        if first is None:
            return Response(status_code=499)  # nobody is listening
        if first[1] in ("error", "shutdown"):
            jobs.cancel()
            raise _error_of(first[2], param) if first[1] == "error" else _shutting_down()
        answers = [_Answer(chat, True, i, calls, loaded) for i in range(n)]

        def chunk(data: dict) -> bytes:
            if include_usage and "usage" not in data:
                data = {**data, "usage": None}
            return b"data: " + orjson.dumps({**head, **data}) + b"\n\n"

        async def events():
            try:
                if chat:
                    yield chunk({"choices": [{"index": i, "delta": {"role": "assistant",
                                                                    "content": ""},
                                              "logprobs": None, "finish_reason": None}
                                             for i in range(n)]})
                event, finished = first, [None] * n
                while True:
                    i, what, value = event
                    if what == "text":
                        for part in answers[i].piece(*value):
                            yield chunk({"choices": [part]})
                    elif what in ("error", "shutdown"):
                        err = _error_of(value, param) if what == "error" else _shutting_down()
                        yield b"data: " + orjson.dumps(err.body(public)) + b"\n\n"
                        break
                    else:
                        finished[i] = value
                        for part in answers[i].last(value):
                            yield chunk({"choices": [part]})
                        if all(f is not None for f in finished):
                            if include_usage:
                                yield chunk({"choices": [], "usage": usage(finished)})
                            break
                    event = await jobs.events.get()
                yield b"data: [DONE]\n\n"
            finally:
                jobs.cancel()

        return _CancellingStream(events(), jobs)

    async def answer(request: Request, jobs: _Jobs, n: int, chat: bool, calls, head: dict,
                     param: str) -> Response:
        """A request not streamed: its choices' answers once all are done."""
        answers = [_Answer(chat, False, i, calls, loaded) for i in range(n)]
        done: list = [None] * n
        while not all(d is not None for d in done):
            event = await jobs.next(request)
            if event is None:
                return Response(status_code=499)  # nobody is listening
            i, what, value = event
            if what == "shutdown":
                raise _shutting_down()
            if what == "error":
                raise _error_of(value, param)
            done[i] = value
        return _json({**head, "choices": [a.whole(d) for a, d in zip(answers, done)],
                      "usage": usage(done)})

    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    async def embeddings(request: Request) -> Response:
        body = await read_body(request)
        if not loaded.embeds:
            raise BadRequest(f"model '{model_id}' does not embed (it is a "
                             f"{loaded.architecture}, not an embedding model)", "model",
                             "model_not_supported")
        check_model(body)
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not (isinstance(texts, list) and texts and all(isinstance(t, str) and t
                                                          for t in texts)):
            raise BadRequest("'input' must be a non-empty string or a non-empty list of "
                             "non-empty strings", "input")
        if len(texts) > MAX_INPUTS:
            raise BadRequest(f"'input' holds {len(texts)} texts; at most {MAX_INPUTS} a "
                             f"request", "input")
        limit = loaded.model.INIT_SEQ_LEN
        for k, text in enumerate(texts):  # before the worker: what it would refuse
            n_tokens = len(loaded.model.tokenizer.Encode(text, add_special_tokens=True))
            if n_tokens > limit:
                raise BadRequest(f"'input[{k}]' has {n_tokens} tokens but the model embeds at "
                                 f"most {limit}", "input", "context_length_exceeded")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise BadRequest("'encoding_format' must be \"float\" or \"base64\"",
                             "encoding_format")
        if body.get("dimensions") is not None:
            raise BadRequest("'dimensions' is not supported by this server", "dimensions")
        if stop.is_set():
            raise _shutting_down()
        future = asyncio.get_running_loop().run_in_executor(executor, loaded.embed_with_counts,
                                                            texts)
        try:
            vectors, n_tokens = await future
        except Exception as e:
            raise _error_of(e, "input") from None

        def encode(v: np.ndarray):
            if fmt == "base64":
                return base64.b64encode(v.astype("<f4").tobytes()).decode()
            return [float(x) for x in v]

        return _json({"object": "list", "model": model_id,
                      "data": [{"object": "embedding", "index": i, "embedding": encode(v)}
                               for i, v in enumerate(vectors)],
                      "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})

    def model_card() -> dict:
        return {"id": model_id, "object": "model", "created": created, "owned_by": "causallm"}

    async def models(request: Request) -> Response:
        return _json({"object": "list", "data": [model_card()]})

    async def model(request: Request) -> Response:
        if request.path_params["model"] != model_id:
            raise BadRequest(f"the model '{request.path_params['model'][:100]}' does not exist "
                             f"(this server has '{model_id}')", "model", "model_not_found", 404)
        return _json(model_card())

    def gauges() -> dict:
        if scheduler is None:
            return {}
        return {"slots": scheduler.n_slots, "slots_busy": scheduler.busy_slots,
                "queue_depth": scheduler.queued}

    async def health(request: Request) -> Response:
        return _json({"status": "ok", "model": model_id, **stats, **gauges()})

    async def metrics(request: Request) -> Response:
        return Response(prometheus_text(scheduler, stats),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    def endpoint(handler):
        """``handler`` with what ends a request turned into its response: a refusal, a client
        gone before its request was read (one log line), or a failure of the server's (500,
        logged once with its traceback)."""
        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except BadRequest as e:
                return e.response(public)
            except _ClientGone:
                log.info("%s %s: the client went away before sending its whole request",
                         request.method, request.url.path)
                return Response(status_code=499)
            except Exception as e:  # noqa: BLE001 (the request's 500; the server goes on)
                return _error_of(e, None).response(public)
        return handle

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return BadRequest(f"{request.method} {request.url.path[:200]}: {exc.detail}", None,
                          None, exc.status_code).response(public)

    routes = [Route("/v1/chat/completions", endpoint(chat_completions), methods=["POST"]),
              Route("/v1/completions", endpoint(completions), methods=["POST"]),
              Route("/v1/embeddings", endpoint(embeddings), methods=["POST"]),
              Route("/v1/models", endpoint(models), methods=["GET"]),
              Route("/v1/models/{model:path}", endpoint(model), methods=["GET"]),
              Route("/health", endpoint(health), methods=["GET"]),
              Route("/metrics", endpoint(metrics), methods=["GET"])]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        """The scheduler's thread runs while the app does; at the end both threads finish
        their step (a generation stops at its next token) before the event loop closes."""
        app.state.loop = asyncio.get_running_loop()
        thread = None
        if scheduler is not None:
            thread = threading.Thread(target=scheduler.run, args=(stop,), daemon=True,
                                      name="causallm-scheduler")
            thread.start()
        try:
            yield
        finally:
            close()
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)
            if thread is not None:
                await asyncio.to_thread(thread.join)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error},
                    lifespan=lifespan)
    app.state.executor = executor
    app.state.close = close
    return app


def prometheus_text(scheduler, stats: dict) -> bytes:
    """The server's counters and gauges in Prometheus' text exposition format."""
    lines = []

    def metric(name: str, kind: str, text: str, value) -> None:
        lines.extend([f"# HELP causallm_{name} {text}", f"# TYPE causallm_{name} {kind}",
                      f"causallm_{name} {value}"])

    metric("generations_stopped_total", "counter",
           "generations stopped because the client went away", stats["generations_stopped"])
    if scheduler is not None:
        st = scheduler.stats
        metric("requests_total", "counter", "generation requests accepted", st["requests"])
        metric("requests_finished_total", "counter", "generations that ran to their end",
               st["finished"])
        metric("prompt_tokens_total", "counter", "prompt tokens of admitted requests",
               st["prompt_tokens"])
        metric("prompt_tokens_cached_total", "counter",
               "prompt tokens found in a slot's cache (not prefilled again)",
               st["cached_tokens"])
        metric("generated_tokens_total", "counter", "new tokens generated",
               st["generated_tokens"])
        metric("steps_total", "counter", "engine steps run", st["steps"])
        metric("step_rows_total", "counter", "token rows run in those steps", st["step_rows"])
        metric("slots", "gauge", "sequences the KV caches hold", scheduler.n_slots)
        metric("slots_busy", "gauge", "slots decoding a request now", scheduler.busy_slots)
        metric("queue_depth", "gauge", "requests waiting for a slot", scheduler.queued)
        lines.extend(["# HELP causallm_time_to_first_token_seconds from a request's arrival "
                      "to its first new token",
                      "# TYPE causallm_time_to_first_token_seconds summary",
                      f"causallm_time_to_first_token_seconds_sum {st['ttft_sum']:.6f}",
                      f"causallm_time_to_first_token_seconds_count {st['ttft_count']}"])
    return ("\n".join(lines) + "\n").encode()


def serve(path: str, host: str = "127.0.0.1", port: int = 8080, model_id: str | None = None,
          log_level: str = "info", parallel: int | None = None, queue: int = 64,
          **options) -> None:
    """Load ``path`` (``causallm.load`` options) with ``parallel`` slots (default
    ``default_parallel``) and serve it until interrupted. The address is taken first, so a
    port in use is an error before the model loads. The first SIGINT (Ctrl-C) or SIGTERM stops
    taking connections, stops the generations in flight and ends the server; a second ends the
    process at once (exit status 128 + the signal)."""
    from causallm.loader import LoadedModel, batches, create

    configure_logging(log_level)
    sock = bind(host, port)
    try:
        model = create(path, **options)
        if not batches(model):  # one request at a time: one sequence's caches
            if parallel is not None and parallel > 1:
                log.warning("%s answers one request at a time (--parallel needs a "
                            "decoder-only text model)", model.architecture)
            parallel = 1
        elif parallel is None:
            parallel = default_parallel(model)
        if parallel > 1:
            model.SLOTS = parallel
        model.initialize()
        model.load_weight()
        loaded = LoadedModel(model, path)
        model_id = model_id or os.path.basename(os.path.normpath(path))
        _server(build_app(loaded, model_id, queue), log_level).run(sockets=[sock])
    finally:
        sock.close()


def configure_logging(log_level: str) -> None:
    """uvicorn's log lines (its default configuration), this module's among them."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["causallm"] = {"handlers": ["default"], "level": log_level.upper(),
                                     "propagate": False}
    logging.config.dictConfig(config)


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (as uvicorn binds one); an address in use, or one
    this machine does not have, is a CausalLMError."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            why = "the port is in use (another server?); choose another --port"
        elif e.errno == errno.EACCES:
            why = "permission denied (a port below 1024 needs privileges)"
        elif isinstance(e, socket.gaierror):
            why = f"no such host (--host): {e.strerror}"
        elif e.errno == errno.EADDRNOTAVAIL:
            why = "not an address of this machine (--host)"
        else:
            why = e.strerror or str(e)
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise CausalLMError(f"cannot listen on {where}: {why}") from None
    sock.set_inheritable(True)
    return sock


def _server(app: Starlette, log_level: str):
    """A uvicorn server of ``app`` whose first SIGINT or SIGTERM also stops the generations in
    flight (``app.state.close``: uvicorn alone would wait for their streams to end) and whose
    second ends the process at once."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            if self.should_exit:
                sys.stderr.write("\ninterrupted\n")
                sys.stderr.flush()
                os._exit(128 + sig)
            super().handle_exit(sig, frame)
            loop = getattr(app.state, "loop", None)
            if loop is not None:
                loop.call_soon_threadsafe(app.state.close)

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:  # what uvicorn says when it binds the socket itself
                host, port = sockets[0].getsockname()[:2]
                where = f"[{host}]" if ":" in host else host
                logging.getLogger("uvicorn.error").info(
                    "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", where, port)

    return Server(uvicorn.Config(app, log_config=None, log_level=log_level,
                                 timeout_graceful_shutdown=5))


PARALLEL = 4
"""Slots a server holds by default, when their KV caches fit in a quarter of the memory
available."""


def default_parallel(model) -> int:
    """PARALLEL, or as many slots as a quarter of the available memory holds (at least one)."""
    from causallm.runtime.context import available_memory

    per_slot = model.kvBytesPerPosition() * model.MAX_SEQ_LEN  # one sequence's KV caches
    available = available_memory()
    if available is None or per_slot <= 0:
        return PARALLEL
    return max(1, min(PARALLEL, available // 4 // per_slot))
