"""The layers the post-norm encoder-decoders bring (BART, Marian, the paper's model), each
against its formula: learned positions with an offset, sinusoidal positions, the logit bias."""

import math

import numpy as np
import pytest
from graphs import build, feature_input

from causallm.api import createLayer, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.layers.logit_bias import LogitBiasLayer
from causallm.layers.positional_embedding import PositionalEmbeddingLayer
from causallm.layers.sinusoidal_embedding import SinusoidalEmbeddingLayer

for _cls in (LogitBiasLayer, PositionalEmbeddingLayer, SinusoidalEmbeddingLayer):
    registerFactory(_cls)

F32 = np.float32


def rand(*shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def infer(model, x, from_, to, width):
    batch = x.shape[0]
    out = model.incremental_inference(batch, [x.reshape(batch, -1)], None, None, from_, to)[0]
    return out.reshape(batch, -1, width)[:, :to - from_]


def test_learned_positions_with_an_offset():
    """BART: position p reads row p + 2 of a table of max_positions + 2 rows."""
    B, H, W, P = 2, 4, 8, 10
    model = build([feature_input("x", H, W), createLayer("positional_embedding", [
        withKey("name", "pos"), withKey("max_position_embeddings", P + 2),
        withKey("offset", 2)])], batch=B)
    table = rand(P + 2, W, seed=1)
    model.setWeight("pos:Embedding", table)
    x = rand(B, H, W, seed=2)
    np.testing.assert_allclose(infer(model, x, 5, 8, W), x[:, :3] + table[7:10], rtol=1e-6)
    with pytest.raises(CausalLMError, match="position 10 is past max_position_embeddings 10"):
        infer(model, x, 8, 11, W)


@pytest.mark.parametrize("dim", [8, 7])
def test_sinusoidal_positions(dim):
    """S[p, j] = sin(p / 10000^(2j/D)) in the first ceil(D/2) columns, cos in the rest."""
    H, P = 3, 20
    model = build([feature_input("x", H, dim), createLayer("sinusoidal_embedding", [
        withKey("name", "pos"), withKey("max_position_embeddings", P)])])
    assert model.getWeightSpecs() == []  # computed, not loaded
    x = rand(1, H, dim, seed=3)
    got = infer(model, x, 11, 14, dim)[0]
    half = (dim + 1) // 2
    for i, p in enumerate(range(11, 14)):
        want = [math.sin(p / 10000 ** (2 * j / dim)) for j in range(half)] + \
               [math.cos(p / 10000 ** (2 * j / dim)) for j in range(dim - half)]
        np.testing.assert_allclose(got[i], x[0, i] + np.array(want, dtype=F32), rtol=1e-6,
                                   atol=1e-6)


def test_logit_bias_adds_one_row():
    B, W = 3, 11
    model = build([feature_input("x", 1, W), createLayer("logit_bias", [withKey("name", "b")])],
                  batch=B)
    bias = rand(W, seed=4)
    model.setWeight("b:bias", bias)
    x = rand(B, 1, W, seed=5)
    np.testing.assert_allclose(infer(model, x, 0, 1, W), x + bias, rtol=1e-6)
