"""The NNTrainer ``.bin`` weight file (porting spec §7.1-7.3).

Layout: the raw bytes of each weight in graph order, with no header, padding or names. A weight
of n elements takes 4n bytes as FP32, 2n as FP16, (n // 32) * 18 as Q4_0, (n // 32) * 34 as
Q8_0 and (n // 256) * 210 as Q6_K (``Q4_0_Tensor::size``). Reads are memory-mapped; writes
are atomic.

The quantized layouts, by the kind of weight (its name; NNTrainer's embedding layers name
theirs ``Embedding`` and save it their own way):

- a fully connected or head weight, logical [in, out] = (K, N): its transpose (N rows of K) in
  ggml blocks along K. Q4_0: NNTrainer's x86 repack, ``block_q4_0x8`` (every 8 rows and each
  K-block: the 8 fp16 scales, then the 8 rows' 16-byte ``qs`` interleaved in 8-byte chunks,
  chunk i from row i % 8, bytes (i // 8) * 8 .. + 8, XOR 0x88); a weight with N % 8 != 0 or
  K % 32 != 0 cannot be Q4_0 (NNTrainer writes 1-row weights unquantized). Q8_0 (our
  extension; NNTrainer has no Q8_0): plain ``block_q8_0`` (fp16 d, 32 int8) rows, no repack.
- an embedding table (V, D): its rows in plain ``block_q4_0`` (fp16 d, 16 bytes qs) or
  ``block_q8_0``, no transpose, no repack.

Read, a packable weight keeps its precision (FP16, Q4_0, Q8_0 as a ``PackedMatrix``; plain
ggml block rows stay views of the mapped file); any
other weight is widened to float32. Q6_K is listed for the sizes only. Every weight read is
checked (``io/weight_check.py``): a NaN or an infinity, or a fully connected, embedding or head
weight of zeros (a zero-filled file has the right size), is an error naming the weight.
"""

import math
import os

import numpy as np

from causallm.errors import CausalLMError
from causallm.io.files import atomic_write, release_pages
from causallm.io.weight_check import check_weight
from causallm.kernels.packed import (
    BLOCK_BYTES,
    PackedMatrix,
    ggml_blocks_to_rows,
    rows_to_ggml_blocks,
)
from causallm.progress import progress

_BIN_DTYPES = ("FP32", "FP16", "Q4_0", "Q8_0", "Q6_K")


def bin_nbytes(shape, dtype):
    """Bytes one weight of `shape` takes in a .bin file: n = prod(shape) elements;
    FP32 4n, FP16 2n, Q4_0 (n // 32) * 18, Q8_0 (n // 32) * 34, Q6_K (n // 256) * 210
    (whole blocks, as NNTrainer)."""
    n = math.prod(shape)
    if dtype == "FP32":
        return 4 * n
    if dtype == "FP16":
        return 2 * n
    if dtype in BLOCK_BYTES:
        return n // 32 * BLOCK_BYTES[dtype]
    if dtype == "Q6_K":
        return n // 256 * 210
    raise CausalLMError(f"weight dtype {dtype!r} is not one of {', '.join(_BIN_DTYPES)}")


def is_table(name):
    """Whether weight ``name`` is an embedding table (stored as its rows), not a fully
    connected weight (stored transposed)."""
    return name.endswith(":Embedding")


# -- ggml blocks ----------------------------------------------------------------------------------

def repack_q4_0x8(qs, d):
    """Q4_0 rows (qs (N, K/2), d (N, K/32)), N % 8 == 0, in NNTrainer's x86 layout (bytes)."""
    N, nb = d.shape
    q = qs.reshape(N // 8, 8, nb, 16)                 # group, row in group, block, byte
    chunks = q.reshape(N // 8, 8, nb, 2, 8)           # ..., half of qs, 8 bytes
    # chunk i = half (i // 8) of row (i % 8): order (half, row)
    inter = chunks.transpose(0, 2, 3, 1, 4) ^ np.uint8(0x88)     # group, block, half, row, 8
    out = np.empty((N // 8, nb, 144), dtype=np.uint8)
    out[:, :, :16] = d.astype("<f2").reshape(N // 8, 8, nb).transpose(0, 2, 1) \
        .copy().view(np.uint8).reshape(N // 8, nb, 16)
    out[:, :, 16:] = inter.reshape(N // 8, nb, 128)
    return out.reshape(-1)


def unpack_q4_0x8(raw, N, K):
    """NNTrainer's x86 Q4_0 bytes of a (K, N) weight back to rows (qs (N, K/2), d (N, K/32))."""
    nb = K // 32
    b = raw.reshape(N // 8, nb, 144)
    d = np.ascontiguousarray(b[:, :, :16]).view("<f2").reshape(N // 8, nb, 8) \
        .transpose(0, 2, 1).reshape(N, nb).astype(np.float32)
    inter = b[:, :, 16:].reshape(N // 8, nb, 2, 8, 8) ^ np.uint8(0x88)  # group, block, half, row
    qs = inter.transpose(0, 3, 1, 2, 4).reshape(N, nb * 16)
    return np.ascontiguousarray(qs), d


# -- reading ---------------------------------------------------------------------------------------

def read_bin(path, specs, allow_extra=False):
    """Read an NNTrainer .bin file: specs = [(full_name, shape, dtype[, packable]), ...] in
    file order.

    Returns one read-only weight of `shape` per spec: float32 arrays (FP32 as zero-copy views
    of a read-only memory map, copied when their offset is not a multiple of 4; FP16 widened),
    or, for a packable spec, a ``PackedMatrix`` of its FP16, Q4_0 or Q8_0 data. The file size
    is checked against the sum of bin_nbytes before anything is read; trailing bytes are an
    error unless allow_extra (NNTrainer itself ignores them).
    """
    path = os.fspath(path)
    specs = [tuple(s) + (False,) * (4 - len(s)) for s in specs]
    sizes = []
    for name, shape, dtype, _ in specs:
        if dtype not in _BIN_DTYPES:
            raise CausalLMError(f"{path}: weight '{name}' has dtype {dtype!r}, not one of "
                                f"{', '.join(_BIN_DTYPES)}")
        sizes.append(bin_nbytes(shape, dtype))
    expected, found = sum(sizes), os.path.getsize(path)
    if found != expected and not (allow_extra and found > expected):
        msg = (f"{path}: expected {expected} bytes for the model's {len(specs)} weights, "
               f"found {found}")
        if found > expected:
            raise CausalLMError(f"{msg} ({found - expected} bytes too many)")
        offset = 0
        for (name, shape, dtype, _), nb in zip(specs, sizes):
            if offset + nb > found:
                break
            offset += nb
        raise CausalLMError(f"{msg} ({expected - found} bytes short; the first weight that does "
                            f"not fit is '{name}' {tuple(shape)} {dtype}, {nb} bytes at offset "
                            f"{offset})")
    for name, shape, dtype, _ in specs:
        if dtype == "Q6_K":
            raise CausalLMError(f"{path}: weight '{name}' has dtype Q6_K, which is not supported "
                                "(FP32, FP16, Q4_0, Q8_0)")
        problem = block_shape_error(name, shape, dtype)
        if problem:
            raise CausalLMError(f"{path}: {problem}")
    mm = np.memmap(path, dtype=np.uint8, mode="r") if found else None
    out, offset = [], 0
    for (name, shape, dtype, packable), nb in zip(specs, sizes):
        raw = mm[offset:offset + nb].view(np.ndarray) if nb else np.zeros(0, np.uint8)
        out.append(read_weight(name, shape, dtype, packable, raw, offset, path))
        offset += nb
    return out


def read_weight(name, shape, dtype, packable, raw, offset, path):
    """One weight from its bytes ``raw`` (at ``offset`` in file ``path``): as read_bin returns
    it, after ``check_weight`` (no NaN or infinity; a packable one not all zero)."""
    return check_weight(_read_weight(name, shape, dtype, packable, raw, offset),
                        f"{path}: weight '{name}' at offset {offset}", zeros=packable)


def _read_weight(name, shape, dtype, packable, raw, offset):
    table = is_table(name)
    if dtype == "FP32":
        return _readonly((raw if offset % 4 == 0 else raw.copy()).view("<f4").reshape(shape))
    if dtype == "FP16":
        half = raw.view("<u2") if offset % 2 == 0 else raw.copy().view("<u2")
        if not packable:
            return _readonly(half.view("<f2").astype(np.float32).reshape(shape))
        rows = half.reshape(shape) if table else np.ascontiguousarray(half.reshape(shape).T)
        return PackedMatrix("F16", rows, transposed=not table)
    R, C = shape if table else (shape[1], shape[0])
    if dtype == "Q4_0" and not table:  # NNTrainer's x86 repack back to ggml's rows: a copy
        data = rows_to_ggml_blocks(dtype, *unpack_q4_0x8(raw, R, C))
        release_pages(raw)
    else:
        data = raw.reshape(R, -1)  # ggml's own block rows: held as mapped
    packed = PackedMatrix(dtype, data, transposed=not table)
    return packed if packable else _readonly(np.ascontiguousarray(packed.toFloat()))


# -- writing ---------------------------------------------------------------------------------------

def write_bin(path, arrays, dtypes, names=None):
    """Write weights in order as an NNTrainer .bin, each converted to its dtype ("FP32",
    "FP16", "Q4_0", "Q8_0"; ``names`` tell a table from a fully connected weight, the module
    docstring), with nothing in between; atomically (temp file + rename). A weight may be a
    float array or a ``PackedMatrix`` (one already in its dtype is written as it is). FP16
    rounds to nearest even; a value beyond the FP16 range (|x| > 65504) is an error."""
    arrays, dtypes = list(arrays), list(dtypes)
    names = list(names) if names is not None else [f"#{i}" for i in range(len(arrays))]
    if len(arrays) != len(dtypes):
        raise CausalLMError(f"write_bin: {len(arrays)} arrays but {len(dtypes)} dtypes")
    for i, dtype in enumerate(dtypes):
        if dtype not in ("FP32", "FP16", "Q4_0", "Q8_0"):
            raise CausalLMError(f"write_bin: weight #{i}: dtype {dtype!r} is not supported "
                                "(FP32, FP16, Q4_0, Q8_0)")

    def convert(i, a, dtype, name):
        if dtype in BLOCK_BYTES:
            return _blocks(name, a, dtype)
        a = a.toFloat() if isinstance(a, PackedMatrix) else a
        a = np.asarray(a, dtype="<f4", order="C")
        if dtype == "FP16":
            finite = np.isfinite(a)
            with np.errstate(over="ignore"):
                h = a.astype("<f2")
            if not np.array_equal(np.isfinite(h), finite):
                raise CausalLMError(f"write_bin: weight #{i} {a.shape}: values beyond the FP16 "
                                    f"range (max |x| = {np.abs(a[finite]).max():g} > 65504)")
            a = h
        return a

    # the size that decides on a progress bar (a weight read on demand has no shape: not counted)
    size = sum(bin_nbytes(a.shape, dtype) for a, dtype in zip(arrays, dtypes)
               if hasattr(a, "shape"))

    def write(f):  # one weight converted at a time, so no second copy of the model is held
        with progress(len(arrays), f"writing {os.path.basename(path)} ({size / 1e9:.1f} GB)",
                      "tensor", size) as bar:
            for i, (a, dtype, name) in enumerate(zip(arrays, dtypes, names)):
                convert(i, a, dtype, name).tofile(f)
                bar.update()

    atomic_write(path, write)


def block_shape_error(name, shape, dtype) -> str | None:
    """Why weight ``name`` of logical ``shape`` cannot be stored as ``dtype``'s blocks, or None.
    Blocks of 32 values run along a table's rows and a fully connected weight's input (K of
    (K, N)); Q4_0's x86 repack also takes a fully connected weight's outputs 8 at a time."""
    if dtype not in BLOCK_BYTES:
        return None
    table = is_table(name)
    if len(shape) == 2 and shape[-1 if table else 0] % 32 == 0 and (
            table or dtype != "Q4_0" or shape[1] % 8 == 0):
        return None
    need = "a matrix" if len(shape) != 2 else \
        f"rows of a multiple of 32 values{'' if table else ' along its input'}" \
        f"{', and a multiple of 8 outputs' if dtype == 'Q4_0' and not table else ''}"
    return f"weight '{name}' {tuple(shape)} cannot be {dtype}: it needs {need}"


def _blocks(name, a, dtype):
    """Weight ``a`` (float or packed) as the bytes of its quantized layout."""
    table = is_table(name)
    problem = block_shape_error(name, a.shape, dtype)
    if problem:
        raise CausalLMError(f"write_bin: {problem}")
    if isinstance(a, PackedMatrix) and a.transposed != table:
        rows = a                             # its rows are the ones to write
    else:
        rows = a.toFloat() if isinstance(a, PackedMatrix) else np.asarray(a, dtype=np.float32)
        rows = rows if table else rows.T
    packed = rows.to(dtype) if isinstance(rows, PackedMatrix) else \
        PackedMatrix.fromFloat(dtype, rows)
    if dtype == "Q4_0" and not table:
        return repack_q4_0x8(*ggml_blocks_to_rows(dtype, packed.data, *packed.rows_shape))
    return packed.data


def _readonly(a):
    a.flags.writeable = False
    return a
