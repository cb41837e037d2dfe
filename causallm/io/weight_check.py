"""Weights that cannot be right, found as they are read rather than as a sampler error at the
first token.

``check_weight(value, what, zeros=False)`` raises a one-line CausalLMError naming ``what`` when
a float tensor holds a NaN or an infinity, and, with ``zeros``, when all of it is zero:

- a float array: its values;
- BF16 / F16 bits (a ``PackedMatrix``): an exponent of all ones is an infinity or a NaN; the bits
  other than the sign are zero only for a zero;
- ggml blocks (Q4_0 ... Q6_K): their fp16 scales and mins (a block is zero when they are).

The rule for zeros (an NNTrainer ``.bin`` has no header, so a zero-filled file or one whose end
was never written has the right size): a fully connected, embedding or head weight, the
matrices a ``.bin`` reader is told are packable, is never all zero in a model that was trained
or even initialised, while a bias or a norm weight may be; such a matrix of zeros is an error.

The readers call it, and the rule holds for every format: ``nntr_bin.read_weight`` (zeros
checked for packable weights), and the safetensors (single or sharded) and GGUF checkpoints'
``get`` / ``raw``, which ``WeightTable.load`` asks with ``zeros=True`` for a tensor that feeds a
packable weight (a safetensors file or a GGUF of zeros is as wrong as a ``.bin`` of zeros, and
the one scan already says so). Experts left on file (``moe_expert_cache``) are read when routed,
not at load, and are not checked.

One pass over the bits finds both: the bits of an IEEE float without its sign, read as an
unsigned integer, order as the magnitudes, and all exponent bits set (an infinity or a NaN) is
at least the exponent mask; so the largest ``bits & ~sign`` says whether a non-finite value is
there (``>= exponent mask``) and whether all is zero (``== 0``). numpy takes it in chunks of
1 Mi values (a bounded temporary), about 17 GB/s: a 600M-parameter BF16 checkpoint in 0.07 s,
and no kernel to compile on a first run.
"""

from __future__ import annotations

import numpy as np

from causallm.errors import CausalLMError
from causallm.kernels.packed import PackedMatrix

CHUNK = 1 << 20
"""Values per step of the scan (its temporary is this many of the tensor's bit words)."""

# (unsigned view, every bit but the sign, all exponent bits) of a float's bits
_F16 = (np.uint16, 0x7FFF, 0x7C00)
_PACKED = {"BF16": (np.uint16, 0x7FFF, 0x7F80), "F16": _F16}  # by PackedMatrix.format
_FLOATS = {np.dtype(np.float16): _F16, np.dtype(np.float32): (np.uint32, 0x7FFFFFFF, 0x7F800000),
           np.dtype(np.float64): (np.uint64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000)}


def scan(value) -> tuple[bool, bool]:
    """(every value finite, some value nonzero) of a float array or a PackedMatrix; (True,
    True) for anything else (integer tensors)."""
    if isinstance(value, PackedMatrix) and value.qtype is not None:
        return _scan_blocks(value.data, value.qtype)
    if isinstance(value, PackedMatrix):  # BF16 / F16 bits
        bits, (unsigned, mask, exponent) = value.data, _PACKED[value.format]
    elif isinstance(value, np.ndarray) and value.dtype in _FLOATS:
        bits, (unsigned, mask, exponent) = value, _FLOATS[value.dtype]
    else:
        return True, True
    flat = np.ascontiguousarray(bits.ravel(order="K")).view(unsigned)  # a view unless strided
    m = max_magnitude_bits(flat, unsigned(mask))
    return m < exponent, m > 0


def _scan_blocks(data: np.ndarray, qtype) -> tuple[bool, bool]:
    """``scan`` of ggml block rows over the fp16 fields of every block: each field a strided
    uint16 view (every block type's size and field offsets are even), a chunk at a time."""
    halves = data.reshape(-1).view(np.uint16).reshape(-1, qtype.nbytes // 2)
    m = 0
    for o in qtype.halves:
        m = max(m, max_magnitude_bits(halves[:, o // 2], np.uint16(_F16[1])))
    return m < _F16[2], m > 0


def max_magnitude_bits(bits: np.ndarray, mask) -> int:
    """max over i of ``bits[i] & mask`` (bits: 1-D unsigned, a float's bits, any stride; mask:
    every bit but the sign), in chunks of ``CHUNK``; 0 for an empty array."""
    buf = np.empty(min(bits.size, CHUNK), bits.dtype)
    m = 0
    for start in range(0, bits.size, CHUNK):
        part = buf[:min(CHUNK, bits.size - start)]
        np.bitwise_and(bits[start:start + CHUNK], mask, out=part)
        m = max(m, int(part.max()))
    return m


def check_weight(value, what: str, zeros: bool = False):
    """``value`` when it passes (the module docstring), else a CausalLMError naming ``what``."""
    finite, nonzero = scan(value)
    if not finite:
        raise CausalLMError(f"{what} holds NaN or infinite values (the file is damaged or was "
                            f"converted wrongly)")
    if zeros and not nonzero:
        raise CausalLMError(f"{what} is all zeros (the file is zero-filled or was not written "
                            f"to the end)")
    return value
