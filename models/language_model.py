"""LanguageModel: a Transformer with an LM head that generates text; the base of CausalLM and
EncoderDecoder.

It reads what ``CausalLM::setupParameters`` reads for generation: the token ids under the C++
names (``EOS_TOKEN_ID``, ``BOS_TOKEN_ID``, nntr_config's ``BAD_WORD_IDS``; ``LMHEAD_DTYPE``), and
the sampling and search keys of generation_config.json, the C++'s and those transformers reads
beyond them, into one frozen ``GenerationSettings``, ``generation`` (``readGenerationConfig``; a
generation_config.json key that is neither applied nor metadata gets one warning line on stderr
after the first generation). A call's options make a copy (``withOptions``); the CLI's flags and
load()'s options replace the model's own (``setGenerationOptions``). The C++-named entry points
are thin wrappers over the generator (causallm/generation/generator.py), which owns token
selection, stop rules, streaming and metrics:

- ``run(prompt, do_sample, system_prompt, tail_prompt, log_output)``: encode the text, generate,
  stream row 0's text to stdout and print the metrics block;
- ``generate_tokens(prompt_ids, max_new_tokens, do_sample, ...)``: the same on token ids.

A subclass gives the generator its ``start`` (prefill, or encode then start the decoder) and
``step``; ``tokenize(text, system_prompt, tail_prompt)`` (the prompt ids; CausalLM overrides it
for the system-prompt KV cache) and ``chatPrompt`` are the other hooks.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from causallm.errors import CausalLMError
from causallm.generation.beam import BeamSearch
from causallm.generation.constraint import compile_json_schema, compile_response_format
from causallm.generation.generator import GenerationResult, Generator, PerformanceMetrics
from causallm.generation.options import check_all as check_options
from causallm.generation.options import CONFIG_KEYS, check_config
from causallm.generation.processors import GenerationSettings
from causallm.io.config import GENERATION_DEFAULTS, JsonConfig
from causallm.io.weights import HEAD
from causallm.models.transformer import Transformer

GENERATION_KEYS = ("eos_token_id", "bos_token_id", "decoder_start_token_id", "pad_token_id",
                   "forced_bos_token_id", "forced_eos_token_id", "num_beams",
                   "num_return_sequences", "length_penalty", "early_stopping",
                   "no_repeat_ngram_size", "min_length", "min_new_tokens", "bad_words_ids",
                   "renormalize_logits")
"""config.json keys a family's key converter (t5BaseConfig, bartBaseConfig, ...) passes on: what
transformers reads for generation when a folder has no generation_config.json."""

APPLIED_GENERATION_KEYS = frozenset((
    "eos_token_id", "bos_token_id", "decoder_start_token_id", "do_sample", "temperature",
    "top_k", "top_p", "min_p", "typical_p", "repetition_penalty", "num_beams",
    "num_return_sequences", "length_penalty", "early_stopping", "no_repeat_ngram_size",
    "min_length", "min_new_tokens", "forced_bos_token_id", "forced_eos_token_id",
    "bad_words_ids", "renormalize_logits", "stop_strings", "max_new_tokens", "max_length"))
"""The generation_config.json keys generation applies (the one list: docs/cli.md shows it)."""

METADATA_GENERATION_KEYS = frozenset((
    "transformers_version", "_from_model_config", "pad_token_id", "use_cache",
    "cache_implementation", "return_dict_in_generate", "output_scores", "output_logits",
    "output_attentions", "output_hidden_states"))
"""generation_config.json keys that do not change the tokens chosen: no warning."""


def unappliedKeyWarnings(generation_cfg: JsonConfig) -> list[str]:
    """One warning line per generation_config.json key that is neither applied nor metadata."""
    return [f"warning: {generation_cfg.name}: '{key}' is not applied\n" for key in generation_cfg
            if key not in APPLIED_GENERATION_KEYS and key not in METADATA_GENERATION_KEYS]


class LanguageModel(Transformer):
    """Generation settings and entry points shared by every model that generates."""

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.BAD_WORD_IDS = nntr_cfg.get_int_list("bad_word_ids", [])
        if any(not 0 <= t < self.NUM_VOCAB for t in self.BAD_WORD_IDS):
            raise nntr_cfg.error("bad_word_ids", f"token ids in [0, {self.NUM_VOCAB})")
        self.LMHEAD_DTYPE = self.precision.dtype(HEAD)  # lmhead_dtype, else embedding_dtype

        if generation_cfg.contains("eos_token_id") and generation_cfg["eos_token_id"] != []:
            self.EOS_TOKEN_ID = generation_cfg.get_int_list("eos_token_id")
        else:
            self.EOS_TOKEN_ID = cfg.get_int_list("eos_token_id", [])
        bos = (generation_cfg.get_int_list("bos_token_id", [])
               or cfg.get_int_list("bos_token_id", []))
        self.BOS_TOKEN_ID = bos[0] if bos else None
        self.generation = self.readGenerationConfig(cfg, generation_cfg, nntr_cfg)
        self.NUM_BEAMS = self.generation.num_beams  # the beams the graph is built for
        self.config_warnings = unappliedKeyWarnings(generation_cfg)
        self.output_list = [""] * self.BATCH_SIZE
        self.performance_metrics = PerformanceMetrics()
        self.result = GenerationResult()

    def readGenerationConfig(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                             nntr_cfg: JsonConfig) -> GenerationSettings:
        """The settings of a generation that sets nothing: CausalLM::setupParameters' sampling
        keys from generation_config.json (NNTrainer's defaults for the missing ones), and the
        search keys transformers' generate() reads, from generation_config.json or from
        config.json when the folder has none (GenerationConfig's from_model_config): beyond
        the C++, which decodes one row greedily or by sampling. Each value is checked by its
        option's rule (causallm/generation/options.py), a bad one naming the file and key."""
        g = GENERATION_DEFAULTS
        src = generation_cfg if generation_cfg.exists else cfg
        num_beams = check_config(src, "num_beams", 1)
        if num_beams > self.NUM_VOCAB:
            raise src.error("num_beams", f"at most vocab_size ({self.NUM_VOCAB})")
        early = src.get("early_stopping", False)
        if early not in (True, False, "never"):
            raise src.error("early_stopping", "true, false or \"never\"")
        forced_bos = src.get_int("forced_bos_token_id", -1, minimum=0) \
            if src.contains("forced_bos_token_id") else None
        forced_eos = src.get_int_list("forced_eos_token_id", [])
        for key, value in (("forced_bos_token_id", [forced_bos] if forced_bos is not None else []),
                           ("forced_eos_token_id", forced_eos)):
            if any(t >= self.NUM_VOCAB for t in value):
                raise src.error(key, f"a token id below vocab_size ({self.NUM_VOCAB})")
        words = check_config(src, "bad_words_ids", [])
        if any(t >= self.NUM_VOCAB for w in words for t in w):
            raise src.error("bad_words_ids", f"a list of non-empty lists of token ids in "
                                             f"[0, {self.NUM_VOCAB})")
        # max_length (prompt and new tokens together; an encoder-decoder's decoder tokens, its
        # start token included) caps the new tokens as in transformers, where it binds: when
        # nothing sets their number (nntr_config num_to_generate, -n, generation_config's
        # max_new_tokens, a call's max_new_tokens), which transformers' max_new_tokens overrides
        max_length = None
        if generation_cfg.get("max_length") is not None and not (
                nntr_cfg.contains("num_to_generate") or generation_cfg.contains("max_new_tokens")):
            max_length = generation_cfg.get_int("max_length", minimum=1)
        return GenerationSettings(
            do_sample=generation_cfg.get_bool("do_sample", g["do_sample"]),
            temperature=float(check_config(generation_cfg, "temperature", g["temperature"])),
            top_k=check_config(generation_cfg, "top_k", g["top_k"]),
            top_p=float(check_config(generation_cfg, "top_p", g["top_p"])),
            min_p=float(check_config(src, "min_p", 0.0)),
            typical_p=float(check_config(src, "typical_p", 1.0)),
            repetition_penalty=float(check_config(generation_cfg, "repetition_penalty",
                                                  g["repetition_penalty"])),
            stop_strings=check_config(src, "stop", []), bad_words_ids=words,
            no_repeat_ngram_size=check_config(src, "no_repeat_ngram_size", 0),
            min_length=src.get_int("min_length", 0, minimum=0),
            min_new_tokens=check_config(src, "min_new_tokens", 0),
            forced_bos_token_id=forced_bos, forced_eos_token_id=forced_eos,
            eos_token_id=list(self.EOS_TOKEN_ID), num_beams=num_beams,
            length_penalty=src.get_float("length_penalty", 1.0), early_stopping=early,
            num_return_sequences=check_config(src, "num_return_sequences", 1),
            renormalize_logits=src.get_bool("renormalize_logits", False),
            max_length=max_length)

    # -- token selection --------------------------------------------------------------------
    def withOptions(self, settings: GenerationSettings, what: str = "setGenerationOptions",
                    **options) -> GenerationSettings:
        """``settings`` with generation options over them (causallm/generation/options.py:
        their names, checks and the surfaces they come from; None keeps the value), a copy:
        nothing of the model changes. A temperature, top-k, top-p, min-p or typical-p switches
        sampling on; ``greedy`` means one beam, argmax; temperature 0 is greedy. ``bad_words_ids``
        and ``stop`` replace the configs' ones. ``response_format`` (OpenAI's: ``{"type":
        "json_object"}``, ``{"type": "json_schema", "json_schema": {"name", "schema",
        "strict"}}`` or ``{"type": "text"}``) or ``json_schema`` (a JSON Schema object) holds
        the answer to JSON (causallm/generation/constraint.py), compiled here against the
        tokenizer so a bad one fails before anything runs; one beam only. ``max_new_tokens``
        is a generation's own argument (``generate_tokens``). ``what`` names the caller in
        errors."""
        if "max_new_tokens" in options:
            raise CausalLMError(f"{what}: max_new_tokens is generate_tokens' argument "
                                f"(nntr_config num_to_generate is the default)")
        options = check_options(options, what=what)
        bad_words_ids = options.get("bad_words_ids")
        if bad_words_ids is not None and any(t >= self.NUM_VOCAB for w in bad_words_ids
                                             for t in w):
            raise CausalLMError(f"bad_words_ids must be token ids below the vocabulary size "
                                f"({self.NUM_VOCAB})")
        response_format = options.pop("response_format", None)
        json_schema = options.pop("json_schema", None)
        greedy = options.pop("greedy", False)
        num_beams = options.get("num_beams")
        if num_beams is not None and num_beams > self.NUM_VOCAB:
            raise CausalLMError(f"num_beams must be at most the vocabulary size "
                                f"({self.NUM_VOCAB}), got {num_beams}")
        if response_format is not None and json_schema is not None:
            raise CausalLMError("give response_format or json_schema, not both")
        changes = {CONFIG_KEYS.get(name, name): value for name, value in options.items()}
        if response_format is not None:
            changes["response_format"] = compile_response_format(self.tokenizer,
                                                                 response_format)
        elif json_schema is not None:
            changes["response_format"] = compile_json_schema(self.tokenizer, json_schema)
        if any(k in options for k in ("temperature", "top_k", "top_p", "min_p", "typical_p")):
            changes["do_sample"] = True
        if greedy:
            changes.update(do_sample=False, num_beams=1)
            changes.setdefault("num_return_sequences", 1)
        s = replace(settings, **changes)
        if self.is_initialized and s.num_beams != self.beams_built:
            raise CausalLMError(f"the model was initialized for {self.beams_built} beam(s), "
                                f"not {s.num_beams}: set num_beams before initialize() "
                                f"(causallm.load(path, num_beams={s.num_beams}))")
        if s.response_format is not None and s.num_beams > 1:
            raise CausalLMError(f"a response format (JSON schema or JSON object) holds one "
                                f"sequence to its grammar: it does not go with {s.num_beams} "
                                f"beams (use num_beams 1)")
        if s.response_format is not None and (s.forced_bos_token_id is not None
                                              or s.forced_eos_token_id):
            raise CausalLMError("a response format (JSON schema or JSON object) does not go with "
                                "the generation config's forced_bos_token_id / "
                                "forced_eos_token_id: the tokens they force are not JSON")
        return s

    def setGenerationOptions(self, **options) -> None:
        """Generation options (``withOptions``) over the model's own settings, the default of
        its every generation: what the CLI's flags and ``causallm.load``'s options do. The
        beams size the graph: set them before ``initialize()``."""
        self.generation = self.withOptions(self.generation, **options)
        self.NUM_BEAMS = self.generation.num_beams

    def rowsPerPrompt(self) -> int:
        """Decoder rows per prompt: one per beam."""
        return self.NUM_BEAMS

    def initialize(self) -> None:
        super().initialize()
        self.beams_built = self.NUM_BEAMS

    def generationSettings(self, settings: GenerationSettings | None = None,
                           do_sample: bool | None = None) -> GenerationSettings:
        """What a generation asks the generator or the beam search for: ``settings`` (default
        the model's) with nntr_config's bad_word_ids among the bad words, sampling only when
        ``do_sample`` (default the settings') and the temperature is not 0 (the limit of
        softmax(x / T) as T -> 0, and what ``--temp 0`` means)."""
        s = self.generation if settings is None else settings
        do_sample = bool(s.do_sample if do_sample is None else do_sample) and s.temperature != 0
        if do_sample and s.num_beams > 1:
            raise CausalLMError(f"sampling with {s.num_beams} beams (beam sampling) is not "
                                f"supported: sample with one beam (--num-beams 1) or search "
                                f"the beams without sampling")
        if s.num_return_sequences > s.num_beams:
            raise CausalLMError(f"num_return_sequences {s.num_return_sequences} exceeds "
                                f"num_beams {s.num_beams}")
        return replace(s, do_sample=do_sample, bad_words_ids=[[t] for t in self.BAD_WORD_IDS]
                       + list(s.bad_words_ids))

    # -- generation -------------------------------------------------------------------------
    def generate_tokens(self, prompt_ids: list[list[int]], max_new_tokens: int | None = None,
                        do_sample: bool | None = None, start_pos: int = 0, on_token=None,
                        context_ids: list[int] = (), stream=None,
                        images=None, settings: GenerationSettings | None = None
                        ) -> GenerationResult:
        """Generate from ``prompt_ids`` (one equal-length list per batch row): up to
        ``max_new_tokens`` (default ``NUM_TO_GENERATE``) new tokens per row, a row stopping at
        an EOS id. ``start_pos`` and ``context_ids`` place the prompt after tokens already in
        the cache (a loaded system prompt, which the repetition penalty counts too);
        ``on_token(b, token_id)`` sees every new token; row 0's text streams to ``stream``.
        ``images`` (a vision model's: paths, Pillow images or pixel values) stand for the
        prompt's image tokens, for this generation only. ``settings`` (``withOptions``) are
        this generation's, default the model's own."""
        self.requireWeights("generate")
        settings = self.generationSettings(settings, do_sample)
        if max_new_tokens is not None:  # the caller's number of new tokens: max_length yields
            settings = replace(settings, max_length=None)
        search = BeamSearch if settings.num_beams > 1 else Generator
        if images is not None:
            self.setImages(images)
        try:
            result = search(self, settings, self.tokenizer, stream).generate(
                prompt_ids, self.NUM_TO_GENERATE if max_new_tokens is None else max_new_tokens,
                start_pos, context_ids, on_token)
        finally:
            if images is not None:
                self.setImages([])
        self.performance_metrics = result.metrics
        self.result = result
        self.output_list = list(result.texts)
        for line in self.config_warnings:  # once, after the first generation: a run that
            sys.stderr.write(line)         # fails shows its error line alone
        self.config_warnings = []
        return result

    def tokenize(self, prompt: str, system_prompt: str = "", tail_prompt: str = "",
                 add_special_tokens: bool = True) -> tuple[list[int], int, list[int]]:
        """(prompt ids, start position, ids already in the cache) for ``run``: the encoding of
        ``system_prompt + prompt + tail_prompt`` at position 0 (with the special tokens the
        tokenizer adds unless ``add_special_tokens`` is false: a rendered chat has its own)."""
        return self.tokenizer.Encode(system_prompt + prompt + tail_prompt,
                                     add_special_tokens=add_special_tokens), 0, []

    def addEosTokenIds(self, ids) -> None:
        """Also stop a row at each of ``ids`` (a chat template's end-of-turn tokens)."""
        self.EOS_TOKEN_ID = list(dict.fromkeys([*self.EOS_TOKEN_ID, *map(int, ids)]))
        self.generation = replace(self.generation, eos_token_id=list(self.EOS_TOKEN_ID))

    def run(self, prompt: str, do_sample: bool | None = None, system_prompt: str = "",
            tail_prompt: str = "", log_output: bool = True, out=None,
            images=None, add_special_tokens: bool = True) -> GenerationResult:
        """Encode ``system_prompt + prompt + tail_prompt``, generate and, with ``log_output``,
        stream row 0's text to ``out`` (stdout), end it with a newline and print the metrics
        block to stderr.
        ``images`` (a vision model's; default: those setImages gave) go with the prompt (its
        image placeholders, or in front); they are used once. A prompt a chat template
        rendered is encoded with ``add_special_tokens=False``."""
        self.requireWeights("run")
        if images is not None:
            self.setImages(images)
        try:
            ids, start_pos, context = self.tokenize(prompt, system_prompt, tail_prompt,
                                                    add_special_tokens)
            result = self.generate_tokens([ids] * self.BATCH_SIZE, do_sample=do_sample,
                                          start_pos=start_pos, context_ids=context,
                                          stream=(out or sys.stdout) if log_output else None)
        finally:
            self.setImages([])
        if log_output:
            (out or sys.stdout).write("\n")
            (out or sys.stdout).flush()
            self.printMetrics(sys.stderr)
        return result

    def printMetrics(self, stream=None) -> None:
        self.performance_metrics.print(stream or sys.stderr)
