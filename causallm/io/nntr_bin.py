"""The NNTrainer ``.bin`` weight file (porting spec §7.1, §7.2).

Layout: the raw bytes of each weight in graph order, with no header, padding or names. A weight
of n elements takes 4n bytes as FP32, 2n as FP16, (n // 32) * 18 as Q4_0 and (n // 256) * 210
as Q6_K (``Q4_0_Tensor::size``). Reads are memory-mapped; writes are atomic.
"""

import math
import os

import numpy as np

from causallm.errors import CausalLMError
from causallm.io.files import atomic_write

_BIN_DTYPES = ("FP32", "FP16", "Q4_0", "Q6_K")


def bin_nbytes(shape, dtype):
    """Bytes one weight of `shape` takes in a .bin file: n = prod(shape) elements;
    FP32 4n, FP16 2n, Q4_0 (n // 32) * 18, Q6_K (n // 256) * 210 (whole blocks, as NNTrainer)."""
    n = math.prod(shape)
    if dtype == "FP32":
        return 4 * n
    if dtype == "FP16":
        return 2 * n
    if dtype == "Q4_0":
        return n // 32 * 18
    if dtype == "Q6_K":
        return n // 256 * 210
    raise CausalLMError(f"weight dtype {dtype!r} is not one of {', '.join(_BIN_DTYPES)}")


def read_bin(path, specs, allow_extra=False):
    """Read an NNTrainer .bin file: specs = [(full_name, shape, dtype), ...] in file order.

    Returns one read-only float32 array of `shape` per spec. FP32 weights are zero-copy views
    of a read-only memory map (copied when their offset is not a multiple of 4); FP16 weights
    are widened. The file size is checked against the sum of bin_nbytes before anything is
    read; trailing bytes are an error unless allow_extra (NNTrainer itself ignores them).
    """
    path = os.fspath(path)
    sizes = []
    for name, shape, dtype in specs:
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
        for (name, shape, dtype), nb in zip(specs, sizes):
            if offset + nb > found:
                break
            offset += nb
        raise CausalLMError(f"{msg} ({expected - found} bytes short; the first weight that does "
                            f"not fit is '{name}' {tuple(shape)} {dtype}, {nb} bytes at offset "
                            f"{offset})")
    for name, shape, dtype in specs:
        if dtype not in ("FP32", "FP16"):
            raise CausalLMError(f"{path}: weight '{name}' has dtype {dtype}, which is not "
                                "supported yet (FP32, FP16)")
    mm = np.memmap(path, dtype=np.uint8, mode="r") if found else None
    out, offset = [], 0
    for (name, shape, dtype), nb in zip(specs, sizes):
        raw = mm[offset:offset + nb].view(np.ndarray) if nb else np.zeros(0, np.uint8)
        if dtype == "FP32":
            a = (raw if offset % 4 == 0 else raw.copy()).view("<f4").reshape(shape)
        else:
            a = raw.view("<f2").astype(np.float32).reshape(shape)
        out.append(_readonly(a))
        offset += nb
    return out


def write_bin(path, arrays, dtypes):
    """Write arrays (float) in order as an NNTrainer .bin, each converted to its dtype
    ("FP32" or "FP16"), with nothing in between; atomically (temp file + rename).
    FP16 rounds to nearest even; a value beyond the FP16 range (|x| > 65504) is an error."""
    arrays, dtypes = list(arrays), list(dtypes)
    if len(arrays) != len(dtypes):
        raise CausalLMError(f"write_bin: {len(arrays)} arrays but {len(dtypes)} dtypes")
    for i, dtype in enumerate(dtypes):
        if dtype not in ("FP32", "FP16"):
            raise CausalLMError(f"write_bin: weight #{i}: dtype {dtype!r} is not supported "
                                "(FP32, FP16)")

    def convert(i, a, dtype):
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

    def write(f):  # one weight converted at a time, so no second copy of the model is held
        for i, (a, dtype) in enumerate(zip(arrays, dtypes)):
            convert(i, a, dtype).tofile(f)

    atomic_write(path, write)


def _readonly(a):
    a.flags.writeable = False
    return a
