"""The Python entry point: a model folder (or .gguf) loaded once, then generating or embedding
as often as asked.

    import causallm

    model = causallm.load("res/tiny-llama")                  # dtype=, kv_dtype=, threads=, ...
    model.generate("Strings are immutable sequences of", greedy=True, max_new_tokens=32)
    for piece in model.stream("The for statement", temperature=0.8, seed=1):
        print(piece, end="", flush=True)
    model.generate([{"role": "user", "content": "Hi"}])     # through the folder's chat template

    embedder = causallm.load("path/to/sentence-transformers-folder")
    vectors = embedder.embed(["first text", "second text"])   # (2, D) float32

``create`` builds the model of a folder with the loading options applied, not yet initialized:
main.py's ``run`` goes through it, so the CLI and the Python API load a model one way. ``load``
then initializes it and loads its weights. ``complete`` (and ``generate``, ``stream``) goes
through the model's own ``generate_tokens`` (the generator loop over batch rows,
causallm/generation/generator.py) and prefills from position 0; ``complete_many`` and
``request`` go through the scheduler (causallm/generation/scheduler.py), which decodes several
prompts on the model's slots and reuses what a slot holds, prefix by prefix. A call's generation
options make a copy of the model's settings (the configs' and load()'s:
``GenerationSettings.withOptions``, causallm/generation/settings.py) for that call, and the
model is not changed, so one loaded model serves any number of calls. Calls from several threads take turns (a lock): the model's caches
are never shared.
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from causallm.errors import CausalLMError, unicode

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "cache_full": "length"}
"""The generator's finish reason -> OpenAI's: an EOS token or a stop string is "stop"; reaching
max_new_tokens or the end of the KV cache is "length"."""


def model_path_error(path: str) -> str | None:
    """Why ``path`` is not something to load (neither a folder nor a .gguf file), or None."""
    from causallm.io.config import is_gguf

    if os.path.isdir(path) or is_gguf(path):
        return None
    what = "a file, neither a folder nor a .gguf" if os.path.exists(path) else "no such directory"
    return f"{path}: not a model folder ({what})"


def model_path(path) -> str:
    """``path`` (a str or an os.PathLike) as a str; anything else is a CausalLMError."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise CausalLMError(f"the model path must be a string or os.PathLike (a folder or a "
                            f".gguf file), got {type(path).__name__}")
    return path


def check_messages(messages) -> None:
    """Chat messages as the server takes them: each a {"role": str, "content": a string or a
    list of parts}, the content null (or absent) only in an assistant message with
    ``tool_calls``; else a CausalLMError naming the message's field."""
    for k, m in enumerate(messages):
        if not isinstance(m.get("role"), str):
            raise CausalLMError(f"'messages[{k}].role' must be a string, got {m.get('role')!r}")
        content = m.get("content")
        if isinstance(content, str):
            unicode(content, f"'messages[{k}].content'")
        if not isinstance(content, (str, list)) and not (
                content is None and m["role"] == "assistant" and m.get("tool_calls")):
            raise CausalLMError(f"'messages[{k}].content' must be a string or a list of parts "
                                f"(null only in an assistant message with tool_calls), got "
                                f"{content!r}")


def create(path: str, dtype: str | None = None, kv_dtype: str | None = None,
           threads: int | None = None, plugins=(), flags: dict[str, str] | None = None,
           ctx_size: int | None = None, **options):
    """The model of ``path`` (a folder or a .gguf file) as main.py builds it, not initialized.
    ``ctx_size`` is the context, the positions a sequence holds (prompt and new tokens, the
    KV cache rows; default nntr_config ``max_seq_len``, else the model's own context, at most
    4096: Transformer.setupContext). ``options`` are nntr_config.json keys
    (``num_to_generate=64``, ``init_seq_len``, ``slots``, ...: they replace the file's) and
    generation options (causallm/generation/options.py: ``max_new_tokens``, ``temperature``,
    ``num_beams``, ...: the defaults of every generation, over generation_config.json's;
    ``max_new_tokens`` is num_to_generate, as the CLI's -n); anything else is an error naming
    it. ``dtype`` holds the packable weights as FP32 / BF16 / FP16 / Q8_0 / Q4_0 ...,
    ``kv_dtype`` the KV cache as FP32 / FP16, ``threads`` sets the kernel threads; ``plugins``
    are model files to register first (the CLI's --plugin, ``factory.loadPlugin``); ``flags``
    name the command-line flag behind an nntr option, for its errors
    (``Factory.createFromFolder``). New tokens asked for (``num_to_generate``) beyond the
    context are refused here, before anything is allocated."""
    from causallm.factory import Factory, loadPlugin
    from causallm.generation.options import OPTIONS, Options, unknown
    from causallm.io.config import NNTR_KEYS
    from causallm.kernels import set_num_threads

    bad = [k for k in options if k not in OPTIONS and k not in NNTR_KEYS]
    if bad:
        own = ("dtype", "kv_dtype", "threads", "plugins", "ctx_size")
        raise unknown(bad, [*own, *OPTIONS, *NNTR_KEYS], "load")
    nntr = {k: v for k, v in options.items() if k in NNTR_KEYS}
    generation = Options.check({k: v for k, v in options.items() if k in OPTIONS}, what="load")
    flags = dict(flags or {})
    if "max_new_tokens" in generation:
        if "num_to_generate" in nntr:
            raise CausalLMError("load: give max_new_tokens or num_to_generate, not both (they "
                                "are one setting)")
        nntr["num_to_generate"] = generation.pop("max_new_tokens")
        flags.setdefault("num_to_generate", "max_new_tokens")
    path = model_path(path)
    error = model_path_error(path)
    if error:
        raise CausalLMError(error)
    if ctx_size is not None:
        if isinstance(ctx_size, bool) or not isinstance(ctx_size, int) or ctx_size < 1:
            raise CausalLMError(f"{flags.get('max_seq_len', 'ctx_size')} must be an integer "
                                f">= 1, got {ctx_size!r}")
        nntr["max_seq_len"] = ctx_size
        flags.setdefault("max_seq_len", "ctx_size")
    flags = {k: v for k, v in flags.items() if k in nntr}  # what was given only
    if threads is not None:
        if not (isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1):
            raise CausalLMError(f"threads must be an integer >= 1, got {threads!r}")
        set_num_threads(threads)
    if isinstance(plugins, (str, os.PathLike)):  # one file
        plugins = [plugins]
    for plugin in plugins:
        loadPlugin(os.fspath(plugin))
    model = Factory.Instance().createFromFolder(path, flags=flags, **nntr)
    give_options(model, generation)
    model.precision.setWeightFormat(dtype.upper() if isinstance(dtype, str) else dtype)
    model.precision.setKVCacheDtype(kv_dtype.upper() if isinstance(kv_dtype, str) else kv_dtype)
    return model


def give_options(model, options) -> None:
    """Give ``model`` (made by ``create``) its settings with generation ``options`` (checked
    already: causallm/generation/options.py, ``Options``) over them: load()'s options, the
    CLI's flags. A model that does not generate takes none: an error naming them, if any."""
    from causallm.models.language_model import LanguageModel

    if isinstance(model, LanguageModel):
        model.setGenerationSettings(model.generation.withOptions(options, model.tokenizer))
    else:
        model.setGenerationOptions(**options)


def load(path: str, **options) -> "LoadedModel":
    """``create(path, **options)``, initialized and with its weights loaded: generation
    options given here are the defaults of its every call."""
    model = create(path, **options)
    model.initialize()
    model.load_weight()
    return LoadedModel(model, model_path(path))


def batches(model) -> bool:
    """Whether ``model`` (made by ``create``, initialized or not) can decode several requests
    together: a decoder-only language model of text, one row and one beam a prompt."""
    from causallm.models.causal_lm import CausalLM

    return (isinstance(model, CausalLM) and model.TEXT_STAGE is None
            and type(model).stageInputs is CausalLM.stageInputs
            and model.BATCH_SIZE == 1 and model.rowsPerPrompt() == 1)


@dataclass
class Completion:
    """One generation: its text, OpenAI's finish reason ("stop" or "length") and token counts
    (the prompt's, and the new tokens, an EOS included; ``cached_tokens``: the prompt's that a
    slot held already); ``result`` is the generator's result or the scheduler's Request."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    result: object
    cached_tokens: int = 0


def completion_of(request) -> Completion:
    """The Completion of a scheduler Request that has finished."""
    return Completion(text=request.text, finish_reason=FINISH_REASONS.get(
        request.finish_reason, request.finish_reason), prompt_tokens=len(request.prompt),
        completion_tokens=len(request.generated), result=request,
        cached_tokens=request.cached)


class Stopped(Exception):
    """Raised between tokens when a caller's ``should_stop`` says so; ends the generation."""


class _Pieces:
    """A text stream for the generator: each piece it writes goes to ``on_text``."""

    def __init__(self, on_text: Callable[[str], None]) -> None:
        self.on_text = on_text

    def write(self, text: str) -> None:
        if text:
            self.on_text(text)

    def flush(self) -> None:
        pass


class LoadedModel:
    """A loaded model (``model``: the architecture's class, initialized, weights in) and what
    to do with it: ``generate`` / ``stream`` / ``complete`` for a language model, ``embed`` for
    an embedding model."""

    def __init__(self, model, path: str) -> None:
        from causallm.models.language_model import LanguageModel
        from causallm.models.transformer import ModelType

        self.model = model
        self.path = path
        self.architecture = model.architecture
        self.generates = isinstance(model, LanguageModel)
        self.embeds = model.MODEL_TYPE == ModelType.EMBEDDING
        self.lock = threading.Lock()
        self._template = None
        self._scheduler = None
        self.no_template_hint = "pass a prompt string"  # what to do instead (the server's own)

    @property
    def context_length(self) -> int | None:
        """Positions of the KV cache a generation can use (prompt and new tokens together) for
        a decoder-only model; the decoder's positions for an encoder-decoder."""
        return self.model.MAX_SEQ_LEN if self.generates else None

    @property
    def prompt_limit(self) -> int | None:
        """The most tokens a prompt may have: what the encoder takes in its one step (an
        encoder-decoder: init_seq_len, and its learned positions), else the positions of the KV
        cache (``context_length``)."""
        from causallm.models.encoder_decoder import EncoderDecoder

        model = self.model
        if isinstance(model, EncoderDecoder):
            return min(n for n in (model.INIT_SEQ_LEN, model.MAX_POSITIONS) if n)
        return self.context_length

    # -- prompts ----------------------------------------------------------------------------
    def chat_template(self):
        """The folder's chat template (causallm.chat.ChatTemplate); an error when it has none."""
        if self._template is None:
            from causallm.chat import ChatTemplate

            from causallm.io.config import gguf_in_folder, is_gguf

            self._template = ChatTemplate.fromFolder(self.path)
            if self._template is None:
                gguf = is_gguf(self.path) or (os.path.isdir(self.path)
                                              and gguf_in_folder(self.path) is not None)
                where = ("no tokenizer.chat_template in the GGUF's metadata" if gguf else
                         "no chat_template.jinja, nor 'chat_template' in tokenizer_config.json")
                raise CausalLMError(f"{self.path}: the model has no chat template ({where}); "
                                    f"{self.no_template_hint}")
        return self._template

    def encode(self, prompt, tools: list | None = None, reply_prefix: str = "",
               images: int | None = None) -> list[int]:
        """The token ids generation starts from: a string as the CLI encodes a prompt (the
        model's ``tokenize``), a list of {"role", "content"} messages rendered by the chat
        template and encoded without adding special tokens again (as transformers), or a
        list of token ids as given. A vision model writes out the placeholders of ``images``
        images (default: the images set on the model); given, the model is not read, so a
        prompt can be measured while another generates."""
        model = self.model
        if images is None:
            images = len(getattr(model, "images", None) or [])
        elif isinstance(prompt, str):  # the model's tokenize without its images
            if images:
                prompt = model.processor.expandPrompt(prompt, images)
            return model.tokenizer.Encode(prompt, add_special_tokens=True)
        if isinstance(prompt, str):
            return list(model.tokenize(prompt)[0])
        if isinstance(prompt, (list, tuple)) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            vocab = model.NUM_VOCAB
            if any(not 0 <= t < vocab for t in prompt):
                raise CausalLMError(f"prompt token ids must be in [0, {vocab})")
            return list(prompt)
        if isinstance(prompt, (list, tuple)) and prompt and all(
                isinstance(m, dict) for m in prompt):
            check_messages(prompt)
            text = self.chat_template().render(list(prompt), add_generation_prompt=True,
                                               tools=tools) + reply_prefix
            if images:  # a vision model's image placeholders, written out as its tokens
                text = model.processor.expandPrompt(text, images)
            return model.tokenizer.Encode(text, add_special_tokens=False)
        raise CausalLMError("the prompt must be a string, a non-empty list of "
                            "{\"role\", \"content\"} messages or a non-empty list of token ids")

    # -- generation -------------------------------------------------------------------------
    def _settings(self, options: dict, what: str, settings=None):
        """The settings of a call: its generation options (causallm/generation/options.py,
        checked here as keywords) over ``settings`` (default the model's: the configs' and
        load()'s), a copy (GenerationSettings.withOptions: the model is not changed). A
        ``max_new_tokens`` beyond the context is an error; None is the model's
        num_to_generate. ``what`` names the call in errors."""
        from causallm.generation.options import Options

        if not self.generates:
            raise CausalLMError(f"{self.architecture} does not generate text (it is an "
                                f"embedding model: use embed)")
        options = Options.check(options, what=what)
        for text in options.get("stop") or ():  # a lone surrogate could never match the text
            unicode(text, "stop")
        max_new_tokens = options.get("max_new_tokens")
        context = self.context_length
        if max_new_tokens is not None and context is not None and max_new_tokens > context:
            raise CausalLMError(f"max_new_tokens {max_new_tokens} is more than the context: "
                                f"{context} positions, shared by the prompt and the new "
                                f"tokens; load the model with a larger ctx_size")
        model = self.model
        return (model.generation if settings is None else settings).withOptions(
            options, model.tokenizer)

    def _encode_turn(self, prompt, settings, tools: list | None = None,
                     reply_prefix: str = ""):
        """(``encode``'s ids, ``settings``); a chat reply also ends at the template's end-of-turn
        token (<|im_end|> ...), added to the settings' EOS ids (hold ``lock``)."""
        ids = self.encode(prompt, tools, reply_prefix)
        if isinstance(prompt, (list, tuple)) and isinstance(prompt[0], dict):
            settings = settings.withEosTokenIds(
                self.chat_template().endOfTurnIds(self.model.tokenizer))
        return ids, settings

    def complete(self, prompt, max_new_tokens: int | None = None,
                 temperature: float | None = None, top_p: float | None = None,
                 top_k: int | None = None, seed: int | None = None,
                 stop: str | list[str] | None = None, greedy: bool = False,
                 repetition_penalty: float | None = None, images=None,
                 on_text: Callable[[str], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, tools: list | None = None,
                 reply_prefix: str = "", settings=None, **options) -> Completion:
        """Generate from ``prompt`` (see ``encode``) up to ``max_new_tokens`` (default:
        nntr_config num_to_generate). ``temperature`` / ``top_p`` / ``top_k`` switch sampling
        on (temperature 0 is greedy), ``greedy`` forces argmax; without them the configs decide
        (generation_config.json). ``stop`` (a string or strings) ends the text before the
        first one; ``options`` are further generation options (``min_p``,
        ``presence_penalty``, ...: causallm/generation/options.py; an unknown one is an error).
        Options not given keep load()'s, else the configs'. ``images`` (a vision model's: paths, Pillow
        images or pixel values) go with the prompt as the CLI's --image do (at its
        placeholders, or in front), for this call only. ``response_format`` (OpenAI's:
        ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"name",
        "schema", "strict"}}``) or ``json_schema`` (a JSON Schema dict), options too, hold the
        text to JSON that parses (and validates), needing the ``grammar`` extra
        (causallm/generation/constraint.py). ``on_text(piece)`` sees the text as it is decoded;
        ``should_stop()`` is asked before every token and ends the generation (raising
        ``Stopped``) when true. ``tools`` (JSON schemas) render with chat messages through the
        template, as transformers' ``tools=``; ``reply_prefix`` is text the reply starts with,
        after the rendered messages. ``settings`` (a GenerationSettings made from the model's,
        ``GenerationSettings.withOptions``: the server's request) stand in for the model's
        under the options."""
        options.update(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                       top_k=top_k, seed=seed, stop=stop, greedy=greedy,
                       repetition_penalty=repetition_penalty)
        with self.lock:
            settings = self._settings(options, "complete", settings)
            if should_stop is not None and should_stop():
                raise Stopped()
            model = self.model
            if self._scheduler is not None:
                self._scheduler.forget()  # this generation writes over slot 0's cache
            model.setImages(images or [])  # before encoding: placeholders expand to image tokens
            try:
                ids, settings = self._encode_turn(prompt, settings, tools, reply_prefix)

                def check(_row: int, _token: int) -> None:
                    if should_stop():
                        raise Stopped()

                result = model.generate_tokens(
                    [ids] * model.BATCH_SIZE,
                    on_token=check if should_stop is not None else None,
                    stream=_Pieces(on_text) if on_text is not None else None,
                    settings=settings)
            finally:
                model.setImages([])
        return Completion(text=result.texts[0], finish_reason=FINISH_REASONS[
            result.finish_reasons[0]], prompt_tokens=len(ids),
            completion_tokens=len(result.generated_ids[0]), result=result)

    @property
    def batches(self) -> bool:
        """Whether this model decodes several requests together (``scheduler``): a
        decoder-only language model of text (not an encoder-decoder, not a vision model)."""
        return batches(self.model)

    @property
    def scheduler(self):
        """The model's Scheduler (causallm/generation/scheduler.py), made at first use: it
        decodes as many requests together as the model has ``slots`` (load option; 1
        unless set)."""
        if self._scheduler is None:
            from causallm.generation.scheduler import Scheduler

            if not self.batches:
                raise CausalLMError(f"{self.architecture} does not decode several requests "
                                    f"together (a decoder-only text model of batch_size 1, "
                                    f"one beam, does)")
            self._scheduler = Scheduler(self.model)
        return self._scheduler

    def request(self, prompt, max_new_tokens: int | None = None,
                temperature: float | None = None, top_p: float | None = None,
                top_k: int | None = None, seed: int | None = None,
                stop: str | list[str] | None = None, greedy: bool = False,
                repetition_penalty: float | None = None,
                on_text: Callable[[str], None] | None = None, tools: list | None = None,
                logprobs: int | None = None, skip_special_tokens: bool = True,
                reply_prefix: str = "", settings=None, **options):
        """A ``Request`` for the scheduler: ``prompt`` and options as ``complete`` takes them
        (no images), its settings fixed now; ``logprobs`` k records each new token's
        log-probability and the k most likely (``Request.token_logprobs``);
        ``skip_special_tokens=False`` keeps special tokens in the text (a template's tool-call
        markers); ``reply_prefix`` is text the reply starts with, after chat messages' rendered
        prompt (a forced tool call's marker); ``settings`` as ``complete`` takes them."""
        from causallm.generation.scheduler import Request

        options.update(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                       top_k=top_k, seed=seed, stop=stop, greedy=greedy,
                       repetition_penalty=repetition_penalty)
        with self.lock:
            settings = self._settings(options, "request", settings)
            ids, settings = self._encode_turn(prompt, settings, tools, reply_prefix)
            model = self.model
            settings = model.generationSettings(settings)
            n = model.NUM_TO_GENERATE if settings.max_new_tokens is None else \
                settings.max_new_tokens
        return Request(ids, settings, n, model.tokenizer, on_text, logprobs=logprobs,
                       skip_special_tokens=skip_special_tokens)

    def complete_many(self, prompts: list, **options) -> list[Completion]:
        """``complete`` of each prompt, decoded together (as many at a time as the model has
        slots: ``causallm.load(path, slots=4)``); options as ``request``, the same for all."""
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise CausalLMError("complete_many takes a non-empty list of prompts")
        requests = [self.request(p, **options) for p in prompts]
        with self.lock:
            self.scheduler.generate(requests)
        return [completion_of(r) for r in requests]

    def generate(self, prompt, stream: bool = False, **options):
        """The generated text of ``prompt`` (a string, chat messages or token ids; the options
        as ``complete``); with ``stream=True`` an iterator over its pieces (``stream``)."""
        if not isinstance(stream, bool):
            raise CausalLMError(f"stream must be true or false, got {stream!r}")
        if stream:
            return self.stream(prompt, **options)
        return self.complete(prompt, **options).text

    def stream(self, prompt, **options) -> Iterator[str]:
        """The generated text of ``prompt`` piece by piece as the model produces it (options as
        ``complete``). The generation runs in a thread; closing the iterator early (``break``
        out of a for loop) stops it at the next token."""
        pieces: queue.Queue = queue.Queue()
        stopped = threading.Event()
        done = object()

        def work() -> None:
            try:
                self.complete(prompt, on_text=pieces.put, should_stop=stopped.is_set, **options)
                pieces.put(done)
            except Stopped:
                pieces.put(done)
            except BaseException as e:  # handed to the caller's thread
                pieces.put(e)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        try:
            while True:
                item = pieces.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stopped.set()
            thread.join()

    # -- embeddings -------------------------------------------------------------------------
    def embed_with_counts(self, texts: str | list[str]) -> tuple[np.ndarray, int]:
        """``embed`` and the number of tokens the texts encoded to."""
        if not self.embeds:
            raise CausalLMError(f"{self.architecture} is not an embedding model (it does not "
                                f"embed)")
        if isinstance(texts, str):
            texts = [texts]
        if not (isinstance(texts, (list, tuple)) and texts
                and all(isinstance(t, str) for t in texts)):
            raise CausalLMError("embed takes a string or a non-empty list of strings")
        rows, n = [], 0
        with self.lock:
            for text in texts:
                rows.append(np.array(self.model.encode(text)[0], dtype=np.float32))
                n += len(self.model.prompt_ids)
        return np.stack(rows), n

    def embed(self, texts: str | list[str]) -> np.ndarray:
        """The embedding of each text, ``(len(texts), D)`` float32 (a string: one row), each
        as ``SentenceTransformer.encode`` computes it (sentence-transformers' encode)."""
        return self.embed_with_counts(texts)[0]
