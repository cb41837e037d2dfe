"""safetensors files (read and write, no `safetensors` package) and Hugging Face checkpoints.

Every weight a caller gets back is a read-only, C-contiguous float32 numpy array. F32 data is
a zero-copy view into a read-only memory map of the file; F16, BF16 and F64 are converted.
(Integer and bool safetensors tensors are returned exactly, in their own dtype.)

safetensors layout (little-endian)::

    u64 N | N bytes of JSON header (padded with spaces) | data buffer
    header = {"__metadata__": {str: str}?, name: {"dtype": "F32", "shape": [..],
              "data_offsets": [begin, end]}}   # offsets are relative to the data buffer

bfloat16 is the top half of a float32: widening is `u16 << 16` (exact), narrowing rounds the
dropped 16 bits to nearest, ties to even; NaN stays NaN.
"""

import math
import os

import numpy as np
import orjson

from causallm.errors import CausalLMError
from causallm.io.config import list_folder
from causallm.io.files import atomic_write, cannot_read, map_file
from causallm.io.mxfp4 import MXFP4_DTYPE, dequantize_mxfp4, find_mxfp4_pairs, mxfp4_shape
from causallm.io.weight_check import check_weight
from causallm.kernels.packed import PackedMatrix

# safetensors dtype string -> (bytes per element, little-endian numpy dtype or None if unreadable)
_ST_DTYPES = {
    "F64": (8, "<f8"), "F32": (4, "<f4"), "F16": (2, "<f2"), "BF16": (2, "<u2"),
    "I64": (8, "<i8"), "U64": (8, "<u8"), "I32": (4, "<i4"), "U32": (4, "<u4"),
    "I16": (2, "<i2"), "U16": (2, "<u2"), "I8": (1, "i1"), "U8": (1, "u1"), "BOOL": (1, "?"),
    "C64": (8, None), "F8_E5M2": (1, None), "F8_E4M3": (1, None), "F8_E8M0": (1, None),
}
_NP_TO_ST = {np.dtype(v[1]): k for k, v in _ST_DTYPES.items()
             if v[1] is not None and k not in ("BF16", "F64")}  # float64 is written as F32
_MAX_HEADER = 100_000_000  # the limit the reference implementation enforces


def _readonly(a):
    a.flags.writeable = False
    return a


def bf16_to_f32(u16):
    """bfloat16 bit patterns (uint16, any shape) -> float32 of the same shape: bits << 16 (exact)."""
    u = np.asarray(u16, dtype=np.uint16).astype(np.uint32)
    u <<= 16  # in place, so 0-d input stays a 0-d array
    return u.view(np.float32)


def f32_to_bf16(f32):
    """float32 (any shape) -> bfloat16 bit patterns as uint16, rounding to nearest, ties to even.

    For finite x with bits u: (u + 0x7FFF + ((u >> 16) & 1)) >> 16, so values above the largest
    bfloat16 round to inf as IEEE rounding does. NaN keeps its sign and top payload bits and gets
    the quiet bit 0x0040, so it can never turn into inf.
    """
    u = np.asarray(f32, dtype=np.float32, order="C").view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, (u >> 16) | np.uint32(0x0040), rounded).astype(np.uint16)


# --------------------------------------------------------------------------------- safetensors

class SafetensorsFile:
    """One .safetensors file, header parsed and checked at open, data memory-mapped read-only.

    keys() lists tensor names in header order; shape(name) is a tuple; dtype(name) is the
    safetensors dtype string ("F32", "BF16", ...); metadata is the "__metadata__" dict ({} if none).
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as f:
                head = f.read(8)
                n = int.from_bytes(head, "little") if len(head) == 8 else -1
                if not 2 <= n <= min(_MAX_HEADER, size - 8):
                    raise CausalLMError(f"{self.path}: not a safetensors file (header length "
                                        f"{n}, file size {size} bytes)")
                raw = f.read(n)
        except OSError as e:
            raise cannot_read(self.path, e) from None
        try:
            header = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise CausalLMError(f"{self.path}: safetensors header is not valid JSON ({e})") from None
        if not isinstance(header, dict):
            raise CausalLMError(f"{self.path}: safetensors header is not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict):
            raise CausalLMError(f"{self.path}: safetensors __metadata__ is not a JSON object")
        self.metadata = meta
        self._start = 8 + n
        data_len = size - self._start
        self._info = {}
        for name, t in header.items():
            where = f"{self.path}: tensor '{name}'"
            if not (isinstance(t, dict) and isinstance(t.get("dtype"), str)
                    and isinstance(t.get("shape"), list) and isinstance(t.get("data_offsets"), list)):
                raise CausalLMError(f"{where}: header entry needs dtype, shape and data_offsets")
            dtype, shape, offs = t["dtype"], t["shape"], t["data_offsets"]
            if dtype not in _ST_DTYPES:
                raise CausalLMError(f"{where}: unknown dtype {dtype!r}")
            if not all(type(d) is int and d >= 0 for d in shape):
                raise CausalLMError(f"{where}: bad shape {shape}")
            if not (len(offs) == 2 and all(type(o) is int for o in offs)
                    and 0 <= offs[0] <= offs[1] <= data_len):
                raise CausalLMError(f"{where}: data_offsets {offs} outside the {data_len}-byte "
                                    "data buffer")
            nbytes = math.prod(shape) * _ST_DTYPES[dtype][0]
            if offs[1] - offs[0] != nbytes:
                raise CausalLMError(f"{where}: shape {shape} x {dtype} is {nbytes} bytes but "
                                    f"data_offsets {offs} span {offs[1] - offs[0]}")
            self._info[name] = (dtype, tuple(shape), offs[0] + self._start, nbytes)
        self._map = map_file(self.path)

    def keys(self):
        return list(self._info)

    def __contains__(self, name):
        return name in self._info

    def __len__(self):
        return len(self._info)

    def _entry(self, name):
        try:
            return self._info[name]
        except KeyError:
            raise CausalLMError(f"{self.path}: no tensor named '{name}'") from None

    def shape(self, name):
        return self._entry(name)[1]

    def dtype(self, name):
        return self._entry(name)[0]

    def get(self, name):
        """The tensor as a read-only C-contiguous array of its shape.

        F32: a view of the file (copied only if its offset is not 4-byte aligned).
        F16, BF16 (exact) and F64 (rounded to nearest) become float32. Integer and BOOL
        tensors come back exact in their own dtype (I64 -> int64, ...), not as float32.
        """
        dtype, shape, start, nbytes = self._entry(name)
        np_dtype = _ST_DTYPES[dtype][1]
        if np_dtype is None:
            raise CausalLMError(f"{self.path}: tensor '{name}' has dtype {dtype}, which is not "
                                "supported (use F32, F16, BF16, F64 or an integer type)")
        raw = self._map[start:start + nbytes].view(np.ndarray)
        if start % np.dtype(np_dtype).itemsize:
            raw = raw.copy()
        a = raw.view(np_dtype).reshape(shape)
        if dtype == "BF16":
            a = bf16_to_f32(a)
        elif dtype in ("F16", "F64"):
            a = a.astype(np.float32)
        return _readonly(a)

    def raw(self, name):
        """The tensor as stored: a BF16 or F16 matrix as a ``PackedMatrix`` of its bits (rows
        as in the file, a read-only view of it, copied only if misaligned), anything else as
        ``get`` gives it."""
        dtype, shape, start, nbytes = self._entry(name)
        if dtype not in ("BF16", "F16") or len(shape) != 2:
            return self.get(name)
        raw = self._map[start:start + nbytes].view(np.ndarray)
        if start % 2:
            raw = raw.copy()
        return PackedMatrix(dtype, _readonly(raw.view("<u2").reshape(shape)), transposed=False)


def _st_dtype_for(a, dtype):
    """The safetensors dtype string an array is written as (see write_safetensors)."""
    if a.dtype.kind == "f" and dtype is not None:
        return dtype
    if a.dtype.kind == "f":
        return "F16" if a.dtype == np.float16 else "F32"
    st = _NP_TO_ST.get(a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype)
    if st is None:
        raise CausalLMError(f"write_safetensors: cannot store numpy dtype {a.dtype}")
    return st


def write_safetensors(path, tensors, metadata=None, dtype=None):
    """Write {name: array} to a .safetensors file, atomically (temp file + rename).

    Floating arrays are written as F32, or F16 when the array is float16; dtype="F32", "F16" or
    "BF16" forces that dtype for every floating array (BF16 rounds float32 to nearest even).
    Integer and bool arrays are written as they are. Tensors are laid out with no gaps, widest
    dtype first (then in dict order), so every tensor is aligned to its element size; the
    header is padded with spaces to a multiple of 8 bytes.
    """
    if dtype not in (None, "F32", "F16", "BF16"):
        raise CausalLMError(f"write_safetensors: dtype must be F32, F16 or BF16, not {dtype!r}")
    items = []
    for name, a in tensors.items():
        a = np.asarray(a)
        st = _st_dtype_for(a, dtype)
        if st == "BF16":
            data = f32_to_bf16(a)
        else:
            data = np.asarray(a, dtype=_ST_DTYPES[st][1], order="C")
        items.append((name, st, a.shape, data))
    items.sort(key=lambda it: -_ST_DTYPES[it[1]][0])  # stable: dict order within one width
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name, st, shape, data in items:
        header[name] = {"dtype": st, "shape": list(shape),
                        "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
    blob = orjson.dumps(header)
    blob += b" " * (-len(blob) % 8)

    def write(f):
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for _, _, _, data in items:
            data.tofile(f)

    atomic_write(path, write)


def float_dtype(ckpt) -> str | None:
    """The floating-point dtype ("F32", "BF16", "F16", ...) holding the most elements of a
    checkpoint (anything with keys, dtype and shape): the precision it was saved in; None when
    it has no float tensor."""
    count: dict[str, int] = {}
    for name in ckpt.keys():
        dtype = ckpt.dtype(name)
        if dtype[0] in "FB" and dtype != "BOOL":
            count[dtype] = count.get(dtype, 0) + math.prod(ckpt.shape(name))
    return max(count, key=count.get) if count else None


class Checkpoint:
    """A Hugging Face model folder's safetensors weights, as one name -> tensor mapping.

    Opens `model.safetensors`; else the shards that `model.safetensors.index.json` lists in its
    "weight_map" (name -> file, a path relative to the folder and inside it: an absolute path or
    one through ``..`` is an error naming the entry); else the folder's only `*.safetensors`
    file.

    MXFP4 (gpt-oss experts): a uint8 pair `X_blocks` [E, R, G, B] + `X_scales` [E, R, G] is
    one tensor `X` of dtype "MXFP4" and shape [E, 2BG, R], which get() dequantizes to float32
    as transformers does (causallm/io/mxfp4.py); the pair's own names are hidden.
    """

    def __init__(self, folder):
        self.folder = os.fspath(folder)
        if not os.path.isdir(self.folder):
            raise CausalLMError(f"{self.folder}: not a directory")
        single = os.path.join(self.folder, "model.safetensors")
        index = os.path.join(self.folder, "model.safetensors.index.json")
        if os.path.isfile(single):
            self._single(single)
        elif os.path.isfile(index):
            self._sharded(index)
        else:
            found = sorted(f for f in list_folder(self.folder) if f.endswith(".safetensors"))
            if not found:
                raise CausalLMError(f"{self.folder}: no model.safetensors or "
                                    "model.safetensors.index.json")
            if len(found) > 1:
                raise CausalLMError(f"{self.folder}: no model.safetensors.index.json to choose "
                                    f"between {', '.join(found)}")
            self._single(os.path.join(self.folder, found[0]))
        self._mxfp4 = find_mxfp4_pairs({n: (f.dtype(n), f.shape(n))
                                        for n, f in self._where.items()})
        self._hidden = {part for pair in self._mxfp4.values() for part in pair}
        blocks_of = {pair[0]: name for name, pair in self._mxfp4.items()}
        self._names = [blocks_of.get(n, n) for n in self._where  # X in the place of X_blocks
                       if n in blocks_of or n not in self._hidden]

    def _single(self, path):
        f = SafetensorsFile(path)
        self._where = {name: f for name in f.keys()}

    def _sharded(self, index):
        try:
            with open(index, "rb") as fh:
                weight_map = orjson.loads(fh.read())["weight_map"]
        except OSError as e:
            raise cannot_read(index, e) from None
        except (orjson.JSONDecodeError, KeyError, TypeError) as e:
            raise CausalLMError(f"{index}: not a safetensors index with a \"weight_map\" "
                                f"({type(e).__name__}: {e})") from None
        if not isinstance(weight_map, dict):
            raise CausalLMError(f"{index}: \"weight_map\" is not a JSON object")
        shards, self._where = {}, {}
        for name, file in weight_map.items():
            if file not in shards:
                if not (isinstance(file, str) and file and not os.path.isabs(file)
                        and os.path.normpath(file).split(os.sep)[0] != os.pardir):
                    raise CausalLMError(f"{index}: \"weight_map\" entry '{name}': {file!r} is "
                                        f"not a file name inside the model folder")
                path = os.path.join(self.folder, file)
                if not os.path.isfile(path):
                    raise CausalLMError(f"{index}: shard '{file}' (for '{name}') does not exist")
                shards[file] = SafetensorsFile(path)
            if name not in shards[file]:
                raise CausalLMError(f"{index}: '{name}' is mapped to '{file}', which has no "
                                    "such tensor")
            self._where[name] = shards[file]

    def _file(self, name):
        if name in self._mxfp4:
            return self._where[self._mxfp4[name][0]]
        if name in self._where and name not in self._hidden:  # parts: only through their X
            return self._where[name]
        raise CausalLMError(f"{self.folder}: checkpoint has no tensor named '{name}'")

    def keys(self):
        return list(self._names)

    def __contains__(self, name):
        return name in self._mxfp4 or (name in self._where and name not in self._hidden)

    def __len__(self):
        return len(self._names)

    def shape(self, name):
        if name in self._mxfp4:
            blocks = self._mxfp4[name][0]
            return mxfp4_shape(self._file(name).shape(blocks), name)
        return self._file(name).shape(name)

    def dtype(self, name):
        return MXFP4_DTYPE if name in self._mxfp4 else self._file(name).dtype(name)

    def get(self, name, zeros=False):
        """The tensor as read-only float32 (see SafetensorsFile.get); an MXFP4 tensor is
        dequantized whole, each expert an F-contiguous matrix (``dequantize_mxfp4``). Checked
        for NaN and infinities, and with ``zeros`` for all zeros (``check_weight``)."""
        if name in self._mxfp4:
            blocks, scales = self._mxfp4[name]
            value = _readonly(dequantize_mxfp4(self._where[blocks].get(blocks),
                                               self._where[scales].get(scales)))
        else:
            value = self._file(name).get(name)
        return check_weight(value, f"{self.file_of(name)}: tensor '{name}'", zeros)

    def raw(self, name, zeros=False):
        """As SafetensorsFile.raw (an MXFP4 tensor: dequantized to float32), checked as get."""
        if name in self._mxfp4:
            return self.get(name, zeros)
        return check_weight(self._file(name).raw(name), f"{self.file_of(name)}: tensor '{name}'",
                            zeros)

    def file_of(self, name):
        """Path of the file that holds `name` (of an MXFP4 tensor: the file of its blocks)."""
        return self._file(name).path


class RenamedCheckpoint:
    """A Checkpoint under other names: each (old prefix, new prefix) of ``renames`` turns a
    name starting with the old prefix into the new one (the first that matches), so a family
    reads checkpoints written under an older layout (Gemma 3's transformers-4 names)."""

    def __init__(self, ckpt, renames) -> None:
        self.ckpt = ckpt
        self.folder = ckpt.folder
        self._old = {}
        for name in ckpt.keys():
            new = next((to + name[len(frm):] for frm, to in renames if name.startswith(frm)),
                       name)
            self._old[new] = name

    def keys(self):
        return list(self._old)

    def __contains__(self, name):
        return name in self._old

    def __len__(self):
        return len(self._old)

    def _name(self, name):
        if name not in self._old:
            raise CausalLMError(f"{self.folder}: checkpoint has no tensor named '{name}'")
        return self._old[name]

    def shape(self, name):
        return self.ckpt.shape(self._name(name))

    def dtype(self, name):
        return self.ckpt.dtype(self._name(name))

    def get(self, name, zeros=False):
        return self.ckpt.get(self._name(name), zeros)

    def raw(self, name, zeros=False):
        return self.ckpt.raw(self._name(name), zeros)

    def file_of(self, name):
        return self.ckpt.file_of(self._name(name))
