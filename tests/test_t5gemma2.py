"""T5Gemma2 (models/t5gemma2/t5gemma2.py) against transformers' numbers, text and image.

Fixtures (tools/fixtures_vision.py): t5gemma2-text (BF16; encoder 3 / decoder 2 layers with
their own layer types, windows 8 (two-sided) and 6, GQA, head_dim 24, query_pre_attn_scalar 20,
linear RoPE on full layers, final softcapping, a 42-token prompt longer than the window, the
Hub's SigLIP names) and t5gemma2-image (F32, one image through the processor and the SigLIP
tower, the boi placeholder written in the prompt, save_pretrained's tower names). The encoder
output, the decoder's 32 cached steps and the no-cache recomputes of the text fixture are also
in tests/test_seq2seq_parity.py.
"""

import json
import os
import shutil

import numpy as np
import pytest
from cli import run_cli
from parity import (
    FIXTURES,
    ROOT,
    check_decoder_no_cache,
    check_decoder_steps,
    check_encoder_output,
    load_folder,
)

from causallm.errors import CausalLMError
from causallm.generation.generator import PerformanceMetrics
from causallm.factory import Factory

TEXT, IMAGE = "t5gemma2-text", "t5gemma2-image"


def expected(name):
    return np.load(os.path.join(FIXTURES, name, "expected.npz"))


def image_paths(ref):
    return [os.path.join(ROOT, p) for p in ref["images"]]


@pytest.fixture(scope="module")
def image_model():
    """t5gemma2-image with its image encoded (the features the encoder stage reads)."""
    model, ref = load_folder(IMAGE), expected(IMAGE)
    model.setImages(image_paths(ref))
    model.image_features = model.encodeImages(PerformanceMetrics())
    return model, ref


@pytest.mark.slow
def test_prompt_with_the_image_placeholder_is_the_processors(image_model):
    model, ref = image_model
    ids, start, _ = model.tokenize(str(ref["prompt"]))
    assert ids == ref["prompt_ids"].tolist() and start == 0
    assert ids.count(model.IMAGE_TOKEN_ID) == model.MM_TOKENS_PER_IMAGE
    assert ids[0] == 2 and model.EOI_TOKEN_ID in ids  # <bos>, and the image's <end_of_image>


def test_pixels_tower_and_features(image_model):
    model, ref = image_model
    np.testing.assert_array_equal(np.stack(model.images), ref["pixel_values"])
    tower, features = model.runVision(model.images[0])
    scale = float(np.abs(ref["vision_output"]).max())
    assert np.abs(tower - ref["vision_output"][0]).max() <= 2e-5 * scale
    scale = float(np.abs(ref["image_features"]).max())
    assert np.abs(features - ref["image_features"][0]).max() <= 2e-5 * scale


def test_encoder_output_with_the_image(image_model):
    check_encoder_output(*image_model)


@pytest.mark.slow
def test_decoder_logits_with_the_image(image_model):
    check_decoder_steps(*image_model)
    check_decoder_no_cache(*image_model)


@pytest.mark.slow
@pytest.mark.parametrize("name", [TEXT, IMAGE])
def test_greedy_generation(name):
    ref = expected(name)
    model = load_folder(name)
    images = image_paths(ref) if "images" in ref else None
    result = model.generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=32,
                                   do_sample=False, images=images)
    assert result.generated_ids[0] == ref["tokens"].tolist()
    m = result.metrics
    assert m.vision_tokens == (16 if images else 0)  # 4 x 4 patches
    assert (m.encode_tokens, m.prefill_tokens) == (len(ref["prompt_ids"]), 1)
    assert model.images == []  # the images were for that generation only


def test_graph_shares_the_decoder_projections_with_the_cross_keys():
    model = load_folder(TEXT)
    graph = model.model
    assert graph.getStageNames() == ["encoder", "decoder", "vision"]
    encoder = graph.getLayerNames("encoder")
    for i in range(model.NUM_DECODER_LAYERS):  # merged attention: the cross K/V of each layer
        assert {f"decoder_layer{i}_cross_wk", f"decoder_layer{i}_cross_k_norm",
                f"decoder_layer{i}_cross_wv"} <= set(encoder)
    weights = {s.full_name for s in graph.getWeightSpecs()}
    assert "decoder_layer0_wk:weight" in weights and not any("cross" in w for w in weights)
    assert not any(w.startswith("decoder_eoi") for w in weights)  # the encoder's, shared
    kinds = [(c.owner, c.kind) for c in graph.getKVCaches(stage="decoder")]
    assert ("decoder_layer0_attention", "self") in kinds
    assert ("decoder_layer0_attention", "cross") in kinds
    props = {k: v for k, v in model.attentionCoreProperties(0, 4, "encoder").items()
             if k.startswith("sliding")}
    assert props == {"sliding_window": 4, "sliding_window_right": 5}  # window 8, two-sided


def test_cli_image_greedy_json():
    ref = expected(IMAGE)
    p = run_cli(os.path.join("tests", "fixtures", IMAGE), str(ref["prompt"]), "--image",
                ref["images"][0], "--greedy", "-n", 32, "--json")
    assert p.returncode == 0, p.stderr
    record = json.loads(p.stdout.rstrip("\n").rsplit("\n", 1)[-1])
    assert record["architecture"] == "T5Gemma2ForConditionalGeneration"
    assert record["prompt_ids"] == ref["prompt_ids"].tolist()
    assert record["generated_ids"] == ref["tokens"].tolist()
    assert record["vision"]["tokens"] == 16
    assert "vision: 16 tokens" in p.stderr


def test_cli_text_only_greedy():
    ref = expected(TEXT)
    p = run_cli(os.path.join("tests", "fixtures", TEXT), str(ref["prompt"]), "--greedy", "-n",
                32, "--json")
    assert p.returncode == 0, p.stderr
    record = json.loads(p.stdout.rstrip("\n").rsplit("\n", 1)[-1])
    assert record["generated_ids"] == ref["tokens"].tolist() and "vision" not in record


@pytest.mark.parametrize("case", ["missing image", "not an image", "folder as image",
                                  "two placeholders for one image", "text model",
                                  "no preprocessor_config.json"])
def test_bad_image_input_is_one_error_line(case, tmp_path):
    folder = os.path.join("tests", "fixtures", IMAGE)
    image = os.path.join("tests", "fixtures", "images", "rgb-40x24.png")
    prompt, names = "describe:", []
    if case == "missing image":
        image, names = "no-such.png", ["--image no-such.png", "no such file"]
    elif case == "not an image":
        image, names = os.path.join(folder, "config.json"), ["config.json", "not an image"]
    elif case == "folder as image":
        image, names = folder, ["a folder"]
    elif case == "two placeholders for one image":
        prompt = "<start_of_image> and <start_of_image>"
        names = ["2 <start_of_image> for 1 image"]
    elif case == "text model":
        folder = os.path.join("tests", "fixtures", "llama-gqa3")
        names = ["LlamaForCausalLM takes no images"]
    else:
        copy = tmp_path / "t5g2"
        shutil.copytree(os.path.join(FIXTURES, IMAGE), copy)
        os.remove(copy / "preprocessor_config.json")
        folder, names = copy, ["preprocessor_config.json", "file not found"]
    p = run_cli(folder, prompt, "--image", image, "-n", 4)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    for name in names:
        assert name in lines[0], f"{name!r} not in {lines[0]!r}"


def test_image_tokens_without_an_image_are_an_error():
    model = load_folder(IMAGE)
    ids = expected(IMAGE)["prompt_ids"].tolist()
    with pytest.raises(CausalLMError, match="holds 4 image tokens for 0 image"):
        model.generate_tokens([ids], max_new_tokens=2, do_sample=False)


def test_a_tokenizer_without_the_image_tokens_runs_text(tmp_path):
    """config.json names a boi token the tokenizer lacks: a text-only run is transformers'
    (the image tokens are the processor's business, checked when an image comes), and a run
    with an image is the one-line error naming the key."""
    folder = tmp_path / "t5g2"
    shutil.copytree(os.path.join(FIXTURES, TEXT), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["encoder"]["boi_token_index"] = 4010  # below vocab_size, not a token of the tokenizer
    (folder / "config.json").write_text(json.dumps(cfg))
    ref = expected(TEXT)
    model = load_folder(str(folder))
    result = model.run(str(ref["prompt"]), do_sample=False, log_output=False)
    assert result.prompt_ids[0] == ref["prompt_ids"].tolist()
    assert result.generated_ids[0][:32] == ref["tokens"].tolist()
    image = os.path.join(FIXTURES, "images", "rgb-40x24.png")
    with pytest.raises(CausalLMError) as e:
        model.run("describe:", log_output=False, images=[image])
    assert str(e.value) == (f"{folder / 'config.json'}: boi_token_index 4010 is not a token of "
                            f"the tokenizer")


def test_nested_config_errors_name_the_section(tmp_path):
    folder = tmp_path / "t5g2"
    shutil.copytree(os.path.join(FIXTURES, TEXT), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["decoder"]["num_key_value_heads"] = 3
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CausalLMError, match="'decoder.num_key_value_heads' must be a divisor"):
        Factory.Instance().createFromFolder(str(folder))
