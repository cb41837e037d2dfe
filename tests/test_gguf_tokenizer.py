"""GGUF tokenizers (causallm/io/gguf_tokenizer.py, causallm/kernels/bpe.py) against the
``tokenizers`` pipeline those vocabularies stand for.

tests/fixtures/gguf-tokenizer-corpus.json.gz (tools/fixtures_gguf_tokenizer_corpus.py) holds
what that pipeline (``tokenizers.models.BPE`` with the merges transformers derives, its
normalizers, pre-tokenizers, added tokens, post-processor and decoders) gives a corpus of texts
and id lists, for every tests/fixtures/gguf-* file, tokenizer-only variants of two of them
(written again here by the tool's ``write_variant``) and the real SmolLM2 and Gemma 3 files
(optional packages). llama.cpp's ids for the real files: tests/test_gguf.py.
"""

import gzip
import json
import os
import sys

import gguf
import numpy as np
import parity
import pytest

from causallm.errors import CausalLMError
from causallm.io.gguf_file import GGUFFile
from causallm.kernels.strings import utf8_valid
from causallm.tokenizer import StreamDecoder, Tokenizer

sys.path.insert(0, os.path.join(parity.ROOT, "tools"))
from fixtures_gguf_tokenizer_corpus import FIXTURE_FILES, write_variant  # noqa: E402

with gzip.open(os.path.join(parity.FIXTURES, "gguf-tokenizer-corpus.json.gz"), "rt",
               encoding="utf-8") as _f:
    CORPUS = json.load(_f)
RECORDS = {r["name"]: r for r in CORPUS["files"]}


@pytest.fixture(scope="module")
def gguf_path(request, tmp_path_factory):
    """name -> the GGUF file of that corpus entry."""
    def path(name):
        if name in FIXTURE_FILES:
            return os.path.join(parity.FIXTURES, name, "model.gguf")
        if name == "smollm2":
            return request.getfixturevalue("smollm2_gguf")
        if name == "gemma3":
            return request.getfixturevalue("gemma3_gguf")
        return write_variant(name, str(tmp_path_factory.mktemp("variants") / f"{name}.gguf"))
    return path


def _record(name):
    r = RECORDS[name]
    return RECORDS[r["same_as"]] if "same_as" in r else r


def _cases(record):
    """(text, case) for the shared texts and the file's own."""
    return [*zip(CORPUS["texts"], record["shared"]), *((c["in"], c) for c in record["own"])]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RECORDS))
def test_ids_and_text_equal_the_tokenizers_pipeline(name, gguf_path):
    """Every text's ids (with and without BOS / EOS) and their decoding (with and without the
    special tokens), every id list's decoding, the vocabulary size and a sample of id <-> token,
    as ``tokenizers`` gave them."""
    record = _record(name)
    tok = Tokenizer(GGUFFile(gguf_path(name)).tokenizer())
    for text, case in _cases(record):
        assert tok.Encode(text) == case["ids"], text
        assert tok.Encode(text, add_special_tokens=False) == case["ids_plain"], text
        assert tok.Decode(case["ids"]) == case["text"], text
        assert tok.Decode(case["ids"], skip_special_tokens=True) == case["text_skip"], text
    for case in record["decode"]:
        assert tok.Decode(case["ids"]) == case["text"], case["ids"]
        assert tok.Decode(np.array(case["ids"]), skip_special_tokens=True) == \
            case["text_skip"], case["ids"]
    assert tok.GetVocabSize() == record["vocab_size"]
    for i, token in record["tokens"]:
        assert tok.IdToToken(i) == token
        assert token is None or tok.TokenToId(token) == i
    assert tok.TokenToId("surely not a token \u2581\u2581") is None
    assert tok.IdToToken(-1) is None and tok.IdToToken(10**7) is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gguf-llama-q8_0", "gguf-llama-spm", "spm-gemma-no-bytes",
                                  "bpe-digits-added", "smollm2", "gemma3"])
def test_streamed_text_is_the_decoded_text(name, gguf_path):
    """StreamDecoder's promise on these tokenizers (its docstring): the chunks add up to Decode
    for any ids of a byte-level vocabulary and for a SentencePiece one's ids of texts; no chunk
    but the last ends in U+FFFD."""
    record = _record(name)
    tok = Tokenizer(GGUFFile(gguf_path(name)).tokenizer())
    byte_level = GGUFFile(gguf_path(name)).metadata["tokenizer.ggml.model"] == "gpt2"
    lists = [case["ids"] for _, case in _cases(record)]
    if byte_level:
        lists += [case["ids"] for case in record["decode"]]
    for ids in lists:
        decoder = StreamDecoder(tok)
        chunks = [decoder.step(i) for i in ids] + [decoder.flush()]
        assert "".join(chunks) == tok.Decode(ids, skip_special_tokens=True), ids
        assert not any(chunk.endswith("\ufffd") for chunk in chunks[:-1])
    for case in record["decode"]:  # byte soup: the stream goes on, never ends a chunk on U+FFFD
        decoder = StreamDecoder(tok)
        chunks = [decoder.step(i) for i in case["ids"]]
        assert not any(chunk.endswith("\ufffd") for chunk in chunks)


@pytest.mark.slow
def test_utf8_check_is_pythons():
    """kernels/strings.py ``utf8_valid`` (the byte-fallback runs' check) against Python's strict
    UTF-8 decoder: random bytes and the edges (overlong forms, surrogates, past U+10FFFF, cut
    sequences)."""
    rng = np.random.default_rng(3)
    samples = [bytes(rng.integers(0, 256, int(rng.integers(0, 6))).astype(np.uint8))
               for _ in range(3000)]
    samples += [bytes(rng.integers(0x80, 0xF6, int(rng.integers(1, 5))).astype(np.uint8))
                for _ in range(3000)]
    samples += [b"\xc0\x80", b"\xc1\xbf", b"\xc2\x80", b"\xe0\x9f\xbf", b"\xe0\xa0\x80",
                b"\xed\x9f\xbf", b"\xed\xa0\x80", b"\xef\xbf\xbf", b"\xf0\x8f\xbf\xbf",
                b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80",
                "😀é日".encode(), "😀".encode()[:3], b"a\x80"]
    for raw in samples:
        try:
            raw.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        assert utf8_valid(np.frombuffer(raw, np.uint8), 0, len(raw)) == valid, raw


def _tokenizer_file(path, tokens, types=None, merges=None, **keys):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2" if merges is not None else "llama")
    w.add_token_list(tokens)
    if types is not None:
        w.add_token_types(types)
    if merges is not None:
        w.add_token_merges(merges)
    for key, value in keys.items():
        w.add_uint32(f"tokenizer.ggml.{key}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_a_vocabulary_it_cannot_use_is_a_one_line_error(tmp_path):
    alphabet = ["a", "b", "ab"]
    bad_merge = _tokenizer_file(tmp_path / "m.gguf", alphabet, merges=["a b", "ab b"])
    with pytest.raises(CausalLMError, match=r"m.gguf: tokenizer.ggml.merges\[1\] 'ab b' is not "
                                            r"two tokens whose joined spelling is a token"):
        GGUFFile(bad_merge).tokenizer()
    no_space = _tokenizer_file(tmp_path / "s.gguf", alphabet, merges=["ab"])
    with pytest.raises(CausalLMError, match=r"merges\[0\] 'ab'"):
        GGUFFile(no_space).tokenizer()
    bos = _tokenizer_file(tmp_path / "b.gguf", alphabet, bos_token_id=3)
    with pytest.raises(CausalLMError, match="b.gguf: 'tokenizer.ggml.bos_token_id' is 3; "
                                            "expected a token id below 3"):
        GGUFFile(bos).tokenizer()
    types = _tokenizer_file(tmp_path / "t.gguf", alphabet, types=[1, 1])
    with pytest.raises(CausalLMError, match="'tokenizer.ggml.token_type' must hold one number "
                                            "per token"):
        GGUFFile(types).tokenizer()
    ok = Tokenizer(GGUFFile(_tokenizer_file(tmp_path / "ok.gguf", alphabet,
                                            merges=["a b"])).tokenizer())
    assert ok.Encode("abba") == [2, 1, 0] and ok.Decode([2, 1, 0]) == "abba"
