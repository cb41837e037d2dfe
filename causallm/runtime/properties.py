"""Property strings ("key=value") and their typed specs.

NNTrainer passes every layer property as a string: ``withKey("unit", 512)`` gives ``"unit=512"``
and ``createLayer`` parses the strings (nntrainer ``getKeyValue``). The rules kept here:

- a string may hold several pairs separated by ``|``; spaces are removed; each pair is
  ``key=value`` with exactly one ``=``;
- keys match case-insensitively (``num_heads_KV`` and ``num_heads_kv`` are one key);
- values are converted once, by the spec the layer declares, so layer code sees typed values.

Fixed here on purpose (docs/nntrainer.md, "Property strings", "Property floats rounded to six
decimals"): floats keep their full precision (``withKey`` writes ``repr(float)``, never
``std::to_string``'s six decimals), and an unsigned property given as an integral float
(``"10000.000000"``, what C++ ``std::to_string`` produces) is accepted exactly instead of being
truncated at the first non-digit. Anything else that does not parse is an error naming the layer and
the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from causallm.errors import CausalLMError

UINT_MAX = 4294967295
"""``UINT_MAX`` as the C++ code passes it, e.g. ``sliding_window`` of a global-attention layer."""


def withKey(key: str, value: Any) -> str:
    """``"key=value"``: lists are comma-joined, bools are true/false, floats keep full precision."""
    return f"{key}={_format_value(value)}"


def _format_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bool,)) or type(value).__name__ == "bool_":
        return "true" if bool(value) else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_format_value(v) for v in value)
    if isinstance(value, int) or type(value).__name__.startswith(("int", "uint")):
        return str(int(value))
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        return repr(float(value))
    return str(value)


def split_properties(props: Iterable[str], where: str) -> list[tuple[str, str]]:
    """Split NNTrainer property strings into (key, value) pairs, in order."""
    if isinstance(props, str):
        props = [props]
    pairs = []
    for prop in props:
        if not isinstance(prop, str):
            raise CausalLMError(f"{where}: property {prop!r} is not a 'key=value' string "
                                f"(build it with withKey(key, value))")
        for part in prop.split("|"):
            part = "".join(part.split())
            if not part:
                continue
            tokens = part.split("=")
            if len(tokens) != 2 or not tokens[0]:
                raise CausalLMError(f"{where}: property {part!r} is not of the form key=value")
            pairs.append((tokens[0], tokens[1]))
    return pairs


def _uint(text: str) -> int:
    value = float(text)  # accepts "512", "512.000000", "1e6"
    if not math.isfinite(value) or value < 0 or value != int(value) or value > UINT_MAX:
        raise ValueError
    return int(value)


def _int(text: str) -> int:
    value = float(text)
    if not math.isfinite(value) or value != int(value):
        raise ValueError
    return int(value)


def _bool(text: str) -> bool:
    low = text.lower()
    if low == "true":
        return True
    if low == "false":
        return False
    raise ValueError


def _float(text: str) -> float:
    return float(text)


def _str(text: str) -> str:
    return text


def _str_list(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


@dataclass(frozen=True)
class Prop:
    """One declared property: its converter, default and whether it must be given."""

    kind: str  # "uint" | "int" | "float" | "bool" | "str" | "list"
    default: Any = None
    required: bool = False
    choices: tuple = ()

    _CONVERTERS = {
        "uint": (_uint, "a non-negative integer"),
        "int": (_int, "an integer"),
        "float": (_float, "a number"),
        "bool": (_bool, "true or false"),
        "str": (_str, "a string"),
        "list": (_str_list, "a comma-separated list"),
    }

    def parse(self, text: str, where: str, key: str) -> Any:
        convert, expected = self._CONVERTERS[self.kind]
        try:
            value = convert(text)
        except (ValueError, OverflowError):
            raise CausalLMError(f"{where}: property '{key}' expects {expected}, got {text!r}") from None
        if self.choices and value not in self.choices:
            raise CausalLMError(f"{where}: property '{key}' must be one of "
                                f"{', '.join(map(str, self.choices))}; got {text!r}")
        return value


def uint(default=None, required=False) -> Prop:
    return Prop("uint", default, required)


def float_(default=None, required=False) -> Prop:
    return Prop("float", default, required)


def bool_(default=False) -> Prop:
    return Prop("bool", default)


def str_(default=None, required=False, choices=()) -> Prop:
    return Prop("str", default, required, tuple(choices))


def list_(default=(), required=False) -> Prop:
    return Prop("list", list(default), required)


def parse_into(specs: dict[str, Prop], pairs: list[tuple[str, str]], values: dict[str, Any],
               where: str, on_unknown: Callable[[str, str], None]) -> None:
    """Convert each (key, value) pair by ``specs`` (matched case-insensitively) into ``values``.

    Keys ``specs`` does not know are handed to ``on_unknown(key, value)``.
    """
    lower = {k.lower(): k for k in specs}
    for key, text in pairs:
        canonical = lower.get(key.lower())
        if canonical is None:
            on_unknown(key, text)
            continue
        values[canonical] = specs[canonical].parse(text, where, canonical)
