"""LanguageModel: a Transformer with an LM head that generates text; the base of CausalLM and
EncoderDecoder.

It keeps what ``CausalLM::setupParameters`` reads for generation under the C++ names
(``EOS_TOKEN_ID``, ``BOS_TOKEN_ID``, nntr_config's ``BAD_WORD_IDS``; ``LMHEAD_DTYPE``) and is
given one frozen ``GenerationSettings``, ``generation``, the default of its every generation:
built from its configs (``GenerationSettings.fromConfigs``: causallm/generation/settings.py,
which builds and checks every generation's settings), then the CLI's flags or load()'s options
over them (``setGenerationSettings``, before ``initialize()``: the beams size the graph). The
C++-named attributes read the settings. A call's settings go with the call
(``generate_tokens(settings=)``). A generation_config.json key that is neither applied nor
metadata gets one warning line on stderr after the first generation. The C++-named entry points
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

from causallm.errors import CausalLMError
from causallm.generation.beam import BeamSearch
from causallm.generation.generator import GenerationResult, Generator, PerformanceMetrics
from causallm.generation.options import Options
from causallm.generation.settings import GenerationSettings, unappliedKeyWarnings
from causallm.io.config import JsonConfig
from causallm.io.weights import HEAD
from causallm.models.transformer import Transformer

GENERATION_KEYS = ("eos_token_id", "bos_token_id", "decoder_start_token_id", "pad_token_id",
                   "forced_bos_token_id", "forced_eos_token_id", "num_beams",
                   "num_return_sequences", "length_penalty", "early_stopping",
                   "no_repeat_ngram_size", "min_length", "min_new_tokens", "bad_words_ids",
                   "renormalize_logits")
"""config.json keys a family's key converter (t5BaseConfig, bartBaseConfig, ...) passes on: what
transformers reads for generation when a folder has no generation_config.json."""


class LanguageModel(Transformer):
    """Generation settings and entry points shared by every model that generates."""

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.LMHEAD_DTYPE = self.precision.dtype(HEAD)  # lmhead_dtype, else embedding_dtype
        bos = (generation_cfg.get_int_list("bos_token_id", [])
               or cfg.get_int_list("bos_token_id", []))
        self.BOS_TOKEN_ID = bos[0] if bos else None
        self.generation = GenerationSettings.fromConfigs(cfg, generation_cfg, nntr_cfg,
                                                         self.NUM_VOCAB)
        self.config_warnings = unappliedKeyWarnings(generation_cfg)
        self.output_list = [""] * self.BATCH_SIZE
        self.performance_metrics = PerformanceMetrics()
        self.result = GenerationResult()

    @property
    def EOS_TOKEN_ID(self) -> list[int]:
        """The ids that end a row: the settings' (generation_config.json's, else
        config.json's)."""
        return self.generation.eos_token_id

    @property
    def BAD_WORD_IDS(self) -> list[int]:
        """nntr_config's bad_word_ids: the settings' ``banned_token_ids``."""
        return self.generation.banned_token_ids

    @property
    def NUM_BEAMS(self) -> int:
        """The beams of the model's settings, which the graph is built for."""
        return self.generation.num_beams

    def setGenerationSettings(self, settings: GenerationSettings) -> None:
        """Give the model its generation settings, the default of its every generation
        (causallm/generation/settings.py builds them: the configs', then the CLI's flags or
        load()'s options). The beams size the graph: give them before ``initialize()``."""
        self.checkBeams(settings)
        self.generation = settings

    def setGenerationOptions(self, **options) -> None:
        """``setGenerationSettings`` of the model's settings with generation ``options`` over
        them (causallm/generation/options.py, checked as keywords). The number of new tokens
        is nntr_config num_to_generate's (a call's own: ``generate_tokens``)."""
        if "max_new_tokens" in options:
            raise CausalLMError("setGenerationOptions: max_new_tokens is generate_tokens' "
                                "argument (nntr_config num_to_generate is the default)")
        self.setGenerationSettings(self.generation.withOptions(
            Options.check(options, what="setGenerationOptions"), self.tokenizer))

    def checkBeams(self, settings: GenerationSettings) -> None:
        """An error unless the graph, once built, has the rows of ``settings``' beams."""
        if self.is_initialized and settings.num_beams != self.NUM_BEAMS:
            raise CausalLMError(f"the model was initialized for {self.NUM_BEAMS} beam(s), "
                                f"not {settings.num_beams}: set num_beams before initialize() "
                                f"(causallm.load(path, num_beams={settings.num_beams}))")

    def rowsPerPrompt(self) -> int:
        """Decoder rows per prompt: one per beam."""
        return self.NUM_BEAMS

    def generationSettings(self, settings: GenerationSettings | None = None,
                           do_sample: bool | None = None) -> GenerationSettings:
        """What a generation runs: ``settings`` (default the model's) resolved
        (``GenerationSettings.resolved``: sampling only when ``do_sample``, default theirs, and
        the temperature is not 0), on the beams the graph was built for."""
        s = (self.generation if settings is None else settings).resolved(do_sample)
        self.checkBeams(s)
        return s

    # -- generation -------------------------------------------------------------------------
    def generate_tokens(self, prompt_ids: list[list[int]], max_new_tokens: int | None = None,
                        do_sample: bool | None = None, start_pos: int = 0, on_token=None,
                        context_ids: list[int] = (), stream=None,
                        images=None, settings: GenerationSettings | None = None
                        ) -> GenerationResult:
        """Generate from ``prompt_ids`` (one equal-length list per batch row): up to
        ``max_new_tokens`` (default the settings', else ``NUM_TO_GENERATE``) new tokens per
        row, a row stopping at an EOS id. ``start_pos`` and ``context_ids`` place the prompt after tokens already in
        the cache (a loaded system prompt, which the repetition penalty counts too);
        ``on_token(b, token_id)`` sees every new token; row 0's text streams to ``stream``.
        ``images`` (a vision model's: paths, Pillow images or pixel values) stand for the
        prompt's image tokens, for this generation only. ``settings`` (a copy of the model's
        with a call's options: ``GenerationSettings.withOptions``) are this generation's,
        default the model's own."""
        self.requireWeights("generate")
        settings = self.generationSettings(settings, do_sample)
        if max_new_tokens is not None:
            settings = settings.withOptions(Options(max_new_tokens=max_new_tokens))
        n = self.NUM_TO_GENERATE if settings.max_new_tokens is None else settings.max_new_tokens
        search = BeamSearch if settings.num_beams > 1 else Generator
        if images is not None:
            self.setImages(images)
        try:
            result = search(self, settings, self.tokenizer, stream).generate(
                prompt_ids, n, start_pos, context_ids, on_token)
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
