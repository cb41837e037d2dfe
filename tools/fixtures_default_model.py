"""Make tests/fixtures/tiny-llama-default.json: what transformers generates for the embedded model.

``python main.py`` without arguments runs res/tiny-llama on nntr_config.json's ``sample_input``
for ``num_to_generate`` tokens, greedy with generation_config.json's ``repetition_penalty``
(``do_sample`` false). This script runs the same with transformers' LlamaForCausalLM in float32
(the BF16 weights widened exactly) and ``generate``, and stores

    prompt, prompt_ids     the sample_input and its tokenizer.json encoding (BOS first)
    generated_ids          the greedy new tokens (an EOS that ended the run included)
    text                   their decoding, special tokens skipped: what the CLI prints
    min_margin             the smallest gap between the best and the second-best processed
                           score over the steps (how far a rounding difference is from a tie)
    transformers_version

Usage:  python tools/fixtures_default_model.py [--out tests/fixtures/tiny-llama-default.json]
"""

from __future__ import annotations

import argparse
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "res", "tiny-llama")


def main() -> None:
    import torch
    import transformers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures",
                                                 "tiny-llama-default.json"))
    args = p.parse_args()

    with open(os.path.join(MODEL, "nntr_config.json")) as f:
        nntr = json.load(f)
    with open(os.path.join(MODEL, "generation_config.json")) as f:
        gen = json.load(f)
    assert not gen.get("do_sample", False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(MODEL, "tokenizer.json"))
    model = LlamaForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    prompt = nntr["sample_input"]
    prompt_ids = tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=nntr["num_to_generate"],
                             do_sample=False, num_beams=1,
                             repetition_penalty=gen["repetition_penalty"],
                             eos_token_id=gen["eos_token_id"], pad_token_id=gen["eos_token_id"],
                             return_dict_in_generate=True, output_scores=True)
    generated = out.sequences[0, len(prompt_ids):].tolist()
    margins = [float(top[0] - top[1]) for top in
               (torch.topk(s[0], 2).values for s in out.scores)]
    record = {"prompt": prompt, "prompt_ids": prompt_ids, "generated_ids": generated,
              "text": tokenizer.decode(generated, skip_special_tokens=True),
              "min_margin": round(min(margins), 6),
              "transformers_version": transformers.__version__}
    with open(args.out, "w") as f:  # one key a line
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
                                   for k, v in record.items()) + "\n}\n")
    print(f"wrote {args.out}: {len(generated)} tokens, min margin {record['min_margin']}")


if __name__ == "__main__":
    main()
