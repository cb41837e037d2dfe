"""Make tests/fixtures/tokenizers/: two small tokenizer.json files and what transformers does with
them.

Both are trained here from a few lines of text, small enough that multi-byte characters are
split over several tokens:

    byte_level.json      byte-level BPE (GPT-2 / Qwen / Llama-3 style): ByteLevel
                         pre-tokenizer and decoder, ``<|endoftext|>``
    sentencepiece.json   SentencePiece-style BPE (Llama-2 / Gemma style): ``▁`` for spaces,
                         ``<0xNN>`` byte-fallback tokens, decoder Replace + ByteFallback + Fuse +
                         Strip, ``<unk>`` ``<s>`` ``</s>``, a post-processor adding ``<s>``

``expected.json`` holds, per file, what transformers' PreTrainedTokenizerFast gives for TEXTS:
``vocab_size`` (``len(tokenizer)``), and per text the ids with and without special tokens and
``decode`` of the ids with special tokens, skipping them and keeping them. The training is
deterministic for one ``tokenizers`` version; the committed files are the reference.

Usage:  python tools/fixtures_tokenizer.py [--out tests/fixtures/tokenizers]
"""

from __future__ import annotations

import argparse
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LINES = [
    "Héllo wörld! Ça va? naïve café, déjà vu, Ærøskøbing",
    "emoji 😀🎉 and 👍🏽 family 👨‍👩‍👧 done",
    "日本語のテキスト and more text",
    "the quick brown fox jumps over the lazy dog",
]
TEXTS = LINES + ["Ça 😀 va très bien 🎉🎉, merci! 日本", "no special characters at all",
                 "the fox", "a 🙂 b"]


def byte_level_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(LINES, trainer)
    return tok


def sentencepiece_bpe():
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=40, show_progress=False)
    tok.train_from_iterator(LINES, trainer)
    spec = json.loads(tok.to_str())  # add the 256 byte-fallback tokens to the model's vocab
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    return tok


def main() -> None:
    import transformers
    from transformers import PreTrainedTokenizerFast

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "tokenizers"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    expected = {"transformers_version": transformers.__version__}
    for name, build in (("byte_level", byte_level_bpe), ("sentencepiece", sentencepiece_bpe)):
        path = os.path.join(args.out, f"{name}.json")
        build().save(path)
        tok = PreTrainedTokenizerFast(tokenizer_file=path)
        rows = []
        for text in TEXTS:
            ids = tok(text)["input_ids"]
            rows.append({"text": text, "ids": ids,
                         "ids_without_special": tok(text, add_special_tokens=False)["input_ids"],
                         "decode_skip_special": tok.decode(ids, skip_special_tokens=True),
                         "decode_with_special": tok.decode(ids, skip_special_tokens=False)})
        expected[name] = {"vocab_size": len(tok), "texts": rows}
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: byte_level.json, sentencepiece.json, expected.json")


if __name__ == "__main__":
    main()
