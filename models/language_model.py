"""LanguageModel: a Transformer with an LM head that generates text; the base of CausalLM and
EncoderDecoder.

It holds what ``CausalLM::setupParameters`` reads for generation (generation_config.json's
``eos_token_id``, ``bos_token_id``, ``do_sample``, ``top_k``, ``top_p``, ``temperature``,
``repetition_penalty``; nntr_config's ``bad_word_ids`` and ``lmhead_dtype``) under the C++ names,
the search and sampling keys transformers reads beyond those (``readSearchParameters``; a
generation_config.json key that is neither applied nor metadata gets one warning line on stderr
after the first generation), and the C++-named entry points, thin wrappers over the generator (causallm/generation/
generator.py), which owns token selection, stop rules, streaming and metrics:

- ``run(prompt, do_sample, system_prompt, tail_prompt, log_output)``: encode the text, generate,
  stream row 0's text to stdout and print the metrics block;
- ``generate_tokens(prompt_ids, max_new_tokens, do_sample, ...)``: the same on token ids.

A subclass gives the generator its ``start`` (prefill, or encode then start the decoder) and
``step``; ``tokenize(text, system_prompt, tail_prompt)`` (the prompt ids; CausalLM overrides it
for the system-prompt KV cache) and ``chatPrompt`` are the other hooks.
"""

from __future__ import annotations

import sys

from causallm.errors import CausalLMError
from causallm.generation.beam import BeamSearch
from causallm.generation.constraint import compile_json_schema, compile_response_format
from causallm.generation.generator import GenerationResult, Generator, PerformanceMetrics
from causallm.generation.options import check_all as check_options
from causallm.generation.options import check_config
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


OPTION_ATTRIBUTES = {
    "temperature": "TEMPERATURE", "top_k": "TOP_K", "top_p": "TOP_P", "min_p": "MIN_P",
    "typical_p": "TYPICAL_P", "repetition_penalty": "REPETITION_PENALTY",
    "presence_penalty": "PRESENCE_PENALTY", "frequency_penalty": "FREQUENCY_PENALTY",
    "no_repeat_ngram_size": "NO_REPEAT_NGRAM_SIZE", "min_new_tokens": "MIN_NEW_TOKENS",
    "seed": "SEED", "stop": "STOP_STRINGS", "num_beams": "NUM_BEAMS",
    "num_return_sequences": "NUM_RETURN_SEQUENCES", "bad_words_ids": "BAD_WORDS_IDS"}
"""The attribute each generation option (causallm/generation/options.py) sets on the model."""


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
        g = GENERATION_DEFAULTS
        self.DO_SAMPLE = generation_cfg.get_bool("do_sample", g["do_sample"])
        self.TOP_K = check_config(generation_cfg, "top_k", g["top_k"])
        self.TOP_P = float(check_config(generation_cfg, "top_p", g["top_p"]))
        self.TEMPERATURE = float(check_config(generation_cfg, "temperature", g["temperature"]))
        self.REPETITION_PENALTY = float(check_config(generation_cfg, "repetition_penalty",
                                                     g["repetition_penalty"]))
        self.SEED = None
        self.PRESENCE_PENALTY = 0.0   # OpenAI's / llama.cpp's, not generation_config keys
        self.FREQUENCY_PENALTY = 0.0
        self.RESPONSE_FORMAT = None   # a compiled response format (structured output), or None
        self.readSearchParameters(cfg, generation_cfg)
        # max_length (prompt and new tokens together; an encoder-decoder's decoder tokens, its
        # start token included) caps the new tokens as in transformers, where it binds: when
        # nothing sets their number (nntr_config num_to_generate, -n, generation_config's
        # max_new_tokens, a call's max_new_tokens), which transformers' max_new_tokens overrides
        self.MAX_LENGTH = None
        if generation_cfg.get("max_length") is not None and not (
                nntr_cfg.contains("num_to_generate") or generation_cfg.contains("max_new_tokens")):
            self.MAX_LENGTH = generation_cfg.get_int("max_length", minimum=1)
        self.config_warnings = unappliedKeyWarnings(generation_cfg)
        self.output_list = [""] * self.BATCH_SIZE
        self.performance_metrics = PerformanceMetrics()
        self.result = GenerationResult()

    def readSearchParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig) -> None:
        """The search keys transformers' generate() reads: from generation_config.json, or from
        config.json when the folder has no generation_config.json (GenerationConfig's
        from_model_config). Beyond the C++, which decodes one row greedily or by sampling."""
        src = generation_cfg if generation_cfg.exists else cfg
        self.NUM_BEAMS = check_config(src, "num_beams", 1)
        if self.NUM_BEAMS > self.NUM_VOCAB:
            raise src.error("num_beams", f"at most vocab_size ({self.NUM_VOCAB})")
        self.NUM_RETURN_SEQUENCES = check_config(src, "num_return_sequences", 1)
        self.LENGTH_PENALTY = src.get_float("length_penalty", 1.0)
        early = src.get("early_stopping", False)
        if early not in (True, False, "never"):
            raise src.error("early_stopping", "true, false or \"never\"")
        self.EARLY_STOPPING = early
        self.NO_REPEAT_NGRAM_SIZE = check_config(src, "no_repeat_ngram_size", 0)
        self.MIN_LENGTH = src.get_int("min_length", 0, minimum=0)
        self.MIN_NEW_TOKENS = check_config(src, "min_new_tokens", 0)
        forced_bos = src.get_int("forced_bos_token_id", -1, minimum=0) \
            if src.contains("forced_bos_token_id") else None
        self.FORCED_BOS_TOKEN_ID = forced_bos
        self.FORCED_EOS_TOKEN_ID = src.get_int_list("forced_eos_token_id", [])
        words = check_config(src, "bad_words_ids", [])
        if any(t >= self.NUM_VOCAB for w in words for t in w):
            raise src.error("bad_words_ids", f"a list of non-empty lists of token ids in "
                                             f"[0, {self.NUM_VOCAB})")
        self.BAD_WORDS_IDS = words
        self.RENORMALIZE_LOGITS = src.get_bool("renormalize_logits", False)
        self.MIN_P = float(check_config(src, "min_p", 0.0))
        self.TYPICAL_P = float(check_config(src, "typical_p", 1.0))
        self.STOP_STRINGS = check_config(src, "stop", [])
        for key, value in (("forced_bos_token_id", [forced_bos] if forced_bos is not None else []),
                           ("forced_eos_token_id", self.FORCED_EOS_TOKEN_ID)):
            if any(t >= self.NUM_VOCAB for t in value):
                raise src.error(key, f"a token id below vocab_size ({self.NUM_VOCAB})")

    # -- token selection --------------------------------------------------------------------
    def setGenerationOptions(self, **options) -> None:
        """Generation options (causallm/generation/options.py: their names, checks and the
        surfaces they come from) over the configs' values; None keeps the config's. A
        temperature, top-k, top-p, min-p or typical-p switches sampling on; ``greedy`` means
        one beam, argmax; temperature 0 is greedy (``samples``). ``bad_words_ids`` and ``stop``
        replace the generation_config ones. ``response_format`` (OpenAI's: ``{"type":
        "json_object"}``, ``{"type": "json_schema", "json_schema": {"name", "schema",
        "strict"}}`` or ``{"type": "text"}``) or ``json_schema`` (a JSON Schema object) holds
        the answer to JSON (causallm/generation/constraint.py), compiled here against the
        tokenizer so a bad one fails before anything runs; one beam only. The beams size the
        graph: set them before ``initialize()``. ``max_new_tokens`` is a generation's own
        argument (``generate_tokens``; ``num_to_generate`` sizes the KV cache)."""
        if "max_new_tokens" in options:
            raise CausalLMError("setGenerationOptions: max_new_tokens is generate_tokens' "
                                "argument (nntr_config num_to_generate sizes the KV cache)")
        options = check_options(options, what="setGenerationOptions")
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
        if response_format is not None:
            self.RESPONSE_FORMAT = compile_response_format(self.tokenizer, response_format)
        elif json_schema is not None:
            self.RESPONSE_FORMAT = compile_json_schema(self.tokenizer, json_schema)
        for name, value in options.items():
            setattr(self, OPTION_ATTRIBUTES[name], value)
        if any(k in options for k in ("temperature", "top_k", "top_p", "min_p", "typical_p")):
            self.DO_SAMPLE = True
        if greedy:
            self.DO_SAMPLE = False
            self.NUM_BEAMS = 1
            if "num_return_sequences" not in options:
                self.NUM_RETURN_SEQUENCES = 1
        if self.is_initialized and self.NUM_BEAMS != self.beams_built:
            raise CausalLMError(f"the model was initialized for {self.beams_built} beam(s), "
                                f"not {self.NUM_BEAMS}: set num_beams before initialize() "
                                f"(causallm.load(path, num_beams={self.NUM_BEAMS}))")
        if self.RESPONSE_FORMAT is not None and self.NUM_BEAMS > 1:
            raise CausalLMError(f"a response format (JSON schema or JSON object) holds one "
                                f"sequence to its grammar: it does not go with {self.NUM_BEAMS} "
                                f"beams (use num_beams 1)")
        if self.RESPONSE_FORMAT is not None and (self.FORCED_BOS_TOKEN_ID is not None
                                                 or self.FORCED_EOS_TOKEN_ID):
            raise CausalLMError("a response format (JSON schema or JSON object) does not go with "
                                "the generation config's forced_bos_token_id / "
                                "forced_eos_token_id: the tokens they force are not JSON")

    def rowsPerPrompt(self) -> int:
        """Decoder rows per prompt: one per beam."""
        return self.NUM_BEAMS

    def initialize(self) -> None:
        super().initialize()
        self.beams_built = self.NUM_BEAMS

    def generationSettings(self, do_sample: bool | None = None) -> GenerationSettings:
        """What ``generate_tokens`` asks the generator or the beam search for: the settings
        above; sampling only when ``do_sample`` (default DO_SAMPLE) and the temperature is not 0."""
        do_sample = self.samples(self.DO_SAMPLE if do_sample is None else do_sample)
        if do_sample and self.NUM_BEAMS > 1:
            raise CausalLMError(f"sampling with {self.NUM_BEAMS} beams (beam sampling) is not "
                                f"supported: sample with one beam (--num-beams 1) or search "
                                f"the beams without sampling")
        if self.NUM_RETURN_SEQUENCES > self.NUM_BEAMS:
            raise CausalLMError(f"num_return_sequences {self.NUM_RETURN_SEQUENCES} exceeds "
                                f"num_beams {self.NUM_BEAMS}")
        return GenerationSettings(
            do_sample=do_sample, temperature=self.TEMPERATURE, top_k=self.TOP_K,
            top_p=self.TOP_P, min_p=self.MIN_P, typical_p=self.TYPICAL_P,
            repetition_penalty=self.REPETITION_PENALTY,
            presence_penalty=self.PRESENCE_PENALTY, frequency_penalty=self.FREQUENCY_PENALTY,
            stop_strings=list(self.STOP_STRINGS),
            bad_words_ids=[[t] for t in self.BAD_WORD_IDS] + list(self.BAD_WORDS_IDS),
            no_repeat_ngram_size=self.NO_REPEAT_NGRAM_SIZE, min_length=self.MIN_LENGTH,
            min_new_tokens=self.MIN_NEW_TOKENS, forced_bos_token_id=self.FORCED_BOS_TOKEN_ID,
            forced_eos_token_id=list(self.FORCED_EOS_TOKEN_ID),
            eos_token_id=list(self.EOS_TOKEN_ID), num_beams=self.NUM_BEAMS,
            length_penalty=self.LENGTH_PENALTY, early_stopping=self.EARLY_STOPPING,
            num_return_sequences=self.NUM_RETURN_SEQUENCES,
            renormalize_logits=self.RENORMALIZE_LOGITS, seed=self.SEED,
            max_length=self.MAX_LENGTH, response_format=self.RESPONSE_FORMAT)

    def samples(self, do_sample: bool) -> bool:
        """Whether ``do_sample`` really samples: temperature 0 is greedy decoding (the limit of
        softmax(x / T) as T -> 0, and what ``--temp 0`` means), whatever ``do_sample`` says."""
        return bool(do_sample) and self.TEMPERATURE != 0.0

    # -- generation -------------------------------------------------------------------------
    def generate_tokens(self, prompt_ids: list[list[int]], max_new_tokens: int | None = None,
                        do_sample: bool | None = None, start_pos: int = 0, on_token=None,
                        context_ids: list[int] = (), stream=None,
                        images=None) -> GenerationResult:
        """Generate from ``prompt_ids`` (one equal-length list per batch row): up to
        ``max_new_tokens`` (default ``NUM_TO_GENERATE``) new tokens per row, a row stopping at
        an EOS id. ``start_pos`` and ``context_ids`` place the prompt after tokens already in
        the cache (a loaded system prompt, which the repetition penalty counts too);
        ``on_token(b, token_id)`` sees every new token; row 0's text streams to ``stream``.
        ``images`` (a vision model's: paths, Pillow images or pixel values) stand for the
        prompt's image tokens, for this generation only."""
        self.requireWeights("generate")
        settings = self.generationSettings(do_sample)
        if max_new_tokens is not None:  # the caller's number of new tokens: max_length yields
            settings.max_length = None
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
