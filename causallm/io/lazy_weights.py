"""Weights read from their file on demand, for layers that keep only a few in memory.

A memory-mapped weight stays resident once touched (its pages count in the process's RSS), so
a layer that wants a small footprint - the MoE expert cache of ``qwen_moe`` - must not touch
the map at all. It keeps a :class:`FileSlice` per weight instead: where the tensor's bytes are
(file, byte offset, stored dtype and shape). ``read()`` copies them into a fresh float32 array
with ``np.fromfile`` (widening F16/BF16); the page cache may keep the file, the process does not.

:class:`ExpertCache` keeps the last ``capacity`` experts read this way (least recently used out).
``bin_slices`` and ``safetensors_slice`` locate tensors in an NNTrainer .bin and a
.safetensors file (layouts in causallm/io/safetensors.py). An MXFP4 tensor (gpt-oss experts: uint8
``X_blocks`` + ``X_scales``, causallm/io/mxfp4.py) is read by :class:`Mxfp4Slice`: only one
expert's blocks and scales are read, then dequantized as transformers does.
"""

from __future__ import annotations

import functools
import math
import os
from collections import OrderedDict

import numpy as np
import orjson

from causallm.errors import CausalLMError
from causallm.io.mxfp4 import BLOCKS_SUFFIX, SCALES_SUFFIX, dequantize_rows, mxfp4_shape
from causallm.io.nntr_bin import bin_nbytes
from causallm.io.safetensors import bf16_to_f32

# stored dtype -> (numpy dtype of the raw values, bytes per value)
_RAW = {"F32": ("<f4", 4), "FP32": ("<f4", 4), "F16": ("<f2", 2), "FP16": ("<f2", 2),
        "BF16": ("<u2", 2)}


class FileSlice:
    """``prod(shape)`` values of ``dtype`` (F32/FP32, F16/FP16, BF16) stored C-contiguously at
    byte ``offset`` of ``path``. ``read()`` returns them as a read-only float32 array of
    ``shape``, or its transpose view when ``transpose`` (a PyTorch [out, in] matrix used as
    [in, out])."""

    __slots__ = ("path", "offset", "dtype", "shape", "transpose")

    def __init__(self, path: str, offset: int, dtype: str, shape: tuple, transpose: bool = False):
        if dtype not in _RAW:
            raise CausalLMError(f"{path}: tensor dtype {dtype} cannot be read on demand "
                                f"(supported: {', '.join(_RAW)})")
        self.path, self.offset, self.dtype = path, int(offset), dtype
        self.shape, self.transpose = tuple(int(s) for s in shape), bool(transpose)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _RAW[self.dtype][1]

    def transposed(self) -> "FileSlice":
        return FileSlice(self.path, self.offset, self.dtype, self.shape, not self.transpose)

    def read(self) -> np.ndarray:
        count = math.prod(self.shape)
        raw = np.fromfile(self.path, dtype=_RAW[self.dtype][0], count=count, offset=self.offset)
        if raw.size != count:
            raise CausalLMError(f"{self.path}: {count} {self.dtype} values at byte {self.offset} "
                                f"run past the end of the file")
        a = bf16_to_f32(raw) if self.dtype == "BF16" else raw.astype(np.float32, copy=False)
        a = a.reshape(self.shape)
        a.flags.writeable = False  # as loaded weights are (and the kernels compile for)
        return a.T if self.transpose else a

    def __array__(self, dtype=None, copy=None):
        a = self.read()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return (f"FileSlice({self.path!r}, offset={self.offset}, {self.dtype}, {self.shape}"
                f"{', transposed' * self.transpose})")


class Mxfp4Slice:
    """Part of an MXFP4 tensor X (uint8 ``X_blocks`` [E, R, G, B] and ``X_scales`` [E, R, G];
    transformers' dequantized X is [E, K, R] with K = 2BG, causallm/io/mxfp4.py), read on demand.

    The part is ``lead`` = (E,) experts (the whole tensor) or () (one expert) whose
    ``prod(lead) * R * G * B`` block bytes lie at ``blocks_offset`` of ``blocks_path`` and
    ``prod(lead) * R * G`` scale bytes at ``scales_offset`` of ``scales_path``; of each expert
    only the stored rows ``rows`` (a slice of R, i.e. columns of X) are dequantized.

    ``read()`` gives ``X[part][..., rows]``, [*lead, K, n] float32: the transpose view of the
    C-contiguous dequantized rows [*lead, n, K] (a PyTorch [out, in] matrix used as [in, out]);
    with ``transpose``, those rows themselves.
    """

    __slots__ = ("blocks_path", "blocks_offset", "scales_path", "scales_offset", "lead",
                 "num_rows", "groups", "block_bytes", "rows", "transpose")

    def __init__(self, blocks_path: str, blocks_offset: int, scales_path: str,
                 scales_offset: int, lead: tuple, num_rows: int, groups: int, block_bytes: int,
                 rows: slice = slice(None), transpose: bool = False):
        self.blocks_path, self.blocks_offset = blocks_path, int(blocks_offset)
        self.scales_path, self.scales_offset = scales_path, int(scales_offset)
        self.lead = tuple(int(d) for d in lead)
        self.num_rows, self.groups, self.block_bytes = int(num_rows), int(groups), int(block_bytes)
        self.rows, self.transpose = rows, bool(transpose)

    @property
    def shape(self) -> tuple:
        """The shape read() returns."""
        K, n = 2 * self.block_bytes * self.groups, len(range(*self.rows.indices(self.num_rows)))
        return (*self.lead, n, K) if self.transpose else (*self.lead, K, n)

    def _bytes(self, path: str, offset: int, shape: tuple) -> np.ndarray:
        count = math.prod(shape)
        raw = np.fromfile(path, dtype=np.uint8, count=count, offset=offset)
        if raw.size != count:
            raise CausalLMError(f"{path}: {count} MXFP4 bytes at byte {offset} run past the "
                                f"end of the file")
        return raw.reshape(shape)

    def read(self) -> np.ndarray:
        shape = (*self.lead, self.num_rows, self.groups)
        blocks = self._bytes(self.blocks_path, self.blocks_offset, shape + (self.block_bytes,))
        scales = self._bytes(self.scales_path, self.scales_offset, shape)
        a = dequantize_rows(blocks[..., self.rows, :, :], scales[..., self.rows, :])
        a.flags.writeable = False  # as loaded weights are (and the kernels compile for)
        return a if self.transpose else np.swapaxes(a, -1, -2)

    def __array__(self, dtype=None, copy=None):
        a = self.read()
        return a if dtype is None else a.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return (f"Mxfp4Slice({self.blocks_path!r}, offset={self.blocks_offset}, scales "
                f"{self.scales_path!r} offset={self.scales_offset}, rows {self.rows}, "
                f"{self.shape}{', transposed' * self.transpose})")


class ExpertCache:
    """At most ``capacity`` experts in memory, least recently used dropped first.

    ``sources[e]`` is expert e's tuple of FileSlices; ``get(e)`` returns its arrays, reading
    them on a miss. ``hits`` / ``misses`` count the lookups."""

    def __init__(self, sources: list, capacity: int) -> None:
        if capacity < 1:
            raise CausalLMError(f"expert cache capacity must be at least 1, got {capacity}")
        self.sources, self.capacity = sources, capacity
        self._loaded: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    def get(self, e: int) -> tuple:
        arrays = self._loaded.get(e)
        if arrays is not None:
            self._loaded.move_to_end(e)
            self.hits += 1
            return arrays
        self.misses += 1
        if len(self._loaded) >= self.capacity:
            self._loaded.popitem(last=False)
        arrays = tuple(s.read() for s in self.sources[e])
        self._loaded[e] = arrays
        return arrays

    def __len__(self) -> int:
        return len(self._loaded)


def bin_slices(path: str, specs: list) -> list[FileSlice]:
    """Locate every weight of an NNTrainer .bin: specs = [(full_name, shape, dtype)] in file
    order (FP32/FP16, nothing between them). The file size must be their sum."""
    path = os.fspath(path)
    out, offset = [], 0
    for name, shape, dtype in specs:
        if dtype not in ("FP32", "FP16"):
            raise CausalLMError(f"{path}: weight '{name}' has dtype {dtype}; only FP32 and "
                                f"FP16 weights can be read on demand")
        out.append(FileSlice(path, offset, dtype, shape))
        offset += bin_nbytes(shape, dtype)
    found = os.path.getsize(path)
    if found != offset:
        raise CausalLMError(f"{path}: expected {offset} bytes for the model's {len(specs)} "
                            f"weights, found {found}")
    return out


@functools.lru_cache(maxsize=64)
def _safetensors_layout(path: str, mtime_ns: int, size: int) -> dict:
    """{name: (dtype, shape, absolute byte offset)} from a .safetensors header."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = orjson.loads(f.read(n))
    header.pop("__metadata__", None)
    return {name: (t["dtype"], tuple(t["shape"]), 8 + n + t["data_offsets"][0])
            for name, t in header.items()}


def _layout(path: str) -> dict:
    st = os.stat(path)
    return _safetensors_layout(path, st.st_mtime_ns, st.st_size)


def _mxfp4_scales(path: str, name: str) -> tuple[str, tuple]:
    """(file, layout entry) of ``name`` (an MXFP4 scales tensor): in ``path`` itself, else in
    the shard ``model.safetensors.index.json`` beside it names."""
    layout = _layout(path)
    if name in layout:
        return path, layout[name]
    index = os.path.join(os.path.dirname(path), "model.safetensors.index.json")
    try:
        with open(index, "rb") as f:
            shard = orjson.loads(f.read())["weight_map"][name]
        shard = os.path.join(os.path.dirname(path), shard)
        return shard, _layout(shard)[name]
    except (OSError, KeyError, TypeError, orjson.JSONDecodeError):
        raise CausalLMError(f"{path}: MXFP4 tensor '{name[:-len(SCALES_SUFFIX)]}' has its "
                            f"blocks here but no '{name}' here or in {index}") from None


def mxfp4_slice(path: str, name: str, index: tuple = (), transpose: bool = False) -> Mxfp4Slice:
    """The MXFP4 tensor ``name`` (``name_blocks`` in ``path``, ``name_scales`` there or in a
    shard of the folder's index), or its part ``X[index]`` of the dequantized X [E, K, R]:
    ``index`` is (), (e,), (e, :) or (e, :, s) with s a slice of positive step (stored rows s
    of expert e, e.g. gpt-oss expert e's gate ``(e, :, 0::2)`` of gate_up_proj [E, H, 2I])."""
    blocks_dtype, shape, blocks_at = _layout(path)[name + BLOCKS_SUFFIX]
    scales_path, (scales_dtype, scales_shape, scales_at) = _mxfp4_scales(path, name +
                                                                           SCALES_SUFFIX)
    logical = mxfp4_shape(shape, name)
    E, R, G, B = shape
    if blocks_dtype != "U8" or scales_dtype != "U8" or tuple(scales_shape) != (E, R, G):
        raise CausalLMError(f"{path}: MXFP4 tensor '{name}' needs U8 blocks [E, R, G, B] and "
                            f"U8 scales [E, R, G]; got {blocks_dtype} {shape} and "
                            f"{scales_dtype} {tuple(scales_shape)}")
    index = tuple(index)
    if index == ():
        return Mxfp4Slice(path, blocks_at, scales_path, scales_at, (E,), R, G, B,
                          transpose=transpose)
    e, *rest = index
    whole = slice(None)
    if (isinstance(e, (int, np.integer)) and 0 <= e < E and len(rest) <= 2
            and all(isinstance(r, slice) for r in rest) and (not rest or rest[0] == whole)
            and (len(rest) < 2 or rest[1].step is None or rest[1].step > 0)):
        e = int(e)
        return Mxfp4Slice(path, blocks_at + e * R * G * B, scales_path, scales_at + e * R * G,
                          (), R, G, B, rest[1] if len(rest) == 2 else whole, transpose)
    raise CausalLMError(f"{path}: MXFP4 tensor '{name}' {logical}, part {index}: only the "
                        f"whole tensor, one expert (e,) with 0 <= e < {E}, or (e, :, columns) "
                        f"can be read on demand")


def safetensors_slice(path: str, name: str, index: tuple | None = None,
                      transpose: bool = False) -> FileSlice | Mxfp4Slice:
    """Tensor ``name`` of the .safetensors file ``path`` (already checked by SafetensorsFile),
    or its part ``tensor[index]``: ``index`` is leading integers, then optionally one slice of
    step 1 on the next axis (a contiguous block, e.g. expert e's gate rows ``(e, slice(0, I))``
    of a fused [E, 2I, H] tensor). An MXFP4 tensor (``name_blocks`` + ``name_scales``) gives
    an :class:`Mxfp4Slice` (the parts :func:`mxfp4_slice` allows)."""
    layout = _layout(path)
    if name not in layout and name + BLOCKS_SUFFIX in layout:
        return mxfp4_slice(path, name, () if index is None else index, transpose)
    try:
        dtype, shape, offset = layout[name]
    except KeyError:
        raise CausalLMError(f"{path}: no tensor named '{name}'") from None
    if dtype not in _RAW:
        raise CausalLMError(f"{path}: tensor '{name}' has dtype {dtype}, which cannot be read "
                            f"on demand (supported: F32, F16, BF16)")
    index = () if index is None else tuple(index)
    where = f"{path}: tensor '{name}' {shape}, part {index}"
    if len(index) > len(shape):
        raise CausalLMError(f"{where}: too many indices")
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    start = 0
    for axis, item in enumerate(index):
        if isinstance(item, (int, np.integer)) and 0 <= item < shape[axis]:
            start += int(item) * strides[axis]
        elif isinstance(item, slice) and axis == len(index) - 1:
            begin, end, step = item.indices(shape[axis])
            if step != 1 or end <= begin:
                raise CausalLMError(f"{where}: the slice must be non-empty with step 1")
            start += begin * strides[axis]
            shape = shape[:axis] + (end - begin,) + shape[axis + 1:]
        else:
            raise CausalLMError(f"{where}: only in-range leading integers and one final slice "
                                f"of step 1 can be read on demand")
    dropped = len(index) - (1 if index and isinstance(index[-1], slice) else 0)  # int axes
    return FileSlice(path, offset + start * _RAW[dtype][1], dtype, shape[dropped:], transpose)
