"""Write the precision fixture folders: an existing fixture's model under an nntr_config.json
that sets a weight dtype (no torch: the folders reuse their base's weights and expectations).

    python tools/fixtures_precision.py

Each folder ``tests/fixtures/<name>/`` holds its base's config.json and generation_config.json
and an nntr_config.json whose ``model_file_name`` and ``tokenizer_file`` name the base's
safetensors and tokenizer (``../<base>/...``) and which sets the dtype keys below; the tests
compare it with the base's ``expected.npz`` (transformers in float32):

    folder                    base               nntr_config dtypes
    llama-gqa3-fc-q8_0        llama-gqa3         fc_layer_dtype Q8_0
    qwen3-swa6-fc-q8_0        qwen3-swa6-bias    fc_layer_dtype Q8_0
    llama-gqa3-embd-q4_0      llama-gqa3         embedding_dtype Q4_0 (lmhead_dtype follows it)
"""

from __future__ import annotations

import json
import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

PRECISION_FIXTURES = {
    "llama-gqa3-fc-q8_0": ("llama-gqa3", {"fc_layer_dtype": "Q8_0"}),
    "qwen3-swa6-fc-q8_0": ("qwen3-swa6-bias", {"fc_layer_dtype": "Q8_0"}),
    "llama-gqa3-embd-q4_0": ("llama-gqa3", {"embedding_dtype": "Q4_0"}),
}
"""folder -> (base fixture, the nntr_config.json dtype keys)."""


def write(name: str) -> str:
    base, dtypes = PRECISION_FIXTURES[name]
    folder = os.path.join(FIXTURES, name)
    os.makedirs(folder, exist_ok=True)
    for file in ("config.json", "generation_config.json"):
        shutil.copyfile(os.path.join(FIXTURES, base, file), os.path.join(folder, file))
    nntr = {"model_file_name": f"../{base}/model.safetensors",
            "tokenizer_file": f"../{base}/tokenizer.json", **dtypes}
    with open(os.path.join(folder, "nntr_config.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(nntr, indent=2) + "\n")
    return folder


if __name__ == "__main__":
    for fixture in PRECISION_FIXTURES:
        print(write(fixture))
