"""Tokenizer wrapper and StreamDecoder, on two small tokenizer.json files (tests/fixtures/
tokenizers/, made by tools/fixtures_tokenizer.py), small enough that multi-byte characters are
split over several tokens:

- byte-level BPE (GPT-2 / Qwen / Llama-3 style): ByteLevel pre-tokenizer and decoder;
- SentencePiece-style BPE (Llama-2 / Gemma style): ``▁`` for spaces, ``<0xNN>`` byte-fallback
  tokens, decoder Replace + ByteFallback + Fuse + Strip, and a post-processor adding ``<s>``.

Encoding, decoding and the vocabulary size are checked against what transformers'
PreTrainedTokenizerFast gave for the same files (expected.json).
"""

import json
import os

import numpy as np
import pytest

import causallm.tokenizer as tokenizer_module
from causallm.errors import CausalLMError
from causallm.tokenizer import StreamDecoder, Tokenizer

TOKENIZERS = os.path.join(os.path.dirname(__file__), "fixtures", "tokenizers")
with open(os.path.join(TOKENIZERS, "expected.json"), encoding="utf-8") as _f:
    EXPECTED = json.load(_f)
TEXTS = [row["text"] for row in EXPECTED["byte_level"]["texts"]]


def _load(kind: str) -> Tokenizer:
    return Tokenizer.FromFile(os.path.join(TOKENIZERS, f"{kind}.json"))


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def tokenizer(request):
    tok = _load(request.param)
    tok.kind = request.param
    return tok


@pytest.fixture(params=["DecodeStream", "python"])
def stream_path(request, monkeypatch):
    """Run a test with tokenizers' DecodeStream and with the pure-Python fallback."""
    if request.param == "python":
        monkeypatch.setattr(tokenizer_module, "_DecodeStream", None)
    else:
        assert tokenizer_module._DecodeStream is not None, "tokenizers has no DecodeStream"
    return request.param


def _eos(tok: Tokenizer) -> int:
    eos = tok.TokenToId("<|endoftext|>")
    return eos if eos is not None else tok.TokenToId("</s>")


def _stream(tok: Tokenizer, ids) -> list[str]:
    decoder = StreamDecoder(tok)
    return [decoder.step(i) for i in ids] + [decoder.flush()]


# --------------------------------------------------------------------------------- Tokenizer

def test_encode_decode_match_transformers(tokenizer):
    for row in EXPECTED[tokenizer.kind]["texts"]:
        text = row["text"]
        assert tokenizer.Encode(text) == row["ids"], text
        assert tokenizer.Encode(text, add_special_tokens=False) == row["ids_without_special"]
        assert tokenizer.Decode(row["ids"], skip_special_tokens=True) == \
            row["decode_skip_special"] == text
        assert tokenizer.Decode(np.array(row["ids"], dtype=np.int64),
                                skip_special_tokens=False) == row["decode_with_special"]


def test_special_tokens_come_from_the_post_processor():
    """The SentencePiece-style file's post-processor adds <s>; the byte-level one adds
    nothing."""
    byte_level, sentencepiece = _load("byte_level"), _load("sentencepiece")
    assert byte_level.Encode("the fox") == byte_level.Encode("the fox", add_special_tokens=False)
    bos = sentencepiece.TokenToId("<s>")
    assert bos == 1
    without = sentencepiece.Encode("the fox", add_special_tokens=False)
    assert sentencepiece.Encode("the fox") == [bos] + without
    assert sentencepiece.Decode([bos] + without) == "<s> the fox"
    assert sentencepiece.Decode([bos] + without, skip_special_tokens=True) == "the fox"


def test_vocab_lookups(tokenizer):
    assert tokenizer.GetVocabSize() == EXPECTED[tokenizer.kind]["vocab_size"]
    eos = _eos(tokenizer)
    assert eos is not None
    assert tokenizer.IdToToken(eos) in ("<|endoftext|>", "</s>")
    assert tokenizer.TokenToId("surely-not-a-token") is None
    assert tokenizer.IdToToken(10**6) is None


def test_missing_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(CausalLMError) as info:
        Tokenizer.FromFile(path)
    message = str(info.value)
    assert str(path) in message and "not found" in message and "\n" not in message


@pytest.mark.parametrize("content", [b"{not json", b"{}", b'{"model": 3}', b"\xff\xfe\x00"])
def test_corrupt_file_is_one_line_naming_it(tmp_path, content):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    with pytest.raises(CausalLMError) as info:
        Tokenizer.FromFile(path)
    message = str(info.value)
    assert str(path) in message and "not a valid tokenizer.json" in message
    assert "\n" not in message


def test_encode_rejects_non_text(tokenizer):
    with pytest.raises(CausalLMError, match="Encode expects a str"):
        tokenizer.Encode(b"bytes")


# ----------------------------------------------------------------------------- StreamDecoder

def test_stream_equals_full_decode_and_never_breaks_a_character(tokenizer, stream_path):
    held_back = 0
    for text in TEXTS:
        ids = tokenizer.Encode(text, add_special_tokens=False)
        chunks = _stream(tokenizer, ids)
        assert "".join(chunks) == tokenizer.Decode(ids, skip_special_tokens=True) == text
        assert not any("\ufffd" in chunk for chunk in chunks)
        held_back += sum(chunk == "" for chunk in chunks[:-1])
    assert held_back > 0, "no multi-byte character was split: the test proves nothing"


def test_split_characters_are_held_until_complete(tokenizer, stream_path):
    ids = tokenizer.Encode("a 🙂 b", add_special_tokens=False)  # 🙂: 4 bytes, 4 tokens
    chunks = _stream(tokenizer, ids)
    assert chunks.count("") >= 3
    assert "🙂" in chunks or " 🙂" in chunks  # emitted whole, in one chunk
    assert "".join(chunks) == "a 🙂 b"


def test_special_tokens_are_not_printed(tokenizer, stream_path):
    eos = _eos(tokenizer)
    ids = tokenizer.Encode("Ça va 🎉", add_special_tokens=True) + [eos]
    assert "".join(_stream(tokenizer, ids)) == "Ça va 🎉"
    decoder = StreamDecoder(tokenizer, skip_special_tokens=False)
    text = "".join(decoder.step(i) for i in ids) + decoder.flush()
    assert text == tokenizer.Decode(ids, skip_special_tokens=False)
    assert text.endswith(tokenizer.IdToToken(eos))


def _random_ids(vocab_size):
    rng = np.random.default_rng(1234)
    for length in (1, 2, 7, 40, 200):
        for _ in range(5):
            yield rng.integers(0, vocab_size, size=length).tolist()


def test_random_ids_including_invalid_utf8(tokenizer, stream_path):
    """Any id sequence, even byte soup that is not UTF-8: the stream goes on and never ends a
    chunk on a replacement character it might still complete. (SentencePiece byte fallback:
    Decode turns a whole run of byte tokens into U+FFFDs when the run is not UTF-8, so text
    already streamed can differ from Decode; DecodeStream raises there, the Python path goes
    on.)"""
    for ids in _random_ids(tokenizer.GetVocabSize()):
        chunks = _stream(tokenizer, ids)
        assert not any(chunk.endswith("\ufffd") for chunk in chunks[:-1])


def test_random_byte_level_ids_stream_to_decode(stream_path):
    """Byte-level: whatever the ids, the streamed chunks add up to Decode."""
    tok = _load("byte_level")
    for ids in _random_ids(tok.GetVocabSize()):
        assert "".join(_stream(tok, ids)) == tok.Decode(ids, skip_special_tokens=True)


def test_invalid_byte_run_does_not_stop_the_stream(stream_path):
    tok = _load("sentencepiece")
    byte_x, lead, n = tok.TokenToId("<0x78>"), tok.TokenToId("<0xE3>"), tok.TokenToId("n")
    fox = tok.Encode("fox", add_special_tokens=False)  # "▁fox": " fox" after other text
    # Decode([<0x78>]) is "x", but Decode([<0x78>, <0xE3>, n]) is "\ufffd\ufffdn": the byte run
    # is not UTF-8, so the "x" already shown is rewritten. DecodeStream raises there.
    assert tok.Decode([byte_x, lead, n]) == "\ufffd\ufffdn"
    chunks = _stream(tok, [byte_x, lead, n] + fox)
    assert chunks[:3] == ["x", "", "\ufffd\ufffdn"]
    assert "".join(chunks) == "x\ufffd\ufffdn fox"


def test_flush_returns_held_bytes_and_resets(tokenizer, stream_path):
    ids = tokenizer.Encode("x 🙂", add_special_tokens=False)  # 🙂 is not in the training text
    decoder = StreamDecoder(tokenizer)
    emitted = "".join(decoder.step(i) for i in ids[:-1])  # the emoji's last byte is missing
    tail = decoder.flush()
    assert emitted + tail == tokenizer.Decode(ids[:-1], skip_special_tokens=True)
    assert tail.endswith("\ufffd")
    assert decoder.flush() == ""
    again = tokenizer.Encode("fox", add_special_tokens=False)  # a fresh start after flush
    assert "".join(decoder.step(i) for i in again) + decoder.flush() == "fox"


def test_one_decoder_per_row_interleaved(tokenizer, stream_path):
    rows = [tokenizer.Encode(t, add_special_tokens=False) for t in TEXTS[:3]]
    decoders_ = [StreamDecoder(tokenizer) for _ in rows]
    outputs = ["" for _ in rows]
    for step in range(max(map(len, rows))):
        for b, ids in enumerate(rows):
            if step < len(ids):
                outputs[b] += decoders_[b].step(np.int64(ids[step]))
    outputs = [out + dec.flush() for out, dec in zip(outputs, decoders_)]
    assert outputs == TEXTS[:3]


def test_padding_and_truncation_in_tokenizer_json_are_ignored():
    """A tokenizer.json saved with padding on (all-MiniLM's pads to 128) encodes unpadded, as a
    plain transformers call does."""
    path = os.path.join(os.path.dirname(__file__), "fixtures", "bert-st-mean", "tokenizer.json")
    assert json.load(open(path))["padding"] is not None
    tok = Tokenizer.FromFile(path)
    ids = tok.Encode("short text")
    assert len(ids) < 10 and tok.TokenToId("[PAD]") not in ids
