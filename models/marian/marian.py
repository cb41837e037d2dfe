"""Marian (HF ``modeling_marian.py`` ``MarianMTModel``): the opus-mt translation models, the
original "Attention is all you need" design. It is :class:`BartForConditionalGeneration` with
two differences per stack::

    h = E[t] * s + S[p]              ``{stack}_embedding0`` (s = sqrt(d_model) with
                                     ``scale_embedding``, which opus-mt sets),
                                     ``{stack}_position_embedding``: ``sinusoidal_embedding``
                                     (sines then cosines, computed as transformers builds them)

and no ``layernorm_embedding``; the blocks are post-norm with biases, the activation
``activation_function`` (``swish`` in opus-mt), the head tied to the shared embedding plus
``final_logits_bias``. Generation starts from ``decoder_start_token_id``, the pad id; opus-mt's
generation_config.json masks the pad token (``bad_words_ids``) and forces the EOS at the last
step (``forced_eos_token_id``), and sets ``num_beams``: the CLI searches with beams unless
``--greedy``.

The position tables are computed, never loaded: a file that holds them
(``model.{encoder,decoder}.embed_positions.weight``, as converted opus-mt checkpoints do) is
checked against the computed table instead (a difference beyond the file's dtype rounding is an
error); transformers neither needs nor saves them.

Tokenizer: opus-mt folders ship ``source.spm``, ``target.spm`` and ``vocab.json`` and no
``tokenizer.json``; ``python tools/marian_tokenizer.py FOLDER`` makes one (see its docstring for
what it reproduces of transformers' MarianTokenizer). Not supported: separate source and target
vocabularies (``share_encoder_decoder_embeddings`` false).
"""

from __future__ import annotations

import os

import numpy as np

from causallm.api import createLayer, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.io.weight_table import WeightTable
from causallm.io.weights import checkpoint_folder
from causallm.layers.sinusoidal_embedding import SinusoidalEmbeddingLayer, sinusoid_table
from causallm.models.bart.bart import BART_WEIGHTS, BartForConditionalGeneration
from causallm.models.encoder_decoder import DECODER, ENCODER

POSITION_TENSORS = {stack: f"model.{stack}.embed_positions.weight" for stack in (ENCODER, DECODER)}

MARIAN_WEIGHTS = BART_WEIGHTS.extend(ignore=POSITION_TENSORS.values())
"""BART's names (no ``layernorm_embedding`` in the graph); the position tables are checked, not
loaded (``MarianMTModel.load_hf_weight``)."""

POSITION_TOLERANCE = {"F32": 1e-6, "F16": 1e-3, "BF16": 8e-3}
"""How far a stored position table may be from the computed one: its dtype's rounding (|S| <= 1)."""


class MarianMTModel(BartForConditionalGeneration):
    """``MarianMTModel`` (module docstring)."""

    EMBEDDING_NORM = False

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        if not cfg.get_bool("share_encoder_decoder_embeddings", True):
            raise cfg.error("share_encoder_decoder_embeddings",
                            "true (separate source and target vocabularies are not supported)")
        super().setupParameters(cfg, generation_cfg, nntr_cfg)

    def tokenizerHint(self) -> str:
        folder = self.cfg.directory
        if os.path.exists(os.path.join(folder, "source.spm")):
            return (f" (Marian folders ship source.spm, target.spm and vocab.json; make one "
                    f"with: python tools/marian_tokenizer.py {folder})")
        return ""

    # -- graph ------------------------------------------------------------------------------
    def createPositionEmbedding(self, name: str, input_name: str):
        """The sinusoidal positions, added to the (scaled) token embedding."""
        return createLayer("sinusoidal_embedding", [
            withKey("name", name), withKey("input_layers", input_name),
            withKey("max_position_embeddings", self.MAX_POSITION_EMBEDDINGS)])

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(SinusoidalEmbeddingLayer)

    # -- weights ----------------------------------------------------------------------------
    def getHFWeightTable(self) -> WeightTable:
        return MARIAN_WEIGHTS

    def load_hf_weight(self, path: str) -> None:
        """BART's load, then each position table the file holds checked against the computed
        one."""
        super().load_hf_weight(path)
        ckpt = self.openHFCheckpoint(checkpoint_folder(path))
        table = sinusoid_table(self.MAX_POSITION_EMBEDDINGS, self.DIM)
        for name in POSITION_TENSORS.values():
            if name not in ckpt:
                continue
            stored = ckpt.get(name)
            if stored.shape != table.shape:
                raise CausalLMError(f"{ckpt.file_of(name)}: tensor '{name}' has shape "
                                    f"{tuple(stored.shape)}; the sinusoid is {table.shape}")
            err = float(np.abs(stored - table).max())
            if err > POSITION_TOLERANCE.get(ckpt.dtype(name), 1e-6):
                raise CausalLMError(f"{ckpt.file_of(name)}: tensor '{name}' differs from the "
                                    f"sinusoidal positions transformers builds (max |diff| "
                                    f"{err:.3g})")
