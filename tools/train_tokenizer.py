"""Train the project's byte-level BPE tokenizer on text that ships with Python.

Corpus: the values of ``pydoc_data.topics.topics`` (the reference manual topics that
``help()`` shows), in sorted key order, joined by blank lines (about 465 kB of English
and Python-doc prose on CPython 3.11).

Tokenizer, laid out like Llama 3's ``tokenizer.json``:

* pre-tokenizer: Sequence[Split(Llama-3 regex, "isolated"), ByteLevel(use_regex=False)],
  so every string maps to byte symbols and never to ``<unk>``;
* model: BPE over those byte symbols, trained to ``BPE_VOCAB`` entries (256 bytes + merges);
* special tokens added after the trained vocabulary, as Llama 3 does:
  ``<|begin_of_text|>`` (BOS, id ``BPE_VOCAB``) and ``<|end_of_text|>`` (EOS, id ``BPE_VOCAB + 1``),
  so the full vocabulary is ``BPE_VOCAB + 2`` = 4003 ids (deliberately not a multiple of 32);
* post-processor: TemplateProcessing ``"<|begin_of_text|> $A"`` (BOS prepended on encode);
* decoder: ByteLevel.

Also writes a minimal ``tokenizer_config.json`` so transformers' PreTrainedTokenizerFast
loads the folder. Training is single-threaded and deterministic: running the script twice
gives byte-identical files (checked with ``--check``).

Usage:  python tools/train_tokenizer.py OUT_DIR [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

BPE_VOCAB = 4001
BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
VOCAB_SIZE = BPE_VOCAB + 2

# Llama 3's pre-tokenizer split pattern (from its tokenizer.json).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def corpus_text() -> str:
    """Return the pydoc topics text: values in sorted key order, joined by blank lines."""
    import pydoc_data.topics as topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def build_tokenizer(text: str):
    """Train and return a ``tokenizers.Tokenizer`` with VOCAB_SIZE ids on ``text``."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one thread: reproducible merges
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([text], trainer=trainer)
    if tok.get_vocab_size() != BPE_VOCAB:
        raise SystemExit(f"trained {tok.get_vocab_size()} BPE entries, expected {BPE_VOCAB}")
    tok.add_special_tokens([BOS, EOS])
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    assert (bos_id, eos_id) == (BPE_VOCAB, BPE_VOCAB + 1), (bos_id, eos_id)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A:0 {BOS}:1 $B:1",
        special_tokens=[(BOS, bos_id)],
    )
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE
    return tok


CHAT_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "    {%- if message['role'] == 'system' %}\n"
    "        {{- message['content'] | trim + '\\n\\n' }}\n"
    "    {%- elif message['role'] == 'user' %}\n"
    "        {{- 'Q: ' + message['content'] | trim + '\\n' }}\n"
    "    {%- elif message['role'] == 'assistant' %}\n"
    "        {{- 'A: ' + message['content'] | trim + eos_token + '\\n' }}\n"
    "    {%- else %}\n"
    "        {{- raise_exception('roles are system, user and assistant, not ' + message['role']) }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- 'A:' }}\n"
    "{%- endif %}\n")
"""The embedded model's chat template. Its vocabulary has no turn tokens, so turns are plain
text: the system prompt, then ``Q: ...`` per user turn and ``A: ...`` + EOS per reply; a reply
ends with the EOS token, which generation already stops at."""


def tokenizer_config() -> dict:
    """The minimal tokenizer_config.json that lets transformers load tokenizer.json, with the
    chat template."""
    return {
        "bos_token": BOS,
        "eos_token": EOS,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 512,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }


def write_tokenizer(tok, out_dir: str) -> None:
    """Write tokenizer.json and tokenizer_config.json into ``out_dir`` (created if missing)."""
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=True)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(), f, indent=2)
        f.write("\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--check", action="store_true", help="train twice and compare the JSON")
    args = ap.parse_args(argv)
    text = corpus_text()
    tok = build_tokenizer(text)
    if args.check:
        again = build_tokenizer(text)
        if tok.to_str() != again.to_str():
            raise SystemExit("tokenizer training is not deterministic")
    write_tokenizer(tok, args.out_dir)
    digest = hashlib.sha256(tok.to_str().encode()).hexdigest()[:16]
    n = len(tok.encode(text).ids)
    print(f"python {sys.version.split()[0]}; corpus {len(text)} chars -> {n} tokens; "
          f"vocab {tok.get_vocab_size(with_added_tokens=True)}; sha256[:16] {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
