"""Reading images and the Gemma 3 processor's text rules (causallm/io/images.py,
models/gemma3/processor.py); the pixel values themselves are checked against transformers' in
test_t5gemma2.py and test_gemma3_vision.py."""

import json
import os

import numpy as np
import pytest
from parity import FIXTURES, load_folder

from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.io.images import ImageProcessor, convert_rgb, load_image

IMAGES = os.path.join(FIXTURES, "images")


@pytest.mark.slow
def test_load_image_errors_name_the_file(tmp_path):
    with pytest.raises(CausalLMError, match="nope.png: image file not found"):
        load_image(str(tmp_path / "nope.png"))
    text = tmp_path / "notes.png"
    text.write_text("not a picture")
    with pytest.raises(CausalLMError, match="notes.png: not an image Pillow can read"):
        load_image(str(text))
    with pytest.raises(CausalLMError, match="is a folder, not an image file"):
        load_image(str(tmp_path))
    cut = tmp_path / "cut.png"
    data = open(os.path.join(IMAGES, "rgb-40x24.png"), "rb").read()
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(CausalLMError, match="cut.png: "):
        load_image(str(cut))


def test_a_large_image_prints_no_pillow_warning(monkeypatch, recwarn):
    """An image past Pillow's DecompressionBombWarning size (89 Mpx) is the user's own file:
    it decodes without Pillow's file:line warning on stderr; twice that is still an error."""
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40 * 24 - 1)  # warns from 960 pixels on
    assert load_image(os.path.join(IMAGES, "rgb-40x24.png")).size == (40, 24)
    assert not [w for w in recwarn if issubclass(w.category, Image.DecompressionBombWarning)]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40 * 24 // 2 - 1)  # errors past twice that
    with pytest.raises(CausalLMError, match="rgb-40x24.png: cannot read it"):
        load_image(os.path.join(IMAGES, "rgb-40x24.png"))


def test_transparency_is_composited_on_white():
    from PIL import Image
    image = Image.new("RGBA", (2, 1))
    image.putpixel((0, 0), (10, 20, 30, 0))      # transparent: white
    image.putpixel((1, 0), (0, 0, 0, 128))       # half: grey
    rgb = np.asarray(convert_rgb(image))
    assert rgb[0, 0].tolist() == [255, 255, 255]
    assert 126 <= rgb[0, 1, 0] <= 128 and rgb[0, 1].tolist() == [rgb[0, 1, 0]] * 3


def test_image_processor_config_errors():
    base = {"size": {"height": 4, "width": 4}}
    for change, key in (({"do_pan_and_scan": True}, "do_pan_and_scan"),
                        ({"size": {"shortest_edge": 4}}, "size"),
                        ({"resample": 9}, "resample"),
                        ({"image_std": [0.5, 0, 0.5]}, "image_std"),
                        ({"image_mean": [0.5, 0.5]}, "image_mean")):
        cfg = JsonConfig({**base, **change}, "/m/preprocessor_config.json")
        with pytest.raises(CausalLMError, match=f"preprocessor_config.json: '{key}'"):
            ImageProcessor(cfg)


def test_image_processor_formula_on_a_constant_image():
    """A flat colour survives resizing; then (x * rescale - mean) / std per channel."""
    from PIL import Image
    cfg = JsonConfig({"size": {"height": 3, "width": 5}, "rescale_factor": 1 / 255,
                      "image_mean": [0.5, 0.25, 0.0], "image_std": [0.5, 0.25, 2.0]}, "p.json")
    pixels = ImageProcessor(cfg)(Image.new("RGB", (7, 2), (51, 102, 255)))
    assert pixels.shape == (3, 3, 5) and pixels.dtype == np.float32
    want = (np.array([51, 102, 255]) / 255 - [0.5, 0.25, 0.0]) / [0.5, 0.25, 2.0]
    np.testing.assert_allclose(pixels[:, 1, 2], want, rtol=1e-6)


@pytest.fixture(scope="module")
def processor():
    return load_folder("gemma3-vision", initialize=False).processor


def test_placeholders_are_written_out(processor):
    seq = processor.full_image_sequence
    assert seq == "\n\n<start_of_image>" + "<image_soft_token>" * 16 + "<end_of_image>\n\n"
    assert processor.expandPrompt("hi", 0) == "hi"
    assert processor.expandPrompt("a <start_of_image> b", 1) == f"a {seq} b"
    assert processor.expandPrompt("hi", 2) == f"{seq} {seq}hi"  # images first
    with pytest.raises(CausalLMError, match="1 <start_of_image> for 2 image"):
        processor.expandPrompt("a <start_of_image>", 2)


def test_image_seq_length_must_match_the_model(tmp_path):
    import shutil
    folder = tmp_path / "g3"
    shutil.copytree(os.path.join(FIXTURES, "gemma3-vision"), folder)
    (folder / "processor_config.json").write_text(json.dumps({"image_seq_length": 9}))
    from causallm.factory import Factory
    model = Factory.Instance().createFromFolder(str(folder))
    with pytest.raises(CausalLMError, match="'image_seq_length' must be the model's "
                                            "mm_tokens_per_image \\(16\\)"):
        model.setImages([os.path.join(IMAGES, "rgb-40x24.png")])
