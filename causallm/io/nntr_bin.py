"""The NNTrainer ``.bin`` weight file (docs/nntrainer.md, "The .bin file").

Layout: the raw bytes of each weight in graph order, with no header, padding or names. A weight
of n elements takes 4n bytes as FP32, 2n as FP16, (n // 32) * 18 as Q4_0, (n // 32) * 34 as
Q8_0, (n // 256) * 210 as Q6_K and 2 + (n // 256) * 144 as Q4_K (``Q4_0_Tensor::size`` and
its kin). Reads are memory-mapped; writes are atomic.

The quantized layouts, by the kind of weight (its name; NNTrainer's embedding layers name
theirs ``Embedding`` and save it their own way; docs/nntrainer_bin_kquants.md has the C++
facts of the K-quants):

- a fully connected or head weight, logical [in, out] = (K, N): its transpose (N rows of K) in
  ggml blocks along K.
  - Q4_0: NNTrainer's x86 repack, ``block_q4_0x8`` (every 8 rows and each K-block: the 8 fp16
    scales, then the 8 rows' 16-byte ``qs`` interleaved in 8-byte chunks, chunk i from row
    i % 8, bytes (i // 8) * 8 .. + 8, XOR 0x88); N % 8 == 0 and K % 32 == 0 (NNTrainer writes
    1-row weights unquantized).
  - Q4_K: a 2-byte uint16 3 (``QScheme::Q4_Kx8``), then the rows of ``block_q4_K`` interleaved
    8 at a time as ``block_q4_Kx8`` (8 d, 8 dmin, 96 bytes of the 8 rows' scales, the qs in
    8-byte chunks as Q4_0's, no XOR); N % 8 == 0 and K % 256 == 0.
  - Q6_K, and Q8_0 (our extension; NNTrainer has no Q8_0): plain ggml block rows, no repack.
- an embedding table (V, D): its rows in plain ``block_q4_0``, ``block_q6_K`` (what
  ``nntr_quantize --embd_dtype Q6_K`` and the tied embedding's save write) or ``block_q8_0``,
  no transpose, no repack. NNTrainer has no Q4_K table.

``bin_to_block_rows`` / ``block_rows_to_bin`` turn a quantized weight's bytes into plain ggml
block rows (what a ``PackedMatrix`` holds, causallm/kernels/quant.py multiplies) and back. Read,
a packable weight keeps its precision (FP16 and every quantized type as a ``PackedMatrix``;
plain rows stay views of the mapped file, repacked ones are copied back to plain rows once);
any other weight is widened to float32. Every weight read is checked (``io/weight_check.py``):
a NaN or an infinity, or a fully connected, embedding or head weight of zeros (a zero-filled
file has the right size), is an error naming the weight.
"""

import math
import os

import numpy as np

from causallm.errors import CausalLMError
from causallm.io.files import atomic_write, cannot_read, map_file, release_pages
from causallm.io.weight_check import check_weight
from causallm.kernels.packed import QUANTIZABLE, PackedMatrix
from causallm.kernels.quantize import BLOCK_BYTES, QK
from causallm.progress import progress

_BIN_DTYPES = ("FP32", "FP16", "Q4_0", "Q8_0", "Q6_K", "Q4_K")
Q4_K_QSCHEME = 3
"""The uint16 NNTrainer writes before a Q4_K weight (``Uint4QTensor::save_quantization_info``:
its ``QScheme::Q4_Kx8``); ``NeuralNetwork::load`` counts the 2 bytes."""


def bin_nbytes(shape, dtype):
    """Bytes one weight of `shape` takes in a .bin file: n = prod(shape) elements;
    FP32 4n, FP16 2n, Q4_0 (n // 32) * 18, Q8_0 (n // 32) * 34, Q6_K (n // 256) * 210,
    Q4_K 2 + (n // 256) * 144 (whole blocks, as NNTrainer)."""
    n = math.prod(shape)
    if dtype == "FP32":
        return 4 * n
    if dtype == "FP16":
        return 2 * n
    if dtype in _BIN_DTYPES[2:]:
        return n // QK[dtype] * BLOCK_BYTES[dtype] + (2 if dtype == "Q4_K" else 0)
    raise CausalLMError(f"weight dtype {dtype!r} is not one of {', '.join(_BIN_DTYPES)}")


def is_table(name):
    """Whether weight ``name`` is an embedding table (stored as its rows), not a fully
    connected weight (stored transposed)."""
    return name.endswith(":Embedding")


# -- ggml blocks ----------------------------------------------------------------------------------

# -- NNTrainer's layouts <-> plain ggml block rows ----------------------------------------------
#
# A block row is uint8 (R, C / QK * block bytes): the ggml blocks of one row of C values, as a
# GGUF file stores them. NNTrainer's x86 repacks interleave 8 rows: for every 8 rows and every
# block along the row, one block_<type>x8 (block_q4_0x8: 8 fp16 d, then the 8 rows' qs in 8-byte
# chunks, chunk i = bytes 8 (i // 8) .. of row i % 8, XOR 0x88; block_q4_Kx8: 8 fp16 d, 8 fp16
# dmin, 96 bytes of scales, then the qs in 8-byte chunks as Q4_0's, no XOR).

def _groups(raw, N, K, fmt, x8_bytes):
    """raw as (N / 8, K / QK, x8_bytes), or an error naming what does not fit."""
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if N % 8 or K % QK[fmt] or raw.size != N * K // QK[fmt] * BLOCK_BYTES[fmt]:
        raise CausalLMError(f"{fmt} x8 repack of {N} rows of {K} values: needs rows in "
                            f"groups of 8 and a multiple of {QK[fmt]} values, "
                            f"{N * K // QK[fmt] * BLOCK_BYTES[fmt]} bytes; got {raw.size}")
    return raw.reshape(N // 8, K // QK[fmt], x8_bytes)


def _interleave(rows, step):
    """qs of 8 rows (group, 8, block, n) as NNTrainer's chunks (group, block, n * 8): chunk i
    is bytes step * (i // 8) .. + step of row i % 8."""
    G, _, nb, n = rows.shape
    return rows.reshape(G, 8, nb, n // step, step).transpose(0, 2, 3, 1, 4).reshape(G, nb, 8 * n)


def _deinterleave(chunks, step):
    """The inverse of _interleave: (group, block, 8 n) -> (group, 8, block, n)."""
    G, nb, m = chunks.shape
    return chunks.reshape(G, nb, m // 8 // step, 8, step).transpose(0, 3, 1, 2, 4) \
        .reshape(G, 8, nb, m // 8)


def _halves(pairs):
    """(..., 8 rows, block, 2) fp16 bytes as the x8 block's (..., block, 16): row r at 2r."""
    return pairs.transpose(0, 2, 1, 3).reshape(pairs.shape[0], pairs.shape[2], 16)


def _unhalves(x):
    """The inverse of _halves: (group, block, 16) -> (group, 8, block, 2)."""
    return x.reshape(x.shape[0], x.shape[1], 8, 2).transpose(0, 2, 1, 3)


def q4_0x8_to_block_rows(raw, N, K):
    """NNTrainer's x86 Q4_0 bytes (``block_q4_0x8``, XOR 0x88) of N rows of K values as plain
    ``block_q4_0`` rows (N, K / 32 * 18)."""
    b = _groups(raw, N, K, "Q4_0", 144)
    out = np.empty((N // 8, 8, K // 32, 18), dtype=np.uint8)
    out[..., :2] = _unhalves(b[:, :, :16])
    out[..., 2:] = _deinterleave(b[:, :, 16:], 8) ^ np.uint8(0x88)
    return out.reshape(N, -1)


def block_rows_to_q4_0x8(rows):
    """Plain ``block_q4_0`` rows (N, K / 32 * 18), N % 8 == 0, as NNTrainer's x86 bytes."""
    N = rows.shape[0]
    r = np.asarray(rows, dtype=np.uint8).reshape(N // 8, 8, -1, 18)
    out = np.empty((N // 8, r.shape[2], 144), dtype=np.uint8)
    out[:, :, :16] = _halves(r[..., :2])
    out[:, :, 16:] = _interleave(r[..., 2:] ^ np.uint8(0x88), 8)
    return out.reshape(-1)


def _unpack_k_scales(b):
    """ggml's 12 bytes of 8 (6-bit scale, 6-bit min) pairs (``get_scale_min_k4``), last axis,
    as (scales (..., 8), mins (..., 8))."""
    b = b.astype(np.uint8)
    lo, hi, nib = b[..., 0:4], b[..., 4:8], b[..., 8:12]
    s = np.concatenate([lo & 63, (nib & 0xF) | ((lo >> 6) << 4)], axis=-1)
    m = np.concatenate([hi & 63, (nib >> 4) | ((hi >> 6) << 4)], axis=-1)
    return s, m


def _pack_k_scales(s, m):
    """The inverse of _unpack_k_scales: 8 (scale, min) pairs of 6 bits as 12 bytes, as
    ``quantize_row_q4_K_ref`` packs a block's and ``make_block_q4_Kx8`` 8 rows' sub-block."""
    out = np.empty(s.shape[:-1] + (12,), dtype=np.uint8)
    out[..., 0:4] = s[..., :4] | ((s[..., 4:] >> 4) << 6)
    out[..., 4:8] = m[..., :4] | ((m[..., 4:] >> 4) << 6)
    out[..., 8:12] = (s[..., 4:] & 0xF) | ((m[..., 4:] & 0xF) << 4)
    return out


def q4_kx8_to_block_rows(raw, N, K):
    """NNTrainer's ``block_q4_Kx8`` bytes (``nntr_repack_q4_K_to_q4_K_8_bl``, x86 and ARM
    alike) of N rows of K values as plain ``block_q4_K`` rows (N, K / 256 * 144). Per x8 block:
    d[8], dmin[8] (fp16 of rows 0..7), scales[96] (12 bytes per sub-block j: the 8 rows'
    (scale, min) of sub-block j packed as a block's 8 pairs), qs[1024] (chunks of 8 bytes)."""
    b = _groups(raw, N, K, "Q4_K", 1152)
    G, nb = b.shape[:2]
    out = np.empty((G, 8, nb, 144), dtype=np.uint8)
    out[..., 0:2] = _unhalves(b[:, :, 0:16])
    out[..., 2:4] = _unhalves(b[:, :, 16:32])
    s, m = _unpack_k_scales(b[:, :, 32:128].reshape(G, nb, 8, 12))   # (G, nb, sub-block, row)
    out[..., 4:16] = _pack_k_scales(s.transpose(0, 3, 1, 2), m.transpose(0, 3, 1, 2))
    out[..., 16:] = _deinterleave(b[:, :, 128:], 8)
    return out.reshape(N, -1)


def block_rows_to_q4_kx8(rows):
    """Plain ``block_q4_K`` rows (N, K / 256 * 144), N % 8 == 0, as NNTrainer's
    ``block_q4_Kx8`` bytes."""
    N = rows.shape[0]
    r = np.asarray(rows, dtype=np.uint8).reshape(N // 8, 8, -1, 144)
    G, nb = r.shape[0], r.shape[2]
    out = np.empty((G, nb, 1152), dtype=np.uint8)
    out[:, :, 0:16] = _halves(r[..., 0:2])
    out[:, :, 16:32] = _halves(r[..., 2:4])
    s, m = _unpack_k_scales(r[..., 4:16])                              # (G, row, nb, sub-block)
    out[:, :, 32:128] = _pack_k_scales(s.transpose(0, 2, 3, 1), m.transpose(0, 2, 3, 1)) \
        .reshape(G, nb, 96)
    out[:, :, 128:] = _interleave(r[..., 16:], 8)
    return out.reshape(-1)


def bin_to_block_rows(name, shape, dtype, raw):
    """A quantized weight's bytes in a .bin (``raw``, bin_nbytes(shape, dtype) of them) as
    plain ggml block rows: a table (V, D) as its V rows; a fully connected or head weight,
    logical [in, out] = (K, N), as the N rows of its transpose. Q4_0 fully connected: from the
    x86 q4_0x8 repack; Q4_K fully connected: past the 2-byte QScheme, from q4_Kx8; the others
    (Q4_0 / Q6_K / Q8_0 tables, Q6_K / Q8_0 fully connected) are plain rows already. NNTrainer
    has no Q4_K table (an error)."""
    R, C = _block_rows_shape(name, shape, dtype)
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size != bin_nbytes(shape, dtype):
        raise CausalLMError(f"weight '{name}' {tuple(shape)} {dtype}: expected "
                            f"{bin_nbytes(shape, dtype)} bytes, got {raw.size}")
    if dtype == "Q4_K":
        scheme = int(raw[0]) | int(raw[1]) << 8
        if scheme != Q4_K_QSCHEME:
            raise CausalLMError(f"weight '{name}' Q4_K: its 2-byte quantization scheme is "
                                f"{scheme}, expected {Q4_K_QSCHEME} (Q4_Kx8)")
        return q4_kx8_to_block_rows(raw[2:], R, C)
    if dtype == "Q4_0" and not is_table(name):
        return q4_0x8_to_block_rows(raw, R, C)
    return raw.reshape(R, -1)


def block_rows_to_bin(name, shape, dtype, rows):
    """The inverse of bin_to_block_rows: plain ggml block rows of weight ``name`` (logical
    ``shape``) as the bytes NNTrainer keeps in a .bin (flat uint8)."""
    R, C = _block_rows_shape(name, shape, dtype)
    rows = np.asarray(rows, dtype=np.uint8)
    if rows.shape != (R, C // QK[dtype] * BLOCK_BYTES[dtype]):
        raise CausalLMError(f"weight '{name}' {tuple(shape)} {dtype}: expected block rows "
                            f"{(R, C // QK[dtype] * BLOCK_BYTES[dtype])}, got {rows.shape}")
    if dtype == "Q4_K":
        return np.concatenate([np.array([Q4_K_QSCHEME, 0], dtype=np.uint8),
                               block_rows_to_q4_kx8(rows)])
    if dtype == "Q4_0" and not is_table(name):
        return block_rows_to_q4_0x8(rows)
    return np.ascontiguousarray(rows).reshape(-1)


def _block_rows_shape(name, shape, dtype):
    """(R, C): the rows of weight ``name`` as ggml blocks hold them, after block_shape_error."""
    if dtype not in QK:
        raise CausalLMError(f"weight '{name}': dtype {dtype!r} is not ggml blocks "
                            f"({', '.join(QK)})")
    problem = block_shape_error(name, shape, dtype)
    if problem:
        raise CausalLMError(problem)
    return tuple(shape) if is_table(name) else (shape[1], shape[0])


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
    try:
        found = os.path.getsize(path)
    except OSError as e:
        raise cannot_read(path, e) from None
    expected = sum(sizes)
    if os.path.isdir(path):
        raise CausalLMError(f"{path}: a folder, not a .bin weight file")
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
        problem = block_shape_error(name, shape, dtype)
        if problem:
            raise CausalLMError(f"{path}: {problem}")
    mm = map_file(path)
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
    data = bin_to_block_rows(name, shape, dtype, raw)
    if not np.shares_memory(data, raw):  # NNTrainer's x8 repack undone: a copy
        release_pages(raw)
    packed = PackedMatrix(dtype, data, transposed=not table)  # plain rows: held as mapped
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
    writable = ("FP32", "FP16", *(t for t in _BIN_DTYPES if t in QUANTIZABLE))
    for i, dtype in enumerate(dtypes):
        if dtype not in writable:
            raise CausalLMError(f"write_bin: weight #{i}: dtype {dtype!r} is not supported "
                                f"({', '.join(writable)})")

    def convert(i, a, dtype, name):
        if dtype in QK:
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
    Blocks (32 values; 256 for the K-quants) run along a table's rows and a fully connected
    weight's input (K of (K, N)); Q4_0's and Q4_K's x86 repacks also take a fully connected
    weight's outputs 8 at a time. NNTrainer has no Q4_K table."""
    if dtype not in QK:
        return None
    table = is_table(name)
    grouped = not table and dtype in ("Q4_0", "Q4_K")
    if table and dtype == "Q4_K":
        return f"weight '{name}' {tuple(shape)} cannot be Q4_K: NNTrainer has no Q4_K table"
    if len(shape) == 2 and shape[-1 if table else 0] % QK[dtype] == 0 and (
            not grouped or shape[1] % 8 == 0):
        return None
    need = "a matrix" if len(shape) != 2 else \
        f"rows of a multiple of {QK[dtype]} values{'' if table else ' along its input'}" \
        f"{', and a multiple of 8 outputs' if grouped else ''}"
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
    return block_rows_to_bin(name, a.shape, dtype, packed.data)


def _readonly(a):
    a.flags.writeable = False
    return a
