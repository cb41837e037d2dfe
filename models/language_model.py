"""LanguageModel: a Transformer with an LM head that generates text; the base of CausalLM and
EncoderDecoder.

It holds what ``CausalLM::setupParameters`` reads for generation (generation_config.json's
``eos_token_id``, ``bos_token_id``, ``do_sample``, ``top_k``, ``top_p``, ``temperature``,
``repetition_penalty``; nntr_config's ``bad_word_ids`` and ``lmhead_dtype``) under the C++ names,
and the C++-named entry points, thin wrappers over the generator (causallm/generation/
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
from causallm.generation.generator import GenerationResult, Generator, PerformanceMetrics
from causallm.generation.sampler import Sampler
from causallm.io.config import GENERATION_DEFAULTS, JsonConfig
from models.transformer import Transformer


class LanguageModel(Transformer):
    """Generation settings and entry points shared by every model that generates."""

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.BAD_WORD_IDS = nntr_cfg.get_int_list("bad_word_ids", [])
        if any(not 0 <= t < self.NUM_VOCAB for t in self.BAD_WORD_IDS):
            raise nntr_cfg.error("bad_word_ids", f"token ids in [0, {self.NUM_VOCAB})")
        self.LMHEAD_DTYPE = nntr_cfg.get_str("lmhead_dtype", self.EMBEDDING_DTYPE)

        if generation_cfg.contains("eos_token_id") and generation_cfg["eos_token_id"] != []:
            self.EOS_TOKEN_ID = generation_cfg.get_int_list("eos_token_id")
        else:
            self.EOS_TOKEN_ID = cfg.get_int_list("eos_token_id", [])
        bos = (generation_cfg.get_int_list("bos_token_id", [])
               or cfg.get_int_list("bos_token_id", []))
        self.BOS_TOKEN_ID = bos[0] if bos else None
        g = GENERATION_DEFAULTS
        self.DO_SAMPLE = generation_cfg.get_bool("do_sample", g["do_sample"])
        self.TOP_K = generation_cfg.get_int("top_k", g["top_k"], minimum=0)
        self.TOP_P = generation_cfg.get_float("top_p", g["top_p"])
        if not 0.0 <= self.TOP_P <= 1.0:
            raise generation_cfg.error("top_p", "a number in [0, 1] (1.0 = off)")
        self.TEMPERATURE = generation_cfg.get_float("temperature", g["temperature"])
        if not self.TEMPERATURE >= 0.0:
            raise generation_cfg.error("temperature", "a number >= 0 (0 = greedy)")
        self.REPETITION_PENALTY = generation_cfg.get_float("repetition_penalty",
                                                           g["repetition_penalty"])
        if not self.REPETITION_PENALTY > 0.0:
            raise generation_cfg.error("repetition_penalty", "a number > 0 (1.0 = off)")
        self.SEED = None
        self.output_list = [""] * self.BATCH_SIZE
        self.performance_metrics = PerformanceMetrics()
        self.result = GenerationResult()

    # -- token selection --------------------------------------------------------------------
    def setGenerationOptions(self, temperature: float | None = None, top_k: int | None = None,
                             top_p: float | None = None, repetition_penalty: float | None = None,
                             seed: int | None = None, greedy: bool = False) -> None:
        """The CLI's sampling options over the configs' values: a temperature, top-k or top-p
        switches sampling on, ``greedy`` off; temperature 0 is greedy (``samples``)."""
        for name, value in (("TEMPERATURE", temperature), ("TOP_K", top_k), ("TOP_P", top_p),
                            ("REPETITION_PENALTY", repetition_penalty), ("SEED", seed)):
            if value is not None:
                setattr(self, name, value)
        if temperature is not None or top_k is not None or top_p is not None:
            self.DO_SAMPLE = True
        if greedy:
            self.DO_SAMPLE = False

    def samples(self, do_sample: bool) -> bool:
        """Whether ``do_sample`` really samples: temperature 0 is greedy decoding (the limit of
        softmax(x / T) as T -> 0, and what ``--temp 0`` means), whatever ``do_sample`` says."""
        return bool(do_sample) and self.TEMPERATURE != 0.0

    def makeSampler(self, do_sample: bool) -> Sampler:
        do_sample = self.samples(do_sample)
        return Sampler(temperature=self.TEMPERATURE, top_k=self.TOP_K, top_p=self.TOP_P,
                       repetition_penalty=self.REPETITION_PENALTY,
                       bad_word_ids=self.BAD_WORD_IDS, seed=self.SEED, do_sample=do_sample)

    def generate(self, logits, do_sample: bool, histories: list[list[int]]) -> list[int]:
        """One token per batch row from ``logits`` (B, vocab), as CausalLM::generate."""
        return [int(t) for t in self.makeSampler(do_sample).select(logits, histories)]

    # -- generation -------------------------------------------------------------------------
    def generate_tokens(self, prompt_ids: list[list[int]], max_new_tokens: int | None = None,
                        do_sample: bool | None = None, start_pos: int = 0, on_token=None,
                        context_ids: list[int] = (), stream=None) -> GenerationResult:
        """Generate from ``prompt_ids`` (one equal-length list per batch row): up to
        ``max_new_tokens`` (default ``NUM_TO_GENERATE``) new tokens per row, a row stopping at
        an EOS id. ``start_pos`` and ``context_ids`` place the prompt after tokens already in
        the cache (a loaded system prompt, which the repetition penalty counts too);
        ``on_token(b, token_id)`` sees every new token; row 0's text streams to ``stream``."""
        if not self.is_initialized:
            raise CausalLMError("generate: call initialize() and load_weight() first")
        do_sample = self.DO_SAMPLE if do_sample is None else do_sample
        generator = Generator(self, self.makeSampler(do_sample), self.EOS_TOKEN_ID,
                              self.tokenizer, stream)
        result = generator.generate(
            prompt_ids, self.NUM_TO_GENERATE if max_new_tokens is None else max_new_tokens,
            start_pos, context_ids, on_token)
        self.performance_metrics = result.metrics
        self.result = result
        self.output_list = list(result.texts)
        return result

    def tokenize(self, prompt: str, system_prompt: str = "", tail_prompt: str = ""
                 ) -> tuple[list[int], int, list[int]]:
        """(prompt ids, start position, ids already in the cache) for ``run``: the encoding of
        ``system_prompt + prompt + tail_prompt`` at position 0."""
        return self.tokenizer.Encode(system_prompt + prompt + tail_prompt), 0, []

    def run(self, prompt: str, do_sample: bool | None = None, system_prompt: str = "",
            tail_prompt: str = "", log_output: bool = True, out=None) -> GenerationResult:
        """Encode ``system_prompt + prompt + tail_prompt``, generate and, with ``log_output``,
        stream row 0's text to ``out`` (stdout) and print the metrics block to stderr."""
        if not self.is_initialized:
            raise CausalLMError("run: call initialize() and load_weight() first")
        ids, start_pos, context = self.tokenize(prompt, system_prompt, tail_prompt)
        result = self.generate_tokens([ids] * self.BATCH_SIZE, do_sample=do_sample,
                                      start_pos=start_pos, context_ids=context,
                                      stream=(out or sys.stdout) if log_output else None)
        if log_output:
            self.printMetrics(sys.stderr)
        return result

    def printMetrics(self, stream=None) -> None:
        self.performance_metrics.print(stream or sys.stderr)
