"""CausalLM: Transformer + LM head + the generation loop (Applications/CausalLM/models/causal_lm.cpp).

``constructModel`` appends ``output_of_causallm``: ``lm_head`` (unit = vocab), or, with tied
embeddings, ``tie_word_embeddings`` sharing ``embedding0``'s weight. ``run()`` encodes the prompt,
prefills it with ``incremental_inference`` (in chunks of ``INIT_SEQ_LEN`` rows), then feeds one
token at a time, streaming the text as it decodes, and reports the NNTrainer metrics block.

Fixed against the C++ (spec §10): every token, the first included, goes through the same
selection (temperature, top-k, top-p, repetition penalty and bad words are all applied; G6, G16);
every token is streamed and recorded, EOS is neither printed nor followed (G7, G8); streamed text
never splits a UTF-8 character (G8); positions are tracked explicitly (G5), so a saved
system-prompt KV cache really continues from its last position; a prompt longer than the step
buffer is prefilled in chunks instead of overflowing it (G11); batches of any size are handled
per row (G30).
"""

from __future__ import annotations

import os
import resource
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import orjson

from causallm.api import createLayer, registerFactory, withKey
from causallm.io.config import GENERATION_DEFAULTS, JsonConfig
from causallm.io.files import write_json_atomic
from causallm.errors import CausalLMError
from causallm.generation.sampler import Sampler
from causallm.tokenizer import StreamDecoder
from layers.lm_head import LmHeadLayer
from models.transformer import ModelType, Transformer


@dataclass
class PerformanceMetrics:
    """models/performance_metrics.h, plus the token counts of the run."""

    prefill_tokens: int = 0
    prefill_duration_ms: float = 0.0
    generation_tokens: int = 0
    generation_duration_ms: float = 0.0
    total_duration_ms: float = 0.0
    initialization_duration_ms: float = 0.0
    peak_memory_kb: int = 0


@dataclass
class GenerationResult:
    """What one generation produced, per batch row."""

    prompt_ids: list = field(default_factory=list)      # [B][P]
    generated_ids: list = field(default_factory=list)   # [B][n], new tokens only (EOS included)
    texts: list = field(default_factory=list)           # [B] decoded new text (no special tokens)
    finish_reasons: list = field(default_factory=list)  # [B] "eos" | "length" | "cache_full"


def peak_memory_kb() -> int:
    """Peak resident set size of this process, in KB (getrusage ``ru_maxrss``)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


class CausalLM(Transformer):
    MODEL_TYPE = ModelType.CAUSALLM

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.BAD_WORD_IDS = nntr_cfg.get_int_list("bad_word_ids", [])
        if any(not 0 <= t < self.NUM_VOCAB for t in self.BAD_WORD_IDS):
            raise nntr_cfg.error("bad_word_ids", f"token ids in [0, {self.NUM_VOCAB})")
        self.LMHEAD_DTYPE = nntr_cfg.get_str("lmhead_dtype", self.EMBEDDING_DTYPE)

        self.USE_KVCACHE = False
        self.PRE_COMPUTED_CACHE_PATH = ""
        self.SYS_PROMP_LEN = 0
        if nntr_cfg.contains("system_prompt"):
            system = nntr_cfg.get_dict("system_prompt")
            if system.contains("kvcache"):
                kv = system.get_dict("kvcache")
                self.USE_KVCACHE = True
                self.PRE_COMPUTED_CACHE_PATH = nntr_cfg.resolve_path(
                    kv.get_str("pre_computed_cache_path"))
                self.SYS_PROMP_LEN = kv.get_int("sys_prompt_token_size", 0, minimum=0)

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

    def constructModel(self) -> None:
        super().constructModel()
        lmhead_type = "tie_word_embeddings" if self.TIE_WORD_EMBEDDINGS else "lm_head"
        lmhead_prop = [withKey("name", "output_of_causallm"), withKey("unit", self.NUM_VOCAB),
                       withKey("disable_bias", "true"), withKey("input_layers", "output_norm"),
                       withKey("weight_dtype", self.LMHEAD_DTYPE)]
        if self.TIE_WORD_EMBEDDINGS:
            lmhead_prop.append(withKey("shared_from", "embedding0"))
        self.model.addLayer(createLayer(lmhead_type, lmhead_prop))

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(LmHeadLayer)

    # -- token selection --------------------------------------------------------------------
    def samples(self, do_sample: bool) -> bool:
        """Whether ``do_sample`` really samples: temperature 0 is greedy decoding (the limit of
        softmax(x / T) as T -> 0, and what ``--temp 0`` means), whatever ``do_sample`` says."""
        return bool(do_sample) and self.TEMPERATURE != 0.0

    def makeSampler(self, do_sample: bool) -> Sampler:
        do_sample = self.samples(do_sample)
        return Sampler(temperature=self.TEMPERATURE, top_k=self.TOP_K, top_p=self.TOP_P,
                       repetition_penalty=self.REPETITION_PENALTY,
                       bad_word_ids=self.BAD_WORD_IDS, seed=self.SEED, do_sample=do_sample)

    @property
    def max_timestep(self) -> int:
        """Rows of every KV cache: the positions a run can use."""
        return self.INIT_SEQ_LEN + self.NUM_TO_GENERATE

    # -- the generation loop ----------------------------------------------------------------
    def generate_tokens(self, prompt_ids: list[list[int]], max_new_tokens: int | None = None,
                        do_sample: bool | None = None, start_pos: int = 0,
                        on_token=None, context_ids: list[int] = ()) -> GenerationResult:
        """Prefill ``prompt_ids`` (one equal-length list per batch row) at positions
        ``[start_pos, start_pos + P)`` and generate up to ``max_new_tokens`` (default
        ``NUM_TO_GENERATE``) new tokens per row, stopping a row at an EOS id.

        ``on_token(b, token_id)`` is called for every new token of a running row.
        ``context_ids`` are tokens already in the cache before ``start_pos`` (a loaded system
        prompt): the repetition penalty counts them, as it counts every token of the context.
        """
        if not self.is_initialized:
            raise CausalLMError("generate: call initialize() and load_weight() first")
        B = self.BATCH_SIZE
        if len(prompt_ids) != B:
            raise CausalLMError(f"generate: got {len(prompt_ids)} prompts for batch_size {B}")
        P = len(prompt_ids[0])
        if P == 0:
            raise CausalLMError("generate: the prompt encodes to no tokens")
        if any(len(row) != P for row in prompt_ids):
            raise CausalLMError("generate: the prompts of a batch must have the same token length")
        T = self.max_timestep
        if start_pos + P > T:
            raise CausalLMError(
                f"prompt has {start_pos + P} tokens but the KV cache holds {T} "
                f"(init_seq_len {self.INIT_SEQ_LEN} + num_to_generate {self.NUM_TO_GENERATE}); "
                f"raise init_seq_len in nntr_config.json")
        wanted = self.NUM_TO_GENERATE if max_new_tokens is None else max_new_tokens
        if wanted < 1:
            raise CausalLMError(f"generate: max_new_tokens must be at least 1, got {wanted}")
        n_new = min(wanted, T - start_pos - P + 1)
        do_sample = self.DO_SAMPLE if do_sample is None else do_sample
        sampler = self.makeSampler(do_sample)
        ids = np.asarray(prompt_ids, dtype=np.float32)
        histories = [list(context_ids) + list(row) for row in prompt_ids]
        result = GenerationResult(prompt_ids=[list(r) for r in prompt_ids],
                                  generated_ids=[[] for _ in range(B)],
                                  finish_reasons=["length"] * B)
        finished = [False] * B
        eos = set(self.EOS_TOKEN_ID)
        metrics = self.performance_metrics = PerformanceMetrics()

        def emit(tokens: np.ndarray) -> None:
            for b in range(B):
                if finished[b]:
                    continue
                token = int(tokens[b])
                result.generated_ids[b].append(token)
                histories[b].append(token)
                if on_token is not None:
                    on_token(b, token)
                if token in eos:
                    finished[b] = True
                    result.finish_reasons[b] = "eos"

        t0 = time.perf_counter()
        logits = self.prefill(ids, start_pos)
        pos = start_pos + P
        emit(sampler.select(logits, histories))
        t1 = time.perf_counter()

        step_ids = np.zeros((B, 1), dtype=np.float32)
        steps = 0
        while steps + 1 < n_new and not all(finished):
            step_ids[:, 0] = [h[-1] for h in histories]
            logits = self.model.incremental_inference(B, [step_ids], None, 1, pos, pos + 1)[0]
            pos += 1
            steps += 1
            emit(sampler.select(logits, histories))
        t2 = time.perf_counter()

        if n_new < wanted:
            result.finish_reasons = [r if r == "eos" else "cache_full"
                                     for r in result.finish_reasons]
        metrics.prefill_tokens = P
        metrics.prefill_duration_ms = (t1 - t0) * 1e3
        metrics.generation_tokens = steps
        metrics.generation_duration_ms = (t2 - t1) * 1e3
        metrics.total_duration_ms = (t2 - t0) * 1e3
        metrics.peak_memory_kb = peak_memory_kb()
        self.result = result
        return result

    def generate(self, logits: np.ndarray, do_sample: bool, histories: list[list[int]]) -> list[int]:
        """One token per batch row from ``logits`` (B, vocab), as CausalLM::generate."""
        return [int(t) for t in self.makeSampler(do_sample).select(logits, histories)]

    def run(self, prompt: str, do_sample: bool | None = None, system_prompt: str = "",
            tail_prompt: str = "", log_output: bool = True, out=None) -> GenerationResult:
        """Encode, prefill, generate and stream ``system_prompt + prompt + tail_prompt``.

        With ``system_prompt.kvcache`` in nntr_config the system prompt's KV cache is read from
        ``pre_computed_cache_path`` (or computed and saved there first) and the run continues
        from its last position. Text streams to ``out`` (stdout); the metrics block goes to stderr.
        """
        if not self.is_initialized:
            raise CausalLMError("run: call initialize() and load_weight() first")
        out = out or sys.stdout
        start_pos, sys_ids = 0, []
        if self.USE_KVCACHE and system_prompt:
            path = self.PRE_COMPUTED_CACHE_PATH
            sys_ids = self.tokenizer.Encode(system_prompt)
            saved_ids = self.cached_prompt_ids(path)
            if os.path.exists(path) and saved_ids in (None, sys_ids):
                start_pos = self.SYS_PROMP_LEN or len(sys_ids)
                self.load_kvcache(path, start_pos)
            else:
                start_pos = self.prefill_only(sys_ids)
                self.save_kvcache(path, start_pos, sys_ids)
                if log_output:
                    why = "the system prompt changed; " if saved_ids is not None else ""
                    print(f"[kv cache] {why}saved {start_pos} system-prompt tokens to {path}",
                          file=sys.stderr)
            self.SYS_PROMP_LEN = start_pos
            ids = self.tokenizer.Encode(prompt + tail_prompt, add_special_tokens=False)
        else:
            ids = self.tokenizer.Encode(system_prompt + prompt + tail_prompt)

        decoders = [StreamDecoder(self.tokenizer) for _ in range(self.BATCH_SIZE)]
        self.output_list = [""] * self.BATCH_SIZE

        def on_token(b: int, token: int) -> None:
            if token in self.EOS_TOKEN_ID:
                return
            text = decoders[b].step(token)
            self.output_list[b] += text
            if log_output and b == 0 and text:
                out.write(text)
                out.flush()

        result = self.generate_tokens([ids] * self.BATCH_SIZE, do_sample=do_sample,
                                      start_pos=start_pos, on_token=on_token,
                                      context_ids=sys_ids[:start_pos])
        for b, decoder in enumerate(decoders):
            tail = decoder.flush()
            self.output_list[b] += tail
            if log_output and b == 0 and tail:
                out.write(tail)
        if log_output:
            out.write("\n")
            out.flush()
        result.texts = list(self.output_list)
        if log_output:
            self.printMetrics(sys.stderr)
        return result

    def prefill_only(self, ids: list[int]) -> int:
        """Fill the KV cache with ``ids`` at positions [0, len) without generating."""
        B = self.BATCH_SIZE
        if len(ids) > self.max_timestep:
            raise CausalLMError(f"system prompt has {len(ids)} tokens but the KV cache holds "
                                f"{self.max_timestep}; raise init_seq_len in nntr_config.json")
        self.prefill(np.asarray([ids] * B, dtype=np.float32), 0)
        return len(ids)

    def prefill(self, ids: np.ndarray, start_pos: int) -> np.ndarray:
        """Feed ``ids`` (B, P) at positions [start_pos, start_pos + P) in chunks of the step
        buffer's INIT_SEQ_LEN rows; the logits of the last position, (B, vocab)."""
        B, P = ids.shape
        for c in range(0, P, self.INIT_SEQ_LEN):
            n = min(self.INIT_SEQ_LEN, P - c)
            logits = self.model.incremental_inference(B, [ids[:, c:c + n]], None, n,
                                                      start_pos + c, start_pos + c + n)[0]
        return logits

    def printMetrics(self, stream=None) -> None:
        m = self.performance_metrics
        stream = stream or sys.stderr

        def tps(n: int, ms: float) -> str:
            return f"{n / ms * 1000:.2f}" if ms > 0 else "inf"

        stream.write("==================[ LLM with NNTrainer ]===================\n"
                     f"prefill: {m.prefill_tokens} tokens, {m.prefill_duration_ms:.0f} ms, "
                     f"{tps(m.prefill_tokens, m.prefill_duration_ms)} TPS\n"
                     f"generation: {m.generation_tokens} tokens, "
                     f"{m.generation_duration_ms:.0f} ms, "
                     f"{tps(m.generation_tokens, m.generation_duration_ms)} TPS\n"
                     f"total: {m.total_duration_ms:.0f} ms\n"
                     f"peak memory: {m.peak_memory_kb} KB\n")
        stream.flush()

    # -- system prompt KV cache -------------------------------------------------------------
    def _caches(self) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """(owner, key, value) of every self-attention KV cache, in graph order."""
        return [(c.owner, c.key, c.value) for c in self.model.getKVCaches("self")]

    def save_kvcache(self, path: str, to: int, token_ids: list[int] | None = None) -> None:
        """Write rows [0, to) of every mha_core's K then V cache, in graph order, as FP16
        (the layout of CausalLM::save_kvcache: no header). Written atomically. With
        ``token_ids``, a sidecar ``<path>.ids.json`` records the tokens the cache holds, so a
        changed system prompt is noticed (the C++ file alone cannot tell)."""
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                for _, k, v in self._caches():
                    f.write(np.ascontiguousarray(k[:, :to], dtype=np.float16).tobytes())
                    f.write(np.ascontiguousarray(v[:, :to], dtype=np.float16).tobytes())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        if token_ids is not None:
            write_json_atomic(f"{path}.ids.json", {"token_ids": list(token_ids)})

    @staticmethod
    def cached_prompt_ids(path: str) -> list[int] | None:
        """The token ids recorded beside a saved cache, or None (no sidecar, or unreadable)."""
        try:
            with open(f"{path}.ids.json", "rb") as f:
                ids = orjson.loads(f.read()).get("token_ids")
        except (OSError, ValueError, AttributeError):
            return None
        return ids if isinstance(ids, list) else None

    def load_kvcache(self, path: str, to: int) -> None:
        """Read what ``save_kvcache(path, to)`` wrote back into rows [0, to) of the caches."""
        if to > self.max_timestep:
            raise CausalLMError(f"{path}: sys_prompt_token_size {to} exceeds the KV cache's "
                                f"{self.max_timestep} rows (init_seq_len + num_to_generate)")
        caches = self._caches()
        expected = sum(k[:, :to].size + v[:, :to].size for _, k, v in caches) * 2
        found = os.path.getsize(path)
        if found != expected:
            raise CausalLMError(f"{path}: expected {expected} bytes for a {to}-token system "
                                f"prompt cache, found {found} (remove the file to recompute it)")
        data = np.fromfile(path, dtype=np.float16)
        if not np.isfinite(data).all():
            raise CausalLMError(f"{path}: the system prompt cache holds non-finite values "
                                f"(corrupt; remove the file to recompute it)")
        offset = 0
        for _, k, v in caches:
            for cache in (k, v):
                part = cache[:, :to]
                part[...] = data[offset:offset + part.size].reshape(part.shape)
                offset += part.size
