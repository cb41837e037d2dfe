"""The tokenizer: Hugging Face ``tokenizer.json`` through the ``tokenizers`` package, or a GGUF
file's vocabulary.

Mirrors the C++ app's ``tokenizers::Tokenizer`` (mlc-ai tokenizers-cpp, ``HFTokenizer``): built
from the file named by ``nntr_config.json``'s ``tokenizer_file`` (``Tokenizer::FromBlobJSON`` of
its bytes), with ``Encode``, ``Decode``, ``GetVocabSize``, ``TokenToId`` and ``IdToToken``.
Encoding and decoding are exactly what the ``tokenizer.json`` pipeline (normalizer,
pre-tokenizer, model, post-processor, decoder) produces; nothing is added here. A GGUF model
wraps its own ``GGUFTokenizer`` (causallm/io/gguf_tokenizer.py) instead, which answers the same
few calls (``encode(...).ids``, ``decode``, ``get_vocab_size``, ``token_to_id``,
``id_to_token``) with the ids and text of the ``tokenizers`` pipeline of that vocabulary.

:class:`StreamDecoder` turns generated ids into text one id at a time without ever printing a
broken UTF-8 character: a character split over several byte-level tokens (an emoji is 4 bytes,
often 2-4 tokens) is held back until its last byte arrives.
"""

from __future__ import annotations

import os
from typing import Iterable

from tokenizers import Tokenizer as _HFTokenizer

from causallm.errors import CausalLMError, unicode
from causallm.io.config import NNTR_DEFAULTS, JsonConfig
from causallm.io.files import not_found

try:  # tokenizers >= 0.21
    from tokenizers.decoders import DecodeStream as _DecodeStream
except ImportError:  # pragma: no cover - depends on the installed tokenizers
    _DecodeStream = None

_REPLACEMENT = "\ufffd"
"""U+FFFD, what a decoder shows for bytes that are not (yet) valid UTF-8."""


class Tokenizer:
    """A loaded ``tokenizer.json`` (build it with :meth:`FromFile`), or a GGUF vocabulary's
    ``GGUFTokenizer`` (``Tokenizer(GGUFFile(path).tokenizer(), path)``)."""

    def __init__(self, hf_tokenizer, path: str = "<memory>"):
        self._tokenizer = hf_tokenizer
        self.path = path

    @property
    def backend(self):
        """What this wraps: a ``tokenizers.Tokenizer`` or a ``GGUFTokenizer``."""
        return self._tokenizer

    @classmethod
    def FromFile(cls, path: str | os.PathLike) -> "Tokenizer":
        """Load a Hugging Face ``tokenizer.json`` (C++: ``Tokenizer::FromBlobJSON(file bytes)``).

        The path is used as given. A missing, unreadable or malformed file raises
        :class:`CausalLMError` with one line naming the file.
        """
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except FileNotFoundError:
            raise not_found(path, "tokenizer file") from None
        except OSError as e:
            raise CausalLMError(f"{path}: cannot read tokenizer file ({e.strerror})") from None
        try:
            hf_tokenizer = _HFTokenizer.from_str(blob.decode("utf-8"))
        except Exception as e:  # UnicodeDecodeError or the tokenizers parser's own exception
            reason = " ".join(str(e).split()) or type(e).__name__
            raise CausalLMError(f"{path}: not a valid tokenizer.json ({reason})") from None
        # a tokenizer.json may carry the padding/truncation it was last used with (e.g. pad to
        # 128); transformers resets both for a plain call, and so do we
        hf_tokenizer.no_padding()
        hf_tokenizer.no_truncation()
        return cls(hf_tokenizer, path)

    @classmethod
    def forModel(cls, cfg: JsonConfig, nntr_cfg: JsonConfig, hint: str = "") -> "Tokenizer":
        """The tokenizer a model's configs name (what the C++ constructor loads): nntr_config's
        ``tokenizer_file`` (in the file or given as a keyword; relative to nntr_config.json),
        else a GGUF's own vocabulary (``cfg.gguf``), else the model folder's
        ``tokenizer.json``. A file that is not there is an error naming it (and the key that
        named it), ``hint`` after it: what a family whose folders ship another format says."""
        given = nntr_cfg.contains("tokenizer_file")  # in the file, or as a keyword argument
        if cfg.gguf is not None and not given:
            return cls(cfg.gguf.tokenizer(), cfg.gguf.path)
        default = NNTR_DEFAULTS["tokenizer_file"]
        path = (nntr_cfg.resolve_path(nntr_cfg.get_str("tokenizer_file", default))
                if nntr_cfg.exists or given else cfg.resolve_path(default))
        if not os.path.exists(path):
            where = f"{nntr_cfg.where('tokenizer_file')}: " if given else ""
            raise CausalLMError(f"{where}{not_found(path, 'tokenizer file')}{hint}")
        return cls.FromFile(path)

    def EnableTruncation(self, max_length: int) -> None:
        """Cut encodings to ``max_length`` tokens, special tokens kept (sentence-transformers'
        ``max_seq_length``)."""
        try:
            self._tokenizer.enable_truncation(max_length)
        except Exception as e:  # a limit shorter than the special tokens
            raise CausalLMError(f"{self.path}: cannot truncate to {max_length} tokens "
                                f"({e})") from None

    def Encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``.

        ``add_special_tokens=True`` lets the tokenizer's own post-processor add what it is
        configured to add (a BOS for Llama-style files, nothing for Qwen's); ``False`` adds none.
        The C++ app encodes prompts with ``add_special_tokens=false`` (docs/nntrainer.md,
        "Prompt encoding without special tokens").
        """
        if not isinstance(text, str):
            raise CausalLMError(f"{self.path}: Encode expects a str, got {type(text).__name__}")
        unicode(text, "the text to encode")
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def Decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` through the tokenizer's decoder (C++ default: special tokens kept).

        Bytes that do not form valid UTF-8 come out as U+FFFD; ids unknown to the vocabulary are
        dropped, as ``tokenizers`` does.
        """
        ids = [int(i) for i in ids]
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def GetVocabSize(self) -> int:
        """Vocabulary size including added tokens (tokenizers-cpp: ``get_vocab_size(true)``)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def TokenToId(self, token: str) -> int | None:
        """Id of a token string (e.g. ``"<|im_end|>"``), or None when it is not in the vocab."""
        return self._tokenizer.token_to_id(token)

    def IdToToken(self, token_id: int) -> str | None:
        """Token string of an id (the raw vocabulary entry, e.g. ``"Ġthe"``), or None."""
        return self._tokenizer.id_to_token(int(token_id))


class StreamDecoder:
    """Incremental detokenizer for one sequence (use one per batch row).

    ``step(id)`` returns the text that ``id`` completes, possibly ``""``; ``flush()`` returns
    what is still held at the end, and
    ``"".join(step(i) for i in ids) + flush() == tokenizer.Decode(ids, skip_special_tokens)``
    for byte-level BPE tokenizers (any ids, even bytes that are not UTF-8) and for
    SentencePiece-style byte-fallback tokenizers on ids that decode to valid UTF-8. (The
    ``ByteFallback`` decoder turns a whole run of ``<0xNN>`` tokens into U+FFFDs when the run
    is not UTF-8, so a late byte can change text already shown; the stream then goes on.)

    Method (the one of ``tokenizers.decoders.DecodeStream``, which is used when installed and
    the tokenizer is a ``tokenizers`` one; a ``GGUFTokenizer`` takes this Python path):
    keep ``context`` (the ids of the last emitted chunk) and ``pending`` (the ids since).
    After each id, decode ``context + pending`` and emit the part after ``Decode(context)``,
    unless it is no longer or it ends with U+FFFD (an incomplete character), in which case
    hold it. Decoding with the left context keeps the leading-space rules of Metaspace and
    byte-level decoders the same as in a full decode.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer._tokenizer
        self._skip = skip_special_tokens
        self._reset()

    def _reset(self) -> None:
        self._stream = None
        if _DecodeStream is not None and isinstance(self._tokenizer, _HFTokenizer):
            self._stream = _DecodeStream(skip_special_tokens=self._skip)
        self._context: list[int] = []  # ids of the last emitted chunk
        self._pending: list[int] = []  # ids fed since that chunk
        self._prefix = ""  # Decode(self._context); kept only on the Python path

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def step(self, token_id: int) -> str:
        """Feed one generated id; return the newly completed text (``""`` while holding)."""
        self._pending.append(int(token_id))
        if self._stream is None:
            text = self._step_python()
        else:
            try:
                text = self._stream.step(self._tokenizer, self._pending[-1])
            except Exception:
                # DecodeStream refuses a decode that rewrites text already emitted (a run of
                # byte-fallback tokens that turned out not to be UTF-8). Go on in Python, which
                # emits what follows the common prefix (and re-raises any other decoding error).
                self._stream = None
                self._prefix = self._decode(self._context)
                text = self._step_python()
        if text is None:
            return ""
        self._context, self._pending = self._pending, []
        return text

    def _step_python(self) -> str | None:
        full = self._decode(self._context + self._pending)
        if len(full) <= len(self._prefix) or full.endswith(_REPLACEMENT):
            return None
        text = full[len(os.path.commonprefix([self._prefix, full])):]
        self._prefix = self._decode(self._pending)
        return text

    def flush(self) -> str:
        """Return the text still held (e.g. U+FFFD for bytes never completed) and start afresh.

        After ``flush()`` the decoder is in the state of a new ``StreamDecoder``.
        """
        text = ""
        if self._pending:
            prefix = self._decode(self._context)
            full = self._decode(self._context + self._pending)
            text = full[len(os.path.commonprefix([prefix, full])):]
        self._reset()
        return text
