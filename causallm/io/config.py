"""The three JSON files of a model folder, read with orjson.

- ``config.json`` (Hugging Face model config): required.
- ``generation_config.json`` (Hugging Face): optional; missing keys take the defaults below.
- ``nntr_config.json`` (NNTrainer runtime settings): optional, so a Hugging Face download runs as
  it is; missing keys take the defaults below.

A :class:`JsonConfig` is a dict that remembers its file, so a missing or ill-typed key is a
one-line error naming the file and the key: ``cfg.get_int("hidden_size")``. C++ lines such as
``NUM_VOCAB = cfg["vocab_size"]`` port as ``self.NUM_VOCAB = cfg.get_int("vocab_size")``.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from causallm.errors import CausalLMError, utf8

_MISSING = object()

NNTR_DEFAULTS: dict[str, Any] = {
    "model_tensor_type": "FP32-FP32",
    "batch_size": 1,
    "init_seq_len": 2048,       # rows of the step buffer: the longest prefill chunk
    "num_to_generate": 512,     # new tokens by default, within the context (max_seq_len)
    "embedding_dtype": "FP32",
    "fc_layer_dtype": "FP32",
    "bad_word_ids": [],
    "tokenizer_file": "tokenizer.json",
    "fsu": False,
    "fsu_lookahead": 1,
}
"""nntr_config.json defaults. ``max_seq_len`` (the context: the positions of a sequence, prompt
and new tokens together; the KV cache rows) defaults to the model's own context at most 4096
(models/transformer.py, ``setupContext``), ``init_seq_len`` is at most the context,
``lmhead_dtype`` defaults to embedding_dtype, and ``model_file_name`` to the folder's
safetensors."""

NNTR_KEYS = frozenset((
    "model_type", "model_tensor_type", "model_file_name", "module_config_path",
    "tokenizer_file", "batch_size", "slots", "init_seq_len", "max_seq_len", "num_to_generate",
    "embedding_dtype", "fc_layer_dtype", "lmhead_dtype", "kv_cache_dtype", "bad_word_ids",
    "fsu", "fsu_lookahead", "moe_expert_cache", "sample_input", "chat_input", "system_prompt"))
"""Every nntr_config.json key the application reads: the nntr options ``causallm.load`` takes
(docs/server.md)."""


class JsonConfig(dict):
    """A JSON object plus the path it came from, with typed getters that fail in one line."""

    def __init__(self, data: dict, path: str, exists: bool = True, section: str = "") -> None:
        super().__init__(data)
        self.path = path
        self.exists = exists
        self.section = section  # "encoder.text_config": where a nested object sits in the file
        # key -> the command-line flag or keyword argument that set its value (for its errors)
        self.flags: dict[str, str] = {}
        self.gguf = None  # config.json of a GGUF: the GGUFFile it was made from (below)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def directory(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))

    def _given(self, key: str) -> str | None:
        """How the user named ``key`` when a flag or a keyword argument set it (or the object
        it sits in): "-n (num_to_generate)", "num_to_generate"; None when the file did."""
        name = f"{self.section}.{key}" if self.section else key
        top = name.split(".")[0]
        given = self.flags.get(top)
        if given is None:
            return None
        return name if given == top else f"{given} ({name})"

    def where(self, key: str) -> str:
        """``key`` as an error names it: its flag or keyword argument (``_given``), else
        ``FILE: 'key'``."""
        name = f"{self.section}.{key}" if self.section else key
        return self._given(key) or f"{self.path}: '{name}'"

    def error(self, key: str, expected: str) -> CausalLMError:
        name = f"{self.section}.{key}" if self.section else key
        if key in self:
            return CausalLMError(f"{self.where(key)} must be {expected}, got {self[key]!r}")
        if self._given(key):  # a key of an object given as a keyword argument
            return CausalLMError(f"{self._given(key)} is missing ({expected})")
        return CausalLMError(f"{self.path}: missing key '{name}' ({expected})")

    def origin(self, key: str) -> str:
        """Where ``key``'s value was set: the flag or keyword argument that overrode it, or
        the file."""
        name = f"{self.section}.{key}" if self.section else key
        return self.flags.get(name.split(".")[0]) or self.path

    def contains(self, key: str) -> bool:
        """True when the key is present and not null (nlohmann ``contains`` + ``is_null``)."""
        return self.get(key) is not None

    def _value(self, key: str, default: Any, expected: str) -> Any:
        value = self.get(key)
        if value is None:
            if default is _MISSING:
                raise self.error(key, expected)
            return default
        return value

    def get_int(self, key: str, default: Any = _MISSING, minimum: int | None = None) -> int:
        value = self._value(key, default, "an integer")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise self.error(key, "an integer")
        if minimum is not None and value < minimum:
            raise self.error(key, f"an integer >= {minimum}")
        return int(value)

    def get_float(self, key: str, default: Any = _MISSING) -> float:
        value = self._value(key, default, "a number")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, "a number")
        return float(value)

    def get_bool(self, key: str, default: Any = _MISSING) -> bool:
        value = self._value(key, default, "true or false")
        if not isinstance(value, bool):
            raise self.error(key, "true or false")
        return value

    def get_str(self, key: str, default: Any = _MISSING) -> str:
        value = self._value(key, default, "a string")
        if not isinstance(value, str):
            raise self.error(key, "a string")
        return value

    def get_int_list(self, key: str, default: Any = _MISSING) -> list[int]:
        """An integer or a list of integers, as a list (``eos_token_id`` takes either)."""
        value = self._value(key, default, "an integer or a list of integers")
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            raise self.error(key, "an integer or a list of integers")
        return list(items)

    def get_dict(self, key: str, default: Any = _MISSING) -> "JsonConfig":
        value = self._value(key, default, "an object")
        if not isinstance(value, dict):
            raise self.error(key, "an object")
        sub = JsonConfig(value, self.path, self.exists,
                         f"{self.section}.{key}" if self.section else key)
        sub.flags = self.flags  # by top-level key: an object given as a keyword stays so
        return sub

    def resolve_path(self, value: str) -> str:
        """A path from this file: absolute as given, else relative to the file's folder."""
        return value if os.path.isabs(value) else os.path.join(self.directory, value)


def load_json(path: str, required: bool = True) -> JsonConfig:
    """Read a JSON object; a missing optional file gives an empty config (``exists`` False)."""
    if not os.path.exists(path):
        if required or os.path.lexists(path):  # a link to nothing was meant to be read
            from causallm.io.files import not_found

            raise not_found(path)
        return JsonConfig({}, path, exists=False)
    try:
        with open(path, "rb") as f:
            raw = f.read()
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        utf8(raw, path)  # a file that is not UTF-8 named by its first bad byte
        raise CausalLMError(f"{path}: invalid JSON ({e})") from None
    except OSError as e:
        raise CausalLMError(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(data, dict):
        raise CausalLMError(f"{path}: expected a JSON object at the top level")
    return JsonConfig(data, path)


def load_model_configs(model_dir: str) -> tuple[JsonConfig, JsonConfig, JsonConfig]:
    """``config.json`` (required), ``generation_config.json`` and ``nntr_config.json`` (optional)
    of a model folder; or, for a .gguf file (or a folder whose only model is one), the configs
    its metadata stands for (causallm/io/gguf_file.py) and the folder's nntr_config.json. A
    GGUF's config carries the open file as ``cfg.gguf``."""
    gguf_path = model_dir if is_gguf(model_dir) else None
    if gguf_path is None:
        if not os.path.isdir(model_dir):
            what = "file" if model_dir.lower().endswith(".gguf") else "directory"
            raise CausalLMError(f"{model_dir}: not a model folder or .gguf file (no such {what})")
        gguf_path = gguf_in_folder(model_dir)
    if gguf_path is not None:
        from causallm.io.gguf_file import GGUFFile  # a GGUF's reader only when there is one

        file = GGUFFile(gguf_path)
        cfg = JsonConfig(file.config(), gguf_path)
        cfg.gguf = file
        gen = JsonConfig(file.generation(), gguf_path)
        folder = os.path.dirname(os.path.abspath(gguf_path))
        nntr = load_json(os.path.join(folder, "nntr_config.json"), required=False)
        return cfg, gen, nntr
    cfg = load_json(os.path.join(model_dir, "config.json"))
    gen = load_json(os.path.join(model_dir, "generation_config.json"), required=False)
    nntr = load_json(os.path.join(model_dir, "nntr_config.json"), required=False)
    return cfg, gen, nntr


def list_folder(folder: str) -> list[str]:
    """``os.listdir(folder)``; a folder that cannot be read is a one-line error naming it."""
    try:
        return os.listdir(folder)
    except OSError as e:
        raise CausalLMError(f"{folder}: cannot read the folder ({e.strerror or e})") from None


def is_gguf(path: str) -> bool:
    """A path that names a .gguf file."""
    return os.path.isfile(path) and path.lower().endswith(".gguf")


def gguf_in_folder(folder: str) -> str | None:
    """The folder's only .gguf file when it has no config.json; an error when it has several."""
    if os.path.exists(os.path.join(folder, "config.json")):
        return None
    found = sorted(f for f in list_folder(folder) if f.lower().endswith(".gguf"))
    if len(found) > 1:
        raise CausalLMError(f"{folder}: no config.json and {len(found)} GGUF files "
                            f"({', '.join(found)}); pass the one to run")
    return os.path.join(folder, found[0]) if found else None
