"""Train the BART / RoBERTa-style byte-level BPE tokenizer of the BART fixtures on text that
ships with Python.

Corpus: ``pydoc_data.topics`` as tools/train_tokenizer.py builds it (topic texts in sorted key
order, joined by blank lines).

Tokenizer, laid out like facebook/bart-base's ``tokenizer.json`` (GPT-2's byte-level BPE with
fairseq's special tokens):

* normalizer: none;
* pre-tokenizer: ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True), GPT-2's
  split regex, so every string maps to byte symbols and never to ``<unk>``;
* model: BPE (no unk_token, no dropout, fuse_unk false), ``<s>`` = 0, ``<pad>`` = 1,
  ``</s>`` = 2, ``<unk>`` = 3, then the 256 byte symbols and the trained merges (BPE_VOCAB ids
  with the specials), then ``<mask>`` = BPE_VOCAB last, as BART's vocab.json has it (in the
  model vocabulary, not only an added token): VOCAB_SIZE = 2501 ids (deliberately not a
  multiple of 32);
* added tokens: the five specials at their model ids, ``<mask>`` with lstrip (as BART's);
* post-processor: RobertaProcessing(sep ("</s>", 2), cls ("<s>", 0)): encoding gives
  ``<s> ... </s>`` (pairs ``<s> A </s></s> B </s>``);
* decoder: ByteLevel.

Training is single-threaded (RAYON_NUM_THREADS=1) and deterministic: ``--check`` trains twice and
compares the JSON. Also writes the ``tokenizer_config.json`` that lets transformers'
AutoTokenizer (BartTokenizer, in transformers 5 an alias of the tokenizers-backed
RobertaTokenizer) load the folder with the same ids; ``--check`` verifies that too.

Usage:  python tools/train_bart_tokenizer.py OUT_DIR [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_tokenizer import corpus_text  # noqa: E402

BPE_VOCAB = 2500
"""BpeTrainer's vocab_size: the 4 specials, the 256 bytes and 2240 merges."""
BOS, PAD, EOS, UNK, MASK = "<s>", "<pad>", "</s>", "<unk>", "<mask>"
BOS_ID, PAD_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
MASK_ID = BPE_VOCAB
VOCAB_SIZE = BPE_VOCAB + 1
SPECIALS = [BOS, PAD, EOS, UNK]


def pre_tokenizer():
    from tokenizers import pre_tokenizers
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)


def train_bpe(text: str) -> tuple[dict[str, int], list]:
    """The trained (vocab, merges): the 4 specials first, then bytes and merged symbols."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one thread: reproducible merges
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB, min_frequency=2, show_progress=False, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    if len(vocab) != BPE_VOCAB:
        raise SystemExit(f"trained {len(vocab)} BPE entries, expected {BPE_VOCAB}")
    assert [vocab[t] for t in SPECIALS] == [BOS_ID, PAD_ID, EOS_ID, UNK_ID], vocab
    return vocab, [tuple(m) if isinstance(m, list) else tuple(m.split(" "))
                   for m in model["merges"]]


def build_tokenizer(text: str):
    """Train and return the ``tokenizers.Tokenizer`` (VOCAB_SIZE ids) on ``text``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    vocab, merges = train_bpe(text)
    vocab = dict(vocab)
    vocab[MASK] = MASK_ID
    tok = Tokenizer(models.BPE(vocab, merges, dropout=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS]
                           + [AddedToken(MASK, lstrip=True, normalized=False, special=True)])
    tok.post_processor = processors.RobertaProcessing(
        (EOS, EOS_ID), (BOS, BOS_ID), trim_offsets=True, add_prefix_space=False)
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE
    assert [tok.token_to_id(t) for t in SPECIALS + [MASK]] == [0, 1, 2, 3, MASK_ID]
    return tok


def tokenizer_config(model_max_length: int = 1024) -> dict:
    """tokenizer_config.json as BART's (the tokenizers-backed BartTokenizer, no prefix space)."""
    return {
        "add_prefix_space": False,
        "bos_token": BOS,
        "clean_up_tokenization_spaces": False,
        "cls_token": BOS,
        "eos_token": EOS,
        "errors": "replace",
        "mask_token": MASK,
        "model_max_length": model_max_length,
        "pad_token": PAD,
        "sep_token": EOS,
        "tokenizer_class": "BartTokenizer",
        "trim_offsets": True,
        "unk_token": UNK,
    }


def write_tokenizer(tok, out_dir: str, pretty: bool = True, model_max_length: int = 1024) -> None:
    """Write tokenizer.json and tokenizer_config.json into ``out_dir`` (created if missing)."""
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=pretty)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(model_max_length), f, indent=2)
        f.write("\n")


CHECK_TEXTS = ["The house is small.", " Leading space, two  spaces,\na newline and tabs\t.",
               "My friends are <mask> but they eat too many carbs.", "caf\u00e9 \u2014 \u00fcber"]


def check_transformers(out_dir: str, texts=CHECK_TEXTS) -> None:
    """transformers' AutoTokenizer on out_dir encodes texts as tokenizer.json does
    (``<s>`` first, ``</s>`` last) and decodes them back."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(out_dir)
    assert len(hf) == VOCAB_SIZE, len(hf)
    assert (hf.bos_token_id, hf.pad_token_id, hf.eos_token_id, hf.unk_token_id,
            hf.mask_token_id) == (BOS_ID, PAD_ID, EOS_ID, UNK_ID, MASK_ID)
    for text in texts:
        ids = tok.encode(text).ids
        assert ids[0] == BOS_ID and ids[-1] == EOS_ID and UNK_ID not in ids, (text, ids)
        assert hf(text)["input_ids"] == ids, (text, hf(text)["input_ids"], ids)
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
        if MASK not in text:
            assert tok.decode(ids) == text, (text, tok.decode(ids))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--check", action="store_true",
                    help="train twice and compare the JSON; check transformers' ids")
    args = ap.parse_args(argv)
    text = corpus_text()
    tok = build_tokenizer(text)
    if args.check and build_tokenizer(text).to_str() != tok.to_str():
        raise SystemExit("tokenizer training is not deterministic")
    write_tokenizer(tok, args.out_dir)
    if args.check:
        check_transformers(args.out_dir)
    digest = hashlib.sha256(tok.to_str().encode()).hexdigest()[:16]
    n = len(tok.encode(text).ids)
    print(f"python {sys.version.split()[0]}; corpus {len(text)} chars -> {n} tokens; "
          f"vocab {tok.get_vocab_size(with_added_tokens=True)}; sha256[:16] {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
