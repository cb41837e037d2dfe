"""VisionLanguageModel: what a language model with a vision stage adds (Gemma 3's image-text
model, T5Gemma2), as a mixin before its text family in the class bases.

The images of a generation run through the ``vision`` stage (models/siglip/siglip.py), one per
step, into M = mm_tokens_per_image feature rows each; the prompt holds M image tokens
(``image_token_index``) per image, in order, which the family's processor (``PROCESSOR``;
models/gemma3/processor.py) wrote out; the feature rows take those tokens' places in the text
embedding::

    pixels_k   = processor(image_k)                    (3, S, S)            images given
    features_k = vision(pixels_k)                      (M, D)               phase "vision"
    rows[b, i] = features[j]  for the j-th image token i of row b (zero elsewhere)
    types[b, i] = 1 at image tokens, else 0

and the text graph's ``embedding_merge`` layer puts ``rows`` in (its ``image_input0`` input);
Gemma 3 also hands ``types`` to its attention (a block of image tokens sees itself whole).
Every row of a batch takes the same images. A model without images runs as its text family:
the image tokens of config.json are checked against the tokenizer when an image comes.

Python::

    model.run("describe:", images=["cat.png"])            # the CLI's --image
    model.generate_tokens([ids], images=["cat.png"])      # ids with the image tokens written out
"""

from __future__ import annotations

import numpy as np

from causallm.api import createLayer, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.layers.embedding_merge import EmbeddingMergeLayer
from causallm.layers.layer_normalization import LayerNormalizationLayer
from causallm.layers.positional_embedding import PositionalEmbeddingLayer
from causallm.models.siglip.siglip import (
    VISION,
    SiglipVisionConfig,
    checkImageTokens,
    createMultiModalProjector,
    createVisionTower,
)

IMAGE_INPUT = "image_input0"
"""The text graph's input of image feature rows (B, rows, D), one row per position."""


class VisionLanguageModel:
    """The mixin (module docstring). A family names its processor class (``PROCESSOR``: made
    with the folder, the tokenizer, the boi / eoi / image token ids and the tokens per image)."""

    PROCESSOR = None

    def setupVision(self, vision_cfg: JsonConfig, mm_cfg: JsonConfig, image_token_id: int,
                    text_hidden: int) -> None:
        """``vision_config``, ``mm_tokens_per_image`` and the boi / eoi ids (keys of
        ``mm_cfg``), the image token's id and the text width the projector maps to."""
        self.VISION = SiglipVisionConfig.read(vision_cfg, mm_cfg, mm_cfg)
        self.MM_TOKENS_PER_IMAGE = self.VISION.mm_tokens_per_image
        self.BOI_TOKEN_ID = mm_cfg.get_int("boi_token_index", 255_999, minimum=0)
        self.EOI_TOKEN_ID = mm_cfg.get_int("eoi_token_index", 256_000, minimum=0)
        self.IMAGE_TOKEN_ID = image_token_id
        self.VISION_TEXT_DIM = text_hidden
        self.images: list[np.ndarray] = []
        self.image_features: np.ndarray | None = None
        self._processor = None

    # -- graph ------------------------------------------------------------------------------
    def createVisionStage(self) -> None:
        """The tower and the projector, added to the model as stage ``vision`` (batch 1)."""
        tower, out = createVisionTower(self.VISION, self.createFullyConnected)
        projector, features = createMultiModalProjector(self.VISION, self.VISION_TEXT_DIM, out,
                                                        self.createFullyConnected)
        for layer in tower + projector:
            self.model.addLayer(layer)
        self.model.addStage(VISION, [f"{VISION}_input0"], [out, features], batch=1)

    def createImageMerge(self, name: str, ids: str, token_id: int, embeddings: str,
                         rows: int) -> list:
        """The image features input (``rows`` rows) and ``name``: ``embedding_merge`` of the
        features into ``embeddings`` where ``ids`` is ``token_id`` (the image token, or 1 in
        token types)."""
        return [createLayer("input", [withKey("name", IMAGE_INPUT),
                                      withKey("input_shape", f"1:{rows}:{self.VISION_TEXT_DIM}")]),
                createLayer("embedding_merge", [
                    withKey("name", name), withKey("token_id", token_id),
                    withKey("input_layers", f"{ids},{embeddings},{IMAGE_INPUT}")])]

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        for layer_class in (EmbeddingMergeLayer, LayerNormalizationLayer,
                            PositionalEmbeddingLayer):
            registerFactory(layer_class)

    # -- images -----------------------------------------------------------------------------
    @property
    def processor(self):
        """The processor, made when the first image comes (it checks that the tokenizer has
        the config's image tokens)."""
        if self._processor is None:
            self._processor = self.PROCESSOR(self.cfg.directory, self.tokenizer,
                                             self.BOI_TOKEN_ID, self.EOI_TOKEN_ID,
                                             self.IMAGE_TOKEN_ID, self.MM_TOKENS_PER_IMAGE)
        return self._processor

    def setImages(self, images) -> None:
        """The images of the next generation: paths, Pillow images, or pixel values
        (3, S, S) the processor made."""
        S = self.VISION.image_size
        pixels = [self.processor.pixels(image) for image in images]
        for p in pixels:
            if p.shape != (3, S, S):
                raise CausalLMError(f"pixel values of shape {p.shape}; the vision tower takes "
                                    f"(3, {S}, {S})")
        self.images = pixels
        self.image_features = None

    def tokenize(self, prompt: str, system_prompt: str = "", tail_prompt: str = "",
                 add_special_tokens: bool = True):
        """The text family's tokenize of the prompt with its images' placeholders written out;
        without images the prompt as it is, so a text-only run never needs the processor (nor
        a tokenizer with the config's image tokens, as in transformers)."""
        if self.images:
            prompt = self.processor.expandPrompt(prompt, len(self.images))
        return super().tokenize(prompt, system_prompt, tail_prompt, add_special_tokens)

    def runVision(self, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The vision stage over one image's pixel values (3, S, S): the tower's output
        (N, vision hidden) and the features (M, D)."""
        N = self.VISION.num_patches
        tower, features = self.model.incremental_inference(1, [pixels.reshape(1, -1)], None, N,
                                                           0, N, stage=VISION)
        return (tower.reshape(N, self.VISION.hidden_size),
                features.reshape(self.MM_TOKENS_PER_IMAGE, self.VISION_TEXT_DIM))

    def encodeImages(self, metrics) -> np.ndarray:
        """The vision stage over each image: features (n_images, M, D) (phase "vision")."""
        out = np.zeros((len(self.images), self.MM_TOKENS_PER_IMAGE, self.VISION_TEXT_DIM),
                       dtype=np.float32)
        with metrics.phase("vision", self.VISION.num_patches * len(self.images)):
            for k, pixels in enumerate(self.images):
                out[k] = self.runVision(pixels)[1]
        return out

    def imageRows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows (B, P, D), types (B, P)) for prompts ``ids`` (B, P): each row's image tokens
        take the features in order (module docstring)."""
        ids = np.asarray(ids)
        B, P = ids.shape
        features = self.image_features
        rows = np.zeros((B, P, self.VISION_TEXT_DIM), dtype=np.float32)
        mask = ids == self.IMAGE_TOKEN_ID
        n_images = 0 if features is None else len(features)
        for b in range(B):
            checkImageTokens(int(mask[b].sum()), n_images, self.MM_TOKENS_PER_IMAGE)
            if n_images:
                rows[b, mask[b]] = features.reshape(-1, self.VISION_TEXT_DIM)
        return rows, mask.astype(np.float32)

    # -- what the generator drives ----------------------------------------------------------
    def start(self, prompt_ids, start_pos, context_ids, metrics):
        """Run the images through the vision stage, then the text family's start."""
        self.image_features = self.encodeImages(metrics) if self.images else None
        return super().start(prompt_ids, start_pos, context_ids, metrics)
