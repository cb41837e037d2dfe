"""Gemma 3's image-text model (models/gemma3/gemma3_vision.py) against transformers' numbers.

Fixture gemma3-vision (tools/fixtures_vision.py): BF16, a 4-layer Gemma 3 text model (sliding
window 6, GQA, linear RoPE on full layers, transformers-4 config keys) with a SigLIP tower
(64 patches) and 16 tokens per image, so each image's block is longer than the window; two
images, the second an RGBA PNG composited on white, and the prompt "describe:" without
placeholders (the images go first). transformers' prefill mask: an image token sees its whole
image.
"""

import json
import os
import sys

import numpy as np
import pytest
from cli import run_cli
from parity import FIXTURES, ROOT, assert_logits_close, load_folder

from causallm.errors import CausalLMError
from causallm.generation.generator import PerformanceMetrics

NAME = "gemma3-vision"


@pytest.fixture(scope="module")
def ref():
    return np.load(os.path.join(FIXTURES, NAME, "expected.npz"))


def image_paths(ref):
    return [os.path.join(ROOT, p) for p in ref["images"]]


@pytest.fixture(scope="module")
def model(ref):
    model = load_folder(NAME)
    model.setImages(image_paths(ref))
    model.image_features = model.encodeImages(PerformanceMetrics())
    return model


@pytest.mark.slow
def test_prompt_expansion_and_token_types(model, ref):
    ids, _, _ = model.tokenize(str(ref["prompt"]))
    assert ids == ref["prompt_ids"].tolist()
    _, types = model.imageRows(np.array([ids]))
    np.testing.assert_array_equal(types[0], ref["token_type_ids"])
    assert types.sum() == 2 * model.MM_TOKENS_PER_IMAGE


def test_pixels_tower_and_features(model, ref):
    np.testing.assert_array_equal(np.stack(model.images), ref["pixel_values"])  # RGBA on white
    for k in range(2):
        tower, features = model.runVision(model.images[k])
        scale = float(np.abs(ref["vision_output"][k]).max())
        assert np.abs(tower - ref["vision_output"][k]).max() <= 2e-5 * scale
        assert_logits_close(features, ref["image_features"][k], f"image {k} features", 2e-5)


@pytest.mark.slow
def test_prefill_and_every_cached_step(model, ref):
    """The prefill with the images (bidirectional within each image), then 31 cached steps
    fed transformers' tokens."""
    ids = ref["prompt_ids"][None].astype(np.float32)
    P = ids.shape[1]
    logits = [model.prefill(ids, 0)[0]]
    model.position = P
    for k in range(1, len(ref["tokens"])):
        logits.append(model.step(np.array([ref["tokens"][k - 1]], dtype=np.float32))[0])
    assert_logits_close(logits[0], ref["prefill_logits"], "prefill")
    for k, row in enumerate(logits):
        assert_logits_close(row, ref["step_logits"][k], f"decode step {k}")


def test_one_shot_forward_over_prompt_and_tokens(model, ref):
    ids = np.concatenate([ref["prompt_ids"], ref["tokens"][:-1]])[None].astype(np.float32)
    assert_logits_close(model.prefill(ids, 0)[0], ref["full_logits_last"], "no-cache forward")


@pytest.mark.slow
@pytest.mark.parametrize("init_seq_len", [256, 20])
def test_greedy_generation(ref, init_seq_len):
    """generate_tokens from the prompt ids and the image paths; with init_seq_len 20 the
    prefill runs in chunks that never split an image (the 16-token blocks)."""
    model = load_folder(NAME, init_seq_len=init_seq_len, num_to_generate=64)
    result = model.generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=32,
                                   do_sample=False, images=image_paths(ref))
    assert result.generated_ids[0] == ref["tokens"].tolist()
    assert result.metrics.vision_tokens == 2 * 64
    if init_seq_len == 20:
        chunks = model.prefillChunks(ref["prompt_ids"][None])
        assert all(n <= 20 for _, n in chunks) and len(chunks) > 2
        image = ref["token_type_ids"] == 1
        for c, n in chunks:  # no chunk ends inside an image
            assert not (c + n < len(image) and image[c + n - 1] and image[c + n])


@pytest.mark.slow
def test_an_image_longer_than_a_prefill_step_is_an_error(ref):
    model = load_folder(NAME, init_seq_len=12)
    with pytest.raises(CausalLMError, match="an image of 16 tokens does not fit one prefill step"):
        model.run(str(ref["prompt"]), do_sample=False, log_output=False,
                  images=image_paths(ref))


@pytest.mark.slow
def test_cli_two_images():
    ref = np.load(os.path.join(FIXTURES, NAME, "expected.npz"))
    args = [os.path.join("tests", "fixtures", NAME), str(ref["prompt"])]
    for path in ref["images"]:
        args += ["--image", str(path)]
    p = run_cli(*args, "--greedy", "-n", "32", "--json")
    assert p.returncode == 0, p.stderr
    record = json.loads(p.stdout.rstrip("\n").rsplit("\n", 1)[-1])
    assert record["architecture"] == "Gemma3ForConditionalGeneration"
    assert record["prompt_ids"] == ref["prompt_ids"].tolist()
    assert record["generated_ids"] == ref["tokens"].tolist()


@pytest.mark.slow
def test_weights_bin_round_trip_and_export(ref, tmp_path):
    """.bin (vision tower included) and back to safetensors under transformers' names: the
    tensors are the checkpoint's, and both give transformers' tokens."""
    model = load_folder(NAME)
    path = str(tmp_path / "g3v.bin")
    model.save_weight(path)
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import bin_to_hf
    out = tmp_path / "hf"
    bin_to_hf.export(os.path.join(FIXTURES, NAME), path, str(out))
    assert {"preprocessor_config.json", "processor_config.json"} <= set(os.listdir(out))
    original, written = model.openHFCheckpoint(os.path.join(FIXTURES, NAME)), \
        model.openHFCheckpoint(str(out))
    assert set(written.keys()) == set(original.keys())
    for key in written.keys():
        np.testing.assert_array_equal(written.get(key), original.get(key), err_msg=key)
    for weights, folder in ((path, NAME), (None, str(out))):
        again = load_folder(folder, weights=weights)
        result = again.generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=32,
                                       do_sample=False, images=image_paths(ref))
        assert result.generated_ids[0] == ref["tokens"].tolist()
