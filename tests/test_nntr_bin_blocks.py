"""NNTrainer's quantized .bin layouts <-> plain ggml block rows (causallm/io/nntr_bin.py).

The expected x86 layouts are written here from NNTrainer's C++ (docs/nntrainer_bin_kquants.md):
``nntr_repack_q4_K_to_q4_K_8_bl`` / ``make_block_q4_Kx8`` and ``Uint4QTensor::save`` for Q4_K,
transcribed loop for loop, and checked against the conversions, which are written differently
(numpy reshapes).
"""

import numpy as np
import pytest

from causallm.errors import CausalLMError
from causallm.io import nntr_bin
from causallm.kernels.quantize import quantize_rows


def block_q4_K_rows(N, K, seed):
    """N rows of K values of block_q4_K with arbitrary bytes (every byte pattern is a valid
    block: its 12 scale bytes hold 16 six-bit values, all 96 bits used)."""
    return np.random.default_rng(seed).integers(0, 256, (N, K // 256 * 144), dtype=np.uint8)


def scale_min_k4(j, q):
    """ggml's get_scale_min_k4(j, q): the 6-bit scale and min of sub-block j."""
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def make_block_q4_Kx8(blocks):
    """NNTrainer's make_block_q4_Kx8(in, 8) on 8 block_q4_K (144 bytes each), line by line."""
    d = [bytes(b[0:2]) for b in blocks]
    dmin = [bytes(b[2:4]) for b in blocks]
    scales = [[int(v) for v in b[4:16]] for b in blocks]
    qs = [bytes(b[16:144]) for b in blocks]
    out_scales = [0] * 96
    for i in range(4):
        s = [scales[j][i] & 63 for j in range(8)]
        m = [scales[j][i + 4] & 63 for j in range(8)]
        for k in range(4):
            out_scales[i * 12 + k] = (s[k] & 63) + ((s[k + 4] & 48) << 2)
            out_scales[i * 12 + 4 + k] = (m[k] & 63) + ((m[k + 4] & 48) << 2)
            out_scales[i * 12 + 8 + k] = (s[k + 4] & 15) + ((m[k + 4] & 15) << 4)
    for i in range(4):
        s = [((scales[j][i] & 192) >> 2) | (scales[j][i + 8] & 15) for j in range(8)]
        m = [((scales[j][i + 4] & 192) >> 2) | ((scales[j][i + 8] & 240) >> 4) for j in range(8)]
        for k in range(4):
            out_scales[i * 12 + 48 + k] = (s[k] & 63) + ((s[k + 4] & 48) << 2)
            out_scales[i * 12 + 52 + k] = (m[k] & 63) + ((m[k + 4] & 48) << 2)
            out_scales[i * 12 + 56 + k] = (s[k + 4] & 15) + ((m[k + 4] & 15) << 4)
    out_qs = bytearray(1024)
    for i in range(256 * 4 // 8):          # end = QK_K * 4 / blck_size_interleave
        src_id, src_offset, dst_offset = i % 8, (i // 8) * 8, i * 8
        out_qs[dst_offset:dst_offset + 8] = qs[src_id][src_offset:src_offset + 8]
    return b"".join(d) + b"".join(dmin) + bytes(out_scales) + bytes(out_qs)


def repack_q4_K_to_q4_K_8(rows):
    """nntr_repack_q4_K_to_q4_K_8_bl(dst, 8, src, size, nrow, k): for every 8 rows, for every
    super-block x, make_block_q4_Kx8 of rows b..b + 7's block x."""
    N, nblocks = rows.shape[0], rows.shape[1] // 144
    out = b""
    for b in range(0, N, 8):
        for x in range(nblocks):
            out += make_block_q4_Kx8([rows[b + i, 144 * x:144 * x + 144] for i in range(8)])
    return np.frombuffer(out, dtype=np.uint8)


def test_q4_kx8_is_nntrainers_repack():
    rows = block_q4_K_rows(16, 512, seed=1)                 # 2 groups of 8 rows, 2 super-blocks
    expected = repack_q4_K_to_q4_K_8(rows)
    ours = nntr_bin.block_rows_to_q4_kx8(rows)
    np.testing.assert_array_equal(ours, expected)
    np.testing.assert_array_equal(nntr_bin.q4_kx8_to_block_rows(expected, 16, 512), rows)
    x8 = expected[:1152]                                    # rows 0..7, super-block 0
    assert bytes(x8[0:2]) == bytes(rows[0, 0:2]) and bytes(x8[14:16]) == bytes(rows[7, 0:2])
    assert bytes(x8[16:18]) == bytes(rows[0, 2:4])          # dmin of row 0
    assert bytes(x8[128:136]) == bytes(rows[0, 16:24])      # chunk 0: row 0, qs bytes 0..7
    assert bytes(x8[136:144]) == bytes(rows[1, 16:24])      # chunk 1: row 1
    assert bytes(x8[192:200]) == bytes(rows[0, 24:32])      # chunk 8: row 0, qs bytes 8..15
    for j in range(8):                                      # 12 bytes per sub-block, 8 rows
        packed = x8[32 + 12 * j:44 + 12 * j]
        assert [scale_min_k4(r, packed) for r in range(8)] == \
            [scale_min_k4(j, rows[r, 4:16]) for r in range(8)]
    second = expected[1152:2304]                            # rows 0..7, super-block 1
    assert bytes(second[0:2]) == bytes(rows[0, 144:146])


def test_q4_0x8_bytes_round_trip():
    rows = np.random.default_rng(2).integers(0, 256, (16, 64 // 32 * 18), dtype=np.uint8)
    raw = nntr_bin.block_rows_to_q4_0x8(rows)
    assert raw.size == rows.size
    assert bytes(raw[:2]) == bytes(rows[0, :2]) and bytes(raw[2:4]) == bytes(rows[1, :2])
    np.testing.assert_array_equal(raw[16:24], rows[0, 2:10] ^ 0x88)
    np.testing.assert_array_equal(raw[24:32], rows[1, 2:10] ^ 0x88)
    np.testing.assert_array_equal(nntr_bin.q4_0x8_to_block_rows(raw, 16, 64), rows)


CASES = [  # name, logical shape, dtype, block rows (R, C)
    ("layer0_wq:weight", (512, 16), "Q4_K", (16, 512)),
    ("layer0_wq:weight", (64, 24), "Q4_0", (24, 64)),
    ("layer0_wq:weight", (512, 12), "Q6_K", (12, 512)),
    ("layer0_wq:weight", (64, 12), "Q8_0", (12, 64)),
    ("embedding0:Embedding", (10, 512), "Q6_K", (10, 512)),
    ("embedding0:Embedding", (10, 64), "Q4_0", (10, 64)),
    ("embedding0:Embedding", (10, 64), "Q8_0", (10, 64)),
]


@pytest.mark.parametrize("name, shape, dtype, rc", CASES)
def test_bin_bytes_round_trip(name, shape, dtype, rc):
    """Every layout: block rows -> .bin bytes (bin_nbytes of them) -> the same rows; and rows
    that ggml's quantizer made decode after the round trip as before."""
    R, C = rc
    x = np.random.default_rng(3).standard_normal((R, C)).astype(np.float32)
    rows = quantize_rows(dtype, x)
    raw = nntr_bin.block_rows_to_bin(name, shape, dtype, rows)
    assert raw.dtype == np.uint8 and raw.size == nntr_bin.bin_nbytes(shape, dtype)
    np.testing.assert_array_equal(nntr_bin.bin_to_block_rows(name, shape, dtype, raw), rows)
    if dtype == "Q4_K":
        assert bytes(raw[:2]) == b"\x03\x00"                 # QScheme::Q4_Kx8, little-endian
        np.testing.assert_array_equal(raw[2:], repack_q4_K_to_q4_K_8(rows))
    elif dtype in ("Q6_K", "Q8_0") or name.endswith(":Embedding"):
        np.testing.assert_array_equal(raw, rows.reshape(-1))  # plain rows, as ggml's


def test_bin_nbytes_q4_k():
    assert nntr_bin.bin_nbytes((512, 16), "Q4_K") == 2 + 512 * 16 // 256 * 144
    assert nntr_bin.bin_nbytes((10, 512), "Q6_K") == 10 * 2 * 210


def test_block_row_errors():
    rows = quantize_rows("Q4_K", np.ones((16, 512), np.float32))
    raw = nntr_bin.block_rows_to_bin("fc:weight", (512, 16), "Q4_K", rows)
    raw[0] = 5
    with pytest.raises(CausalLMError, match=r"'fc:weight' Q4_K: its 2-byte quantization scheme "
                                            r"is 5, expected 3"):
        nntr_bin.bin_to_block_rows("fc:weight", (512, 16), "Q4_K", raw)
    with pytest.raises(CausalLMError, match="expected 4610 bytes, got 4609"):
        nntr_bin.bin_to_block_rows("fc:weight", (512, 16), "Q4_K", raw[1:])
    with pytest.raises(CausalLMError, match=r"cannot be Q4_K: it needs rows of a multiple of 256 "
                                            r"values along its input, and a multiple of 8 outputs"):
        nntr_bin.block_rows_to_bin("fc:weight", (512, 12), "Q4_K", rows[:12])
    with pytest.raises(CausalLMError, match="NNTrainer has no Q4_K table"):
        nntr_bin.block_rows_to_bin("emb:Embedding", (16, 512), "Q4_K", rows)
    with pytest.raises(CausalLMError, match=r"expected block rows \(16, 288\), got \(16, 144\)"):
        nntr_bin.block_rows_to_bin("fc:weight", (512, 16), "Q4_K", rows[:, :144])
    with pytest.raises(CausalLMError, match="dtype 'FP16' is not ggml blocks"):
        nntr_bin.bin_to_block_rows("fc:weight", (512, 16), "FP16", raw)
