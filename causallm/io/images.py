"""Images: reading a file and turning it into a model's pixel values, as the folder's
``preprocessor_config.json`` says (transformers' image processors, PIL backend).

    load_image(path)            the file through Pillow, turned as its EXIF orientation says
    ImageProcessor(folder)      preprocessor_config.json's steps, for one image:

        rgb    = convert_rgb(image)                   alpha composited onto white, else RGB
        rgb    = rgb.resize((W, H), resample)         Pillow, size {"height": H, "width": W}
        x      = float32(float64(rgb) * rescale_factor)          channels first, (3, H, W)
        pixels = (x - image_mean) / image_std         in float32, per channel

Each step runs only when its ``do_*`` key is true (``do_convert_rgb`` null means true, as
Gemma 3's processor passes it). This is what transformers computes with Pillow installed and
torchvision absent (``Gemma3ImageProcessorPil``); its torchvision backend resizes with its own
antialiasing filter, so pixel values from it differ in the last digits. Pan-and-scan crops
(``do_pan_and_scan``) are not supported.

Pillow is imported when an image is first read. Bad input is a one-line error naming the file:
a missing or unreadable file, a file that is not an image, a config key of the wrong type.
"""

from __future__ import annotations

import io
import os
import warnings

import numpy as np

from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig, load_json
from causallm.io.files import not_found

RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box",
                  5: "hamming"}
"""Pillow's (and transformers' PILImageResampling) filter numbers."""


def _pil():
    try:
        from PIL import Image, ImageOps
    except ImportError:
        raise CausalLMError("reading images needs Pillow: pip install pillow") from None
    return Image, ImageOps


def load_image(path: str):
    """The image file ``path`` as a Pillow image, decoded and turned upright (EXIF)."""
    if not os.path.exists(path):
        raise not_found(path, "image file")
    if os.path.isdir(path):
        raise CausalLMError(f"{path}: is a folder, not an image file")
    return decode_image(path, path)


def decode_image(source, name: str, max_pixels: int | None = None):
    """``source`` (a path, or an image file's bytes) as a Pillow image, decoded and turned
    upright (EXIF); errors name ``name``. An image of more than ``max_pixels`` pixels is refused
    from its header, before it is decoded."""
    Image, ImageOps = _pil()
    if isinstance(source, (bytes, bytearray)):
        source = io.BytesIO(source)
    try:
        with warnings.catch_warnings():
            # Pillow's DecompressionBombWarning (a file:line of its own on stderr) for an
            # image over 89 Mpx: the caller's limit, or Pillow's error at twice that, decides
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(source)
        with image:
            w, h = image.size
            if max_pixels is not None and w * h > max_pixels:
                raise CausalLMError(f"{name}: the image is {w}x{h}, over {max_pixels} pixels")
            image.load()
            return ImageOps.exif_transpose(image)
    except CausalLMError:
        raise
    except OSError as e:  # PIL.UnidentifiedImageError is an OSError too
        reason = "not an image Pillow can read" if isinstance(e, Image.UnidentifiedImageError) \
            else f"cannot read it ({e})"
        raise CausalLMError(f"{name}: {reason}") from None
    except (ValueError, Image.DecompressionBombError) as e:
        raise CausalLMError(f"{name}: cannot read it ({e})") from None


def convert_rgb(image):
    """RGB, any transparency composited onto a white background (transformers'
    ``convert_to_rgb``)."""
    Image, _ = _pil()
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


class ImageProcessor:
    """preprocessor_config.json's resize, rescale and normalisation (module docstring)."""

    def __init__(self, cfg: JsonConfig) -> None:
        self.cfg = cfg
        self.do_convert_rgb = cfg.get_bool("do_convert_rgb", True)
        self.do_resize = cfg.get_bool("do_resize", True)
        self.do_rescale = cfg.get_bool("do_rescale", True)
        self.do_normalize = cfg.get_bool("do_normalize", True)
        if cfg.get_bool("do_pan_and_scan", False):
            raise cfg.error("do_pan_and_scan", "false or null (pan-and-scan crops are not "
                                               "supported)")
        size = cfg.get_dict("size") if self.do_resize else {}
        if self.do_resize:
            if not (size.contains("height") and size.contains("width")):
                raise cfg.error("size", 'an object {"height": H, "width": W}')
            self.height = size.get_int("height", minimum=1)
            self.width = size.get_int("width", minimum=1)
        self.resample = cfg.get_int("resample", 2)
        if self.resample not in RESAMPLE_NAMES:
            names = ", ".join(f"{k} {v}" for k, v in RESAMPLE_NAMES.items())
            raise cfg.error("resample", f"a Pillow filter number ({names})")
        self.rescale_factor = cfg.get_float("rescale_factor", 1 / 255)
        self.mean = self._channels("image_mean", [0.5, 0.5, 0.5])
        self.std = self._channels("image_std", [0.5, 0.5, 0.5])
        if (self.std == 0).any():
            raise cfg.error("image_std", "non-zero numbers")

    def _channels(self, key: str, default: list[float]) -> np.ndarray:
        value = self.cfg.get(key, default)
        values = value if isinstance(value, list) else [value] * 3
        if len(values) != 3 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                       for v in values):
            raise self.cfg.error(key, "a number or a list of 3 numbers")
        return np.array(values, dtype=np.float32)

    @classmethod
    def fromFolder(cls, folder: str) -> "ImageProcessor":
        return cls(load_json(os.path.join(folder, "preprocessor_config.json")))

    def __call__(self, image) -> np.ndarray:
        """One image (a path or a Pillow image) as pixel values (3, H, W) float32."""
        if isinstance(image, (str, os.PathLike)):
            image = load_image(os.fspath(image))
        if self.do_convert_rgb:
            image = convert_rgb(image)
        if self.do_resize:
            image = image.resize((self.width, self.height), resample=self.resample)
        x = np.asarray(image)
        if x.ndim == 2:
            x = x[:, :, None]
        if x.shape[2] != 3:
            raise CausalLMError(f"an image of {x.shape[2]} channels; the model takes 3 "
                                f"(set do_convert_rgb)")
        x = np.moveaxis(x, -1, 0)
        if self.do_rescale:
            x = (x.astype(np.float64) * self.rescale_factor).astype(np.float32)
        x = x.astype(np.float32)
        if self.do_normalize:
            x = (x - self.mean[:, None, None]) / self.std[:, None, None]
        return np.ascontiguousarray(x, dtype=np.float32)
