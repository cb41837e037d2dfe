"""The CLI, mirroring Applications/CausalLM/main.cpp.

    python main.py [MODEL_DIR] [PROMPT] [options]
    python main.py serve MODEL_DIR [--host 127.0.0.1] [--port 8080]   # docs/server.md

MODEL_DIR holds config.json (required), generation_config.json and nntr_config.json (both
optional) and the weights: nntr_config's ``model_file_name`` (an NNTrainer .bin, or a
.safetensors), else the folder's Hugging Face safetensors. Without MODEL_DIR the small model
embedded in res/tiny-llama runs. The generated text streams to stdout; the NNTrainer metrics
block goes to stderr; ``--json`` adds one JSON object as the last stdout line. A user error is
one line ``error: ...`` on stderr and exit status 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import errno
import gc
import os
import stat
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL_DIR = os.path.join(HERE, "res", "tiny-llama")
WEIGHT_FORMATS = ["FP32", "BF16", "FP16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K",
                  "Q6_K"]
"""``--dtype``'s choices: causallm/io/weights.py's WEIGHT_FORMATS, spelled out so that parsing
the command line imports no kernel (tests/test_options.py checks that they agree)."""
KV_FORMATS = ["FP32", "FP16"]
"""``--kv-dtype``'s choices."""
USER_ERRNOS = frozenset((errno.EACCES, errno.EPERM, errno.ENOENT, errno.EISDIR, errno.ENOTDIR,
                         errno.ELOOP, errno.ENAMETOOLONG, errno.EROFS))
"""An OSError of these on a named path is the user's files (unreadable, a folder where a file
should be, ...): ``error: PATH: why``, status 2, wherever no closer check names it first."""
OUTPUT_ERRNOS = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO))
"""An OSError of these on no named path is the output failing (stdout on a full disk):
``error: cannot write the output (why)``, status 1."""


def version() -> str:
    """The package's version: the ``[project]`` version of a source tree's pyproject.toml (beside
    this file; read with tomllib, Python 3.11+), else the installed distribution's metadata,
    else "unknown"."""
    try:
        import tomllib

        with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (ImportError, OSError, ValueError, KeyError, TypeError):
        pass
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        return installed("causallm")
    except PackageNotFoundError:
        return "unknown"


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line error (``error: ...``, exit status 2) instead of the
    usage block."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


RUN, SERVE, WARMUP = "run", "serve", "warmup"
"""The commands: ``causallm`` (main.py's run), ``causallm serve``, ``python -m causallm.warmup``."""


def _option(flags: tuple, commands: set, **kwargs) -> tuple:
    return flags, frozenset(commands), kwargs


OPTIONS = [
    _option(("-c", "--ctx-size"), {RUN, SERVE}, type=int, default=None,
            help="context: the positions of the prompt and the new tokens together, the KV "
                 "cache rows, for serve each slot's (nntr_config max_seq_len; default: the "
                 "model's own context, at most 4096)"),
    _option(("--dtype",), {RUN, SERVE, WARMUP}, type=str.upper, default=None,
            choices=WEIGHT_FORMATS,
            help="hold the fully connected, embedding and head weights in this format "
                 "(converted at load); default: as the weight file stores them"),
    _option(("--kv-dtype",), {RUN, SERVE, WARMUP}, type=str.upper, default=None,
            choices=KV_FORMATS,
            help="precision of the KV cache (nntr_config kv_cache_dtype); default: FP32 for "
                 "float32 weights, FP16 for 16-bit or quantized ones"),
    _option(("--image",), {RUN}, action="append", default=[], metavar="PATH",
            help="an image for a vision model (repeatable, in the order of the prompt's "
                 "<start_of_image> placeholders, or put before the prompt)"),
    _option(("-t", "--threads"), {RUN, SERVE}, type=int, default=None,
            help="threads that compute (default: every core)"),
    _option(("-np", "--parallel"), {SERVE}, type=int, default=None,
            help="requests decoded together: the KV caches hold this many sequences (default: "
                 "4, fewer when their caches would take over a quarter of the available "
                 "memory)"),
    _option(("--queue",), {SERVE}, type=int, default=64,
            help="requests that may wait for a slot; beyond them a request gets a 503 "
                 "(default: 64)"),
    _option(("--system",), {RUN}, default=None,
            help="system prompt placed before the prompt (with --chat / -i: the system "
                 "message)"),
    _option(("--chat",), {RUN}, action="store_true",
            help="render the prompt as a user message through the model's chat template"),
    _option(("-i", "--interactive"), {RUN}, action="store_true",
            help="chat in the terminal, turn by turn, keeping the KV cache"),
    _option(("--chat-template-file",), {RUN}, default=None, metavar="FILE",
            help="with --chat / -i: the Jinja chat template in FILE instead of the model's (a "
                 "GGUF's tokenizer.chat_template, a folder's chat_template.jinja or "
                 "tokenizer_config.json)"),
    _option(("--plugin",), {RUN, SERVE}, action="append", default=[], metavar="FILE.py",
            help="import a Python file that registers model classes (repeatable)"),
    _option(("--graph",), {RUN}, default=None, metavar="FILE",
            help="write the compiled layer graph (FILE.dot, or FILE.svg with Graphviz) and "
                 "exit without loading weights or generating"),
    _option(("--json",), {RUN}, action="store_true",
            help="print one JSON object with ids, text and metrics as the last line"),
    _option(("--log-level",), {SERVE}, default="info",
            choices=["critical", "error", "warning", "info", "debug"],
            help="uvicorn's log level (default: info)"),
    _option(("--debug",), {RUN, SERVE}, action="store_true", help="show tracebacks"),
]
"""Every option of the commands but the generation options, declared once (as llama.cpp's
common/arg.cpp): its flags, the commands that take it, argparse's keywords. The generation
options' flags come from their table (``generation_flags``)."""


def generation_flags() -> list[tuple]:
    """The generation options' flags (causallm/generation/options.py: each option's flag, other
    spellings and argparse keywords, under its keyword as dest), as OPTIONS entries: main.py
    takes them all; serve takes -n, a request's default number of new tokens (nntr_config
    num_to_generate), as load() does."""
    from causallm.generation.options import OPTIONS as GENERATION

    return [_option(tuple(sorted((o.flag, *o.aliases), key=lambda f: f.startswith("--"))),
                    {RUN, SERVE} if o.name == "max_new_tokens" else {RUN}, dest=o.name,
                    **o.cli)
            for o in GENERATION.values() if o.flag is not None]


def add_options(p: argparse.ArgumentParser, command: str) -> None:
    """The options of ``command`` (the generation options' flags, then OPTIONS) on parser
    ``p``."""
    for flags, commands, kwargs in [*generation_flags(), *OPTIONS]:
        if command in commands:
            p.add_argument(*flags, **kwargs)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = Parser(
        prog="causallm",
        usage="causallm [MODEL_DIR] [PROMPT] [options]\n       causallm serve MODEL_DIR [options]",
        description="Run an NNTrainer-style CausalLM on a model folder. To serve it over an "
                    "OpenAI-compatible HTTP API instead: causallm serve MODEL_DIR (causallm serve "
                    "--help).",
        epilog="Sampling defaults come from generation_config.json; --temp/--top-k/--top-p/"
               "--min-p/--typical-p switch sampling on (--temp 0 means greedy); --greedy forces "
               "greedy decoding. In -i, /help lists the chat's commands.")
    p.add_argument("--version", action="version", version=f"causallm {version()}")
    p.add_argument("model_dir", nargs="?", default=DEFAULT_MODEL_DIR,
                   help="model folder or .gguf file (default: the embedded res/tiny-llama)")
    p.add_argument("prompt", nargs="?", default=None,
                   help="input text; '-' reads it from stdin, as does no PROMPT when stdin is "
                        "a pipe or a file (default: nntr_config.json sample_input)")
    add_options(p, RUN)
    args = p.parse_intermixed_args(argv)  # options may come before, between or after them
    if args.model_dir == "-" and args.prompt is None:  # `causallm -`: the default model
        args.model_dir, args.prompt = DEFAULT_MODEL_DIR, "-"
    return args


def _check_model_options(args: argparse.Namespace) -> None:
    """The options main.py and serve share (-n, -c, -t), checked one way for both."""
    from causallm.errors import CausalLMError
    from causallm.generation.options import check

    check("max_new_tokens", args.max_new_tokens, "flag")
    for flag, value in (("-c", args.ctx_size), ("-t", args.threads)):  # as load() words them
        if value is not None and value < 1:
            raise CausalLMError(f"{flag} must be an integer >= 1, got {value}")


def _check_args(args: argparse.Namespace):
    """The run's flags checked, each once, and its generation options (the flags' values, by
    their options' rules: causallm/generation/options.py) but -n (nntr_config num_to_generate,
    ``create``'s) and the response formats (read and checked when the model is made)."""
    from causallm.errors import CausalLMError
    from causallm.generation.options import OPTIONS as GENERATION, Options

    _check_model_options(args)
    given = Options.check({name: getattr(args, name) for name, o in GENERATION.items()
                           if o.flag is not None and name not in (
                               "max_new_tokens", "json_schema", "response_format")}, "flag")
    checks = [
        (args.greedy and args.num_beams is not None and args.num_beams > 1,
         "--greedy means one beam; it cannot go with --num-beams > 1"),
        (args.interactive and args.prompt is not None,
         "--interactive reads the prompts from the terminal; pass no PROMPT"),
        (args.interactive and (args.json or args.image),
         "--interactive does not go with --json or --image"),
        (args.chat_template_file is not None and not (args.chat or args.interactive),
         "--chat-template-file is the template of --chat or --interactive; pass one of them"),
        (args.json_schema is not None and args.response_format,
         "--json-schema and --json-object do not go together (a schema says what the object "
         "holds)"),
    ]
    for bad, message in checks:
        if bad:
            raise CausalLMError(message)
    return given


def _stdin_is_input() -> bool:
    """Whether stdin is a pipe or a file (not a terminal, not /dev/null): then a missing PROMPT
    is read from it."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # no stdin, or one without a descriptor
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode)


def _utf8(raw: bytes, what: str) -> str:
    """``raw`` decoded as UTF-8, or a one-line error naming the first invalid byte."""
    from causallm.errors import utf8

    return utf8(raw, what)


def _arg_text(text: str, what: str) -> str:
    """A command-line string as the user typed it: argv bytes that are not UTF-8 arrive as
    lone surrogates (surrogateescape), named here by their byte offset."""
    return _utf8(text.encode("utf-8", "surrogateescape"), what)


def read_json_schema(value: str) -> tuple[dict, str]:
    """--json-schema's schema and how errors name it: the text itself when it starts with '{',
    else the file it names."""
    import orjson

    from causallm.errors import CausalLMError

    value = _arg_text(value, "--json-schema")
    if value.lstrip().startswith("{"):
        text, where = value, "--json-schema"
    else:
        where = f"--json-schema {value}"
        try:
            with open(value, "rb") as f:
                text = _utf8(f.read(), where)
        except FileNotFoundError:
            raise CausalLMError(f"{where}: no such file (give a JSON Schema file, or the "
                                f"schema's text starting with '{{')") from None
        except OSError as e:
            raise CausalLMError(f"{where}: cannot read it ({e.strerror})") from None
    try:
        schema = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise CausalLMError(f"{where}: not valid JSON ({e})") from None
    return schema, where


def read_prompt(args: argparse.Namespace) -> str | None:
    """PROMPT; its text from stdin when it is '-' or missing while stdin is a pipe or a file
    (trailing newlines removed, as the shell's ``$(...)`` does); None when there is none. An
    interactive session keeps stdin for its turns, and --graph needs no prompt."""
    reads_stdin = not args.interactive and args.graph is None
    if args.prompt == "-" or (args.prompt is None and reads_stdin and _stdin_is_input()):
        return _utf8(sys.stdin.buffer.read(), "the prompt read from stdin").rstrip("\r\n")
    return None if args.prompt is None else _arg_text(args.prompt, "PROMPT")


def _warn_threads(args: argparse.Namespace) -> None:
    """One warning line when -t asks for more threads than numba may run (NUMBA_NUM_THREADS,
    every core by default): the count is lowered to that."""
    if args.threads is None:
        return
    import numba

    most = numba.config.NUMBA_NUM_THREADS
    if args.threads > most:
        sys.stderr.write(f"warning: -t {args.threads}: at most {most} threads here "
                         f"(NUMBA_NUM_THREADS, every core by default); using {most}\n")


def _short(path: str) -> str:
    """``path`` relative to the working directory when it lies below it, else absolute."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _write_graph(model, path: str) -> int:
    """--graph: initialize the model (its layers compiled, nothing loaded) and write its graph
    (causallm/runtime/graphviz.py)."""
    from causallm.runtime.graphviz import write_graph

    model.initialize()
    write_graph(model.model, path, model.architecture)
    sys.stderr.write(f"graph written to {path}\n")
    return 0


def run(args: argparse.Namespace) -> int:
    """main.cpp: the model folder -> Factory -> initialize -> load_weight -> run, then the
    metrics; with --json one last stdout line with the run's record. The same for every
    architecture: a model's ``run`` returns a result whose ``record()`` holds its fields. The
    model is made by causallm.loader.create, as the Python API's ``causallm.load``."""
    import orjson

    from causallm.errors import CausalLMError
    from causallm.generation.options import Options
    from causallm.loader import create, give_options, model_path_error

    t_start = time.perf_counter()
    given = _check_args(args)
    given_prompt = read_prompt(args)
    if args.system is not None:
        args.system = _arg_text(args.system, "--system")
    if args.stop is not None:
        args.stop = given["stop"] = [_arg_text(text, "--stop") for text in args.stop]
    _warn_threads(args)
    error = model_path_error(args.model_dir)
    if error:
        hint = (f"; to prompt the default model, pass its folder first: "
                f"{_short(DEFAULT_MODEL_DIR)} \"PROMPT\""
                if given_prompt is None and not os.path.exists(args.model_dir) else "")
        raise CausalLMError(f"{error}{hint}")
    overrides, flags = {}, {"max_seq_len": "-c"}
    if args.max_new_tokens is not None:
        overrides["num_to_generate"], flags["num_to_generate"] = args.max_new_tokens, "-n"
    for path in args.image:
        if not os.path.isfile(path):
            what = "a folder, not an image file" if os.path.isdir(path) else "no such file"
            raise CausalLMError(f"--image {path}: {what}")
    model = create(args.model_dir, dtype=args.dtype, kv_dtype=args.kv_dtype,
                   threads=args.threads, plugins=args.plugin, flags=flags,
                   ctx_size=args.ctx_size, **overrides)
    give_options(model, given.subset(lambda k: k == "num_beams"))  # first: the graph has
    # a row per beam
    if args.graph is not None:  # the graph alone: no prompt, no weights, no generation
        return _write_graph(model, args.graph)
    nntr_cfg = model.nntr_cfg
    if args.image:  # read before the weights load, so a bad image fails fast
        model.setImages(args.image)

    head_prompt, tail_prompt = "", ""
    if nntr_cfg.contains("system_prompt"):
        system = nntr_cfg.get_dict("system_prompt")
        head_prompt = system.get_str("head_prompt", "")
        tail_prompt = system.get_str("tail_prompt", "")
    if args.system is not None:  # a line of its own before the prompt, unless it ends one
        head_prompt = args.system if not args.system or args.system[-1].isspace() else \
            f"{args.system}\n"

    prompt, prompt_source = given_prompt, None
    if prompt is None and not args.interactive and nntr_cfg.contains("chat_input"):  # main.cpp 6
        prompt, prompt_source = model.chatPrompt(nntr_cfg.get_dict("chat_input")), "chat_input"
        if prompt is None:
            sys.stderr.write(f"[Warning] 'chat_input' is set but support for model architecture "
                             f"'{model.architecture}' is not implemented. Falling back to "
                             f"'sample_input'.\n")
    if prompt is None and not args.interactive:
        if not nntr_cfg.contains("sample_input"):
            raise CausalLMError(f"no prompt: pass one after the model folder or set "
                                f"'sample_input' in {nntr_cfg.path}")
        prompt, prompt_source = nntr_cfg.get_str("sample_input"), "sample_input"

    schema, schema_source = read_json_schema(args.json_schema) if args.json_schema else \
        (None, None)
    formats = Options.check({"json_schema": schema, "response_format": {"type": "json_object"}
                             if args.response_format else None})
    try:
        rest = given.subset(lambda k: k != "num_beams")
        rest.update(formats)
        give_options(model, rest)
    except CausalLMError as e:  # the schema's errors name the flag and the file
        if schema_source and str(e).startswith("json_schema: "):
            raise CausalLMError(f"{schema_source}: {str(e)[len('json_schema: '):]}") from None
        raise
    chat = _chat_template(args, model)
    if chat is not None and not args.interactive:  # rendered before the weights load
        messages = [{"role": "system", "content": args.system}] if args.system else []
        prompt_text = chat.render([*messages, {"role": "user", "content": prompt}])
        model.setGenerationSettings(model.generation.withEosTokenIds(
            chat.endOfTurnIds(model.tokenizer)))  # the reply ends with the turn
    model.initialize()
    model.load_weight()
    init_ms = (time.perf_counter() - t_start) * 1e3

    if args.interactive:
        from causallm.chat import ChatSession, interactive

        banner = (f"causallm {version()}: {_short(args.model_dir)} ({model.architecture}), chat "
                  f"template from {_short(chat.source)}")
        session = ChatSession(model, chat, args.system, args.max_new_tokens)
        return interactive(session, banner=banner)
    if prompt_source is not None:  # the user gave none: say which text the output continues
        sys.stderr.write(f"[prompt: {prompt_source} of {_short(nntr_cfg.path)}] {prompt}\n")
        sys.stderr.flush()
    if chat is not None:
        result = model.run(prompt_text, None, log_output=True, add_special_tokens=False)
    else:
        result = model.run(prompt, None, head_prompt, tail_prompt, log_output=True)
    e2e_ms = (time.perf_counter() - t_start) * 1e3
    record = result.record()
    if record.get("finish_reason") == "cache_full":
        sys.stderr.write(f"[cache full] stopped after {len(record['generated_ids'])} of "
                         f"{model.NUM_TO_GENERATE} new tokens: {model.cacheLimit()}\n")
    sys.stderr.write(f"[e2e time]: {e2e_ms:.0f} ms\n")
    if args.json:
        record = {"architecture": model.architecture,
                  "model_dir": os.path.abspath(args.model_dir), "prompt": prompt,
                  "weight_types": model.loader.heldTypes(),
                  **record, "initialization_ms": round(init_ms, 3),
                  "total_ms": round(e2e_ms, 3)}
        sys.stdout.write(orjson.dumps(record).decode() + "\n")
        sys.stdout.flush()
    return 0


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    p = Parser(prog="causallm serve",
                description="Serve a model over an OpenAI-compatible HTTP API "
                            "(docs/server.md); needs the 'serve' extra.")
    p.add_argument("model_dir", help="model folder or .gguf file")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8080, help="TCP port (default: 8080)")
    p.add_argument("--model-name", default=None,
                   help="the model id responses and /v1/models show (default: the folder name)")
    add_options(p, SERVE)
    return p.parse_args(argv)


def serve(args: argparse.Namespace) -> int:
    """``causallm serve``: load the model once, then answer HTTP requests until interrupted."""
    from causallm.errors import CausalLMError

    if not 0 <= args.port <= 65535:
        raise CausalLMError("--port must be in [0, 65535]")
    _check_model_options(args)
    if args.parallel is not None and args.parallel < 1:
        raise CausalLMError("--parallel must be at least 1")
    if args.queue < 0:
        raise CausalLMError("--queue must be at least 0")
    args.host = _arg_text(args.host, "--host")
    if args.model_name is not None:
        args.model_name = _arg_text(args.model_name, "--model-name")
        if not args.model_name.strip():
            raise CausalLMError("--model-name needs a non-empty name")
    _warn_threads(args)
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise CausalLMError(f"causallm serve needs Starlette and uvicorn ({e.name} is not "
                            f"installed): pip install \"causallm[serve]\" (or: pip install "
                            f"starlette uvicorn)") from None
    from causallm.server import serve as run_server

    overrides = {} if args.max_new_tokens is None else {"num_to_generate": args.max_new_tokens}
    run_server(args.model_dir, host=args.host, port=args.port, model_id=args.model_name,
               log_level=args.log_level, dtype=args.dtype, kv_dtype=args.kv_dtype,
               threads=args.threads, plugins=args.plugin, parallel=args.parallel,
               queue=args.queue, ctx_size=args.ctx_size,
               flags={"num_to_generate": "-n", "max_seq_len": "-c"}, **overrides)
    return 0


def _chat_template(args: argparse.Namespace, model):
    """The model's chat template for --chat / --interactive (None without them); an error when
    the folder (or GGUF) has none, or when --interactive cannot run on the model. Called once
    the model is made and before it is initialized: nothing is allocated, no weight read."""
    if not (args.chat or args.interactive):
        return None
    from causallm.chat import ChatTemplate
    from causallm.errors import CausalLMError
    from causallm.models.causal_lm import CausalLM

    flag = "--interactive" if args.interactive else "--chat"
    if args.interactive and not isinstance(model, CausalLM):
        raise CausalLMError(f"--interactive needs a decoder-only model; {model.architecture} "
                            f"is not one (use --chat for one turn)")
    if args.interactive and (model.BATCH_SIZE != 1 or model.NUM_BEAMS != 1):
        raise CausalLMError("--interactive generates one row with one beam (batch_size 1, "
                            "--num-beams 1)")
    gguf = getattr(getattr(model, "cfg", None), "gguf", None)  # read with the configs
    if args.chat_template_file is not None:
        path = _arg_text(args.chat_template_file, "--chat-template-file")
        return ChatTemplate.fromFile(path, gguf if gguf is not None else args.model_dir)
    chat = ChatTemplate.fromGGUF(gguf) if gguf is not None else \
        ChatTemplate.fromFolder(args.model_dir)
    if chat is None:
        where = ("no tokenizer.chat_template in the GGUF's metadata" if gguf is not None else
                 "chat_template.jinja or tokenizer_config.json's 'chat_template'")
        raise CausalLMError(f"{flag}: {args.model_dir} has no chat template ({where}); give "
                            f"one with --chat-template-file FILE")
    return chat


def main(argv: list[str] | None = None) -> int:
    """Parse, run, and turn what ends the run into its exit status: 0, 2 for bad input, 1 for
    another failure, 130 for an interrupt (from start-up on: the engine is imported here, not
    at the top), 141 for a closed stdout."""
    args, own_process = None, argv is None
    try:
        if sys.stdout is None or getattr(sys.stdout, "closed", False):  # started with `>&-`
            return 141
        argv = sys.argv[1:] if argv is None else argv
        if argv[:1] == ["serve"]:  # `causallm serve MODEL_DIR`; a folder named serve: ./serve
            args, command = parse_serve_args(argv[1:]), serve
        else:
            args, command = parse_args(argv), run
        import causallm  # noqa: F401  (first: it sizes the thread pools before numpy loads)

        reconfigure = getattr(sys.stdout, "reconfigure", None)
        if reconfigure is not None:  # a non-UTF-8 terminal shows '?', not an error mid-stream
            reconfigure(errors="replace")
        return command(args)
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        return 130
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as SIGPIPE would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # one line for the user; the traceback with --debug
        if args is not None and args.debug:
            raise
        from causallm.errors import CausalLMError

        if isinstance(e, CausalLMError):
            sys.stderr.write(f"error: {e}\n")
            return 2
        if isinstance(e, OSError) and e.filename is not None and e.errno in USER_ERRNOS:
            sys.stderr.write(f"error: {e.filename}: {e.strerror}\n")  # a path the run was given
            return 2
        if isinstance(e, OSError) and e.filename is None and e.errno in OUTPUT_ERRNOS:
            sys.stderr.write(f"error: cannot write the output ({e.strerror})\n")
            return 1
        sys.stderr.write(f"error: {type(e).__name__}: {e} (run with --debug for the traceback)\n")
        return 1
    finally:
        if own_process:  # the process ends next: its teardown need not search numba's many
            gc.freeze()  # objects for cycles (0.1 s of a short run)


if __name__ == "__main__":
    sys.exit(main())
