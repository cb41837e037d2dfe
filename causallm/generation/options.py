"""The generation options, one table for every way in.

Each option has one keyword, the same in ``causallm.load()`` (a default for every call),
``generate()`` / ``complete()`` / ``stream()`` / ``request()`` (this call only) and, where the
option says so, generation_config.json; one command-line flag (main.py and ``main.py serve``
declare theirs from this table); one server request field (the server reads its fields from
this table); one rule for a good value; and the GenerationSettings field it sets. A value is
checked once, where it comes in (``Options.check``), and refused the same way wherever it
comes from, in a message that names it as the user wrote it:

    keyword   temperature must be a finite number >= 0, got -1
    flag      --temp must be a finite number >= 0, got -1
    field     'temperature' must be a finite number >= 0, got -1
    config    generation_config.json: 'temperature' must be a finite number >= 0, got -1

Only the value's own domain is checked here; what depends on the other settings or on the
model (token ids below the vocabulary, a response format's grammar) is the settings' check
(causallm/generation/settings.py), the beams the graph was built for the model's.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

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
    """One option: its keyword (``name``), command-line flag (``flag``, the spelling errors
    name; ``aliases`` are its other spellings) and server field (None where a surface has
    none), what a good value is (``expected``, said in errors) and the test of one.
    ``setting`` is the GenerationSettings field it sets (default: ``name``; None for the
    options that set others: ``greedy``, the response formats); ``config``: generation_config.json
    has it under that field's name; ``sampling``: giving it switches sampling on. ``cli`` are
    the flag's argparse keywords (its type or action, help)."""

    name: str
    flag: str | None
    field: str | None
    expected: str
    valid: Callable[[Any], bool]
    setting: str | None = ""
    config: bool = False
    sampling: bool = False
    aliases: tuple = ()
    cli: dict | None = None

    def __post_init__(self) -> None:
        if self.setting == "":
            object.__setattr__(self, "setting", self.name)

    def called(self, source: str = "keyword") -> str:
        """How ``source`` ("keyword", "flag" or "field") spells this option in an error."""
        if source == "flag" and self.flag:
            return self.flag
        if source == "field" and self.field:
            return f"'{self.field}'"
        return self.name

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
           lambda v: _int(v) and v >= 1, aliases=("--max-new-tokens",),
           cli=dict(type=int, help="new tokens to generate, for serve those of a request "
                                   "without max_tokens (nntr_config num_to_generate), at most "
                                   "the context")),
    Option("temperature", "--temp", "temperature", "a finite number >= 0 (0 = greedy)",
           lambda v: _number(v) and v >= 0, config=True, sampling=True,
           aliases=("--temperature",), cli=dict(type=float, help="sampling temperature")),
    Option("top_k", "--top-k", "top_k", "an integer >= 0 (0 = off)",
           lambda v: _int(v) and v >= 0, config=True, sampling=True,
           cli=dict(type=int, help="keep the k most likely tokens (0: all)")),
    Option("top_p", "--top-p", "top_p", "a number in [0, 1] (1 = off)",
           lambda v: _number(v) and 0 <= v <= 1, config=True, sampling=True,
           cli=dict(type=float, help="nucleus sampling mass")),
    Option("min_p", "--min-p", "min_p", "a number in [0, 1] (0 = off)",
           lambda v: _number(v) and 0 <= v <= 1, config=True, sampling=True,
           cli=dict(type=float, help="keep tokens with probability >= P x the top one's "
                                     "(0: off)")),
    Option("typical_p", "--typical-p", "typical_p", "a number in (0, 1] (1 = off)",
           lambda v: _number(v) and 0 < v <= 1, config=True, sampling=True,
           cli=dict(type=float, help="locally typical sampling mass (1.0: off)")),
    Option("repetition_penalty", "--repeat-penalty", "repetition_penalty",
           "a finite number > 0 (1 = off)", lambda v: _number(v) and v > 0, config=True,
           aliases=("--repetition-penalty",),
           cli=dict(type=float, help="repetition penalty (1.0: off)")),
    Option("presence_penalty", "--presence-penalty", "presence_penalty",
           "a finite number (0 = off)", _number,
           cli=dict(type=float, help="subtract from the logit of every token already "
                                     "generated (0: off)")),
    Option("frequency_penalty", "--frequency-penalty", "frequency_penalty",
           "a finite number (0 = off)", _number,
           cli=dict(type=float, help="subtract this times its count from a generated "
                                     "token's logit (0: off)")),
    Option("no_repeat_ngram_size", "--no-repeat-ngram-size", "no_repeat_ngram_size",
           "an integer >= 0 (0 = off)", lambda v: _int(v) and v >= 0, config=True,
           cli=dict(type=int, help="never repeat an n-gram of this size (0: off)")),
    Option("min_new_tokens", "--min-new-tokens", "min_new_tokens", "an integer >= 0",
           lambda v: _int(v) and v >= 0, config=True,
           cli=dict(type=int, help="hold back EOS until this many new tokens")),
    Option("seed", "--seed", "seed", "an integer in [0, 2**64)",
           lambda v: _int(v) and 0 <= v < 2 ** 64, aliases=("-s",),
           cli=dict(type=int, help="random seed for sampling")),
    Option("stop", "--stop", "stop", "a non-empty string or a list of them", _stop,
           setting="stop_strings", config=True,
           cli=dict(action="append", metavar="STR", help="end generation when the text "
                    "contains STR, which is not printed (repeatable)")),
    Option("greedy", "--greedy", None, "true or false", lambda v: isinstance(v, bool),
           setting=None, cli=dict(action="store_true", help="argmax decoding, one beam")),
    Option("num_beams", "--num-beams", None, "an integer >= 1", lambda v: _int(v) and v >= 1,
           config=True,
           cli=dict(type=int, help="beam search with N beams (generation_config num_beams)")),
    Option("num_return_sequences", "--num-return-sequences", None, "an integer >= 1",
           lambda v: _int(v) and v >= 1, config=True,
           cli=dict(type=int, help="hypotheses a beam search returns (at most --num-beams)")),
    Option("bad_words_ids", None, None, "a list of non-empty lists of token ids",
           _token_lists, config=True),
    Option("json_schema", "--json-schema", None, "a JSON Schema object",
           lambda v: isinstance(v, dict), setting=None,
           cli=dict(metavar="FILE_OR_JSON", help="hold the answer to JSON valid under this "
                    "JSON Schema (a file, or the schema's text when it starts with '{'); "
                    "needs the 'grammar' extra")),
    Option("response_format", "--json-object", "response_format",
           "an object with a 'type' (\"text\", \"json_object\" or \"json_schema\")",
           lambda v: isinstance(v, dict), setting=None,
           cli=dict(action="store_true", help="hold the answer to one JSON object (OpenAI's "
                    "json_object response format); needs the 'grammar' extra")),
)}
"""Every generation option (module docstring). The checks of a response format's contents
and a schema's are the constraint compiler's (causallm/generation/constraint.py)."""


def check(name: str, value, source: str = "keyword", label: str | None = None):
    """``value`` of option ``name`` if it is good (a stop string as a list of one), else the
    option's error for ``source`` ("keyword", "flag", "field"; ``label``: the name the value
    came under, where not the option's own). None stands for unset."""
    option = OPTIONS[name]
    if value is None:
        return None
    if not option.valid(value):
        raise option.error(value, source, label)
    return _as_given(name, value)


def _as_given(name: str, value):
    """A good ``value`` of option ``name`` as the settings hold it: a stop string as a list of
    one, lists as lists."""
    if name == "stop" and isinstance(value, str):
        return [value]
    if name in ("stop", "bad_words_ids"):
        return [list(w) if isinstance(w, (list, tuple)) else w for w in value]
    return value


def check_config(cfg, name: str, default):
    """Option ``name`` from a JsonConfig (generation_config.json, or config.json where a folder
    has none) under its config key, ``default`` when absent; a bad value names the file."""
    key = OPTIONS[name].setting
    value = cfg.get(key)
    if value is None:
        return default
    if not OPTIONS[name].valid(value):
        raise cfg.error(key, OPTIONS[name].expected)
    return _as_given(name, value)


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


class Options(dict):
    """Generation options from one surface, option name -> value, each checked by its
    option's rule where it came in (``check``): what GenerationSettings.withOptions takes, so
    that no value is checked twice. Made directly (``Options(seed=3)``) only of values checked
    already or made by the code itself. ``source`` is the surface they came from (errors about
    how they go together spell them as it does)."""

    source = "keyword"

    @classmethod
    def check(cls, options: Mapping, source: str = "keyword",
              what: str = "generate") -> "Options":
        """``options`` (keyword -> value) checked: an unknown keyword is an error naming
        ``what`` took it; values as ``check`` gives them, None ones dropped; ``source`` as
        ``check`` takes it (a flag or a field is named as the option's)."""
        bad = [k for k in options if k not in OPTIONS]
        if bad:
            raise unknown(bad, OPTIONS, what)
        checked = cls((k, v) for k, v in ((k, check(k, v, source)) for k, v in options.items())
                      if v is not None)
        checked.source = source
        beams, returned = checked.get("num_beams"), checked.get("num_return_sequences")
        if beams is not None and returned is not None and returned > beams:
            raise CausalLMError(f"{OPTIONS['num_return_sequences'].called(source)} {returned} "
                                f"exceeds {OPTIONS['num_beams'].called(source)} {beams}")
        return checked

    def subset(self, keep) -> "Options":
        """The options whose names ``keep(name)`` is true of, from the same source."""
        out = Options((k, v) for k, v in self.items() if keep(k))
        out.source = self.source
        return out
