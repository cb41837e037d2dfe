"""Structured output: generation held to JSON, or to a JSON schema (OpenAI's ``response_format``).

A response format is compiled once per request, against the model's tokenizer
(``compile_response_format``, ``compile_json_schema``: a bad one is a one-line error naming the
field, before anything runs); each generated row then gets its own ``JsonConstraint`` (the
compiled ``ResponseFormat.constraint(eos_ids)``), which any generation loop drives:

- ``mask(scores)``: ``scores[i] = -inf`` in place for every token i the grammar does not allow
  next, on the (V,) float32 row the sampler chooses from, after the logits processors and
  before the sampling warpers and the draw (greedy too). Ids the tokenizer does not have (a
  padded embedding's extra rows) are never allowed. The row's EOS ids are allowed exactly when
  the text so far is a complete value (a top-level number that could go on), and refused
  otherwise;
- ``advance(token_id)``: the chosen token moves the grammar on;
- ``done``: the value is complete and nothing may follow it (the top-level object's closing
  brace): the generator ends the row there, finish reason "stop", without asking the model for
  an EOS.

So the text parses as JSON and validates against the schema unless the row runs out of tokens
first (finish reason "length"). The JSON may be laid out freely (a space, or a newline and up
to 20 spaces or tabs, wherever JSON allows whitespace; none before the value or after it),
object properties come in the schema's ``properties`` order, and ``"strict": false`` ignores
the keywords the engine does not support instead of refusing the schema.

The grammar engine is llguidance (the Rust library for constrained decoding behind Guidance,
an optional dependency: ``pip install "causallm[grammar]"``), which turns a JSON schema (Draft
2020-12, with the departures its docs/json_schema.md lists) into a grammar and computes each
token mask from a trie of the vocabulary's bytes. Those bytes come from the tokenizer: a
``tokenizer.json`` is read by llguidance itself; a GGUF vocabulary gives them with
``GGUFTokenizer.token_bytes``. That trie is built once per tokenizer and process
(``grammar_tokenizer``: about 0.4 s and 25 MB for SmolLM2's 49k tokens, 2.5 s and 130 MB for
Gemma 3's 262k); a schema compiles in milliseconds and a mask costs about 0.1-0.2 ms per token
(docs/cli.md, Structured output; bench/bench_grammar.py).
"""

from __future__ import annotations

import threading
import weakref
from typing import Iterable

import numpy as np

from causallm.errors import CausalLMError
from causallm.kernels.token_mask import apply_token_bitmask

INSTALL = 'pip install "causallm[grammar]" (or: pip install llguidance)'
"""How to get the grammar engine."""

WHITESPACE = r"\x20|\x0A[\x20\x09]{0,20}"
"""The whitespace allowed wherever JSON allows some: one space, or a newline and at most 20
spaces or tabs (llama.cpp's JSON grammars bound it the same way), so a model cannot loop on
blank lines. A schema's own top-level ``x-guidance`` options replace it."""

_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise CausalLMError(f"structured output (a JSON schema or JSON object response format) "
                            f"needs llguidance, which is not installed: {INSTALL}") from None
    return llguidance


def _one_line(message) -> str:
    return " ".join(str(message).split())


class _GGUFVocabulary:
    """A GGUF vocabulary as llguidance's ``TokenizerWrapper`` reads it: each token's bytes, the
    special ids, an EOS id (the grammar's; ``JsonConstraint`` decides the row's EOS ids
    itself) and the encoder of text that continues a text (no BOS, no space prefix)."""

    def __init__(self, tokenizer) -> None:
        self.tokens = tokenizer.token_bytes()
        self.special_token_ids = tokenizer.special_ids()
        self.eos_token_id = self.special_token_ids[0] if self.special_token_ids else 0
        self.bos_token_id = None
        self._tokenizer = tokenizer

    def __call__(self, text) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._tokenizer.encode_continuation(text)


def grammar_tokenizer(tokenizer):
    """llguidance's ``LLTokenizer`` of ``tokenizer`` (a ``causallm.tokenizer.Tokenizer`` over a
    ``tokenizer.json`` or a GGUF vocabulary), built once per tokenizer object and kept while it
    lives."""
    llg = _llguidance()
    with _lock:
        built = _tokenizers.get(tokenizer)
        if built is None:
            backend = tokenizer.backend
            if hasattr(backend, "token_bytes"):  # causallm.io.gguf_tokenizer.GGUFTokenizer
                built = llg.LLTokenizer(llg.TokenizerWrapper(_GGUFVocabulary(backend)),
                                       slices=llg.LLTokenizer.json_slices())
            else:  # tokenizers.Tokenizer: llguidance reads its tokenizer.json
                special = sorted(i for i, t in backend.get_added_tokens_decoder().items()
                                 if t.special)
                try:
                    built = llg.LLTokenizer(backend.to_str(),
                                           eos_token=special[0] if special else 0,
                                           slices=llg.LLTokenizer.json_slices())
                except ValueError as e:  # a decoder it does not know (T5's Metaspace)
                    raise CausalLMError(f"{tokenizer.path}: structured output cannot use this "
                                        f"tokenizer (llguidance: {_one_line(e)})") from None
            _tokenizers[tokenizer] = built
    return built


class JsonConstraint:
    """One row's grammar state (module docstring): ``mask(scores)``, ``advance(token_id)``,
    ``done``. Made by ``ResponseFormat.constraint``."""

    def __init__(self, matcher, vocab_size: int, eos_ids: Iterable[int],
                 grammar_eos: Iterable[int]) -> None:
        self._matcher = matcher
        self._n = vocab_size                                   # ids the grammar's mask covers
        self._bits = np.empty((vocab_size + 31) // 32, np.int32)
        self.eos = sorted({int(t) for t in eos_ids})
        # the grammar's own EOS ids and the row's: their bits are set here, not by the grammar
        self._eos_bits = [t for t in sorted(set(self.eos) | set(grammar_eos)) if t < vocab_size]
        self.done = False

    def mask(self, scores: np.ndarray) -> None:
        """``scores[i] = -inf`` for every id the grammar does not allow next; scores (V,)
        float32, in place."""
        if self.done:
            raise CausalLMError("response format: the JSON value is complete; no token may "
                                "follow it")
        m = self._matcher
        m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if m.is_error():
            raise CausalLMError(f"response format: {_one_line(m.get_error())}")
        words = self._bits.view(np.uint32)
        for t in self._eos_bits:
            words[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
        eos = [t for t in self.eos if t < scores.shape[0]] if m.is_accepting() else []
        kept = scores[eos].copy()
        allowed = apply_token_bitmask(scores, self._bits, self._n)
        scores[eos] = kept
        if allowed + len(eos) == 0:
            raise CausalLMError("response format: no token of the vocabulary can continue the "
                                "JSON here")

    def advance(self, token_id: int) -> None:
        """Move on by the chosen token (one ``mask`` allowed). An EOS id ends the value."""
        token_id = int(token_id)
        if token_id in self.eos:
            self.done = True
            return
        m = self._matcher
        if not m.consume_token(token_id):
            raise CausalLMError(f"response format: token {token_id} does not continue the JSON "
                                f"({_one_line(m.get_error())})")
        self.done = m.is_stopped()


class ResponseFormat:
    """A compiled response format: ``kind`` ("json_object" or "json_schema"), its ``schema``
    and ``name``, and the grammar ready for one tokenizer. ``constraint(eos_ids)`` gives a row
    its own ``JsonConstraint``; many rows may share one ``ResponseFormat``."""

    def __init__(self, kind: str, schema: dict, name: str | None, matcher, tokenizer) -> None:
        self.kind, self.schema, self.name = kind, schema, name
        self._matcher = matcher
        self._vocab_size = tokenizer.vocab_size
        self._grammar_eos = list(tokenizer.eos_tokens)

    def constraint(self, eos_ids: Iterable[int] = ()) -> JsonConstraint:
        """A new row's constraint; ``eos_ids`` are the ids that end the row (allowed once the
        value is complete)."""
        return JsonConstraint(self._matcher.deep_copy(), self._vocab_size, eos_ids,
                              self._grammar_eos)


def compile_json_schema(tokenizer, schema, strict: bool = True, field: str = "json_schema",
                        kind: str = "json_schema", name: str | None = None) -> ResponseFormat:
    """The grammar of JSON Schema ``schema`` (a dict) for ``tokenizer``; a schema that is not
    one, or that uses a keyword llguidance does not support (with ``strict``), is a one-line
    error starting with ``field``."""
    llg = _llguidance()
    if not isinstance(schema, dict):
        raise CausalLMError(f"{field}: a JSON Schema must be a JSON object, got "
                            f"{type(schema).__name__}")
    defaults = None if "x-guidance" in schema else {"whitespace_pattern": WHITESPACE}
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(
            schema, defaults=defaults, overrides=None if strict else {"lenient": True})
    except (TypeError, ValueError) as e:  # not serializable as JSON
        raise CausalLMError(f"{field}: {_one_line(e)}") from None
    llt = grammar_tokenizer(tokenizer)
    matcher = llg.LLMatcher(llt, grammar, log_level=0)
    if matcher.is_error():
        raise CausalLMError(f"{field}: {_one_line(matcher.get_error())}")
    return ResponseFormat(kind, schema, name, matcher, llt)


def compile_response_format(tokenizer, response_format) -> ResponseFormat | None:
    """OpenAI's ``response_format`` compiled for ``tokenizer``: ``None`` or ``{"type": "text"}``
    -> None (no constraint); ``{"type": "json_object"}`` -> any JSON object;
    ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``
    -> that schema (``strict`` defaults to true here: an unsupported keyword is an error). A
    bad one is a one-line error naming the field."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or response_format.get("type") not in (
            "text", "json_object", "json_schema"):
        got = response_format.get("type") if isinstance(response_format, dict) else \
            type(response_format).__name__
        raise CausalLMError(f"response_format: expected an object whose 'type' is \"text\", "
                            f"\"json_object\" or \"json_schema\", got {got!r}")
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return compile_json_schema(tokenizer, {"type": "object"}, field="response_format",
                                   kind=kind)
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise CausalLMError("response_format.json_schema: expected an object with 'name' and "
                            "'schema' (and optionally 'strict')")
    name, strict = spec.get("name"), spec.get("strict")
    for bad, key, expected in (
            (name is not None and not isinstance(name, str), "name",
             f"expected a string, got {type(name).__name__}"),
            ("schema" not in spec, "schema", "missing (the JSON Schema the answer must follow)"),
            (strict is not None and not isinstance(strict, bool), "strict",
             f"expected true or false, got {strict!r}")):
        if bad:
            raise CausalLMError(f"response_format.json_schema.{key}: {expected}")
    return compile_json_schema(tokenizer, spec["schema"], True if strict is None else strict,
                               field="response_format.json_schema.schema", name=name)
