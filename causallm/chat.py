"""Chat templates: a model's Jinja template that turns messages into its prompt text.

``ChatTemplate.fromFolder(path)`` finds the template as transformers' tokenizer loading does:

- a folder: ``chat_template.jinja`` (with named extras in ``additional_chat_templates/*.jinja``),
  else ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of ``{name, template}``),
  else ``chat_template.json``'s ``chat_template`` (a processor's); the special tokens (``bos_token``,
  ``eos_token``, ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``, ``mask_token``, any
  other ``*_token`` string and the named ``extra_special_tokens``) come from
  ``tokenizer_config.json``, a token written as an AddedToken object by its ``content``;
- a ``.gguf`` file: ``tokenizer.chat_template``; its BOS, EOS, unknown and padding tokens are the
  vocabulary entries ``tokenizer.ggml.{bos,eos,unknown,padding}_token_id`` name.

``render(messages, add_generation_prompt, tools, **extra)`` equals transformers'
``apply_chat_template(..., tokenize=False)``: messages lose their keys whose value is None, a
reasoning text given as ``reasoning_content``, ``thinking`` or ``reasoning`` is passed under
``thinking`` and ``reasoning_content`` (what Qwen3's and gpt-oss's templates read), and the
template sees ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the special
tokens and ``extra`` (e.g. Qwen3's ``enable_thinking``). Of several named templates, ``tool_use``
renders a call with tools when there is one, else ``default``.

The template runs in Jinja's immutable sandbox set up as transformers sets it up: blocks trimmed
(``trim_blocks``, ``lstrip_blocks``), ``break``/``continue``, a ``{% generation %}`` block that
renders its body, ``tojson`` as ``json.dumps`` (non-ASCII kept, ``indent``, ``separators``,
``sort_keys``), and the globals ``raise_exception(message)``, ``strftime_now(format)``, ``dict``
and a ``namespace`` that refuses underscore names. A template that does not parse, or raises, is a
one-line :class:`CausalLMError` naming the file. The rendered text already holds the special tokens
the model expects, so it is encoded without adding any (``Encode(text, add_special_tokens=False)``).

:class:`ChatSession` holds a conversation over one causal LM's KV cache (prefilling only what a
new turn adds) and :func:`interactive` is the terminal chat of ``main.py -i`` on it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime

from causallm.errors import CausalLMError, utf8

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                      "cls_token", "mask_token")
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
"""Names a message's reasoning comes under; a template reads it as one of the first two."""


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _token_text(value) -> str | None:
    """A special token's text: a string, or an AddedToken object's ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise CausalLMError(f"{path}: not readable JSON ({_one_line(e)})") from None
    if not isinstance(data, dict):
        raise CausalLMError(f"{path}: expected a JSON object")
    return data


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:  # the reason alone, as every file the loader reads says it
        raise CausalLMError(f"{path}: cannot read the chat template "
                            f"({e.strerror or type(e).__name__})") from None
    except UnicodeDecodeError as e:
        raise CausalLMError(f"{path}: cannot read the chat template ({_one_line(e)})") from None


def _environment():
    """The sandbox transformers renders chat templates in (module docstring)."""
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}`` marks an assistant's text; renders it."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body
                                          ).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """Jinja's namespace without underscore attributes (no reaching into Python's
        internals)."""

        def __init__(*args, **kwargs):  # noqa: N805 - Jinja's signature, so `self=` works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a namespace attribute may not start with '_': {name!r}")

    class Dict:
        """``dict(...)`` and ``dict.fromkeys(...)``, and nothing else of the type."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       dict=Dict(), namespace=Namespace)
    return env


class ChatTemplate:
    """A model's chat template(s) and special tokens; ``source`` names the file they came from."""

    def __init__(self, templates: str | dict[str, str], special_tokens: dict[str, str],
                 source: str) -> None:
        self.templates = templates if isinstance(templates, dict) else {"default": templates}
        self.special_tokens = dict(special_tokens)
        self.source = source
        self._compiled: dict[str, object] = {}

    # -- finding it -------------------------------------------------------------------------
    @classmethod
    def fromFolder(cls, path: str) -> "ChatTemplate | None":
        """The template of a model folder or ``.gguf`` file (module docstring); None if it has
        none."""
        path = os.fspath(path)
        if os.path.isfile(path) and path.lower().endswith(".gguf"):
            return cls._fromGGUF(path)
        from causallm.io.config import gguf_in_folder

        if os.path.isdir(path) and (gguf := gguf_in_folder(path)) is not None:
            return cls._fromGGUF(gguf)
        config_path = os.path.join(path, "tokenizer_config.json")
        config = _read_json(config_path) if os.path.isfile(config_path) else {}
        templates: dict[str, str] = {}
        jinja_path = os.path.join(path, "chat_template.jinja")
        extra_dir = os.path.join(path, "additional_chat_templates")
        if os.path.isfile(jinja_path):
            templates["default"] = _read_text(jinja_path)
        if os.path.isdir(extra_dir):
            for name in sorted(os.listdir(extra_dir)):
                if name.endswith(".jinja"):
                    templates[name[:-len(".jinja")]] = _read_text(os.path.join(extra_dir, name))
        source = jinja_path if os.path.isfile(jinja_path) else extra_dir
        if not templates and config.get("chat_template") is not None:
            templates, source = cls._parse(config["chat_template"], config_path), config_path
        processor_path = os.path.join(path, "chat_template.json")
        if not templates and os.path.isfile(processor_path):
            value = _read_json(processor_path).get("chat_template")
            if value is not None:
                templates, source = cls._parse(value, processor_path), processor_path
        if not templates:
            return None
        return cls(templates, cls._specialTokens(path, config), source)

    @staticmethod
    def _parse(value, path: str) -> dict[str, str]:
        """A ``chat_template`` value: a string, or a list of ``{"name", "template"}``."""
        if isinstance(value, str):
            return {"default": value}
        if isinstance(value, list) and all(
                isinstance(t, dict) and isinstance(t.get("name"), str)
                and isinstance(t.get("template"), str) for t in value):
            return {t["name"]: t["template"] for t in value}
        raise CausalLMError(f"{path}: 'chat_template' must be a string or a list of "
                            f"{{\"name\", \"template\"}} objects")

    @staticmethod
    def _specialTokens(path: str, config: dict) -> dict[str, str]:
        """The named special tokens transformers hands a template (module docstring); an old
        folder's ``special_tokens_map.json`` wins when tokenizer_config.json has no
        ``added_tokens_decoder``, as it does there."""
        values = dict(config)
        legacy = os.path.join(path, "special_tokens_map.json")
        if "added_tokens_decoder" not in config and os.path.isfile(legacy):
            values.update(_read_json(legacy))
        tokens = {}
        for key, value in values.items():
            if key in SPECIAL_TOKEN_KEYS or key.endswith("_token"):
                text = _token_text(value)
                if text is not None:
                    tokens[key] = text
        named = values.get("extra_special_tokens")
        if isinstance(named, dict):
            tokens.update({k: t for k, v in named.items() if (t := _token_text(v)) is not None})
        return tokens

    @classmethod
    def _fromGGUF(cls, path: str) -> "ChatTemplate | None":
        from causallm.io.gguf_file import GGUFFile

        return cls.fromGGUF(GGUFFile(path))

    @classmethod
    def fromGGUF(cls, gguf) -> "ChatTemplate | None":
        """The template of an open GGUF file (causallm.io.gguf_file.GGUFFile); None if its
        metadata has none."""
        template = gguf.chat_template
        if not template:
            return None
        return cls(template, cls._ggufTokens(gguf), gguf.path)

    @staticmethod
    def _ggufTokens(gguf) -> dict[str, str]:
        """The named special tokens of an open GGUF file (its tokenizer.ggml.*_token_id)."""
        vocab = gguf.metadata.get("tokenizer.ggml.tokens") or []
        tokens = {}
        for key, name in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                          ("pad_token", "padding")):
            token_id = gguf.metadata.get(f"tokenizer.ggml.{name}_token_id")
            if token_id is not None and 0 <= int(token_id) < len(vocab):
                tokens[key] = vocab[int(token_id)]
        return tokens

    @classmethod
    def fromFile(cls, template_path: str, model) -> "ChatTemplate":
        """The Jinja chat template in the file ``template_path`` (the CLI's
        ``--chat-template-file``, as llama.cpp's), with the special tokens of ``model``: an open
        GGUF file (causallm.io.gguf_file.GGUFFile) or a model folder (its
        tokenizer_config.json's)."""
        if os.path.isdir(template_path):
            raise CausalLMError(f"{template_path}: a folder, not a chat template file")
        text = _read_text(template_path)
        if isinstance(model, (str, os.PathLike)):
            config_path = os.path.join(model, "tokenizer_config.json")
            config = _read_json(config_path) if os.path.isfile(config_path) else {}
            tokens = cls._specialTokens(os.fspath(model), config)
        else:
            tokens = cls._ggufTokens(model)
        return cls(text, tokens, template_path)

    # -- rendering --------------------------------------------------------------------------
    def template(self, tools: list | None = None) -> str:
        """The template a call renders with: ``tool_use`` when there are tools and it exists,
        else ``default``."""
        if tools is not None and "tool_use" in self.templates:
            return "tool_use"
        if "default" in self.templates:
            return "default"
        raise CausalLMError(f"{self.source}: several chat templates "
                            f"({', '.join(sorted(self.templates))}) and none named 'default'")

    def _compile(self, name: str):
        if name not in self._compiled:
            import jinja2

            try:
                self._compiled[name] = _environment().from_string(self.templates[name])
            except jinja2.TemplateSyntaxError as e:
                raise CausalLMError(f"{self.source}: the chat template does not parse (line "
                                    f"{e.lineno}: {_one_line(e)})") from None
        return self._compiled[name]

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               tools: list | None = None, **extra) -> str:
        """The prompt text of ``messages`` (a list of ``{"role", "content", ...}``), ending with
        the assistant's header when ``add_generation_prompt``; ``tools`` are JSON schemas;
        ``extra`` are further template variables (``documents``, ``enable_thinking``, ...)."""
        import jinja2

        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise CausalLMError("chat messages must be a list of objects with 'role' and "
                                "'content'")
        if tools is not None and not all(isinstance(t, dict) for t in tools):
            raise CausalLMError("chat tools must be JSON schema objects")
        chat = []
        for message in messages:
            message = {k: v for k, v in message.items() if v is not None}
            reasoning = next((message[k] for k in REASONING_KEYS if k in message), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
            chat.append(message)
        variables = {**self.special_tokens, **extra}
        variables.setdefault("documents", None)
        template = self._compile(self.template(tools))
        try:
            return template.render(messages=chat, tools=tools,
                                   add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.TemplateError as e:
            raise CausalLMError(f"{self.source}: the chat template raised: {_one_line(e)}") \
                from None
        except Exception as e:  # a template calling what the data does not allow
            raise CausalLMError(f"{self.source}: the chat template failed: "
                                f"{type(e).__name__}: {_one_line(e)}") from None

    def endOfTurnIds(self, tokenizer) -> list[int]:
        """Ids of the tokens that close an assistant's turn: those that follow the assistant's
        text in a rendered exchange and are single special tokens of ``tokenizer``'s vocabulary
        (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``, ``<|end|>``...): the first token of
        what follows a marker reply in a rendered user/assistant pair, when it is a special token
        (one that decoding with ``skip_special_tokens`` drops)."""
        marker = "\u2063chat-reply\u2063"
        try:
            text = self.render([{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": marker}],
                               add_generation_prompt=False)
        except CausalLMError:
            return []
        if marker not in text:
            return []
        tail = text[text.rindex(marker) + len(marker):].lstrip()
        ids = tokenizer.Encode(tail, add_special_tokens=False)[:1]
        return [i for i in ids if tokenizer.Decode([i], skip_special_tokens=True) == ""]


class ChatSession:
    """A conversation with a causal LM over its KV cache, turn by turn.

    ``cached`` are the token ids whose keys and values the cache holds at positions
    ``[0, len(cached))``. A turn renders the whole conversation with the template, encodes it
    (no special tokens added), keeps the longest prefix it shares with ``cached`` (all of the
    previous prompt and reply when the template renders the history as it was generated) and
    prefills only the rest at its positions, so the model computes exactly what a fresh run on
    the full conversation would (the repetition penalty also counts the kept tokens). The reply
    stops at the model's EOS ids and the template's end-of-turn token (``endOfTurnIds``): the
    session's ``settings``, the model's with those ids, go with each turn (the model's own are
    not changed). Any causal LM with ``start``/``step`` over one row (``CausalLM``) can hold a
    session."""

    def __init__(self, model, template: ChatTemplate, system: str | None = None,
                 max_new_tokens: int | None = None) -> None:
        self.model = model
        self.template = template
        self.max_new_tokens = max_new_tokens
        self.system = [{"role": "system", "content": system}] if system else []
        self.messages: list[dict] = list(self.system)
        self.cached: list[int] = []
        self.settings = model.generation.withEosTokenIds(template.endOfTurnIds(model.tokenizer))

    def promptIds(self, messages: list[dict]) -> list[int]:
        """The ids of ``messages`` rendered with the assistant's header."""
        text = self.template.render(messages, add_generation_prompt=True)
        return self.model.tokenizer.Encode(text, add_special_tokens=False)

    def reset(self) -> None:
        """Forget the conversation (the system message stays)."""
        self.messages = list(self.system)
        self.cached = []

    def reply(self, text: str, stream=None) -> "Turn":
        """Add the user's ``text``, generate the reply (streamed to ``stream``) and add it to the
        conversation. A conversation that does not fit the cache raises CausalLMError and is
        left as it was. Ctrl-C (KeyboardInterrupt) ends the reply early; what was generated
        stays in the conversation and the cache."""
        messages = [*self.messages, {"role": "user", "content": text}]
        ids = self.promptIds(messages)
        T = self.model.MAX_SEQ_LEN
        if len(ids) >= T:
            raise CausalLMError(f"the conversation has {len(ids)} tokens but the KV cache holds "
                                f"{T} positions ({self.model.context.cacheSize()})")
        keep = 0
        while keep < min(len(ids) - 1, len(self.cached)) and ids[keep] == self.cached[keep]:
            keep += 1  # at least the last prompt token is fed, for the first reply token
        turn = Turn(prompt_tokens=len(ids), reused=keep)
        self.model.position = keep  # the cache rows still valid, whatever happens below
        try:
            turn.result = self.model.generate_tokens(
                [ids[keep:]], self.max_new_tokens, start_pos=keep, context_ids=ids[:keep],
                on_token=lambda b, t: turn.generated_ids.append(t), stream=stream,
                settings=self.settings)
            turn.text = turn.result.texts[0]
        except KeyboardInterrupt:
            turn.text = self.model.tokenizer.Decode(
                [t for t in turn.generated_ids if t not in self.settings.eos_token_id],
                skip_special_tokens=True)
        finally:  # the last token chosen is never fed: the cache ends before it
            self.cached = (ids + turn.generated_ids)[:self.model.position]
        self.messages = [*messages, {"role": "assistant", "content": turn.text.strip()}]
        return turn


@dataclass
class Turn:
    """One reply of a ChatSession: its text, the prompt's token count and how many of them the
    cache already held, the new token ids, and the generation's result (None when Ctrl-C
    ended it)."""

    prompt_tokens: int
    reused: int
    text: str = ""
    generated_ids: list = field(default_factory=list)
    result: object = None

    def summary(self) -> str:
        """``[prefill P of N tokens (R from the cache), generation G tokens, ...]``."""
        head = (f"prefill {self.prompt_tokens - self.reused} of {self.prompt_tokens} tokens "
                f"({self.reused} from the cache), generation {len(self.generated_ids)} tokens")
        if self.result is None:
            return f"[interrupted: {head}]"
        m = self.result.metrics
        tps = f"{m.generation_tokens / m.generation_duration_ms * 1e3:.1f}" \
            if m.generation_duration_ms > 0 else "inf"
        full = ", the KV cache is full" if self.result.finish_reasons[0] == "cache_full" else ""
        return f"[{head}, {tps} TPS{full}]"


COMMANDS = (("/help", "this list"),
            ("/clear", "forget the conversation (the system message stays)"),
            ("/bye", "leave (also /exit, /quit, or Ctrl-D)"))
"""The chat's commands: a line that is one of them (or /exit, /quit) is not sent to the model."""
LEAVE = ("/bye", "/exit", "/quit")


class _Tail:
    """A text stream that remembers whether what was written to it ends a line."""

    def __init__(self, out) -> None:
        self.out, self.ends_line = out, True

    def write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.ends_line = text.endswith("\n")

    def flush(self) -> None:
        self.out.flush()


def interactive(session: ChatSession, out=None, err=None, banner: str | None = None,
                terminal: bool | None = None) -> int:
    """The chat of ``main.py -i``: one user turn per line of stdin, the reply streamed to ``out``
    and ended with a newline, then the turn's statistics as a line of their own on ``err``: its
    prefill (new tokens of the whole prompt and those reused from the cache) and generation.

    On a terminal (``terminal``, default: stdin is a tty) ``banner`` and a line on how to use
    the chat go to ``err`` first and each turn is read after the prompt ``> ``; from a pipe or a
    file there is neither, so ``out`` holds the replies alone. The lines in ``COMMANDS`` are
    commands, not turns (``//`` starts a turn with ``/``; another ``/word`` is refused). A line
    that is not UTF-8, or a turn the model refuses (a conversation too long for the KV cache),
    is one ``error: ...`` line on ``err``, and the session goes on with the next line. Ctrl-C
    during a reply ends the reply, at the prompt it clears the line; Ctrl-D (end of input) or
    /bye ends the session. Returns 0, or 2 when any line or turn was refused (not answered).
    On a terminal a turn that would overflow the KV cache offers to start over without the
    history; elsewhere it is refused."""
    import sys

    out, err = out or sys.stdout, err or sys.stderr
    if terminal is None:
        terminal = bool(getattr(sys.stdin, "isatty", lambda: False)())
    reconfigure = getattr(sys.stdin, "reconfigure", None)
    if reconfigure is not None:  # bytes that are not UTF-8 reach the check below, not input()
        reconfigure(encoding="utf-8", errors="surrogateescape")
    if terminal:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:  # pragma: no cover - platforms without it
            pass
        if banner:
            err.write(banner + "\n")
        err.write("Type a message and press Enter; /help lists the commands, /bye or Ctrl-D "
                  "leaves, Ctrl-C stops a reply.\n")
        err.flush()
    status, lines = 0, 0

    def ask(prompt: str) -> str | None:
        """A line of input; None at the end of input, "" after Ctrl-C."""
        try:
            return input(prompt if terminal else "")
        except EOFError:
            return None
        except KeyboardInterrupt:
            out.write("\n")
            return ""

    def refuse(message: str) -> None:
        nonlocal status
        err.write(f"error: {message}\n")
        err.flush()
        status = 2

    while True:
        text = ask("> ")
        if text is None:
            if terminal:
                out.write("\n")
            out.flush()
            return status
        lines += 1
        try:
            text = utf8(text.encode("utf-8", "surrogateescape"), f"input line {lines}")
        except CausalLMError as e:
            refuse(f"{e}; the line is skipped")
            continue
        command = text.strip()
        if not command:
            continue
        if command.lower() in LEAVE:
            out.flush()
            return status
        if command.lower() == "/help":  # on err, as the banner: out holds replies alone
            err.write("".join(f"{name:<8}{what}\n" for name, what in COMMANDS)
                      + "//TEXT  send TEXT starting with '/'\n"
                      "Ctrl-C stops a reply; at the prompt it clears the line.\n")
            err.flush()
            continue
        if command.lower() == "/clear":
            session.reset()
            err.write("[the conversation is cleared]\n")
            err.flush()
            continue
        if command.startswith("//"):
            text = text.replace("//", "/", 1)
        elif command.startswith("/") and command[1:2].isalpha():
            refuse(f"unknown command {command.split()[0]} (/help lists the commands; // starts "
                   f"a message with /)")
            continue
        stream = _Tail(out)
        try:
            turn = session.reply(text, stream)
        except CausalLMError as e:
            if not stream.ends_line:
                out.write("\n")
            if not terminal or len(session.messages) <= len(session.system):
                refuse(str(e))
                continue
            err.write(f"error: {e}\n")
            err.flush()
            answer = ask("start over without the history? [y/N] ")
            lines += answer is not None
            if answer is None or answer.strip().lower() not in ("y", "yes"):
                status = 2  # the turn is dropped
                continue
            session.reset()
            stream = _Tail(out)
            try:
                turn = session.reply(text, stream)
            except CausalLMError as e:
                refuse(str(e))
                continue
        if not stream.ends_line or turn.result is None:  # after Ctrl-C's ^C too
            out.write("\n")
        out.flush()
        err.write(turn.summary() + "\n")
        err.flush()
