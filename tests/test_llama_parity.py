"""LlamaForCausalLM against Hugging Face transformers, on committed fixtures.

tools/make_fixtures.py built each folder with transformers (tiny random weights, a real
tokenizer.json) and stored what transformers computed: the prompt ids, the prefill logits of the
last prompt position, 32+ greedy tokens generated with its KV cache and the logits behind each,
and a no-cache forward over the whole sequence. The checks are tests/parity.py's. Nothing here
imports torch or transformers.
"""

import pytest

import parity
from causallm.models.causal_lm import CausalLM

LLAMA_FIXTURES = ["llama-gqa3", "llama-hd80-bf16-sharded", "llama-f16-yarn-bias"]


def load(name, **nntr):
    return parity.load(CausalLM, name, **nntr)


@pytest.mark.parametrize("name", LLAMA_FIXTURES)
def test_prompt_ids_match_tokenizer_json(name):
    parity.check_prompt_ids(load(name), parity.expected(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", LLAMA_FIXTURES)
def test_prefill_and_cached_decode_match_transformers(name):
    parity.check_prefill_and_cached_decode(load(name), parity.expected(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", LLAMA_FIXTURES)
def test_greedy_generation_gives_transformers_tokens(name):
    parity.check_greedy(load(name), parity.expected(name))


@pytest.mark.parametrize("name", LLAMA_FIXTURES)
def test_one_shot_forward_matches_no_cache_reference(name):
    """Prefill of prompt + tokens[:-1] in one step equals transformers' no-cache forward."""
    ref = parity.expected(name)
    model = load(name, init_seq_len=len(parity.full_sequence(ref)), num_to_generate=8)
    logits = parity.check_one_shot(model, ref)
    parity.assert_logits_close(logits, ref["step_logits"][-1], "one-shot vs cached")


def test_chunked_prefill_equals_one_shot():
    """A prompt longer than init_seq_len is prefilled in chunks with the same result."""
    parity.check_chunked_prefill(load("llama-gqa3", init_seq_len=5), parity.expected("llama-gqa3"))
