"""CausalLM: Transformer + LM head, generating (Applications/CausalLM/models/causal_lm.cpp).

``constructModel`` appends ``output_of_causallm``: ``lm_head`` (unit = vocab), or, with tied
embeddings, ``tie_word_embeddings`` sharing ``embedding0``'s weight. ``run()`` (LanguageModel)
encodes the prompt and hands the model to the generator (causallm/generation/generator.py),
which calls ``start`` (prefill with ``incremental_inference`` in chunks of ``INIT_SEQ_LEN`` rows)
and then ``step`` (one token at a time), streaming the text and reporting the metrics block.

Fixed against the C++: positions are tracked explicitly, so a saved system-prompt KV cache
really continues from its last position; a prompt longer than the step buffer is prefilled in
chunks instead of overflowing it (docs/nntrainer.md, "Positions across turns", "Prompts longer
than the step buffer"); the token selection, streaming and stop fixes are the generator's.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from causallm.api import createLayer, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.generation.generator import PerformanceMetrics, Start
from causallm.io.config import JsonConfig
from causallm.layers.lm_head import LmHeadLayer
from causallm.models.language_model import LanguageModel
from causallm.models.transformer import ModelType
from causallm.runtime.kv_cache import (load_system_cache, read_system_cache, save_system_cache,
                                      system_cache_identity)


class CausalLM(LanguageModel):
    MODEL_TYPE = ModelType.CAUSALLM
    TEXT_STAGE: str | None = None
    """The stage prefill and decode steps run: the only one, unless a family adds stages (a
    vision tower) and names its text stage."""

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.USE_KVCACHE = False
        self.PRE_COMPUTED_CACHE_PATH = ""
        self.SYS_PROMP_LEN = 0
        self.sys_prompt_cfg = None  # nntr_config's system_prompt.kvcache, when it has one
        self.position = 0  # positions the KV caches hold (start, step)
        if nntr_cfg.contains("system_prompt"):
            system = nntr_cfg.get_dict("system_prompt")
            if system.contains("kvcache"):
                kv = system.get_dict("kvcache")
                self.USE_KVCACHE = True
                self.PRE_COMPUTED_CACHE_PATH = nntr_cfg.resolve_path(
                    kv.get_str("pre_computed_cache_path"))
                if os.path.isdir(self.PRE_COMPUTED_CACHE_PATH):
                    raise kv.error("pre_computed_cache_path", "the path of the cache file, not a "
                                                              "folder")
                self.SYS_PROMP_LEN = kv.get_int("sys_prompt_token_size", 0, minimum=0)
                self.sys_prompt_cfg = kv

    def setupContext(self, nntr_cfg: JsonConfig) -> None:
        super().setupContext(nntr_cfg)
        if self.SYS_PROMP_LEN > self.MAX_SEQ_LEN:
            raise self.sys_prompt_cfg.error(
                "sys_prompt_token_size", f"at most the KV cache's {self.MAX_SEQ_LEN} positions "
                f"({self.context.cacheSize()})")

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

    def cacheLimit(self) -> str:
        """Why a generation ended with its KV cache full (finish reason ``cache_full``), and the
        setting that raises the limit: the prompt and the new tokens share the context's
        MAX_SEQ_LEN positions, so fewer than num_to_generate fit after a long prompt."""
        return (f"the KV cache is full at {self.MAX_SEQ_LEN} positions "
                f"({self.context.cacheSize()}), shared by the prompt and the new tokens; a "
                f"longer context: -c (ctx_size, max_seq_len)")

    # -- what the generator drives ----------------------------------------------------------
    def start(self, prompt_ids: np.ndarray, start_pos: int, context_ids: list[int],
              metrics: PerformanceMetrics) -> Start:
        """Prefill ``prompt_ids`` (B, P) at positions ``[start_pos, start_pos + P)``, each
        prompt in its rowsPerPrompt() rows (one per beam, as transformers expands them)."""
        prompt_ids = np.repeat(prompt_ids, self.rowsPerPrompt(), axis=0)
        P = prompt_ids.shape[1]
        T = self.MAX_SEQ_LEN
        if start_pos + P > T:
            raise CausalLMError(
                f"prompt has {start_pos + P} tokens but the KV cache holds {T} "
                f"({self.context.cacheSize()}); a longer context: -c (ctx_size, max_seq_len)")
        self.position = start_pos  # what the cache holds until the prefill completes
        with metrics.phase("prefill", P):
            logits = self.prefill(prompt_ids, start_pos)
        self.position = start_pos + P
        history = [list(context_ids) + [int(t) for t in row] for row in prompt_ids]
        return Start(logits, history, T - self.position + 1)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Feed one token per row at the next position; its logits (rows, vocab)."""
        B, pos = tokens.shape[0], self.position
        logits = self.model.incremental_inference(B, self.stageInputs(tokens.reshape(B, 1), pos),
                                                  None, 1, pos, pos + 1, stage=self.TEXT_STAGE)[0]
        self.position = pos + 1
        return self.firstHeadRow(logits)

    def firstHeadRow(self, logits: np.ndarray) -> np.ndarray:
        """(B, vocab): the logits of a step of one sequence per batch row, out of the head's
        (B, L * vocab) (L rows when the caches hold more sequences than batch rows)."""
        heads = max(1, self.SLOTS // (self.BATCH_SIZE * self.rowsPerPrompt()))
        return logits if heads == 1 else logits.reshape(logits.shape[0], heads, -1)[:, 0]

    def reorder(self, rows) -> None:
        """Beam search: row r continues the sequence of row ``rows[r]``, KV caches included."""
        for cache in self.model.getKVCaches("self"):
            cache.reorder(rows, self.position)

    def tokenize(self, prompt: str, system_prompt: str = "", tail_prompt: str = "",
                 add_special_tokens: bool = True) -> tuple[list[int], int, list[int]]:
        """As LanguageModel.tokenize; with ``system_prompt.kvcache`` in nntr_config the system
        prompt's KV cache is read from ``pre_computed_cache_path`` when its header vouches for
        it (``read_kvcache``), else computed and saved there (a cache that cannot be saved costs
        the cache, not the run; one stderr line says why it was not used or not saved), and the
        prompt continues from its last position."""
        if not (self.USE_KVCACHE and system_prompt):
            return super().tokenize(prompt, system_prompt, tail_prompt, add_special_tokens)
        path = self.PRE_COMPUTED_CACHE_PATH
        sys_ids = self.tokenizer.Encode(system_prompt)
        data, problem = self.read_kvcache(path, sys_ids)
        if data is not None:
            start_pos = len(sys_ids)
            self.load_kvcache(path, start_pos, data)
        else:
            start_pos = self.prefill_only(sys_ids)
            why = f"warning: {path}: {problem}; recomputed, " if problem else ""
            try:
                self.save_kvcache(path, start_pos, sys_ids)
                line = f"{why}saved {start_pos} system-prompt tokens to {path}"
            except OSError as e:
                line = (f"{why or 'warning: '}cannot save the system prompt's cache to {path} "
                        f"({e.strerror or e}); going on without it")
            print(f"[kv cache] {line}", file=sys.stderr)
        self.SYS_PROMP_LEN = start_pos
        ids = self.tokenizer.Encode(prompt + tail_prompt, add_special_tokens=False)
        return ids, start_pos, sys_ids[:start_pos]

    def prefill_only(self, ids: list[int]) -> int:
        """Fill the KV cache with ``ids`` at positions [0, len) without generating."""
        B = self.BATCH_SIZE
        if len(ids) > self.MAX_SEQ_LEN:
            raise CausalLMError(f"system prompt has {len(ids)} tokens but the KV cache holds "
                                f"{self.MAX_SEQ_LEN} ({self.context.cacheSize()}); a longer "
                                f"context: -c (ctx_size, max_seq_len)")
        self.prefill(np.asarray([ids] * B, dtype=np.float32), 0)
        return len(ids)

    def prefill(self, ids: np.ndarray, start_pos: int) -> np.ndarray:
        """Feed ``ids`` (B, P) at positions [start_pos, start_pos + P) in chunks of at most the
        step buffer's INIT_SEQ_LEN rows (prefillChunks); the logits of the last position,
        (B, vocab)."""
        B, P = ids.shape
        for c, n in self.prefillChunks(ids):
            pos = start_pos + c
            logits = self.model.incremental_inference(B, self.stageInputs(ids[:, c:c + n], pos),
                                                      None, n, pos, pos + n,
                                                      stage=self.TEXT_STAGE)[0]
        return self.firstHeadRow(logits)

    def prefillChunks(self, ids: np.ndarray):
        """(offset, length) of each prefill step over ``ids`` (B, P): INIT_SEQ_LEN rows at a
        time."""
        P = ids.shape[1]
        return [(c, min(self.INIT_SEQ_LEN, P - c)) for c in range(0, P, self.INIT_SEQ_LEN)]

    def stageInputs(self, ids: np.ndarray, pos: int) -> list:
        """The text stage's inputs for ``ids`` (B, n) at positions [pos, pos + n): the ids (a
        family with more input layers adds theirs)."""
        return [ids]

    # -- system prompt KV cache (the file: causallm/runtime/kv_cache.py) -------------------
    def save_kvcache(self, path: str, to: int, token_ids: list[int] | None = None) -> None:
        """CausalLM::save_kvcache: positions [0, to) of the self caches to ``path``
        (``save_system_cache``; with ``token_ids`` and this model's identity in its header)."""
        save_system_cache(path, self.model.getKVCaches("self"), to, token_ids,
                          self.kvcacheIdentity() if token_ids is not None else None)

    def kvcacheIdentity(self) -> dict:
        """What the cached keys and values depend on besides the tokens (``system_cache_identity``):
        the class, config.json, the weight files read, the formats the packable weights are
        held in (``precision.heldFormat``) and the self caches."""
        return system_cache_identity(
            type(self).__name__, self.cfg, self.weight_path,
            [self.precision.heldFormat(s) for s in self.model.getWeightSpecs() if s.packable],
            self.model.getKVCaches("self"))

    def read_kvcache(self, path: str, token_ids: list[int]) -> tuple[bytes | None, str]:
        """``read_system_cache`` for these ``token_ids`` and this model."""
        return read_system_cache(path, token_ids, self.kvcacheIdentity)

    def load_kvcache(self, path: str, to: int, data: bytes) -> None:
        """CausalLM::load_kvcache: the vouched-for ``data`` into rows [0, to) of the caches."""
        load_system_cache(path, self.model.getKVCaches("self"), to, data, self.MAX_SEQ_LEN)
