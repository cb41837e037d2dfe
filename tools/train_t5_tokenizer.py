"""Train the T5-style Unigram tokenizer of the T5 fixtures on text that ships with Python.

Corpus: ``pydoc_data.topics`` as tools/train_tokenizer.py builds it (topic texts in sorted key
order, joined by blank lines).

Tokenizer, laid out like a T5 / Flan-T5 ``tokenizer.json`` (SentencePiece Unigram converted by
transformers):

* normalizer: none (T5's Precompiled charsmap is not needed for ASCII prose);
* pre-tokenizer: Sequence[WhitespaceSplit, Metaspace("▁", prepend_scheme "always", split)], as
  transformers' T5Tokenizer builds it: runs of whitespace (newlines included) separate words and
  every word starts with "▁";
* model: Unigram, ``<pad>`` = 0, ``</s>`` = 1, ``<unk>`` = 2 (``unk_id`` 2) with score 0, then
  the trained pieces by descending score, then the sentinels ``<extra_id_{EXTRA_IDS-1}>`` ...
  ``<extra_id_0>`` (score 0; ``<extra_id_0>`` has the highest id, as in T5), TRAINED + EXTRA_IDS
  = 2408 ids in all (deliberately not a multiple of 32);
* added tokens: the three specials and the sentinels (special, at their model ids);
* post-processor: TemplateProcessing single ``$A </s>``, pair ``$A </s> $B </s>`` (encoding
  appends EOS, as T5's does);
* decoder: Metaspace.

The Unigram trainer of ``tokenizers`` is not bit-reproducible even on one thread: it iterates
hash maps, so tied pieces come out in varying order, scores vary in the last bits and the
required characters it adds at the end (characters the trained pieces do not cover) get the
scores ``min + k * 1e-4`` in a random order. :func:`canonical_pieces` removes that: scores
rounded to 6 decimals, that block of added characters re-scored in code-point order, pieces
sorted by (score descending, piece). The piece set itself is stable; ``--check`` trains three
times and compares the resulting JSON.

Also writes the ``tokenizer_config.json`` that lets transformers' AutoTokenizer (T5Tokenizer)
load the folder with the same ids.

Usage:  python tools/train_t5_tokenizer.py OUT_DIR [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_tokenizer import corpus_text  # noqa: E402

TRAIN_VOCAB = 2400
"""UnigramTrainer's vocab_size: the 3 specials and 2397 pieces."""
EXTRA_IDS = 8
PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
VOCAB_SIZE = TRAIN_VOCAB + EXTRA_IDS
SENTINELS = [f"<extra_id_{i}>" for i in range(EXTRA_IDS)]
"""``<extra_id_0>`` ... ``<extra_id_7>``; ``<extra_id_i>`` has id VOCAB_SIZE - 1 - i."""
PENALTY_DELTA = 1e-4
"""The step of the scores tokenizers' UnigramTrainer gives the required characters it adds."""


def pre_tokenizer():
    from tokenizers import pre_tokenizers
    return pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
    ])


def train_pieces(text: str) -> list[tuple[str, float]]:
    """The trained (piece, score) list, the three specials excluded, as the trainer gives it."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import Tokenizer, models, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizer()
    trainer = trainers.UnigramTrainer(vocab_size=TRAIN_VOCAB, special_tokens=[PAD, EOS, UNK],
                                      unk_token=UNK, max_piece_length=16, show_progress=False)
    tok.train_from_iterator([text], trainer=trainer)
    vocab = json.loads(tok.to_str())["model"]["vocab"]
    assert [p for p, _ in vocab[:3]] == [PAD, EOS, UNK], vocab[:3]
    if len(vocab) != TRAIN_VOCAB:
        raise SystemExit(f"trained {len(vocab)} Unigram entries, expected {TRAIN_VOCAB}")
    return [(p, float(s)) for p, s in vocab[3:]]


def canonical_pieces(pieces: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Pieces with reproducible scores and order (see the module docstring)."""
    low = min(s for _, s in pieces)
    added = []  # single characters scored low + k * PENALTY_DELTA by the trainer's finalize
    for p, s in pieces:
        k = (s - low) / PENALTY_DELTA
        if len(p) == 1 and k < len(pieces) and abs(k - round(k)) < 1e-4:
            added.append(p)
    added.sort()
    rescored = {p: low + i * PENALTY_DELTA for i, p in enumerate(added)}
    out = [(p, round(rescored.get(p, s), 6)) for p, s in pieces]
    return sorted(out, key=lambda ps: (-ps[1], ps[0]))


def build_tokenizer(text: str):
    """Train and return the ``tokenizers.Tokenizer`` (VOCAB_SIZE ids) on ``text``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    vocab = [(PAD, 0.0), (EOS, 0.0), (UNK, 0.0)] + canonical_pieces(train_pieces(text))
    vocab += [(s, 0.0) for s in reversed(SENTINELS)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=UNK_ID, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizer()
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t in [PAD, EOS, UNK] + list(reversed(SENTINELS))])
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, EOS_ID)])
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE
    assert [tok.token_to_id(t) for t in (PAD, EOS, UNK)] == [PAD_ID, EOS_ID, UNK_ID]
    assert tok.token_to_id(SENTINELS[0]) == VOCAB_SIZE - 1
    return tok


def tokenizer_config() -> dict:
    """tokenizer_config.json as T5's (T5Tokenizer, the sentinels as additional special tokens)."""
    return {
        "additional_special_tokens": SENTINELS,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "extra_ids": EXTRA_IDS,
        "model_max_length": 512,
        "pad_token": PAD,
        "tokenizer_class": "T5Tokenizer",
        "unk_token": UNK,
    }


def write_tokenizer(tok, out_dir: str, pretty: bool = True) -> None:
    """Write tokenizer.json and tokenizer_config.json into ``out_dir`` (created if missing)."""
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=pretty)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(), f, indent=2)
        f.write("\n")


def check_transformers(out_dir: str, texts) -> None:
    """transformers' AutoTokenizer on out_dir encodes texts as tokenizer.json does (</s> last)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(out_dir)
    assert len(hf) == VOCAB_SIZE, len(hf)
    assert (hf.eos_token_id, hf.pad_token_id, hf.unk_token_id) == (EOS_ID, PAD_ID, UNK_ID)
    for text in texts:
        ids = tok.encode(text).ids
        assert ids[-1] == EOS_ID and EOS_ID not in ids[:-1], (text, ids)
        assert hf(text)["input_ids"] == ids, (text, hf(text)["input_ids"], ids)
        assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids), text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--check", action="store_true",
                    help="train three times and compare the JSON; check transformers' ids")
    args = ap.parse_args(argv)
    text = corpus_text()
    tok = build_tokenizer(text)
    if args.check:
        for _ in range(2):
            if build_tokenizer(text).to_str() != tok.to_str():
                raise SystemExit("tokenizer training is not deterministic")
    write_tokenizer(tok, args.out_dir)
    if args.check:
        check_transformers(args.out_dir, ["translate English to German: The house is small.",
                                          "  Two  spaces,\na newline and <extra_id_0> a sentinel."])
    digest = hashlib.sha256(tok.to_str().encode()).hexdigest()[:16]
    n = len(tok.encode(text).ids)
    print(f"python {sys.version.split()[0]}; corpus {len(text)} chars -> {n} tokens; "
          f"vocab {tok.get_vocab_size(with_added_tokens=True)}; sha256[:16] {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
