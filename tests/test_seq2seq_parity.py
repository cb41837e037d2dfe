"""Every text encoder-decoder fixture (T5, BART, Marian, T5Gemma2) against transformers'
numbers: the encoder output, the raw decoder logits at each of at least 24 cached steps, and
no-cache recomputes (parity.check_encoder_output, check_decoder_steps, check_decoder_no_cache).
The family files (test_t5.py, test_bart.py, test_marian.py, test_t5gemma2.py) test what is
particular to each, t5gemma2-image (which needs its image) included."""

import os

import numpy as np
import pytest
from parity import (
    FIXTURES,
    check_decoder_no_cache,
    check_decoder_steps,
    check_encoder_output,
    load_folder,
)

NAMES = ["t5-relu-tied", "t5-v11-gated-untied", "t5-flan-short", "bart-forced", "bart-scaled",
         "marian-positions-in-file", "marian-no-positions", "t5gemma2-text"]
WITH_IMAGES = {"t5gemma2-image"}


@pytest.fixture(scope="module", params=NAMES)
def case(request):
    name = request.param
    return load_folder(name), np.load(os.path.join(FIXTURES, name, "expected.npz"))


def test_every_encoder_decoder_fixture_is_here():
    found = {name for name in os.listdir(FIXTURES)
             if name.split("-")[0] in ("t5", "bart", "marian", "t5gemma2")
             and os.path.isdir(os.path.join(FIXTURES, name))}
    assert found == set(NAMES) | WITH_IMAGES


@pytest.mark.slow
def test_encoder_output(case):
    check_encoder_output(*case)


@pytest.mark.slow
def test_decoder_logits_at_every_cached_step(case):
    check_decoder_steps(*case)


def test_no_cache_recompute_equals_the_cached_steps(case):
    check_decoder_no_cache(*case)
