"""ggml's own quantized bytes for the rows of tests/quantize_cases.py, for tests/test_quantize.py.

    python tools/fixtures_quantize.py [--check]

Calls ``ggml_quantize_chunk(type, src, dst, 0, nrows, n_per_row, imatrix=NULL)`` of the
``libggml-base.so`` that llama-cpp-python ships, through ctypes. With no importance matrix,
ggml-quants.c's ``quantize_q4_0`` ... ``quantize_q6_K`` call ``quantize_row_<type>_ref`` on the
whole chunk (``quantize_q8_0`` always does), so these are the reference quantizers' bytes.

Writes tests/fixtures/quantize/ggml_blocks.npz:

    inputs_sha256       json {case: sha256 of the float32 rows}: the tests make the same rows
    bytes_sha256        json {type: {case: sha256 of ggml's bytes}}
    <type>/edges        uint8 (R, row bytes): ggml's bytes of the "edges" case, kept whole
    <type>/normal_head  uint8: the first 4 rows of the "normal" case, kept whole
    about               json: seed, llama-cpp-python version, what made it

``--check`` compares our quantizers (causallm/kernels/quantize.py) with ggml on every case and
prints the first differing block of each type, without writing.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402

from tests import quantize_cases  # noqa: E402

OUT = os.path.join(ROOT, "tests", "fixtures", "quantize", "ggml_blocks.npz")
TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


def ggml_library() -> ctypes.CDLL:
    import llama_cpp
    path = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so")
    lib = ctypes.CDLL(path)
    f = lib.ggml_quantize_chunk
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


def ggml_quantize(lib: ctypes.CDLL, fmt: str, rows: np.ndarray) -> np.ndarray:
    """ggml's bytes of float32 rows (R, C) as uint8 (R, row bytes)."""
    x = np.ascontiguousarray(rows, dtype=np.float32)
    R, C = x.shape
    qk, size = GGML_QUANT_SIZES[GGMLQuantizationType[fmt]]
    out = np.zeros((R, C // qk * size), dtype=np.uint8)
    n = lib.ggml_quantize_chunk(int(GGMLQuantizationType[fmt]), x.ctypes.data, out.ctypes.data,
                                0, R, C, None)
    assert n == out.nbytes, (fmt, n, out.nbytes)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare causallm's quantizers with ggml on every case, write nothing")
    args = ap.parse_args()
    lib = ggml_library()
    inputs = {name: quantize_cases.make(name) for name in quantize_cases.CASES}
    if args.check:
        from causallm.kernels.quantize import BLOCK_BYTES, quantize_rows
        bad = 0
        for fmt in TYPES:
            for name, x in inputs.items():
                diff = quantize_cases.first_difference(
                    quantize_rows(fmt, x), ggml_quantize(lib, fmt, x), BLOCK_BYTES[fmt])
                print(f"{fmt} {name}: {diff or 'equal'}")
                bad += diff is not None
        sys.exit(1 if bad else 0)
    arrays = {}
    digests = {}
    for fmt in TYPES:
        digests[fmt] = {}
        for name, x in inputs.items():
            q = ggml_quantize(lib, fmt, x)
            digests[fmt][name] = quantize_cases.sha256(q)
            if name == "edges":
                arrays[f"{fmt}/edges"] = q
            elif name == "normal":
                arrays[f"{fmt}/normal_head"] = q[:4]
    about = {"seed": quantize_cases.SEED,
             "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
             "maker": "tools/fixtures_quantize.py: ggml_quantize_chunk with imatrix NULL"}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    np.savez_compressed(
        OUT, inputs_sha256=json.dumps({n: quantize_cases.sha256(x) for n, x in inputs.items()}),
        bytes_sha256=json.dumps(digests), about=json.dumps(about), **arrays)
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
