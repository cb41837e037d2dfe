"""MXFP4 expert weights as Hugging Face stores them (gpt-oss), dequantized as transformers does.

A quantized tensor ``X`` of the checkpoint is two uint8 tensors (OCP microscaling, MXFP4)::

    X_blocks  [E, R, G, B]   two FP4 (e2m1) codes per byte: value 2j in the low nibble
                             (byte & 0x0F), value 2j+1 in the high nibble (byte >> 4)
    X_scales  [E, R, G]      one E8M0 exponent per group of 2B (= 32) values, bias 127

Stored row r of expert e is ``q[e, r, 32g + j] = FP4[code] * 2^(X_scales[e, r, g] - 127)``
(q is [E, R, 32G]), with the e2m1 code table FP4 = [+0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5,
-1, -1.5, -2, -3, -4, -6] (the sign is bit 3). Rows are PyTorch [out, in] rows, so the
weight transformers uses is the transpose of the last two axes (``convert_moe_packed_tensors``
in transformers/integrations/mxfp4.py: ``out.transpose(1, 2).contiguous()``)::

    X = q.transpose(0, 2, 1)                [E, 32G, R]
    gate_up_proj: blocks [E, 2I, H/32, 16] -> [E, H, 2I];  down_proj: [E, H, I/32, 16] -> [E, I, H]

Every value is exactly ``ldexp(FP4[code], scale - 127)`` in float32 (what torch.ldexp gives):
products of a 2-bit mantissa and a power of two are exact, a scale byte of 255 gives
2^128 * v (2^127 for v = 0.5, inf from 1 up), and 0 stays 0. No NaN arises.
"""

from __future__ import annotations

import numpy as np

from causallm.errors import CausalLMError

FP4_VALUES = np.array([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
"""The e2m1 value of each 4-bit code (bit 3 = sign, bits 2-1 = exponent, bit 0 = mantissa)."""

E8M0_BIAS = 127
MXFP4_DTYPE = "MXFP4"  # the dtype string a Checkpoint reports for a dequantized pair
BLOCKS_SUFFIX, SCALES_SUFFIX = "_blocks", "_scales"

# 2^(s - 127) for every scale byte s, float32; s = 255 (2^128) is not a float32 and is handled
# apart; s = 0 gives the subnormal 2^-127, which is exact.
_SCALE = np.ldexp(np.float32(1.0), np.arange(255, dtype=np.int32) - E8M0_BIAS).astype(np.float32)


def dequantize_rows(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks uint8 [..., G, B] and scales uint8 [..., G] -> float32 [..., G * 2B], C-contiguous:
    the stored rows ``q`` of the module docstring (not yet transposed)."""
    blocks = np.asarray(blocks, dtype=np.uint8)
    scales = np.asarray(scales, dtype=np.uint8)
    if blocks.ndim < 2 or blocks.shape[:-1] != scales.shape:
        raise CausalLMError(f"MXFP4: blocks [..., groups, bytes] {blocks.shape} need scales "
                            f"of shape {blocks.shape[:-1]}, got {scales.shape}")
    *lead, B = blocks.shape
    out = np.empty((*lead, B, 2), dtype=np.float32)
    np.take(FP4_VALUES, blocks & 0x0F, out=out[..., 0])
    np.take(FP4_VALUES, blocks >> 4, out=out[..., 1])
    out = out.reshape(*lead, 2 * B)
    top = scales == 255
    with np.errstate(over="ignore"):  # |v| * 2^127 >= 2^128 is inf, as in torch
        out *= _SCALE[np.where(top, 0, scales)][..., None]
        if top.any():  # 2^128 * v: exact in float64, then one rounding (inf from |v| >= 1)
            out[top] = (out[top].astype(np.float64) * 2.0 ** (128 + E8M0_BIAS)).astype(np.float32)
    return out.reshape(*lead[:-1], lead[-1] * 2 * B)


def mxfp4_shape(blocks_shape: tuple, name: str = "tensor") -> tuple:
    """The dequantized (transformers) shape [E, 32G, R] of blocks [E, R, G, B]: [E, 2BG, R]."""
    if len(blocks_shape) != 4:
        raise CausalLMError(f"MXFP4 tensor '{name}': blocks must be [experts, rows, groups, "
                            f"bytes], got shape {tuple(blocks_shape)}")
    E, R, G, B = blocks_shape
    return (E, G * 2 * B, R)


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks [E, R, G, B] and scales [E, R, G] -> transformers' dequantized X [E, 2BG, R] as
    the transpose view of the C-contiguous rows q [E, R, 2BG]: each expert X[e] is an
    F-contiguous matrix (a PyTorch [out, in] weight used as [in, out], as HFWeight transposes
    give), and no second full-size copy is made."""
    mxfp4_shape(blocks.shape)
    return np.swapaxes(dequantize_rows(blocks, scales), 1, 2)


def convert_moe_packed_tensors(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """transformers' ``convert_moe_packed_tensors`` in float32, layout included: blocks
    [E, R, G, B], scales [E, R, G] -> C-contiguous [E, 2BG, R]."""
    return np.ascontiguousarray(dequantize_mxfp4(blocks, scales))


def find_mxfp4_pairs(entries: dict) -> dict:
    """{X: (X_blocks, X_scales)} for every pair of uint8 tensors of ``entries`` (name ->
    (dtype, shape)) named ``X_blocks`` and ``X_scales``; their shapes must agree (blocks
    [E, R, G, B], scales [E, R, G]). Unpaired or non-U8 tensors are left alone."""
    pairs = {}
    for name, (dtype, shape) in entries.items():
        if not name.endswith(BLOCKS_SUFFIX):
            continue
        base = name[:-len(BLOCKS_SUFFIX)]
        scales = entries.get(base + SCALES_SUFFIX)
        if scales is None or dtype != "U8" or scales[0] != "U8":
            continue
        mxfp4_shape(shape, base)
        if tuple(scales[1]) != tuple(shape[:-1]):
            raise CausalLMError(f"MXFP4 tensor '{base}': {name} {tuple(shape)} needs "
                                f"{base}{SCALES_SUFFIX} of shape {tuple(shape[:-1])}, got "
                                f"{tuple(scales[1])}")
        if base in entries:
            raise CausalLMError(f"checkpoint holds both '{base}' and its MXFP4 blocks/scales")
        pairs[base] = (name, base + SCALES_SUFFIX)
    return pairs

