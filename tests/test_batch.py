"""batch_size > 1: every row is its own sequence (NNTrainer mixes rows up: docs/nntrainer.md,
"Batch rows mixed up")."""

import os
from dataclasses import replace

import numpy as np

from causallm.io.config import load_model_configs
from causallm.models.causal_lm import CausalLM

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "llama-gqa3")


def load(batch):
    cfg, gen, nntr = load_model_configs(FIXTURE)
    nntr.update(batch_size=batch, init_seq_len=32, num_to_generate=32)
    model = CausalLM(cfg, gen, nntr)
    model.initialize()
    model.load_weight(FIXTURE)
    return model


def test_batch_rows_match_single_runs():
    ref = np.load(os.path.join(FIXTURE, "expected.npz"))
    prompt = ref["prompt_ids"].tolist()
    other = [prompt[0]] + prompt[:0:-1]  # same length, different tokens
    single = load(1)
    other_alone = single.generate_tokens([other], max_new_tokens=24, do_sample=False)
    model = load(2)
    result = model.generate_tokens([prompt, other], max_new_tokens=24, do_sample=False)
    assert result.generated_ids[0] == ref["tokens"][:24].tolist()
    assert result.generated_ids[1] == other_alone.generated_ids[0]
    assert result.generated_ids[0] != result.generated_ids[1]


def test_batch_rows_sample_independently_and_stop_on_their_own_eos():
    model = load(2)
    prompt = model.tokenizer.Encode("The for statement")
    model.setGenerationOptions(seed=3, temperature=1.5, top_k=0, top_p=1.0)
    result = model.generate_tokens([prompt, prompt], max_new_tokens=12, do_sample=True)
    assert result.generated_ids[0] != result.generated_ids[1]
    # make the first token of row 0 that row 1 never draws an EOS: row 0 stops there, row 1
    # goes on to the end
    rows = result.generated_ids
    k = next(i for i, t in enumerate(rows[0]) if t not in rows[1])
    assert k < 11  # row 0 stops before its end
    again = model.generate_tokens([prompt, prompt], max_new_tokens=12, do_sample=True,
                                  settings=replace(model.generation, eos_token_id=[rows[0][k]]))
    assert again.generated_ids[0] == rows[0][:k + 1]
    assert again.finish_reasons[0] == "eos"
    assert again.generated_ids[1] == rows[1]
    assert again.finish_reasons[1] == "length"
