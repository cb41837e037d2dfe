"""causallm/kernels/quantize.py against ggml's own quantizer and gguf-py's dequantizer.

The expected bytes are ggml's (``ggml_quantize_chunk`` with no importance matrix, i.e.
``quantize_row_<type>_ref``), recorded by tools/fixtures_quantize.py for the rows of
tests/quantize_cases.py: whole for the "edges" case and the head of "normal", as sha256 for
every case. Neither llama.cpp nor torch is needed here.
"""

import json
import os

import gguf
import numba
import numpy as np
import pytest

import quantize_cases
from causallm.kernels.quantize import BLOCK_BYTES, QK, QUANTIZERS, quantize_rows, row_bytes

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "quantize", "ggml_blocks.npz")
TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


@pytest.fixture(scope="module")
def ggml():
    with np.load(FIXTURE) as z:
        return {k: (json.loads(str(z[k])) if z[k].ndim == 0 else z[k]) for k in z.files}


@pytest.fixture(scope="module")
def inputs(ggml):
    cases = {name: quantize_cases.make(name) for name in quantize_cases.CASES}
    for name, x in cases.items():  # the rows ggml quantized: same generator, same bits
        assert quantize_cases.sha256(x) == ggml["inputs_sha256"][name], name
    return cases


def _differ(ours, theirs, fmt):
    return f"{fmt}: {quantize_cases.first_difference(ours, theirs, BLOCK_BYTES[fmt])}"


def test_table_and_sizes():
    assert tuple(QUANTIZERS) == TYPES
    for fmt in TYPES:
        qk, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt]]
        assert (QK[fmt], BLOCK_BYTES[fmt]) == (qk, size)
        assert row_bytes(fmt, 4 * qk) == 4 * size


@pytest.mark.slow
@pytest.mark.parametrize("scalar", [False, True], ids=["vector", "scalar"])
@pytest.mark.parametrize("fmt", TYPES)
def test_bytes_equal_ggml(fmt, scalar, ggml, inputs):
    """Every case, byte for byte: the vector code (with its fallbacks) and the scalar code."""
    for name, x in inputs.items():
        if scalar and name == "bulk":
            continue  # the scalar code is slow; the other cases reach all its branches
        ours = quantize_rows(fmt, x, scalar=scalar)
        assert ours.shape == (x.shape[0], row_bytes(fmt, x.shape[1])) and ours.dtype == np.uint8
        if name == "edges":
            assert np.array_equal(ours, ggml[f"{fmt}/edges"]), \
                _differ(ours, ggml[f"{fmt}/edges"], fmt)
        if name == "normal":
            head = ggml[f"{fmt}/normal_head"]
            assert np.array_equal(ours[:len(head)], head), \
                _differ(ours[:len(head)], head, fmt)
        assert quantize_cases.sha256(ours) == ggml["bytes_sha256"][fmt][name], \
            f"{fmt} {name}: not ggml's bytes (tools/fixtures_quantize.py --check shows where)"


# Largest error |x - dequantize(quantize(x))| allowed per block: half a step of the type's grid
# (rounded as ggml rounds) plus the fp16 rounding of the scales; for the K-quants, whose
# sub-block scales are searched and then quantized to 6 or 8 bits against the super-block's
# largest, one whole step of the super-block's grid (its span over 15 / 31 levels, its largest
# magnitude over 32).

def _bound(fmt, g):
    amax = np.abs(g).max(1)
    fp16 = 2.0 ** -10
    return {
        "Q8_0": amax / 254 + amax * fp16,
        "Q4_0": amax / 8 * (1 + fp16),        # the side opposite the largest reaches 7 steps only
        "Q5_0": amax / 16 * (1 + fp16),
        "Q4_1": (g.max(1) - g.min(1)) / 30 + amax * fp16,
        "Q5_1": (g.max(1) - g.min(1)) / 62 + amax * fp16,
        "Q4_K": (g.max(1) - np.minimum(g.min(1), 0)) / 15,
        "Q5_K": (g.max(1) - np.minimum(g.min(1), 0)) / 31,
        "Q6_K": amax / 32,
    }[fmt]


@pytest.mark.parametrize("fmt", TYPES)
def test_round_trip_gguf_dequantize(fmt, inputs):
    """gguf-py's dequantizer (the reference reader of these bytes) gives the rows back within
    what the type allows, and the error is that of a working quantizer (not, e.g., a scale
    stored in the wrong place that still decodes)."""
    for name in ("normal", "wide"):
        x = inputs[name]
        y = gguf.quants.dequantize(quantize_rows(fmt, x), gguf.GGMLQuantizationType[fmt])
        assert y.shape == x.shape
        n = QK[fmt]
        g, e = x.reshape(-1, n).astype(np.float64), (y - x).reshape(-1, n)
        worst = (np.abs(e).max(1) / _bound(fmt, g)).max()
        assert worst <= 1.0, f"{fmt} {name}: error {worst:.3f} x the allowed bound"
        rel = np.sqrt((e.astype(np.float64) ** 2).sum() / (g ** 2).sum())
        limit = {"Q8_0": 0.006, "Q4_0": 0.09, "Q4_1": 0.085, "Q5_0": 0.045, "Q5_1": 0.042,
                 "Q4_K": 0.08, "Q5_K": 0.04, "Q6_K": 0.02}[fmt]
        assert rel < limit, f"{fmt} {name}: relative RMS error {rel:.4f}"


def test_inputs_any_layout_and_dtype():
    x = quantize_cases.make("normal")[:8, :512]
    expected = quantize_rows("Q4_K", x)
    assert np.array_equal(quantize_rows("Q4_K", np.asfortranarray(x)), expected)
    assert np.array_equal(quantize_rows("Q4_K", x.astype(np.float64)), expected)
    assert np.array_equal(quantize_rows("Q4_K", x[3]), expected[3:4])
    assert quantize_rows("Q8_0", np.zeros((0, 64), np.float32)).shape == (0, 68)


def test_bad_input():
    with pytest.raises(ValueError, match="Q4_K quantizes rows of a multiple of 256"):
        quantize_rows("Q4_K", np.zeros((2, 288), np.float32))
    with pytest.raises(ValueError, match="no quantizer for 'Q3_K'"):
        quantize_rows("Q3_K", np.zeros((2, 256), np.float32))


def test_threads_do_not_change_bytes(inputs):
    x = inputs["normal"]
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = [quantize_rows(fmt, x) for fmt in ("Q4_0", "Q4_K", "Q6_K")]
    finally:
        numba.set_num_threads(before)
    for fmt, a in zip(("Q4_0", "Q4_K", "Q6_K"), one):
        assert np.array_equal(a, quantize_rows(fmt, x))
