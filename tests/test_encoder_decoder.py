"""The EncoderDecoder base (models/encoder_decoder.py) on its own: a Llama-style encoder-decoder
(RMS norms, RoPE self-attention, SwiGLU, cross-attention) from a plain config, random weights.

No Hugging Face class has exactly this shape (T5 is checked against transformers in
test_t5.py), so these tests check the structure: the encoder is bidirectional and runs once,
the decoder is causal, cached decoding equals a no-cache recompute, and the layer names and
stages are the note's (docs/nntrainer.md, "What the note plans").
"""

import json
import os
import shutil

import numpy as np
import pytest
from parity import FIXTURES, assert_logits_close

from causallm.errors import CausalLMError
from causallm.io.config import load_model_configs
from causallm.models.encoder_decoder import EncoderDecoder

CONFIG = {"architectures": ["EncoderDecoder"], "vocab_size": 2408, "hidden_size": 48,
          "intermediate_size": 80, "num_hidden_layers": 2, "num_decoder_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True,
          "decoder_start_token_id": 0, "eos_token_id": 1}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("encdec")
    shutil.copy(os.path.join(FIXTURES, "t5-flan-short", "tokenizer.json"), folder)
    json.dump(CONFIG, open(folder / "config.json", "w"))
    cfg, gen, nntr = load_model_configs(str(folder))
    nntr.update(init_seq_len=16, num_to_generate=12, max_seq_len=12)
    m = EncoderDecoder(cfg, gen, nntr)
    m.initialize()
    rng = np.random.default_rng(0)
    for spec in m.model.getWeightSpecs():  # norm gains 1 + N(0, 0.1^2), the rest N(0, 0.3^2)
        w = rng.standard_normal(spec.shape).astype(np.float32)
        m.model.setWeight(spec.full_name, 1 + 0.1 * w if spec.full_name.endswith(":gamma")
                          else 0.3 * w)
    return m


PROMPT = np.array([[5, 17, 300, 42, 9, 1]])
DECODED = [0, 11, 12, 13, 14, 15, 16]


def test_names_stages_and_shared_embedding(model):
    names = model.model.getLayerNames()
    assert names[:3] == ["encoder_input0", "encoder_embedding0", "encoder_layer0_attention_norm"]
    for name in ("encoder_layer1_encoder_output", "encoder_output_norm", "decoder_layer2_cross_wq",
                 "decoder_layer2_cross_attention_out", "decoder_output_norm",
                 "output_of_encoder_decoder"):
        assert name in names
    assert "decoder_layer0_cross_wk" in model.model.getLayerNames("encoder")
    weights = [s.full_name for s in model.model.getWeightSpecs()]
    assert weights[0] == "encoder_embedding0:Embedding"
    assert not any(w.startswith(("decoder_embedding0", "output_of_encoder_decoder"))
                   for w in weights)  # one embedding: the decoder's and the head share it


def test_encoder_is_bidirectional(model):
    a = model.encode(PROMPT)
    changed = PROMPT.copy()
    changed[0, -2] = 99
    b = model.encode(changed)
    assert np.abs(a[0, 0] - b[0, 0]).max() > 1e-4  # an early row sees a later token


def test_decoder_is_causal_and_cached_equals_recompute(model):
    model.encode(PROMPT)
    cached = [model.decode(np.array([[t]]), k)[0] for k, t in enumerate(DECODED)]
    for k in range(len(DECODED)):
        full = model.decode(np.array([DECODED[:k + 1]]), 0)[0]
        assert_logits_close(full, cached[k], f"no-cache prefix {k}", rtol=2e-5)
    # a later decoder token does not change an earlier position's logits
    other = model.decode(np.array([DECODED[:3] + [99]]), 0)[0]
    assert np.abs(other - cached[3]).max() > 1e-4


def test_generation_starts_from_the_decoder_start_token(model):
    result = model.generate_tokens(PROMPT.tolist(), max_new_tokens=5, do_sample=False)
    model.encode(PROMPT)
    first = int(np.argmax(model.decode(np.array([[0]]), 0)[0]))
    assert result.generated_ids[0][0] == first
    assert result.metrics.encode_tokens == PROMPT.shape[1]


def test_decoder_positions_are_bounded(model):
    model.encode(PROMPT)
    with pytest.raises(CausalLMError, match="decoder position 13 is past its 12 positions"):
        model.decode(np.array([[5]]), 12)
