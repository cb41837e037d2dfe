"""Make the tokenizer.json of a Marian (opus-mt) folder from its source.spm and vocab.json.

Marian folders on the Hub (Helsinki-NLP/opus-mt-*) ship ``source.spm``, ``target.spm``,
``vocab.json`` and ``tokenizer_config.json`` but no ``tokenizer.json``; transformers reads them
with the slow, sentencepiece-based ``MarianTokenizer``. This tool writes ``FOLDER/tokenizer.json``
(Hugging Face ``tokenizers`` format, which the runtime reads; written to a temporary file and
renamed) that encodes text to ``MarianTokenizer(FOLDER)(text)["input_ids"]``, ``</s>`` appended,
and decodes ids (``skip_special_tokens=True``) to ``MarianTokenizer.decode``'s text. Building
it needs only ``tokenizers``: the spm model proto is read by a small protobuf wire-format
parser, so neither protobuf, sentencepiece nor torch is imported; ``--check`` also needs
transformers (whose MarianTokenizer runs sentencepiece).

How MarianTokenizer (transformers 5.23) encodes: the special tokens ``</s>``, ``<unk>``,
``<pad>`` are split out of the text first; a segment that starts with ``>>`` and contains
``<<`` loses that prefix, which becomes one token (its vocab.json id, or ``<unk>``); the rest
goes through the *source* spm (``encode(text, out_type=str)``) and each piece is looked up in
vocab.json (a miss is ``<unk>``); ``</s>`` is appended. There is no Moses punctuation
normalization: ``MarianTokenizer.normalize`` (sacremoses' MosesPunctNormalizer when installed)
is never called on the way from text to ids, so having sacremoses or not changes nothing. The
tokenizer.json written here:

* normalizer: Sequence[Precompiled(the source spm's ``precompiled_charsmap``),
  Replace(" {2,}", " "), Replace(leading / trailing " ", ""), Prepend("▁")] -- spm's own
  normalizer: the charsmap (nmt_nfkc for opus-mt: NFKC, control characters dropped, whitespace
  and "▁" mapped to " "), ``remove_extra_whitespaces`` (runs of spaces collapsed, both ends
  stripped; left out when the spm model turns it off) and ``add_dummy_prefix`` (likewise);
* pre-tokenizer: Metaspace("▁", prepend_scheme "never", split): spaces become "▁" and words
  split before each "▁" (spm pieces hold no inner "▁", so the Viterbi path is unchanged);
* model: Unigram whose vocabulary is vocab.json in id order (Marian's ids, not the spm ids),
  ``unk_id`` = vocab.json's ``<unk>``: a NORMAL source-spm piece keeps its spm score; ``</s>``,
  ``<unk>``, ``<pad>`` and the language codes get 0; an entry the source spm lacks (the
  target-only pieces of a joint vocabulary) is stored as "▁▁" + piece with the lowest spm score
  -- no pre-tokenized word holds "▁" after its first character, so it is never chosen, yet it
  decodes -- except (``--unknown-runs lookup``, the default) an entry made only of characters
  the source spm does not know, which is stored as is: sentencepiece turns a run of such
  characters into one unknown piece whose *text* MarianTokenizer looks up in vocab.json, so
  "ß" alone gets the target piece "ß" when only the target spm has it. The Unigram unknown score
  is min(score) - 10 as in sentencepiece (hence the lowest spm score for the added entries) and
  a run of unknown characters fuses into one ``<unk>`` as in spm;
* added tokens: ``</s>``, ``<unk>``, ``<pad>`` (special) and every ``>>xx<<`` entry of
  vocab.json (not special: MarianTokenizer keeps codes when decoding), matched on the raw text;
* post-processor: TemplateProcessing ``$A </s>`` (pair ``$A $B </s>``, as
  build_inputs_with_special_tokens);
* decoder: Sequence[Replace("^▁▁", ""), Metaspace, Fuse, Replace(leading / trailing
  whitespace, "")]: MarianTokenizer.convert_tokens_to_string concatenates the pieces (spm
  decodes a piece it lacks as its own text), turns "▁" into spaces and strips the result.
  Stream decoding (``tokenizers.decoders.DecodeStream``) gives the same text.

Limits -- ``--check`` reports every mismatch it meets; none occurs on the fixtures' prompts, on
the paragraphs of pydoc_data.topics or on plain text:

* language codes: MarianTokenizer takes a code out only at the very start of a segment and
  maps a code missing from vocab.json (or any ``>>...<<`` prefix, e.g. ">> deu <<") to
  ``<unk>``; here every vocab.json code is an added token matched anywhere ("a >>fra<< b" gives
  the code's id where MarianTokenizer gives the spm pieces of ">>fra<<") and any other prefix
  is text;
* unknown characters: a run of characters the source spm does not know that is not itself a
  vocab.json entry but contains entries (e.g. "ßß" when "ß" is one) is one ``<unk>`` for
  MarianTokenizer and those entries here; with ``--unknown-runs unk`` such entries are never
  chosen, which gets these runs right and the single-entry runs ("ß") wrong instead. No
  Unigram model can express "the whole run or <unk>";
* source-spm pieces missing from vocab.json (Marian drops pieces never seen in its training
  data) are left out: where spm's best segmentation uses one, MarianTokenizer emits ``<unk>``
  and this tokenizer segments the span otherwise (the tool prints how many there are);
* ties: two segmentations into the same pieces in another order (runs like "*" * 24 or
  "-" * 30 in reST tables) have equal scores; sentencepiece sums them in float32 and tokenizers
  in float64, so rounding can pick different orders;
* normalization: tokenizers' Precompiled works on grapheme clusters and, for a cluster shorter
  than 6 bytes whose first character(s) the charsmap rewrites, keeps only that rewrite (e.g. a
  full-width letter or ZWNJ followed by a combining mark, Hangul jamo sequences, "\\r\\n"
  when spaces are kept); sentencepiece rewrites the rest too;
* ``separate_vocabs`` models (``target_vocab.json``: decoder ids differ from encoder ids)
  cannot be one tokenizer.json and are refused; so are spm models that are not Unigram or use
  byte_fallback, user-defined symbols or treat_whitespace_as_suffix;
* decoding matches with ``skip_special_tokens=True`` only (without it MarianTokenizer writes
  each special token followed by a space). MarianTokenizer 5.23 decodes with the source spm
  when the vocabulary is shared (4.x used the target spm); both concatenate piece strings.

``--check`` compares, for each text given (or, with no text, a built-in set: every paragraph
of pydoc_data.topics, punctuation, digits, unicode, whitespace, special tokens, language
codes), the ids of the tokenizer and of MarianTokenizer and their decodes, plus the decodes of
300 random id sequences over all of vocab.json, and exits 1 on a mismatch.

Usage:  python tools/marian_tokenizer.py FOLDER [--unknown-runs lookup|unk] [--check [TEXT ...]]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile

SPIECE = "▁"
MARK = SPIECE * 2
"""Prefix of the vocab.json entries the source spm lacks: never matched, removed on decode."""
UNK_PENALTY = 10.0
"""sentencepiece's and tokenizers' unknown-piece penalty below the lowest score."""
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
"""sentencepiece ModelProto.SentencePiece.Type."""


# ---------------------------------------------------------------- the spm model proto


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _fields(buf: bytes):
    """(field number, value) of a protobuf message: int for varints, bytes for
    length-delimited fields, raw bytes for fixed32 / fixed64."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, value


def read_spm(path: str) -> dict:
    """The parts of a sentencepiece ModelProto this tool uses: ``pieces`` [(piece, score
    (float32 widened), type)], ``normalizer`` {precompiled_charsmap, add_dummy_prefix,
    remove_extra_whitespaces, escape_whitespaces} and ``trainer`` {model_type, byte_fallback,
    treat_whitespace_as_suffix} (proto defaults where a field is absent)."""
    with open(path, "rb") as f:
        buf = f.read()
    pieces = []
    normalizer = dict(name="", precompiled_charsmap=b"", add_dummy_prefix=True,
                      remove_extra_whitespaces=True, escape_whitespaces=True)
    trainer = dict(model_type=1, byte_fallback=False, treat_whitespace_as_suffix=False)
    for number, value in _fields(buf):
        if number == 1:  # SentencePiece
            piece, score, kind = "", 0.0, NORMAL
            for n, v in _fields(value):
                if n == 1:
                    piece = v.decode("utf-8")
                elif n == 2:
                    score = struct.unpack("<f", v)[0]
                elif n == 3:
                    kind = v
            pieces.append((piece, score, kind))
        elif number == 2:  # TrainerSpec
            for n, v in _fields(value):
                if n == 3:
                    trainer["model_type"] = v
                elif n == 35:
                    trainer["byte_fallback"] = bool(v)
                elif n == 24:
                    trainer["treat_whitespace_as_suffix"] = bool(v)
        elif number == 3:  # NormalizerSpec
            for n, v in _fields(value):
                if n == 1:
                    normalizer["name"] = v.decode("utf-8")
                elif n == 2:
                    normalizer["precompiled_charsmap"] = bytes(v)
                elif n == 3:
                    normalizer["add_dummy_prefix"] = bool(v)
                elif n == 4:
                    normalizer["remove_extra_whitespaces"] = bool(v)
                elif n == 5:
                    normalizer["escape_whitespaces"] = bool(v)
    return dict(pieces=pieces, normalizer=normalizer, trainer=trainer)


# ---------------------------------------------------------------- building


def load_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def is_language_code(token: str) -> bool:
    """MarianTokenizer's test for supported_language_codes."""
    return token.startswith(">>") and token.endswith("<<")


def folder_config(folder: str) -> dict:
    """tokenizer_config.json (or {}), refusing separate_vocabs."""
    path = os.path.join(folder, "tokenizer_config.json")
    cfg = load_json(path) if os.path.isfile(path) else {}
    if cfg.get("separate_vocabs") or os.path.isfile(os.path.join(folder, "target_vocab.json")):
        raise SystemExit(f"{folder}: separate_vocabs (target_vocab.json) is not supported: the "
                         "decoder's ids differ from the encoder's, which one tokenizer.json "
                         "cannot express")
    return cfg


def special_token(cfg: dict, key: str, default: str) -> str:
    value = cfg.get(key, default)
    return value["content"] if isinstance(value, dict) else value


def build_tokenizer(folder: str, unknown_runs: str = "lookup", verbose: bool = False):
    """The ``tokenizers.Tokenizer`` for a Marian folder (see the module docstring);
    unknown_runs "lookup" (default) or "unk" chooses how vocab.json entries made only of
    characters the source spm does not know are treated; verbose prints what was left out or
    made unreachable."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    cfg = folder_config(folder)
    eos = special_token(cfg, "eos_token", "</s>")
    unk = special_token(cfg, "unk_token", "<unk>")
    pad = special_token(cfg, "pad_token", "<pad>")
    vocab = load_json(os.path.join(folder, "vocab.json"))
    size = len(vocab)
    by_id = {}
    for piece, i in vocab.items():
        if not isinstance(i, int) or not 0 <= i < size or i in by_id:
            raise SystemExit(f"{folder}/vocab.json: ids are not a permutation of 0..{size - 1}")
        by_id[i] = piece
    for t in (eos, unk, pad):
        if t not in vocab:
            raise SystemExit(f"{folder}/vocab.json has no {t!r}")

    spm = read_spm(os.path.join(folder, "source.spm"))
    trainer, norm = spm["trainer"], spm["normalizer"]
    if trainer["model_type"] != 1:
        raise SystemExit("source.spm is not a Unigram model")
    if trainer["byte_fallback"] or trainer["treat_whitespace_as_suffix"]:
        raise SystemExit("source.spm uses byte_fallback or treat_whitespace_as_suffix")
    if not norm["escape_whitespaces"]:
        raise SystemExit("source.spm does not escape whitespace")
    if any(kind == USER_DEFINED for _, _, kind in spm["pieces"]):
        raise SystemExit("source.spm has user-defined symbols")
    normal = {p: s for p, s, kind in spm["pieces"] if kind == NORMAL}
    low = min(normal.values())
    for p in normal:
        if p.startswith(MARK):
            raise SystemExit(f"source.spm piece {p!r} starts with the mark {MARK!r}")
    inner = [p for p in normal if SPIECE in p[1:]]

    known = set("".join(normal))
    specials = (eos, unk, pad)
    codes = [by_id[i] for i in range(size) if is_language_code(by_id[i])]
    entries, unreachable, lookups = [], [], []
    for i in range(size):
        piece = by_id[i]
        if piece in specials or is_language_code(piece):
            entries.append((piece, 0.0))
        elif piece in normal:
            entries.append((piece, normal[piece]))
        elif unknown_runs == "lookup" and not set(piece) & known:
            entries.append((piece, low))
            lookups.append(piece)
        else:
            entries.append((MARK + piece, low))
            unreachable.append(piece)
    dropped = [p for p in normal if p not in vocab]
    if verbose:
        print(f"{folder}: {size} ids, {len(codes)} language codes; entries the source spm "
              f"lacks: {len(unreachable)} never chosen, {len(lookups)} made of characters it "
              f"does not know (chosen for those characters); {len(dropped)} source-spm pieces "
              f"missing from vocab.json (left out); {len(inner)} source pieces with an inner "
              f"{SPIECE!r} (never chosen)")

    tok = Tokenizer(models.Unigram(entries, unk_id=vocab[unk], byte_fallback=False))
    steps = []
    if norm["precompiled_charsmap"]:
        steps.append(normalizers.Precompiled(norm["precompiled_charsmap"]))
    if norm["remove_extra_whitespaces"]:
        steps += [normalizers.Replace(Regex(" {2,}"), " "),
                  normalizers.Replace(Regex(r"\A | \z"), "")]
    if norm["add_dummy_prefix"]:
        steps.append(normalizers.Prepend(SPIECE))
    if steps:
        tok.normalizer = normalizers.Sequence(steps)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE, prepend_scheme="never",
                                                 split=True)
    scheme = "always" if norm["add_dummy_prefix"] else "never"
    tok.decoder = decoders.Sequence([
        decoders.Replace(Regex("^" + MARK), ""),
        decoders.Metaspace(replacement=SPIECE, prepend_scheme=scheme, split=True),
        decoders.Fuse(),
        decoders.Replace(Regex(r"\A\s+|\s+\z"), ""),
    ])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    tok.add_tokens([AddedToken(c, normalized=False, special=False) for c in codes])
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {eos}:0", pair=f"$A:0 $B:1 {eos}:1", special_tokens=[(eos, vocab[eos])])
    assert tok.get_vocab_size(with_added_tokens=True) == size
    for t in specials + tuple(codes):
        assert tok.token_to_id(t) == vocab[t], t
    return tok


def write_tokenizer(folder: str, tok, pretty: bool = False) -> str:
    """Write FOLDER/tokenizer.json atomically (a temporary file renamed over it)."""
    path = os.path.join(folder, "tokenizer.json")
    fd, tmp = tempfile.mkstemp(prefix=".tokenizer.", suffix=".json", dir=folder)
    os.close(fd)
    try:
        tok.save(tmp, pretty=pretty)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


# ---------------------------------------------------------------- checking


def default_texts() -> list[str]:
    """--check's built-in texts: every paragraph of pydoc_data.topics (sorted keys), and
    punctuation, digits, unicode, whitespace and language-code cases."""
    import pydoc_data.topics as topics

    texts = []
    for key in sorted(topics.topics):
        texts += [p for p in topics.topics[key].split("\n\n") if p.strip()]
    texts += [
        "", " ", "  \n\t ", "Hello, world!", "  leading and trailing spaces  ",
        "tabs\tand\nnewlines\r\nand  double  spaces", "a\u00a0non-breaking\u3000space",
        "Numbers: 0 1 23 456 7890 3.14159 -2e10 1,000,000 0x1F 12:30 2024-05-09",
        "Punctuation: !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ ... -- ---",
        "Quotes “curly” ‘single’ « guillemets » „low“ — dashes – en",
        "Ligatures ﬁ ﬂ, full width ＡＢＣ１２３！, superscript x² ½, circled ①",
        "Accents: café naïve Zürich São Paulo Ångström façade",
        "Greek αβγ, Cyrillic Привет, CJK 日本語 中文, Hangul 한국어, emoji 🙂👍🏽",
        "Straße ß ßß °C 25°", "ß", "x ß y", "Combining: e\u0301 a\u0308 n\u0303",
        "zero\u200bwidth and soft\u00adhyphen and \u2028 line sep", "control \x07 \x1b chars",
        "a▁b ▁ ▁▁ c", "</s> inside </s>", "<unk> and <pad> tokens", "<s> is plain text",
        ">>deu<< The house is small.", ">>fra<<Bonjour", ">>nld<<", " >>deu<< leading space",
        ">>xyz<< unknown code", ">>deu<< >>fra<< two codes", "text then >>deu<< code",
        ">>deu<", ">> deu <<", "a >> b << c", "Ünïcödé ℌ𝔢𝔩𝔩𝔬 𝟙𝟚𝟛",
    ]
    return texts


def check(folder: str, texts: list[str], tok=None, n_random: int = 300, seed: int = 0) -> dict:
    """Compare tokenizer.json (or tok) with transformers' MarianTokenizer on texts (ids and
    skip_special_tokens decodes) and on n_random random id sequences (decodes); return
    {"texts", "encode_mismatches": [...], "decode_mismatches": [...]}."""
    import random
    import warnings

    import transformers
    from tokenizers import Tokenizer
    from transformers import MarianTokenizer

    transformers.logging.set_verbosity_error()  # "sequence length is longer than 512"
    if tok is None:
        tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = MarianTokenizer.from_pretrained(folder)
    enc_bad, dec_bad = [], []
    for text in texts:
        want = hf(text)["input_ids"]
        got = tok.encode(text).ids
        if got != want:
            enc_bad.append(dict(text=text, marian=hf.convert_ids_to_tokens(want),
                                tokenizer_json=hf.convert_ids_to_tokens(got)))
        for ids in (want, got):
            a = hf.decode(ids, skip_special_tokens=True)
            b = tok.decode(ids, skip_special_tokens=True)
            if a != b:
                dec_bad.append(dict(ids=ids, marian=a, tokenizer_json=b))
    rng = random.Random(seed)
    size = tok.get_vocab_size(with_added_tokens=True)
    for _ in range(n_random):
        ids = [rng.randrange(size) for _ in range(rng.randrange(1, 24))]
        a = hf.decode(ids, skip_special_tokens=True)
        b = tok.decode(ids, skip_special_tokens=True)
        if a != b:
            dec_bad.append(dict(ids=ids, marian=a, tokenizer_json=b))
    return dict(texts=len(texts), random_decodes=n_random, encode_mismatches=enc_bad,
                decode_mismatches=dec_bad)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--unknown-runs", choices=["lookup", "unk"], default="lookup",
                    help="vocab.json entries made only of characters the source spm does not "
                         "know: chosen for those characters (lookup, default) or never (unk)")
    ap.add_argument("--check", nargs="*", metavar="TEXT",
                    help="compare with transformers' MarianTokenizer on these texts (none: a "
                         "built-in set) and on random id sequences; exit 1 on a mismatch")
    args = ap.parse_args(argv)
    tok = build_tokenizer(args.folder, args.unknown_runs, verbose=True)
    path = write_tokenizer(args.folder, tok)
    print(f"wrote {path} ({tok.get_vocab_size(with_added_tokens=True)} ids)")
    if args.check is None:
        return 0
    report = check(args.folder, args.check or default_texts())
    for kind in ("encode_mismatches", "decode_mismatches"):
        for m in report[kind]:
            print(f"{kind[:6]} mismatch: {json.dumps(m, ensure_ascii=False)}")
    print(f"checked {report['texts']} texts and {report['random_decodes']} random id "
          f"sequences: {len(report['encode_mismatches'])} encode and "
          f"{len(report['decode_mismatches'])} decode mismatches")
    return 1 if report["encode_mismatches"] or report["decode_mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
