"""The generation options, one table for every way in.

Each option has one keyword, the same in ``causallm.load()`` (a default for every call),
``generate()`` / ``complete()`` / ``stream()`` / ``request()`` (this call only) and, where the
key exists, generation_config.json; one command-line flag (main.py and ``main.py serve``); one
server request field; and one rule for a good value. Every surface checks through ``check``,
so a value is refused the same way wherever it comes from, in a message that names it as the
user wrote it:

    keyword   temperature must be a finite number >= 0, got -1
    flag      --temp must be a finite number >= 0, got -1
    field     'temperature' must be a finite number >= 0, got -1
    config    generation_config.json: 'temperature' must be a finite number >= 0, got -1

Only the value's own domain is checked here; what depends on the model (token ids below the
vocabulary, beams the graph was built for) is the model's check (LanguageModel).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from causallm.errors import CausalLMError


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _stop(v) -> bool:
    return isinstance(v, str) and v != "" or (
        isinstance(v, (list, tuple)) and all(isinstance(s, str) and s for s in v))


def _token_lists(v) -> bool:
    return isinstance(v, (list, tuple)) and all(
        isinstance(w, (list, tuple)) and w and all(_int(t) and t >= 0 for t in w) for w in v)


@dataclass(frozen=True)
class Option:
    """One option: its keyword, command-line flag and server field (None where a surface has
    none), what a good value is (``expected``, said in errors) and the test of one."""

    name: str
    flag: str | None
    field: str | None
    expected: str
    valid: Callable[[Any], bool]

    def error(self, value, source: str = "keyword", label: str | None = None) -> CausalLMError:
        """The one-line error for a bad ``value`` from ``source``: "keyword", "flag" or
        "field" (a JsonConfig names the file itself: ``JsonConfig.error``); ``label`` names
        the option where the surface has more than one name for it."""
        if source == "flag":
            return CausalLMError(f"{label or self.flag} must be {self.expected}, got {value}")
        if source == "field":
            shown = orjson.dumps(value, default=repr).decode()
            return CausalLMError(f"'{label or self.field}' must be {self.expected}, "
                                 f"got {shown}")
        return CausalLMError(f"{label or self.name} must be {self.expected}, got {value!r}")


OPTIONS: dict[str, Option] = {o.name: o for o in (
    Option("max_new_tokens", "-n", "max_tokens", "an integer >= 1",
           lambda v: _int(v) and v >= 1),
    Option("temperature", "--temp", "temperature", "a finite number >= 0 (0 = greedy)",
           lambda v: _number(v) and v >= 0),
    Option("top_k", "--top-k", "top_k", "an integer >= 0 (0 = off)",
           lambda v: _int(v) and v >= 0),
    Option("top_p", "--top-p", "top_p", "a number in [0, 1] (1 = off)",
           lambda v: _number(v) and 0 <= v <= 1),
    Option("min_p", "--min-p", "min_p", "a number in [0, 1] (0 = off)",
           lambda v: _number(v) and 0 <= v <= 1),
    Option("typical_p", "--typical-p", "typical_p", "a number in (0, 1] (1 = off)",
           lambda v: _number(v) and 0 < v <= 1),
    Option("repetition_penalty", "--repeat-penalty", "repetition_penalty",
           "a finite number > 0 (1 = off)", lambda v: _number(v) and v > 0),
    Option("presence_penalty", "--presence-penalty", "presence_penalty",
           "a finite number (0 = off)", _number),
    Option("frequency_penalty", "--frequency-penalty", "frequency_penalty",
           "a finite number (0 = off)", _number),
    Option("no_repeat_ngram_size", "--no-repeat-ngram-size", "no_repeat_ngram_size",
           "an integer >= 0 (0 = off)", lambda v: _int(v) and v >= 0),
    Option("min_new_tokens", "--min-new-tokens", "min_new_tokens", "an integer >= 0",
           lambda v: _int(v) and v >= 0),
    Option("seed", "--seed", "seed", "an integer in [0, 2**64)",
           lambda v: _int(v) and 0 <= v < 2 ** 64),
    Option("stop", "--stop", "stop", "a non-empty string or a list of them", _stop),
    Option("greedy", "--greedy", None, "true or false", lambda v: isinstance(v, bool)),
    Option("num_beams", "--num-beams", None, "an integer >= 1", lambda v: _int(v) and v >= 1),
    Option("num_return_sequences", "--num-return-sequences", None, "an integer >= 1",
           lambda v: _int(v) and v >= 1),
    Option("bad_words_ids", None, None, "a list of non-empty lists of token ids",
           _token_lists),
    Option("json_schema", "--json-schema", None, "a JSON Schema object",
           lambda v: isinstance(v, dict)),
    Option("response_format", "--json-object", "response_format",
           "an object with a 'type' (\"text\", \"json_object\" or \"json_schema\")",
           lambda v: isinstance(v, dict)),
)}
"""Every generation option (module docstring). The checks of a response format's contents
and a schema's are the constraint compiler's (causallm/generation/constraint.py)."""

CONFIG_KEYS = {"stop": "stop_strings"}
"""generation_config.json spells these options otherwise (transformers' names, which the
GenerationSettings fields follow too)."""


def check(name: str, value, source: str = "keyword", label: str | None = None):
    """``value`` of option ``name`` if it is good (a stop string as a list of one), else the
    option's error for ``source`` ("keyword", "flag", "field"; ``label``: the name the value
    came under, where not the option's own). None stands for unset."""
    option = OPTIONS[name]
    if value is None:
        return None
    if not option.valid(value):
        raise option.error(value, source, label)
    if name == "stop" and isinstance(value, str):
        return [value]
    if name in ("stop", "bad_words_ids"):
        return [list(w) if isinstance(w, (list, tuple)) else w for w in value]
    return value


def check_config(cfg, name: str, default):
    """Option ``name`` from a JsonConfig (generation_config.json, or config.json where a folder
    has none) under its config key, ``default`` when absent; a bad value names the file."""
    key = CONFIG_KEYS.get(name, name)
    value = cfg.get(key)
    if value is None:
        return default
    if not OPTIONS[name].valid(value):
        raise cfg.error(key, OPTIONS[name].expected)
    return check(name, value)


def unknown(names, known, what: str) -> CausalLMError:
    """The error for options nobody takes: each named with the nearest known one, or with the
    known ones listed when a name is near none."""
    parts, guessed = [], True
    for name in names:
        near = difflib.get_close_matches(str(name), list(known), n=1)
        parts.append(f"'{name}'" + (f" (did you mean '{near[0]}'?)" if near else ""))
        guessed = guessed and bool(near)
    listed = "" if guessed else f"; known: {', '.join(sorted(known))}"
    return CausalLMError(f"{what}: unknown option{'s' if len(parts) > 1 else ''} "
                         f"{', '.join(parts)}{listed}")


def check_all(options: dict, source: str = "keyword", what: str = "generate") -> dict:
    """``options`` (keyword -> value) checked: an unknown keyword is an error naming ``what``
    took it; values as ``check`` gives them, None ones dropped."""
    bad = [k for k in options if k not in OPTIONS]
    if bad:
        raise unknown(bad, OPTIONS, what)
    return {k: v for k, v in ((k, check(k, v, source)) for k, v in options.items())
            if v is not None}
