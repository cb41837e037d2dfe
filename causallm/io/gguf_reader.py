"""GGUF files parsed directly: header, typed metadata and tensor table, over one read-only map.

The layout (llama.cpp's ggml/src/gguf.cpp; versions 2 and 3, little-endian)::

    "GGUF" | version u32 | tensor count u64 | key/value count u64
    each key/value:  key (string) | value type u32 | value
    each tensor:     name (string) | n_dims u32 | ne[0 .. n_dims) u64 (ne0, the contiguous
                     dimension, first) | ggml type u32 | offset u64 (into the data section)
    zero padding to the alignment (``general.alignment``, a uint32 power of two; 32 if absent)
    the data section: tensor t at data_offset + offset_t (a multiple of the alignment)

A string is its byte length (u64) then its UTF-8 bytes; an array is its element type (u32),
its count (u64) and the elements (an element array again type, count, elements). The value
types are gguf-py's ``GGUFValueType``: eleven fixed-size numbers and bools, string, array.

``GGUFContents(path)`` maps the file once (``np.memmap``, read-only) and reads everything but
the tensor data:

- ``metadata``: key -> value in file order. A scalar is a Python int, float, bool or str; an
  array of numbers (or bools) is one read-only numpy array (one ``np.frombuffer``, copied off the
  map); an array of strings a ``StringArray``, a read-only sequence over the map whose
  offsets one compiled walk finds (causallm/kernels/strings.py) and whose strings are decoded
  only when read (a 262k-token vocabulary costs two int64 arrays, not 262k str); an array of
  arrays a list. ``types`` gives each key's ``GGUFValueType``.
  A string that is not UTF-8 reads with U+FFFD in place of its bad bytes.
  ``string_bytes(key)`` gives an array of strings as bytes instead (``buffer``, ``starts``,
  ``lengths``: string i is ``buffer[starts[i]:starts[i] + lengths[i]]``, the UTF-8 of
  ``metadata[key][i]``): spans of the map, no Python object per string (a vocabulary's
  tokenizer reads its tokens and merges so).
- ``tensors``: name -> ``GGUFTensor`` in file order: the ggml type (gguf-py's
  ``GGMLQuantizationType``), the shape in ggml order (``shape``, ne0 first) and in Hugging Face
  order (``hf_shape``, reversed), the absolute byte offset and size (``n_elements / block *
  type_size``, gguf-py's ``GGML_QUANT_SIZES``), and ``data``, the raw bytes as a read-only
  uint8 view of the map (nothing read until used); ``values()`` views F32 / F16 / BF16 bytes as
  float32 / float16 / BF16 bits (uint16) of the Hugging Face shape.

A file that is not one of these (no magic, another version, big-endian, cut short, an unknown
type, a tensor outside the file) is a one-line ``CausalLMError``: ``"{path}: not a readable
GGUF file (what is wrong)"``.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType

from causallm.errors import CausalLMError

VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
_SCALAR = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
           GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
           GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
           GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}
"""Fixed-size value types -> their struct (and numpy) format."""
_FLOAT_VIEWS = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
                GGMLQuantizationType.BF16: np.uint16}


@dataclass(frozen=True, eq=False)
class GGUFTensor:
    """One tensor of a GGUF file (module docstring); ``data`` is the raw bytes, not a copy."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    n_bytes: int
    data: np.ndarray

    @property
    def hf_shape(self) -> tuple[int, ...]:
        return self.shape[::-1]

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    def values(self) -> np.ndarray:
        """F32 as float32, F16 as float16, BF16 as its bits (uint16), of ``hf_shape``: a view."""
        kind = _FLOAT_VIEWS.get(self.tensor_type)
        if kind is None:
            raise CausalLMError(f"tensor '{self.name}' is {self.tensor_type.name}, blocks rather "
                                f"than values (gguf.quants.dequantize reads them)")
        return self.data.view(kind).reshape(self.hf_shape)


class _Malformed(Exception):
    """What is wrong with the file, for the one-line error."""


class StringArray(Sequence):
    """An array of strings of the file: string i is ``buffer[starts[i]:starts[i] +
    lengths[i]]``, decoded (U+FFFD for bad bytes) when read. Equal to a list of the same
    strings."""

    def __init__(self, buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        self.buffer, self.starts, self.lengths = buffer, starts, lengths

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        s, n = int(self.starts[i]), int(self.lengths[i])
        return str(memoryview(self.buffer)[s:s + n], "utf-8", "replace")

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and \
            len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self) -> str:
        head = ", ".join(map(repr, self[:3]))
        return f"StringArray([{head}{', ...' if len(self) > 3 else ''}], {len(self)} strings)"

    def utf8(self) -> bool:
        """Every string is UTF-8."""
        from causallm.kernels.strings import first_not_utf8
        return len(self) == 0 or first_not_utf8(self.buffer, self.starts, self.lengths) < 0


class GGUFContents:
    """A GGUF file's metadata and tensor table (module docstring)."""

    def __init__(self, path) -> None:
        self.path = os.fspath(path)
        try:
            self.buffer = np.memmap(self.path, mode="r", dtype=np.uint8)
        except FileNotFoundError:
            raise CausalLMError(f"{self.path}: no such file") from None
        except OSError as e:
            raise CausalLMError(f"{self.path}: not a readable GGUF file "
                                f"({e.strerror or type(e).__name__})") from None
        except ValueError:  # numpy cannot map an empty file
            raise CausalLMError(f"{self.path}: not a readable GGUF file (it is empty)") from None
        self.metadata: dict[str, object] = {}
        self.types: dict[str, GGUFValueType] = {}
        self.tensors: dict[str, GGUFTensor] = {}
        try:
            self._parse()
        except _Malformed as e:
            raise CausalLMError(f"{self.path}: not a readable GGUF file ({e})") from None

    # -- reading ------------------------------------------------------------------------------
    def _need(self, n: int, what: str) -> int:
        """The current position, after checking ``n`` bytes of ``what`` are there."""
        if self._pos + n > self.size:
            raise _Malformed(f"it ends inside {what}, at byte {self.size}; truncated?")
        return self._pos

    def _unpack(self, fmt: str, what: str) -> tuple:
        n = struct.calcsize(fmt)
        values = struct.unpack_from(fmt, self._view, self._need(n, what))
        self._pos += n
        return values

    def _string(self, what: str) -> str:
        (n,) = self._unpack("<Q", what)
        start = self._need(n, what)
        self._pos += n
        return str(self._view[start:self._pos], "utf-8", "replace")

    def _value(self, kind: int, what: str):
        if kind in _SCALAR:
            return self._unpack(_SCALAR[kind], what)[0]
        if kind == GGUFValueType.STRING:
            return self._string(what)
        if kind == GGUFValueType.ARRAY:
            item, count = self._unpack("<IQ", what)
            return self._array(item, count, what)
        raise _Malformed(f"{what} has unknown value type {kind}")

    def _array(self, item: int, count: int, what: str):
        if item in _SCALAR:
            dtype = np.dtype(_SCALAR[item].replace("?", "B"))
            start = self._need(count * dtype.itemsize, what)
            self._pos += count * dtype.itemsize
            a = np.frombuffer(self.buffer, dtype, count, start)
            a = a != 0 if item == GGUFValueType.BOOL else a.copy()
            a.flags.writeable = False
            return a
        if item == GGUFValueType.STRING:
            return self._strings(count, what)
        if item == GGUFValueType.ARRAY:
            return [self._value(item, what) for _ in range(count)]
        raise _Malformed(f"{what} is an array of unknown value type {item}")

    def _strings(self, count: int, what: str) -> StringArray:
        """``count`` strings from the current position: their spans in one compiled walk."""
        from causallm.kernels.strings import string_spans

        self._need(8 * count, what)  # each string takes at least its length
        starts, lengths = np.empty(count, np.int64), np.empty(count, np.int64)
        if count:
            end = string_spans(self._array_view, self._pos, starts, lengths)
            if end < 0:
                raise _Malformed(f"it ends inside string {-1 - end} of {what}, at byte "
                                 f"{self.size}; truncated?")
            self._pos = int(end)
        return StringArray(self._array_view, starts, lengths)

    def string_bytes(self, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The array of strings ``key`` as (buffer, starts, lengths) (module docstring): spans
        of the mapped file, or, when a string is not UTF-8, of the UTF-8 of what ``metadata``
        holds for it."""
        strings = self.metadata.get(key)
        if not isinstance(strings, StringArray):
            raise CausalLMError(f"{self.path}: '{key}' is not an array of strings")
        if strings.utf8():
            return strings.buffer, strings.starts, strings.lengths
        encoded = [s.encode("utf-8") for s in strings]
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        starts = np.zeros(len(encoded), np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        return np.frombuffer(b"".join(encoded), np.uint8), starts, lengths

    def _parse(self) -> None:
        self.size = int(self.buffer.size)
        self._view = memoryview(self.buffer)
        self._array_view = np.asarray(self.buffer)
        self._pos = 0
        if self.size < 4 or self._view[:4] != b"GGUF":
            raise _Malformed("it does not start with 'GGUF'")
        self._pos = 4
        (version,) = self._unpack("<I", "the header")
        if version not in VERSIONS:
            if version & 0xFFFF == 0 and int.from_bytes(version.to_bytes(4, "little"), "big") \
                    in VERSIONS:
                raise _Malformed("a big-endian file; this reader reads little-endian ones")
            raise _Malformed(f"version {version}; versions {' and '.join(map(str, VERSIONS))} "
                             f"are read")
        self.version = version
        n_tensors, n_kv = self._unpack("<QQ", "the header")
        for i in range(n_kv):
            key = self._string(f"key/value {i}")
            if key in self.metadata:
                raise _Malformed(f"key '{key}' appears twice")
            what = f"the value of '{key}'"
            (kind,) = self._unpack("<I", what)
            self.metadata[key], self.types[key] = self._value(kind, what), GGUFValueType(kind)
        self.alignment = self._alignment()
        infos = []
        for i in range(n_tensors):
            name = self._string(f"tensor info {i}")
            what = f"the info of tensor '{name}'"
            (n_dims,) = self._unpack("<I", what)
            if n_dims > MAX_DIMS:
                raise _Malformed(f"tensor '{name}' has {n_dims} dimensions (at most {MAX_DIMS})")
            shape = self._unpack(f"<{n_dims}Q", what)
            kind, offset = self._unpack("<IQ", what)
            infos.append((name, shape, kind, offset))
        self.data_offset = -(-self._pos // self.alignment) * self.alignment
        for name, shape, kind, offset in infos:
            self._add_tensor(name, shape, kind, offset)
        del self._view

    def _alignment(self) -> int:
        if "general.alignment" not in self.metadata:
            return GGUF_DEFAULT_ALIGNMENT
        value = self.metadata["general.alignment"]
        if self.types["general.alignment"] != GGUFValueType.UINT32:
            raise _Malformed(f"general.alignment is a {self.types['general.alignment'].name}, "
                             f"not a UINT32")
        if value == 0 or value & (value - 1):
            raise _Malformed(f"general.alignment {value} is not a power of two")
        return value

    def _add_tensor(self, name: str, shape: tuple, kind: int, offset: int) -> None:
        if name in self.tensors:
            raise _Malformed(f"tensor '{name}' appears twice")
        try:
            tensor_type = GGMLQuantizationType(kind)
        except ValueError:
            raise _Malformed(f"tensor '{name}' has unknown ggml type {kind}") from None
        block, type_size = GGML_QUANT_SIZES[tensor_type]
        if shape and shape[0] % block:
            raise _Malformed(f"tensor '{name}' is {tensor_type.name} with rows of {shape[0]} "
                             f"values, not whole blocks of {block}")
        n_bytes = math.prod(shape) // block * type_size
        start = self.data_offset + offset
        if offset % self.alignment:
            raise _Malformed(f"tensor '{name}' starts at offset {offset} of the data section, "
                             f"not a multiple of the alignment {self.alignment}")
        if start + n_bytes > self.size:
            raise _Malformed(f"tensor '{name}' ({n_bytes} bytes at byte {start}) ends past the "
                             f"end of the file ({self.size} bytes); truncated?")
        self.tensors[name] = GGUFTensor(name, tensor_type, tuple(int(n) for n in shape), start,
                                        n_bytes, self.buffer[start:start + n_bytes])
