"""A GGUF file's tokenizer, built from its vocabulary metadata on arrays (no Python object per
token) and run by numba kernels (causallm/kernels/bpe.py).

``GGUFTokenizer.from_gguf(file)`` (what ``GGUFFile.tokenizer()`` returns) gives the token ids
and text of the ``tokenizers`` pipeline such a vocabulary stands for (transformers' GGUF
tokenizer; llama.cpp's where they differ, ``DIGIT_SPLIT_PRE``):

- **the vocabulary**: ``tokenizer.ggml.tokens`` as bytes straight from the file
  (``GGUFContents.string_bytes``) in one buffer with offsets, a hash table from spelling to
  id (a spelling held twice: its last id), ``token_type`` and ``scores`` the parsed arrays.
  "gpt2" (byte-level BPE): a token with a character outside GPT-2's byte alphabet is spelled
  by the characters of its UTF-8 bytes. "llama" (SentencePiece): on Gemma a token of spaces is
  spelled with ``▁``;
- **added tokens**: control tokens (special: ``decode(..., skip_special_tokens=True)`` drops
  them) and user-defined ones are cut out of the raw text first, leftmost and longest first
  (a trie, numba), as ``tokenizers``' AddedVocabulary does with tokens that are not normalized;
- **each piece between them**: "llama": spaces spelled ``▁`` (Llama with
  ``add_space_prefix``: a ``▁`` before a piece at the start of the text that lacks one,
  Metaspace's "first" scheme), the whole piece one word; "gpt2": split by
  ``tokenizers.pre_tokenizers`` objects (the regex of ``tokenizer.ggml.pre``, llama.cpp's
  pre-tokenizer types; ``DIGIT_SPLIT_PRE``: numeric characters cut apart first; else GPT-2's)
  and spelled with GPT-2's byte alphabet (``pre_tokenize_str``);
- **BPE of each word** in one compiled pass, the lowest-ranked adjacent pair merged first
  (leftmost on ties), as ``tokenizers``' BPE: "gpt2" ranks the file's merges in their order;
  "llama" has no merges in the file and ranks every split of every token into two tokens
  as transformers does (best score first, then the longer left piece, then the longer right,
  ties in vocabulary order; Gemma's scores are its file order), found on the fly from the
  hash table rather than listed (kernels/bpe.py). A character with no token: its ``<0xNN>``
  byte tokens ("llama"), else the unknown token (Gemma; consecutive ones fused), else nothing;
- **BOS / EOS** added as ``tokenizer.ggml.add_bos_token`` (default: "llama" yes, "gpt2" no) /
  ``add_eos_token`` say, when ``encode(..., add_special_tokens=True)``;
- **decoding**: "gpt2" maps the characters back to bytes (invalid UTF-8 as U+FFFD);
  "llama" turns ``▁`` into spaces and each run of byte tokens into its text (U+FFFD per byte
  when the run is not UTF-8, as ``tokenizers``' ByteFallback), then, with the space prefix,
  drops one leading space.

It presents what ``causallm.tokenizer.Tokenizer`` and ``StreamDecoder`` call on a
``tokenizers.Tokenizer``: ``encode(text, add_special_tokens).ids``, ``decode(ids,
skip_special_tokens)``, ``get_vocab_size``, ``token_to_id``, ``id_to_token``. Ids that are not
a live token (out of range, a spelling's earlier copy) decode to nothing and have no token.

Cost for Gemma 3's 262,144 tokens: 0.06-0.13 s of CPU to build (the first build in a process
loads the compiled kernels) and 10 MB of arrays, where the ``tokenizers`` model it replaces took
2-3 s and 105 MB; encoding about as fast as ``tokenizers`` (faster for SentencePiece, up to 20 %
slower for byte-level text, whose pre-tokenizer is ``tokenizers``' own); docs/performance.md.
Checked against the ``tokenizers`` pipeline on a corpus (tests/fixtures/gguf-tokenizer-corpus
.json.gz, tools/fixtures_gguf_tokenizer_corpus.py) and against llama.cpp
(tests/fixtures/gguf-tokenizer-ids.json).
"""

from __future__ import annotations

import numpy as np

from causallm.errors import CausalLMError
from causallm.kernels.bpe import (
    AS_IS,
    BYTE_CHARS,
    BYTE_LEVEL,
    GEMMA_SPACES,
    LIVE,
    SPECIAL,
    Vocab,
    build_merges,
    build_vocab,
    decode_ids,
    encode_sentencepiece,
    encode_words,
    find_added,
)

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx",
                     "pixtral"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4"), _GPT4O_SPLIT),
}
"""``tokenizer.ggml.pre`` -> the regex a byte-level vocabulary's text is split by before BPE
(llama.cpp's pre-tokenizer types); any other name ("gpt-2", ...) splits as GPT-2."""
DIGIT_SPLIT_PRE = ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
                   "minerva-7b", "mellum2")
"""``tokenizer.ggml.pre`` names whose text llama.cpp first cuts into single numeric characters
(``\\p{N}``), then splits as GPT-2 (SmolLM2's own tokenizer.json: ``Digits`` then
``ByteLevel``). transformers' GGUF tokenizer lacks the first cut, so " ⅞" is one piece there
and two in llama.cpp; this follows llama.cpp."""

_BUILT = ("data", "offsets", "table", "shift", "first", "flags", "byte_ids", "pw", "max_bytes",
          "trie_root", "trie_keys", "trie_child", "trie_token", "trie_shift")
"""What kernels/bpe.py ``build_vocab`` returns."""
_MERGES = ("merge_keys", "merge_rank", "merge_new", "merge_shift")
_NONE32, _NONE64 = np.zeros(0, np.int32), np.zeros(0, np.int64)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table of byte-level vocabularies."""
    return {b: chr(c) for b, c in enumerate(BYTE_CHARS.tolist())}


class Encoding:
    """What ``encode`` gives: ``ids``, as on a ``tokenizers.Encoding``."""

    __slots__ = ("ids",)

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class GGUFTokenizer:
    """A GGUF vocabulary's tokenizer (module docstring). Build it with ``from_gguf``."""

    def __init__(self, path: str, vocab: Vocab, byte_level: bool, *, pre_tokenizer=None,
                 space_prefix: bool = False, unk: int = -1, bos: int | None = None,
                 eos: int | None = None) -> None:
        self.path, self.vocab, self.byte_level = path, vocab, byte_level
        self.pre_tokenizer, self.space_prefix, self.unk = pre_tokenizer, space_prefix, unk
        self.bos, self.eos = bos, eos
        self._size = int(np.count_nonzero(vocab.flags & LIVE))

    @classmethod
    def from_gguf(cls, file) -> "GGUFTokenizer":
        """The tokenizer of a ``GGUFFile``'s metadata."""
        meta, path = file.metadata, file.path
        kind = meta.get("tokenizer.ggml.model")
        if not meta.get("tokenizer.ggml.tokens"):
            raise CausalLMError(f"{path}: no tokenizer.ggml.tokens (the file carries no "
                                f"vocabulary)")
        if kind not in ("gpt2", "llama"):
            raise CausalLMError(f"{path}: tokenizer.ggml.model {kind!r} is not supported "
                                f"(gpt2, llama)")
        gemma = kind == "llama" and file.architecture.startswith("gemma")
        types = _per_token(file, "tokenizer.ggml.token_type", 1).astype(np.int32)
        raw, starts, lengths = file.contents.string_bytes("tokenizer.ggml.tokens")
        mode = BYTE_LEVEL if kind == "gpt2" else GEMMA_SPACES if gemma else AS_IS
        fields = dict(zip(_BUILT, build_vocab(raw, starts, lengths, types, mode)))
        options = {}
        if kind == "gpt2":
            fields.update(zip(_MERGES, _merges(file, fields)), score_rank=_NONE32)
            options["pre_tokenizer"] = _pre_tokenizer(meta.get("tokenizer.ggml.pre"))
        else:
            fields.update(zip(_MERGES, (_NONE64, _NONE32, _NONE32, 0)),
                          score_rank=_NONE32 if gemma else _score_rank(file))
            n, longest = len(lengths), fields["max_bytes"]
            if n * (longest + 1) ** 2 * (n + 1) >= 2 ** 63:
                raise CausalLMError(f"{path}: a vocabulary of {n} tokens of up to {longest} "
                                    f"bytes is too large to rank its merges")
            options["space_prefix"] = not gemma and \
                bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        for key, default in (("bos", kind == "llama"), ("eos", False)):
            token = meta.get(f"tokenizer.ggml.{key}_token_id")
            if meta.get(f"tokenizer.ggml.add_{key}_token", default) and token is not None:
                options[key] = _token_id(file, token, f"{key}_token_id")
        tok = cls(path, Vocab(**fields), kind == "gpt2", **options)
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        if gemma and unk is not None:  # the last token of its spelling, as a dict finds it
            unk = _token_id(file, unk, "unknown_token_id")
            tok.unk = tok._find(fields["data"][fields["offsets"][unk]:
                                               fields["offsets"][unk + 1]].tobytes())
        return tok

    # -- encoding --------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> Encoding:
        """The token ids of ``text`` (module docstring)."""
        ids = self._encode(text, self.space_prefix)
        if add_special_tokens:
            if self.bos is not None:
                ids.insert(0, self.bos)
            if self.eos is not None:
                ids.append(self.eos)
        return Encoding(ids)

    def encode_continuation(self, text: str) -> list[int]:
        """The ids of ``text`` as the continuation of a text: no special tokens added, and no
        ``▁`` put before its first piece (Llama's space prefix); what a grammar engine
        tokenizes the bytes its grammar forces with."""
        return self._encode(text, False)

    def _encode(self, text: str, space_prefix: bool) -> list[int]:
        raw = text.encode("utf-8")
        buf = np.frombuffer(raw, np.uint8)
        if self.byte_level:
            return self._encode_byte_level(raw, buf)
        out = np.empty(3 * len(raw) + 3, np.int32)
        return out[:encode_sentencepiece(self.vocab, buf, space_prefix, self.unk, out)].tolist()

    def _encode_byte_level(self, raw: bytes, buf: np.ndarray) -> list[int]:
        """Added tokens cut out, each piece between them split by the pre-tokenizer, every word
        and added token in one kernel call (``encode_words``)."""
        starts, ends, tokens = (np.empty(len(raw), np.int64) for _ in range(3))
        words, added = [], {}
        pos = 0
        for k in range(find_added(self.vocab, buf, starts, ends, tokens)):
            if starts[k] > pos:
                words += [w for w, _ in self.pre_tokenizer.pre_tokenize_str(
                    raw[pos:starts[k]].decode("utf-8"))]
            added[len(words)] = int(tokens[k])
            words.append("")
            pos = int(ends[k])
        if pos < len(raw):
            words += [w for w, _ in self.pre_tokenizer.pre_tokenize_str(raw[pos:].decode("utf-8"))]
        joined = " ".join(words).encode("utf-8")
        slots = np.full(len(words), -1, np.int32)
        for i, token in added.items():
            slots[i] = token
        out = np.empty(len(joined) + len(words), np.int32)
        return out[:encode_words(self.vocab, np.frombuffer(joined, np.uint8), slots, out)].tolist()

    # -- decoding --------------------------------------------------------------------------
    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (module docstring)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        offsets = self.vocab.offsets
        known = ids[(ids >= 0) & (ids < len(offsets) - 1)]
        out = np.empty(int((offsets[known + 1] - offsets[known]).sum()), np.uint8)
        n = decode_ids(self.vocab, ids, skip_special_tokens, self.byte_level, out)
        text = out[:n].tobytes().decode("utf-8", "replace")
        return text[1:] if self.space_prefix and text.startswith(" ") else text

    # -- the vocabulary --------------------------------------------------------------------
    def token_bytes(self) -> list[bytes]:
        """The bytes each token id stands for in decoded text, what a grammar matches tokens
        by: "gpt2": each character's byte under GPT-2's table (a spelling with a character
        outside it: its own UTF-8, as ``decode``); "llama": ``<0xNN>`` is byte NN, else the
        spelling with ``▁`` as a space. A token that is not live is ``b""``; a special
        token (``special_ids``) is its spelling."""
        data, offsets, flags = self.vocab.data.tobytes(), self.vocab.offsets.tolist(), \
            self.vocab.flags
        spellings = [data[a:b] for a, b in zip(offsets, offsets[1:])]
        if self.byte_level:
            out = []
            for spelling in spellings:
                try:
                    out.append(spelling.decode("utf-8").translate(_BYTE_OF_CHAR).encode("latin-1"))
                except UnicodeEncodeError:  # a character outside the table: the spelling
                    out.append(spelling)
        else:
            out = [s.replace(_SPACE, b" ") for s in spellings]
            for b, t in enumerate(self.vocab.byte_ids.tolist()):
                if t >= 0:
                    out[t] = bytes([b])
        for t in self.special_ids():
            out[t] = spellings[t]
        for t in np.flatnonzero(flags & LIVE == 0).tolist():
            out[t] = b""
        return out

    def special_ids(self) -> list[int]:
        """The ids of the live control tokens (``decode(..., skip_special_tokens=True)`` drops
        them)."""
        both = LIVE | SPECIAL
        return np.flatnonzero(self.vocab.flags & both == both).tolist()

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        """The number of distinct spellings (every added token is one of the vocabulary's)."""
        return self._size

    def token_to_id(self, token: str) -> int | None:
        t = self._find(token.encode("utf-8"))
        return None if t < 0 else t

    def id_to_token(self, token_id: int) -> str | None:
        flags, offsets = self.vocab.flags, self.vocab.offsets
        if not 0 <= token_id < len(flags) or not flags[token_id] & LIVE:
            return None
        return self.vocab.data[offsets[token_id]:offsets[token_id + 1]].tobytes().decode("utf-8")

    def _find(self, spelling: bytes) -> int:
        """The live token spelled so, or -1: the kernels' hash-table lookup (kernels/bpe.py
        ``_find``) in Python, for one string."""
        h = 0
        for b in spelling:
            h = (h * 0x100000001B3 + b) & _MASK64
        table, offsets, data = self.vocab.table, self.vocab.offsets, self.vocab.data
        slot = ((h * 0x9E3779B97F4A7C15) & _MASK64) >> self.vocab.shift
        while True:
            entry = int(table[slot])
            if entry < 0:
                return -1
            t = entry >> 32
            if entry & 0xFFFFFFFF == h & 0xFFFFFFFF and \
                    data[offsets[t]:offsets[t + 1]].tobytes() == spelling:
                return t
            slot = (slot + 1) & (len(table) - 1)


_MASK64 = (1 << 64) - 1
_SPACE = "\u2581".encode()
_BYTE_OF_CHAR = {**{b: 0xFFFF for b in range(256)},
                 **{int(c): b for b, c in enumerate(BYTE_CHARS.tolist())}}
"""str.translate table: a GPT-2 byte character -> its byte; any other character below 256 ->
U+FFFF, which no byte is (so such a spelling fails to encode as Latin-1)."""


def _per_token(file, key: str, default) -> np.ndarray:
    """The numbers ``key`` gives each token of the vocabulary (``default`` for all when the file
    has none); an error when they are not one per token."""
    n = len(file.metadata["tokenizer.ggml.tokens"])
    values = file.contents.metadata.get(key)
    if values is None:
        return np.full(n, default)
    if not isinstance(values, np.ndarray) or values.dtype == bool or len(values) != n:
        got = f"{len(values)} values" if isinstance(values, (list, np.ndarray)) else \
            type(values).__name__
        raise CausalLMError(f"{file.path}: '{key}' must hold one number per token ({n}), "
                            f"not {got}")
    return values


def _token_id(file, token, key: str) -> int:
    n = len(file.metadata["tokenizer.ggml.tokens"])
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < n:
        raise CausalLMError(f"{file.path}: 'tokenizer.ggml.{key}' is {token!r}; expected a "
                            f"token id below {n}")
    return int(token)


def _score_rank(file) -> np.ndarray:
    """Each token's score's place among the distinct scores, best first."""
    scores = _per_token(file, "tokenizer.ggml.scores", 0.0).astype(np.float64)
    return np.unique(-scores, return_inverse=True)[1].astype(np.int32)


def _merges(file, fields: dict):
    """The merge table of a byte-level vocabulary (kernels/bpe.py ``build_merges``)."""
    if "tokenizer.ggml.merges" in file.contents.metadata:
        raw, starts, lengths = file.contents.string_bytes("tokenizer.ggml.merges")
    else:
        raw, starts, lengths = np.zeros(0, np.uint8), _NONE64, _NONE64
    keys, rank, new, merge_shift, bad = build_merges(
        fields["data"], fields["offsets"], fields["table"], fields["shift"], raw, starts, lengths)
    if bad >= 0:
        merge = raw[starts[bad]:starts[bad] + lengths[bad]].tobytes().decode("utf-8", "replace")
        raise CausalLMError(f"{file.path}: tokenizer.ggml.merges[{bad}] {merge!r} is not two "
                            f"tokens whose joined spelling is a token")
    return keys, rank, new, merge_shift


def _pre_tokenizer(pre: str | None):
    """The ``tokenizers`` pre-tokenizer of a byte-level vocabulary's ``tokenizer.ggml.pre``
    (module docstring)."""
    from tokenizers import Regex, pre_tokenizers

    split = PRE_TOKENIZER_SPLITS.get(pre)
    if split is not None:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre in DIGIT_SPLIT_PRE:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
