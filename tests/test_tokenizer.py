"""Tokenizer wrapper and StreamDecoder, on tokenizers trained here from a few lines of text.

Two kinds of tokenizer.json, both small enough that multi-byte characters are split over
several tokens:

- byte-level BPE (GPT-2 / Qwen / Llama-3 style): ByteLevel pre-tokenizer and decoder;
- SentencePiece-style BPE (Llama-2 / Gemma style): ``▁`` for spaces, ``<0xNN>`` byte-fallback
  tokens, decoder Replace + ByteFallback + Fuse + Strip, and a post-processor adding ``<s>``.
"""

import json

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

import causallm.tokenizer as tokenizer_module
from causallm.errors import CausalLMError
from causallm.tokenizer import StreamDecoder, Tokenizer

LINES = [
    "Héllo wörld! Ça va? naïve café, déjà vu, Ærøskøbing",
    "emoji 😀🎉 and 👍🏽 family 👨‍👩‍👧 done",
    "日本語のテキスト and more text",
    "the quick brown fox jumps over the lazy dog",
]
TEXTS = LINES + ["Ça 😀 va très bien 🎉🎉, merci! 日本", "no special characters at all"]


def _byte_level_bpe() -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(LINES, trainer)
    return tok


def _sentencepiece_bpe() -> HFTokenizer:
    tok = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
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
    tok = HFTokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    return tok


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def tokenizer(request, tmp_path_factory):
    hf = _byte_level_bpe() if request.param == "byte_level" else _sentencepiece_bpe()
    path = tmp_path_factory.mktemp(request.param) / "tokenizer.json"
    hf.save(str(path))
    return Tokenizer.FromFile(path)


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

def test_encode_decode_match_the_tokenizer_json(tokenizer, tmp_path):
    hf = HFTokenizer.from_file(tokenizer.path)
    for text in TEXTS:
        for add_special in (True, False):
            ids = tokenizer.Encode(text, add_special_tokens=add_special)
            assert ids == hf.encode(text, add_special_tokens=add_special).ids
        ids = tokenizer.Encode(text, add_special_tokens=False)
        assert tokenizer.Decode(ids) == text
        assert tokenizer.Decode(np.array(ids, dtype=np.int64)) == text


def test_special_tokens_come_from_the_post_processor(tokenizer):
    bos = tokenizer.TokenToId("<s>")
    with_special = tokenizer.Encode("the fox")
    without = tokenizer.Encode("the fox", add_special_tokens=False)
    if bos is None:  # byte-level file: its post-processor adds nothing
        assert with_special == without
    else:
        assert with_special == [bos] + without
        assert tokenizer.Decode(with_special) == "<s> the fox"
        assert tokenizer.Decode(with_special, skip_special_tokens=True) == "the fox"


def test_vocab_lookups(tokenizer):
    hf = HFTokenizer.from_file(tokenizer.path)
    assert tokenizer.GetVocabSize() == hf.get_vocab_size(with_added_tokens=True)
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


def _kind(tok: Tokenizer) -> str:
    return "byte_level" if tok.TokenToId("<|endoftext|>") is not None else "sentencepiece"


def test_random_ids_including_invalid_utf8(tokenizer, stream_path):
    """Any id sequence, even byte soup that is not UTF-8.

    Byte-level: the stream adds up to Decode. SentencePiece byte fallback: Decode turns a whole
    run of byte tokens into U+FFFDs when the run is not UTF-8, so text already streamed can
    differ; the stream must still go on (DecodeStream raises there; we fall back to Python).
    """
    rng = np.random.default_rng(1234)
    vocab_size = tokenizer.GetVocabSize()
    for length in (1, 2, 7, 40, 200):
        for _ in range(5):
            ids = rng.integers(0, vocab_size, size=length).tolist()
            chunks = _stream(tokenizer, ids)
            assert not any(chunk.endswith("\ufffd") for chunk in chunks[:-1])
            if _kind(tokenizer) == "byte_level":
                assert "".join(chunks) == tokenizer.Decode(ids, skip_special_tokens=True)


def test_invalid_byte_run_does_not_stop_the_stream(stream_path, tmp_path):
    _sentencepiece_bpe().save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.FromFile(tmp_path / "tokenizer.json")
    byte_x, lead, n = tok.TokenToId("<0x78>"), tok.TokenToId("<0xE3>"), tok.TokenToId("n")
    fox = tok.Encode("fox", add_special_tokens=False)  # "▁fox": " fox" after other text
    # Decode([<0x78>]) is "x", but Decode([<0x78>, <0xE3>, n]) is "\ufffd\ufffdn": the byte run
    # is not UTF-8, so the "x" already shown is rewritten. DecodeStream raises there.
    assert tok.Decode([byte_x, lead, n]) == "\ufffd\ufffdn"
    chunks = _stream(tok, [byte_x, lead, n] + fox)
    assert chunks[:3] == ["x", "", "\ufffd\ufffdn"]
    assert "".join(chunks) == "x\ufffd\ufffdn fox"


def test_both_paths_emit_the_same_chunks(tokenizer, monkeypatch):
    ids = tokenizer.Encode(" ".join(TEXTS), add_special_tokens=True) + [_eos(tokenizer)]
    with_stream = _stream(tokenizer, ids)
    monkeypatch.setattr(tokenizer_module, "_DecodeStream", None)
    assert _stream(tokenizer, ids) == with_stream


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
    import json
    import os

    path = os.path.join(os.path.dirname(__file__), "fixtures", "bert-st-mean", "tokenizer.json")
    assert json.load(open(path))["padding"] is not None
    tok = Tokenizer.FromFile(path)
    ids = tok.Encode("short text")
    assert len(ids) < 10 and tok.TokenToId("[PAD]") not in ids
