"""Record transformers' greedy decoding of several different prompts on existing fixture
folders, each prompt alone: tests/fixtures/sequences.npz.

Serving decodes several sequences in one step (their rows side by side, each at its own
position, a prompt chunk of one beside the decode token of another). Each sequence must get
the tokens and logits it gets alone; this file holds what transformers gives each alone.

No model is made here: each folder was written by tools/make_fixtures.py, tools/fixtures_qwen.py,
tools/fixtures_gemma3.py or tools/fixtures_gpt2.py; it is loaded with
``AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
attn_implementation="eager")`` (eval mode, no grad, one torch thread). Prompts are ids, not
text: PROMPT_LENGTHS prompts of those lengths drawn from ``[4, vocab - 8)`` with
``numpy.random.default_rng(seed)`` (seed = the folder's index in FOLDERS), so they differ from
each other in length and content and reach past a sliding window. For each prompt,
fixture_common.greedy decodes N_NEW tokens with the KV cache.

Keys, per folder f (its name with "-" as "_"):

    f/prompt_<k>        (P_k,) int64 the k-th prompt
    f/tokens_<k>        (N_NEW,) int64 its greedy tokens
    f/step_logits_<k>   (N_NEW, V) float32 the logits that chose each token
    transformers_version

    python tools/fixtures_sequences.py            # rewrites tests/fixtures/sequences.npz
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import greedy, min_margin, quiet_torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
FOLDERS = ["llama-gqa3", "qwen3-swa6-bias", "gemma3-swa-tied", "gpt2-tied"]
PROMPT_LENGTHS = [3, 11, 6, 17]
N_NEW = 12


def main() -> int:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    quiet_torch()
    out = {"transformers_version": np.array(transformers.__version__)}
    for seed, folder in enumerate(FOLDERS):
        model = AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, folder),
                                                     dtype=torch.float32,
                                                     attn_implementation="eager").eval()
        vocab = model.config.vocab_size
        rng = np.random.default_rng(seed)
        key = folder.replace("-", "_")
        for k, n in enumerate(PROMPT_LENGTHS):
            prompt = rng.integers(4, vocab - 8, size=n).astype(np.int64)
            tokens, steps = greedy(model, prompt, N_NEW)
            out[f"{key}/prompt_{k}"] = prompt
            out[f"{key}/tokens_{k}"] = tokens
            out[f"{key}/step_logits_{k}"] = steps
            print(f"{folder} prompt {k} ({n} ids): tokens {tokens.tolist()} "
                  f"min margin {min_margin(steps):.4f}")
    np.savez_compressed(os.path.join(FIXTURES, "sequences.npz"), **out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
