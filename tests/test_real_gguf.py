"""The real GGUF files people download (optional: skipped without their packages, see
tests/real_files.py): SmolLM2-135M-Instruct Q4_1 (llama.cpp's converter, every matrix Q4_1, the
embedding Q8_0) and Gemma 3 270M Q4_K_M (F32 norms, Q5_0, Q8_0, Q4_K and Q6_K matrices, a
262,144-row Q8_0 embedding that is also the head).

The reference is transformers' float32 run of the same file (``from_pretrained(gguf_file=)``,
its own reader and exact dequantization; tools/fixtures_gguf.py ``--smollm2`` / ``--gemma3``):

- every weight is held in the file's own type, as the file's bytes (a view of the map, none
  converted; Llama's q / k rows copied into Hugging Face's order);
- widened exactly (``--dtype FP32``), the prompt ids, the prefill and 16 cached decode steps
  are transformers' to float rounding;
- on their own kernels (activations rounded to 8 bits per block, as llama.cpp's are), every
  teacher-forced step's next-token distribution stays within a small KL of transformers' and
  picks its token wherever transformers' choice is not a near tie.
"""

import numpy as np
import parity
import pytest

from causallm.factory import Factory
from causallm.io.gguf_file import GGUFFile

REFERENCES = {"smollm2_gguf": "smollm2-reference", "gemma3_gguf": "gemma3-270m-reference"}


@pytest.fixture(scope="module", params=list(REFERENCES))
def real(request):
    """(path, transformers' expected.npz) of one real file."""
    return request.getfixturevalue(request.param), parity.expected(REFERENCES[request.param])


def load(path, dtype=None):
    model = Factory.Instance().createFromFolder(path, init_seq_len=32, num_to_generate=32)
    model.precision.setWeightFormat(dtype)
    model.initialize()
    model.load_weight()
    return model


def test_the_files_own_tokenizer_gives_transformers_prompt_ids(smollm2_gguf):
    """SmolLM2's vocabulary metadata (tokenizer.ggml.*) encodes the reference prompt to the ids
    transformers gave; the one check here that loads no weights."""
    ref = parity.expected(REFERENCES["smollm2_gguf"])
    encoding = GGUFFile(smollm2_gguf).tokenizer().encode(str(ref["prompt"]))
    assert encoding.ids == ref["prompt_ids"].tolist()


@pytest.mark.slow
def test_every_weight_is_held_as_the_file_stores_it(real):
    path, _ = real
    file = GGUFFile(path)
    stored = {}
    for t in file.tensors.values():
        if len(t.shape) == 2:
            stored[t.tensor_type.name] = stored.get(t.tensor_type.name, 0) + 1
    model = load(path)
    held = {k: v for k, v in model.loader.heldTypes().items() if k != "F32"}
    assert held == {k: v for k, v in stored.items() if k != "F32"}
    permuted = ("_wq:", "_wk:") if file.architecture == "llama" else ()
    for spec in model.model.getWeightSpecs():
        w = model.model.getWeight(spec.full_name)
        if hasattr(w, "qtype") and not any(p in spec.full_name for p in permuted):
            assert not w.data.flags.owndata, spec.full_name  # the file's bytes, mapped


@pytest.mark.slow
def test_exact_weights_match_transformers(real):
    """--dtype FP32: the file's weights dequantized exactly, an FP32 cache."""
    path, ref = real
    model = Factory.Instance().createFromFolder(path, init_seq_len=32, num_to_generate=32,
                                                kv_cache_dtype="FP32")
    model.precision.setWeightFormat("FP32")
    model.initialize()
    model.load_weight()
    parity.check_prompt_ids(model, ref)
    parity.check_prefill_and_cached_decode(model, ref)


OWN_KERNELS_KL = 0.05
"""The largest KL divergence of a step from transformers' float32 one on the files' own
kernels (int8 activations, FP16 cache): seen 0.014 (SmolLM2; mean 0.005) and 0.009 (Gemma 3;
mean 0.004), over 16 steps; unrelated distributions of the same logits are above 1."""


@pytest.mark.slow
def test_own_kernels_follow_transformers(real):
    path, ref = real
    model = load(path)
    logits = parity.teacher_forced(model, ref)
    kl = parity.kl_divergence(ref["step_logits"], logits)
    assert kl.max() < OWN_KERNELS_KL, f"KL {kl.max():.3g} at step {kl.argmax()}"
    for k, row in enumerate(logits):
        if parity.decided(ref, k, parity.INT8_ACTIVATIONS_MARGIN):
            assert int(np.argmax(row)) == ref["tokens"][k], f"greedy token {k}"
