"""Gemma3Processor: transformers' processor of Gemma 3's image-text models, which T5Gemma2 uses
too (the fork's T5Gemma2Processor, with the special ids transformers gives them).

Text: every ``<start_of_image>`` (boi) of the prompt stands for one image and becomes

    "\\n\\n" + boi + M x image_token + eoi + "\\n\\n"          M = image_seq_length

(``full_image_sequence``); a prompt with images but no boi gets one per image in front, joined
by spaces, as the processor writes them when it is given images without text; any other
count of boi tokens than of images is an error, as in transformers. The tokenizer then adds
its special tokens (``<bos>``). The token strings are the tokenizer's for the config's
``boi_token_index``, ``eoi_token_index`` and ``image_token_index``; M is processor_config.json's
``image_seq_length`` (default the config's ``mm_tokens_per_image``, which it must equal).

Images: causallm/io/images.py with the folder's preprocessor_config.json.
"""

from __future__ import annotations

import os

import numpy as np

from causallm.errors import CausalLMError
from causallm.io.config import load_json
from causallm.io.images import ImageProcessor


class Gemma3Processor:
    def __init__(self, folder: str, tokenizer, boi_id: int, eoi_id: int, image_id: int,
                 mm_tokens_per_image: int) -> None:
        self.folder = folder
        names = {}
        for key, token_id in (("boi_token_index", boi_id), ("eoi_token_index", eoi_id),
                              ("image_token_index", image_id)):
            token = tokenizer.IdToToken(token_id)
            if token is None:
                raise CausalLMError(f"{os.path.join(folder, 'config.json')}: {key} {token_id} "
                                    f"is not a token of the tokenizer")
            names[key] = token
        self.boi_token, self.eoi_token = names["boi_token_index"], names["eoi_token_index"]
        self.image_token = names["image_token_index"]
        cfg = load_json(os.path.join(folder, "processor_config.json"), required=False)
        self.image_seq_length = cfg.get_int("image_seq_length", mm_tokens_per_image, minimum=1)
        if self.image_seq_length != mm_tokens_per_image:
            raise cfg.error("image_seq_length", f"the model's mm_tokens_per_image "
                                                f"({mm_tokens_per_image})")
        self.full_image_sequence = (f"\n\n{self.boi_token}"
                                    f"{self.image_token * self.image_seq_length}"
                                    f"{self.eoi_token}\n\n")
        self._images = None

    @property
    def image_processor(self) -> ImageProcessor:
        """preprocessor_config.json's steps, read when the first image comes."""
        if self._images is None:
            self._images = ImageProcessor.fromFolder(self.folder)
        return self._images

    def expandPrompt(self, text: str, n_images: int) -> str:
        """The prompt with each image's placeholder written out (module docstring)."""
        if n_images == 0:
            return text
        k = text.count(self.boi_token)
        if k == 0:
            text = " ".join([self.boi_token] * n_images) + text
        elif k != n_images:
            raise CausalLMError(f"the prompt has {k} {self.boi_token} for {n_images} image(s): "
                                f"write one per image, or none to put the images first")
        return text.replace(self.boi_token, self.full_image_sequence)

    def pixels(self, image) -> np.ndarray:
        """One image (a path, a Pillow image, or pixel values (3, H, W) already processed) as
        the model's pixel values."""
        if isinstance(image, np.ndarray):
            return np.ascontiguousarray(image, dtype=np.float32)
        return self.image_processor(image)
