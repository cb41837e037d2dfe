"""LlamaForCausalLM against Hugging Face transformers, on committed fixtures.

tools/make_fixtures.py built each folder with transformers (tiny random weights, a real
tokenizer.json) and stored what transformers computed: the prompt ids, the prefill logits of the
last prompt position, 32+ greedy tokens generated with its KV cache and the logits behind each,
and a no-cache forward over the whole sequence. Nothing here imports torch or transformers.
"""

import os

import numpy as np
import pytest

from causallm.config import load_model_configs
from models.causal_lm import CausalLM

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
LLAMA_FIXTURES = ["llama-gqa3", "llama-hd80-bf16-sharded", "llama-f16-yarn-bias"]


def load(name, **nntr):
    cfg, gen, nntr_cfg = load_model_configs(os.path.join(FIXTURES, name))
    nntr_cfg.update(nntr)
    model = CausalLM(cfg, gen, nntr_cfg)
    model.initialize()
    model.load_weight(os.path.join(FIXTURES, name))
    return model


def expected(name):
    return np.load(os.path.join(FIXTURES, name, "expected.npz"))


def assert_logits_close(ours, ref, what):
    scale = max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(ours - ref).max())
    assert err <= 2e-4 * scale, f"{what}: max |diff| {err:.3g} (logit scale {scale:.3g})"


@pytest.mark.parametrize("name", LLAMA_FIXTURES)
def test_prompt_ids_match_tokenizer_json(name):
    ref = expected(name)
    model = load(name, init_seq_len=64, num_to_generate=64)
    assert model.tokenizer.Encode(str(ref["prompt"])) == ref["prompt_ids"].tolist()


@pytest.mark.parametrize("name", LLAMA_FIXTURES)
def test_prefill_and_cached_decode_match_transformers(name):
    ref = expected(name)
    model = load(name, init_seq_len=64, num_to_generate=64)
    ids = ref["prompt_ids"].astype(np.float32)[None, :]
    P = ids.shape[1]
    logits = model.model.incremental_inference(1, [ids], None, P, 0, P)[0][0]
    assert_logits_close(logits, ref["prefill_logits"], "prefill")
    tokens = ref["tokens"]
    assert int(np.argmax(logits)) == tokens[0]
    # teacher-forced cached decode: each step's logits against transformers'
    for k in range(1, len(tokens)):
        step = np.array([[tokens[k - 1]]], dtype=np.float32)
        pos = P + k - 1
        logits = model.model.incremental_inference(1, [step], None, 1, pos, pos + 1)[0][0]
        assert_logits_close(logits, ref["step_logits"][k], f"decode step {k}")
        assert int(np.argmax(logits)) == tokens[k], f"greedy token {k}"


@pytest.mark.parametrize("name", LLAMA_FIXTURES)
def test_greedy_generation_gives_transformers_tokens(name):
    ref = expected(name)
    model = load(name, init_seq_len=64, num_to_generate=64)
    n = len(ref["tokens"])
    result = model.generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=n, do_sample=False)
    assert result.generated_ids[0] == ref["tokens"].tolist()


@pytest.mark.parametrize("name", LLAMA_FIXTURES)
def test_one_shot_forward_matches_no_cache_reference(name):
    """Prefill of prompt + tokens[:-1] in one step equals transformers' no-cache forward."""
    ref = expected(name)
    seq = np.concatenate([ref["prompt_ids"], ref["tokens"][:-1]]).astype(np.float32)[None, :]
    model = load(name, init_seq_len=seq.shape[1], num_to_generate=8)
    logits = model.model.incremental_inference(1, [seq], None, seq.shape[1], 0, seq.shape[1])[0][0]
    assert_logits_close(logits, ref["full_logits_last"], "one-shot forward")
    assert_logits_close(logits, ref["step_logits"][-1], "one-shot vs cached")


def test_chunked_prefill_equals_one_shot():
    """A prompt longer than init_seq_len is prefilled in chunks with the same result."""
    ref = expected("llama-gqa3")
    model = load("llama-gqa3", init_seq_len=5, num_to_generate=64)
    n = len(ref["tokens"])
    result = model.generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=n, do_sample=False)
    assert result.generated_ids[0] == ref["tokens"].tolist()
