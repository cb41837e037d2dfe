"""Gemma 3's image-text model (HF ``Gemma3ForConditionalGeneration``): the SigLIP tower and
projector (models/siglip/siglip.py) in a ``vision`` stage, and Gemma3CausalLM's decoder in the
``model`` stage, whose embedding takes the image features at the image tokens
(models/vision_language.py)::

    vision   vision_input0 -> SigLIP tower -> vision_projector        (one image per step)
    model    input0 -> embedding0 -> image_merge (embedding_merge, image_input0) ->
             layer{i} blocks (Gemma3Transformer) -> output_norm -> output_of_causallm
             [-> output_softcapping]

Attention in the prefill (transformers' mask given the processor's ``token_type_ids``): a text
token sees the keys before it (and its window on a sliding layer); an image token also sees the
rest of its image, the window's lower bound still applying on sliding layers. Every mha_core
takes ``token_type_input0`` (1 at image tokens) for that (``block_bidirectional``); decode
steps feed zeros, as transformers passes no token types after the prefill. A prefill chunk
never splits an image (prefillChunks).

Config (Gemma3Config): ``text_config`` (Gemma3CausalLM's keys), ``vision_config`` (SigLIP),
``mm_tokens_per_image`` (256), ``boi_token_index`` (255999), ``eoi_token_index`` (256000),
``image_token_index`` (262144); transformers' defaults where a key is missing. An image token
id at or past the vocabulary is embedded as id 0, whose row the image features replace, as
transformers does.

Hugging Face names: GEMMA3_VISION_WEIGHTS (the checkpoint layout transformers writes); the
module tree's names (``model.language_model.*``, ``model.vision_tower.vision_model.*``, ...)
are read as those.
"""

from __future__ import annotations

import numpy as np

from causallm.api import createLayer, withKey
from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.io.safetensors import Checkpoint, RenamedCheckpoint
from causallm.io.weight_table import Tensor, WeightTable
from causallm.runtime.compiler import DEFAULT_STAGE
from causallm.models.gemma3.gemma3_causallm import GEMMA3_WEIGHTS, Gemma3CausalLM
from causallm.models.gemma3.processor import Gemma3Processor
from causallm.models.language_model import GENERATION_KEYS
from causallm.models.siglip.siglip import SIGLIP_HEAD_IGNORED, siglipWeights
from causallm.models.transformer import SELF_ATTENTION
from causallm.models.vision_language import IMAGE_INPUT, VisionLanguageModel

TOKEN_TYPE_INPUT = "token_type_input0"
"""The text stage's input of token types (1 at image tokens), read by every attention."""

_TOWER, _PROJECTOR = "vision_tower.", "multi_modal_projector."


def _language(name: str) -> str:
    """Gemma3TextModel's name (``model.*``, ``lm_head.*``) inside the image-text checkpoint."""
    return "language_model." + name


GEMMA3_VISION_WEIGHTS = WeightTable(
    [Tensor(t.ours, _language(t.hf), t.transpose, t.offset, t.part,
            tuple(_language(a) for a in t.aliases))
     for t in GEMMA3_WEIGHTS.tensors] + siglipWeights(_TOWER, _PROJECTOR),
    ignore=[*(_language(i) for i in GEMMA3_WEIGHTS.ignore),
            *(_TOWER + i for i in SIGLIP_HEAD_IGNORED)])
"""Gemma3ForConditionalGeneration's names in its checkpoints (transformers 4 and 5 write
them alike): ``language_model.model.*``, ``language_model.lm_head.weight`` (untied),
``vision_tower.*``, ``multi_modal_projector.*``."""

OTHER_LAYOUTS = (("model.language_model.", "language_model.model."),
                 ("lm_head.", "language_model.lm_head."),
                 ("model.vision_tower.vision_model.", _TOWER),
                 ("model.vision_tower.", _TOWER),
                 ("vision_tower.vision_model.", _TOWER),
                 ("model.multi_modal_projector.", _PROJECTOR))
"""The module tree's names (a ``state_dict()`` saved as is, older SigLIP ``vision_model``
prefixes): prefix there -> prefix here."""


def gemma3TextConfig(cfg: JsonConfig) -> JsonConfig:
    """``text_config`` with the top-level generation keys it lacks, for Gemma3CausalLM."""
    text = cfg.get_dict("text_config", {})
    extra = {k: cfg[k] for k in (*GENERATION_KEYS, "tie_word_embeddings")
             if k in cfg and k not in text}
    return JsonConfig({**extra, **text}, cfg.path, cfg.exists, "text_config")


class Gemma3ForConditionalGeneration(VisionLanguageModel, Gemma3CausalLM):
    """``Gemma3ForConditionalGeneration`` (module docstring)."""

    TEXT_STAGE = DEFAULT_STAGE
    PROCESSOR = Gemma3Processor

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(gemma3TextConfig(cfg), generation_cfg, nntr_cfg)
        self.setupVision(cfg.get_dict("vision_config", {}), cfg,
                         cfg.get_int("image_token_index", 262_144, minimum=0), self.DIM)
        self._image_rows = self._image_types = None
        self._image_base = 0

    # -- graph ------------------------------------------------------------------------------
    def createEmbeddingInputs(self, ids: str, embedding: str) -> tuple[list, str]:
        """The token types input (1 at image tokens), which every attention reads, and the
        image features merged in where it is 1 (``image_merge``)."""
        types = createLayer("input", [withKey("name", TOKEN_TYPE_INPUT),
                                      withKey("input_shape", f"1:1:{self.INIT_SEQ_LEN}")])
        merge = self.createImageMerge("image_merge", TOKEN_TYPE_INPUT, 1, embedding,
                                      self.INIT_SEQ_LEN)
        return [types, *merge], "image_merge"

    def createAttentionCore(self, name: str, layer_id: int, n_heads: int, input_layers: list,
                            kind: str = SELF_ATTENTION):
        return super().createAttentionCore(name, layer_id, n_heads,
                                           [*input_layers, TOKEN_TYPE_INPUT], kind)

    def attentionCoreProperties(self, layer_id: int, n_heads: int,
                                kind: str = SELF_ATTENTION) -> dict:
        """Gemma 3's, and an image token sees its whole image (block_bidirectional)."""
        return {**super().attentionCoreProperties(layer_id, n_heads, kind),
                "block_bidirectional": True}

    def constructModel(self) -> None:
        super().constructModel()
        logits = "output_softcapping" if self.FINAL_LOGIT_SOFTCAPPING else "output_of_causallm"
        self.createVisionStage()
        self.model.addStage(DEFAULT_STAGE, ["input0", TOKEN_TYPE_INPUT, IMAGE_INPUT], [logits])

    # -- weights ----------------------------------------------------------------------------
    def getHFWeightTable(self) -> WeightTable:
        return GEMMA3_VISION_WEIGHTS

    def openHFCheckpoint(self, folder: str) -> Checkpoint:
        return RenamedCheckpoint(super().openHFCheckpoint(folder), OTHER_LAYOUTS)

    # -- prefill with images ----------------------------------------------------------------
    def prefill(self, ids: np.ndarray, start_pos: int) -> np.ndarray:
        """CausalLM's prefill, each step given the image rows and token types of its
        positions."""
        self._image_rows, self._image_types = self.imageRows(ids)
        self._image_base = start_pos
        try:
            return super().prefill(ids, start_pos)
        finally:
            self._image_rows = self._image_types = None

    def prefillChunks(self, ids: np.ndarray):
        """INIT_SEQ_LEN rows at a time, each chunk ending before an image it would split."""
        image = np.asarray(ids) == self.IMAGE_TOKEN_ID
        P, chunks, c = ids.shape[1], [], 0
        while c < P:
            end = min(c + self.INIT_SEQ_LEN, P)
            while end < P and end > c and (image[:, end - 1] & image[:, end]).any():
                end -= 1
            if end == c:
                raise CausalLMError(f"an image of {self.MM_TOKENS_PER_IMAGE} tokens does not "
                                    f"fit one prefill step of init_seq_len = "
                                    f"{self.INIT_SEQ_LEN}; raise init_seq_len in "
                                    f"nntr_config.json")
            chunks.append((c, end - c))
            c = end
        return chunks

    def stageInputs(self, ids: np.ndarray, pos: int) -> list:
        """The ids, the image feature rows and the token types of positions [pos, pos + n):
        the prompt's in the prefill, zeros after."""
        B, n = ids.shape
        k = pos - self._image_base
        if self._image_rows is not None and 0 <= k < self._image_rows.shape[1]:
            if self.IMAGE_TOKEN_ID >= self.NUM_VOCAB:  # transformers embeds it as id 0
                ids = np.where(ids == self.IMAGE_TOKEN_ID, 0, ids)
            return [ids, self._image_types[:, k:k + n], self._image_rows[:, k:k + n]]
        return [ids, np.zeros((B, n), np.float32), np.zeros((B, n * self.DIM), np.float32)]
