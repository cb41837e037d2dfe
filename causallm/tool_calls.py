"""OpenAI tool calls: the request's ``tools``, the calls in a conversation, and the model's calls
read back from the text it generates.

Request side (``/v1/chat/completions``):

- :func:`check_tools` checks ``tools`` and ``tool_choice`` as OpenAI defines them and returns the
  tools for the chat template (transformers' ``tools=``: the ``{"type": "function", "function":
  {...}}`` objects themselves) and the choice;
- :func:`prepare_messages` turns OpenAI's messages into what Hugging Face chat templates read: an
  assistant's ``tool_calls[j].function.arguments`` from a JSON string to the object it encodes
  (transformers' documented form; Mistral's and Llama's templates print it with ``tojson``), an
  assistant message with calls and no content gets ``content: ""`` (Qwen3's template concatenates
  it), a ``role: "tool"`` message gets the ``name`` of the call its ``tool_call_id`` answers, and
  for the Mistral families every call id becomes the 9 letters or digits their templates demand.

A bad field raises :class:`ToolRequestError`, a :class:`CausalLMError` whose ``param`` names the
field (``tools[1].function.name``, ``messages[3].tool_calls[0].function.arguments``): the server
answers it as a 400 with that ``param``.

Generation side. A chat template's *family* (:func:`detect_family`, from the template's text)
fixes how its model writes calls; with transformers' templates these are:

====================  =====================================================================
family                what the model writes (``J`` a JSON object; calls may follow each other)
====================  =====================================================================
``hermes``            ``<tool_call>`` J ``</tool_call>``, J = ``{"name": N, "arguments": A}``,
                      whitespace allowed inside the tags (Qwen2.5, Qwen3, Hermes 2 Pro/3, QwQ)
``llama3``            J = ``{"name": N, "parameters": A}`` (or ``"arguments"``) as the reply's
                      first text, or after ``<|python_tag|>`` anywhere; further calls follow
                      after ``;`` (Llama 3.1, 3.2, 3.3)
``mistral``           ``[TOOL_CALLS]`` ``[`` J, J ... ``]``, J = ``{"name", "arguments"[, "id"]}``
                      (Mistral 7B v0.3, Nemo)
``mistral_args``      ``[TOOL_CALLS]`` N ``[ARGS]`` A (Devstral, Ministral 3)
``mistral_call_id``   ``[TOOL_CALLS]`` N ``[CALL_ID]`` id ``[ARGS]`` A (Mistral Small 3.2)
====================  =====================================================================

The three Mistral families read all three Mistral forms; they differ in the ids they make and in
:func:`tool_call_schema`. A call is kept when its JSON parses (no NaN/Infinity), N is a string
naming a declared tool (when the tools are given) and A is an object (absent: ``{}``; a JSON
string encoding an object is read as that object). A call's ``arguments`` in the answer are
``json.dumps(A, ensure_ascii=False)``; its id is the model's own (Mistral's ``id`` / ``[CALL_ID]``)
or a new one (``call_`` and 24 hex digits; 9 letters and digits for Mistral).

Text that is not a kept call stays content, whole: when a call does not hold, its opening marker
(``<tool_call>``, ``[TOOL_CALLS]``, ``<|python_tag|>``, Llama's leading ``{``) is content and the
text after it is read again. The content is the text without its calls and the whitespace after
each: whitespace before calls stays only as the separator of text before and after them (at the
reply's start or end it goes). With no call the content is the text exactly; with calls and
nothing else it is None. Several markers are special tokens of their vocabularies
(``[TOOL_CALLS]``, ``[ARGS]``, ``[CALL_ID]``, ``<|python_tag|>``; ``<tool_call>`` in some): the
text given here must be decoded keeping them (:data:`MARKERS`).

:class:`ToolCallStream` reads the text as it is decoded: content that no continuation can turn
into a call is given at once, text that may still become one (a marker's first characters, an
opened call) is held until it is decided, a call is given when it is complete, in OpenAI's
streaming shape. :func:`parse_tool_calls` is the same reader over the whole text, so a stream and
a whole answer give the same content and calls however the text is cut.

``tool_choice`` ``"required"`` or a named function cannot be kept by parsing: the generation has
to be constrained. :func:`tool_call_schema` gives the text a forced call is made of, in the
family's format: a literal prefix, a JSON value satisfying a JSON schema, a literal suffix.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from typing import NamedTuple

from causallm.errors import CausalLMError

FAMILIES = ("hermes", "llama3", "mistral", "mistral_args", "mistral_call_id")
MISTRAL = ("mistral", "mistral_args", "mistral_call_id")

MARKERS = {"hermes": ("<tool_call>", "</tool_call>"),
           "llama3": ("<|python_tag|>",),
           "mistral": ("[TOOL_CALLS]",),
           "mistral_args": ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
           "mistral_call_id": ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")}
"""The texts of a family's call markers: decoding must keep them (they may be special tokens)."""

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A function name as OpenAI allows it: letters, digits, '_' and '-', at most 64."""

EMPTY_PARAMETERS = {"type": "object", "properties": {}}
"""A function without ``parameters`` takes none (OpenAI): this schema says so to a template."""

_ALNUM = string.ascii_letters + string.digits
_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")


class ToolRequestError(CausalLMError):
    """A tool field of a request that OpenAI's API would refuse; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


# -- the request ------------------------------------------------------------------------------
def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def check_tools(body: dict) -> tuple[list[dict] | None, str | dict]:
    """``(tools, tool_choice)`` of a chat request ``body``.

    ``tools``: absent, null or ``[]`` -> None; else a list of ``{"type": "function", "function":
    {"name", "description"?, "parameters"?, ...}}`` with unique names matching :data:`NAME`, a
    string description and a JSON-schema object as parameters; returned as given but for the
    function's null fields, which go, and a missing ``parameters``, which becomes
    :data:`EMPTY_PARAMETERS`. ``tool_choice``: absent -> ``"auto"``
    with tools, ``"none"`` without; ``"none"``, ``"auto"``, ``"required"`` (tools needed) or
    ``{"type": "function", "function": {"name": N}}`` with N a declared tool (returned as
    ``{"type": "function", "function": {"name": N}}``). Anything else raises ToolRequestError."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ToolRequestError("'tools' must be a list of {\"type\": \"function\", \"function\": "
                               "{...}} objects", "tools")
    checked, names = [], set()
    for j, tool in enumerate(tools or []):
        where = f"tools[{j}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ToolRequestError(f"'{where}' must be an object with \"type\": \"function\"",
                                   where)
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ToolRequestError(f"'{where}.function' must be an object", f"{where}.function")
        function = {k: v for k, v in function.items() if v is not None}
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ToolRequestError(f"'{where}.function.name' must be a string of letters, digits, "
                                   f"'_' or '-' (1 to 64), got {_dumps(name)}",
                                   f"{where}.function.name")
        if name in names:
            raise ToolRequestError(f"'{where}.function.name': a second tool named '{name}'",
                                   f"{where}.function.name")
        names.add(name)
        if not isinstance(function.get("description", ""), str):
            raise ToolRequestError(f"'{where}.function.description' must be a string",
                                   f"{where}.function.description")
        parameters = function.setdefault("parameters", dict(EMPTY_PARAMETERS))
        if not isinstance(parameters, dict):
            raise ToolRequestError(f"'{where}.function.parameters' must be a JSON schema object, "
                                   f"got {_dumps(parameters)}", f"{where}.function.parameters")
        checked.append({**tool, "function": function})
    tools = checked or None

    choice = body.get("tool_choice")
    if choice is None:
        return tools, "auto" if tools else "none"
    if choice in ("none", "auto"):
        return tools, choice
    if choice == "required":
        if not tools:
            raise ToolRequestError("'tool_choice' \"required\" needs 'tools'", "tool_choice")
        return tools, choice
    if isinstance(choice, dict) and choice.get("type") == "function" \
            and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise ToolRequestError(f"'tool_choice.function.name' must name one of the tools, got "
                                   f"{_dumps(name)}", "tool_choice.function.name")
        return tools, {"type": "function", "function": {"name": name}}
    raise ToolRequestError("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                           "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")


def _mistral_id(call_id: str) -> str:
    """``call_id`` if it is 9 letters or digits, else 9 derived from its SHA-256 (the same id
    always maps to the same 9, so a call and its result still match)."""
    if _MISTRAL_ID.fullmatch(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest(), "big")
    out = []
    for _ in range(9):
        n, r = divmod(n, len(_ALNUM))
        out.append(_ALNUM[r])
    return "".join(out)


def _arguments(value, where: str) -> dict:
    """A call's arguments as an object: a JSON string encoding one, or the object itself."""
    if isinstance(value, str):
        value = _loads(value)
    if not isinstance(value, dict):
        raise ToolRequestError(f"'{where}' must be a JSON object (as a string)", where)
    return value


def prepare_messages(messages: list[dict], family: str | None = None) -> list[dict]:
    """OpenAI chat messages (as the server's ``chat_messages`` returns them: contents already
    strings or None) in the form chat templates read (module docstring); a new list, the input
    untouched. An assistant's ``tool_calls`` must be ``[{"id", "type": "function", "function":
    {"name", "arguments"}}]``; a ``tool`` message needs a ``tool_call_id`` naming a call of the
    latest assistant message with calls, and string content."""
    out, calls = [], {}
    for k, message in enumerate(messages):
        where = f"messages[{k}]"
        message = dict(message)
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls") is not None:
            if not isinstance(message["tool_calls"], list):
                raise ToolRequestError(f"'{where}.tool_calls' must be a list",
                                       f"{where}.tool_calls")
            calls, converted = {}, []
            for j, call in enumerate(message["tool_calls"]):
                at = f"{where}.tool_calls[{j}]"
                if not isinstance(call, dict) or call.get("type", "function") != "function" \
                        or not isinstance(call.get("function"), dict):
                    raise ToolRequestError(f"'{at}' must be {{\"id\", \"type\": \"function\", "
                                           f"\"function\": {{\"name\", \"arguments\"}}}}", at)
                call_id, function = call.get("id"), call["function"]
                if not isinstance(call_id, str) or not call_id:
                    raise ToolRequestError(f"'{at}.id' must be a non-empty string", f"{at}.id")
                if not isinstance(function.get("name"), str):
                    raise ToolRequestError(f"'{at}.function.name' must be a string",
                                           f"{at}.function.name")
                arguments = _arguments(function.get("arguments"), f"{at}.function.arguments")
                calls[call_id] = function["name"]
                converted.append({"id": _mistral_id(call_id) if family in MISTRAL else call_id,
                                  "type": "function",
                                  "function": {"name": function["name"],
                                               "arguments": arguments}})
            if converted:
                message["tool_calls"] = converted
                if message.get("content") is None:
                    message["content"] = ""
            else:
                del message["tool_calls"]
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in calls:
                raise ToolRequestError(f"'{where}.tool_call_id' must be the id of a call of the "
                                       f"assistant message before it, got {_dumps(call_id)}",
                                       f"{where}.tool_call_id")
            if not isinstance(message.get("content"), str):
                raise ToolRequestError(f"'{where}.content' must be a string (the call's result)",
                                       f"{where}.content")
            message.setdefault("name", calls[call_id])
            if family in MISTRAL:
                message["tool_call_id"] = _mistral_id(call_id)
        out.append(message)
    return out


# -- the family -------------------------------------------------------------------------------
_OTHER_FORMATS = ("<function=", "<arg_key>", "<invoke", "<tool_calls>")
"""Calls written as XML (Qwen3-Coder's ``<function=N><parameter=...>``, GLM's ``<arg_key>``,
MiniMax's ``<invoke>``, Functionary's ``<function=N>``) or as a ``<tool_calls>`` list (Apriel):
templates that mention ``<tool_call>`` or Llama's header but are not read here."""


def detect_family(template) -> str | None:
    """The tool-call family (module docstring) of a chat template: its text, or a
    causallm.chat.ChatTemplate (the template it renders ``tools`` with, ``tool_use`` when it has
    one). None: a template whose calls are not read here (or that has no tools)."""
    if not isinstance(template, str):
        template = template.templates[template.template(tools=[])]
    if "[TOOL_CALLS]" in template:
        if "[CALL_ID]" in template:
            return "mistral_call_id"
        return "mistral_args" if "[ARGS]" in template else "mistral"
    if any(m in template for m in _OTHER_FORMATS):
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template
                                        and '"parameters"' in template):
        return "llama3"
    return None


def new_call_id(family: str | None) -> str:
    """A fresh call id: 9 random letters and digits for the Mistral families (their templates
    refuse any other), else ``call_`` and 24 random hex digits."""
    if family in MISTRAL:
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return "call_" + secrets.token_hex(12)


# -- reading calls ----------------------------------------------------------------------------
def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _loads(text: str):
    """The JSON value of ``text``; None when it is not JSON (NaN and Infinity are not)."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return None


def _json_end(text: str, i: int) -> int | None:
    """The index just after the JSON object or array opening at ``text[i]``: brackets are counted
    outside strings (a backslash escapes the next character in one) until they balance; None when
    the text ends first. Whether the span is valid JSON is for ``_loads`` to say."""
    depth, in_string, escaped = 0, False, False
    for j in range(i, len(text)):
        c = text[j]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _find(text: str, marker: str) -> tuple[int, bool]:
    """``(p, complete)``: the first place a ``marker`` starts in ``text`` (complete), else where
    a proper prefix of it ends the text (not complete), else ``(len(text), False)``."""
    p = text.find(marker)
    if p >= 0:
        return p, True
    for i in range(max(0, len(text) - len(marker) + 1), len(text)):
        if marker.startswith(text[i:]):
            return i, False
    return len(text), False


def _before(text: str, marker: str, at_end: bool):
    """The step of the text before ``marker``: content up to its first occurrence, or up to a
    beginning of it that ends the text (then waiting for more); False when the text starts with
    the marker."""
    p, complete = _find(text, marker)
    if p > 0:
        return "content", p, ()
    if complete:
        return False
    return ("content", len(text), ()) if at_end else None


class _Call(NamedTuple):
    name: str
    arguments: dict
    id: str | None


_ABSENT = object()


def _call(name, arguments, names, call_id=None) -> _Call | None:
    """A call if ``name`` is a (declared) function name and ``arguments`` an object, a JSON
    string encoding one, or ``_ABSENT`` (no arguments: ``{}``); else None."""
    if arguments is _ABSENT:
        arguments = {}
    elif isinstance(arguments, str):
        arguments = _loads(arguments)
    if not isinstance(name, str) or (names is not None and name not in names) \
            or not isinstance(arguments, dict):
        return None
    return _Call(name, arguments, call_id if isinstance(call_id, str) and call_id else None)


def _object_call(obj, names, keys=("arguments",)) -> _Call | None:
    """The call a JSON value states: an object with ``"name"`` and at most one of ``keys``
    (and an ``"id"``: Mistral's)."""
    if not isinstance(obj, dict) or sum(k in obj for k in keys) > 1:
        return None
    arguments = next((obj[k] for k in keys if k in obj), _ABSENT)
    return _call(obj.get("name"), arguments, names, obj.get("id"))


def _json_at(text: str, i: int, at_end: bool):
    """The JSON value opening at ``text[i]``: ``("ok", end, value)``, ``("bad", ...)`` when it
    is not JSON, or ``("wait", ...)`` when its brackets are still open and more text may come."""
    end = _json_end(text, i)
    if end is None:
        return ("bad" if at_end else "wait"), None, None
    value = _loads(text[i:end])
    return ("bad" if value is None else "ok"), end, value


def _scan_hermes(text, state, at_end, names):
    """``<tool_call>`` J ``</tool_call>``: the JSON between the tag and the first closing tag."""
    opening, closing = MARKERS["hermes"]
    step = _before(text, opening, at_end)
    if step is not False:
        return step
    q = text.find(closing, len(opening))
    if q < 0:
        return ("content", len(opening), ()) if at_end else None
    call = _object_call(_loads(text[len(opening):q].strip()), names)
    return ("call", q + len(closing), (call,)) if call else ("content", len(opening), ())


def _scan_llama3(text, state, at_end, names):
    """Llama 3's JSON calls: ``{`` as the reply's first text, ``<|python_tag|>`` anywhere, and
    after a call, ``;`` and the next one."""
    keys = ("parameters", "arguments")
    if state == "start":
        ws = _skip_space(text, 0)
        if ws:
            return "content", ws, ()
        if text[0] == "{":
            status, end, value = _json_at(text, 0, at_end)
            if status == "wait":
                return None
            call = _object_call(value, names, keys)
            return ("call", end, (call,)) if call else ("content", 1, ())
    elif state == "call":
        j = _skip_space(text, 0)
        if j < len(text) and text[j] == ";":
            j = _skip_space(text, j + 1)
            if j < len(text) and text[j] == "{":
                status, end, value = _json_at(text, j, at_end)
                if status == "wait":
                    return None
                call = _object_call(value, names, keys)
                if call:
                    return "call", end, (call,)
        if j == len(text) and not at_end:
            return None
    tag = MARKERS["llama3"][0]
    step = _before(text, tag, at_end)
    if step is not False:
        return step
    j = _skip_space(text, len(tag))
    if j == len(text):
        return ("content", len(tag), ()) if at_end else None
    if text[j] != "{":
        return "content", len(tag), ()
    status, end, value = _json_at(text, j, at_end)
    if status == "wait":
        return None
    call = _object_call(value, names, keys)
    return ("call", end, (call,)) if call else ("content", len(tag), ())


def _prefix_of(text: str, i: int, literal: str) -> bool | None:
    """Whether ``text[i:]`` starts with ``literal``: True, False, or None when the text ends
    inside a beginning of it."""
    rest = text[i:i + len(literal)]
    if rest == literal:
        return True
    return None if literal.startswith(rest) and i + len(rest) == len(text) else False


_NAME_CHARS = re.compile(r"[A-Za-z0-9_-]*")
_ID_CHARS = re.compile(r"[A-Za-z0-9]*")


def _scan_mistral(text, state, at_end, names):
    """``[TOOL_CALLS]`` then a JSON list of calls, or ``N[ARGS]A`` / ``N[CALL_ID]id[ARGS]A``."""
    marker = MARKERS["mistral"][0]
    step = _before(text, marker, at_end)
    if step is not False:
        return step
    bad = ("content", len(marker), ())
    wait = bad if at_end else None
    j = _skip_space(text, len(marker))
    if j == len(text):
        return wait
    if text[j] == "[":
        status, end, items = _json_at(text, j, at_end)
        if status == "wait":
            return None
        calls = [_object_call(c, names) for c in items] if isinstance(items, list) else []
        return ("call", end, tuple(calls)) if calls and all(calls) else bad
    name = _NAME_CHARS.match(text, len(marker)).group()
    i = len(marker) + len(name)
    call_id = None
    if not name:
        return bad
    starts = _prefix_of(text, i, "[CALL_ID]")
    if starts:
        call_id = _ID_CHARS.match(text, i + len("[CALL_ID]")).group()
        i += len("[CALL_ID]") + len(call_id)
        starts = _prefix_of(text, i, "[ARGS]")
        if starts is not None and not call_id:
            return bad
    elif starts is False:
        starts = _prefix_of(text, i, "[ARGS]")
    if starts is None:
        return wait
    if not starts:
        return bad
    j = _skip_space(text, i + len("[ARGS]"))
    if j == len(text):
        return wait
    if text[j] != "{":
        return bad
    status, end, value = _json_at(text, j, at_end)
    if status == "wait":
        return None
    call = _call(name, value, names, call_id) if status == "ok" else None
    return ("call", end, (call,)) if call else bad


def _scan_none(text, state, at_end, names):
    return "content", len(text), ()


_SCANNERS = {"hermes": _scan_hermes, "llama3": _scan_llama3, "mistral": _scan_mistral,
             "mistral_args": _scan_mistral, "mistral_call_id": _scan_mistral}
"""A family's scanner ``(text, state, at_end, names)`` decides how the undecided ``text`` begins
(``state``: what came before it, "start", "content" or "call"): ``("content", n, ())`` or
``("call", n, calls)`` for its first ``n > 0`` characters, or None when that depends on text not
yet seen (never when ``at_end``). It decides only what no continuation can change, which is what
makes a stream cut anywhere read as the whole text does."""


class ToolCallStream:
    """Reads a model's reply piece by piece into content and tool calls (module docstring).

    ``feed(text)`` and ``finish()`` return the deltas decided, each a ``choices[0].delta`` of
    OpenAI's ``chat.completion.chunk``: ``{"content": str}``, or ``{"tool_calls": [{"index": i,
    "id", "type": "function", "function": {"name", "arguments"}}]}`` once the call ``i`` (counted
    from 0 in the reply) is complete. After ``finish()``, ``content`` (None when there are calls
    and nothing else) and ``calls`` (OpenAI's ``message.tool_calls``) are the whole answer.
    ``family`` None reads everything as content; ``tools`` (check_tools') restrict the names a
    call may have."""

    def __init__(self, family: str | None, tools: list[dict] | None = None) -> None:
        if family is not None and family not in _SCANNERS:
            raise ValueError(f"unknown tool-call family {family!r} (one of {', '.join(FAMILIES)})")
        self.family = family
        self._scan = _SCANNERS.get(family, _scan_none)
        self._names = None if tools is None else {t["function"]["name"] for t in tools}
        self._text = ""        # not decided yet
        self._state = "start"  # what came before: "start" (whitespace at most), "content", "call"
        self._space = ""       # content's trailing whitespace, given when more content follows
        self._content: list[str] = []
        self.calls: list[dict] = []

    def feed(self, text: str) -> list[dict]:
        """The deltas that ``text`` (the next decoded piece) decides."""
        self._text += text
        return self._read(at_end=False)

    def finish(self) -> list[dict]:
        """The deltas of everything held (the reply has ended)."""
        out = self._read(at_end=True)
        if self._space and self._state != "call":
            out.append(self._give(self._space))
            self._space = ""
        return out

    @property
    def content(self) -> str | None:
        text = "".join(self._content)
        return None if self.calls and not text else text

    def result(self) -> tuple[str | None, list[dict]]:
        """``(content, calls)`` of the whole reply (after ``finish()``)."""
        return self.content, self.calls

    def _give(self, text: str) -> dict:
        self._content.append(text)
        return {"content": text}

    def _read(self, at_end: bool) -> list[dict]:
        out = []
        while self._text:
            step = self._scan(self._text, self._state, at_end, self._names)
            if step is None:
                break
            kind, n, calls = step
            piece, self._text = self._text[:n], self._text[n:]
            if kind == "call":
                if self._state == "start":
                    self._space = ""
                for call in calls:
                    entry = {"index": len(self.calls),
                             "id": call.id or new_call_id(self.family), "type": "function",
                             "function": {"name": call.name, "arguments": _dumps(call.arguments)}}
                    self.calls.append({k: v for k, v in entry.items() if k != "index"})
                    out.append({"tool_calls": [entry]})
                self._state = "call"
                continue
            blank = piece.isspace()
            if self._state == "call":
                piece = piece.lstrip()
            if not (blank and self._state in ("start", "call")):
                self._state = "content"
            piece = self._space + piece
            body = piece.rstrip()
            self._space = piece[len(body):]
            if body:
                out.append(self._give(body))
        return out


def parse_tool_calls(text: str, family: str | None,
                     tools: list[dict] | None = None) -> tuple[str | None, list[dict]]:
    """``(content, calls)`` of a whole reply: ``calls`` as OpenAI's ``message.tool_calls``
    (``[{"id", "type": "function", "function": {"name", "arguments": JSON text}}]``), ``content``
    the rest (None when there are calls and nothing else). The same reading as ToolCallStream."""
    stream = ToolCallStream(family, tools)
    stream.feed(text)
    stream.finish()
    return stream.result()


def finish_reason(calls: list, reason: str) -> str:
    """OpenAI's ``finish_reason``: ``"tool_calls"`` when the reply made calls and ended by
    itself (``reason`` ``"stop"``), else ``reason``."""
    return "tool_calls" if calls and reason == "stop" else reason


# -- forcing a call ---------------------------------------------------------------------------
class ForcedCall(NamedTuple):
    """A forced call's text: ``prefix`` + a JSON value satisfying ``schema`` + ``suffix``."""

    prefix: str
    schema: dict
    suffix: str


def tool_call_schema(tools: list[dict], tool_choice, family: str) -> ForcedCall | None:
    """What a reply must be for ``tool_choice`` ``"required"`` (one call of any tool) or a named
    function (a call of it), in ``family``'s format; None for ``"none"``/``"auto"`` (nothing to
    force) and for ``mistral_args``/``mistral_call_id`` with ``"required"`` over several tools
    (the name is outside the JSON there: a schema cannot choose it).

    The caller appends ``prefix`` to the prompt (it is the family's marker text, encoded as its
    special tokens), constrains the generation to a JSON value of ``schema`` and reads
    ``prefix + generated + suffix`` with parse_tool_calls. One call is forced; the schemas are
    ``{"name": {"const": N}, <arguments key>: <N's parameters>}`` objects (``anyOf`` over the
    tools for ``"required"``), a one-element-or-more list of them for ``mistral``."""
    if tool_choice in ("none", "auto"):
        return None
    if tool_choice == "required":
        chosen = [t["function"] for t in tools]
    else:
        name = tool_choice["function"]["name"]
        chosen = [t["function"] for t in tools if t["function"]["name"] == name]

    def one_of(key: str, extra: dict | None = None) -> dict:
        objects = [{"type": "object",
                    "properties": {"name": {"const": f["name"]},
                                   key: f.get("parameters") or EMPTY_PARAMETERS, **(extra or {})},
                    "required": ["name", key], "additionalProperties": False} for f in chosen]
        return objects[0] if len(objects) == 1 else {"anyOf": objects}

    if family == "hermes":
        return ForcedCall("<tool_call>\n", one_of("arguments"), "\n</tool_call>")
    if family == "llama3":
        return ForcedCall("", one_of("parameters"), "")
    if family == "mistral":
        item = one_of("arguments", {"id": {"type": "string", "pattern": "^[A-Za-z0-9]{9}$"}})
        return ForcedCall("[TOOL_CALLS]", {"type": "array", "items": item, "minItems": 1}, "")
    if family in ("mistral_args", "mistral_call_id") and len(chosen) == 1:
        f = chosen[0]
        call_id = f"[CALL_ID]{new_call_id(family)}" if family == "mistral_call_id" else ""
        return ForcedCall(f"[TOOL_CALLS]{f['name']}{call_id}[ARGS]",
                          f.get("parameters") or EMPTY_PARAMETERS, "")
    return None
