"""Convert an NNTrainer .bin back into a Hugging Face folder (no torch).

    python tools/bin_to_hf.py MODEL_DIR BIN -o OUT_DIR [--dtype F32|F16|BF16]
                              [--model-tensor-type FP32-FP32|FP16-FP32]

MODEL_DIR gives the configs the .bin was made for (its nntr_config.json's model_tensor_type fixes
the .bin layout unless ``--model-tensor-type`` says otherwise). The .bin is loaded into our model
(its size is checked exactly) and every weight is written to OUT_DIR/model.safetensors under its
Hugging Face name, the inverse of loading through the family's weight table: FC weights go back
from [in, out] to PyTorch's [out, in] (W.T), the embedding and the norms as they are. A tied LM head is not written
(transformers ties it from ``tie_word_embeddings``). The header carries ``{"format": "pt"}``,
which transformers requires. config.json, generation_config.json and the tokenizer files of
MODEL_DIR are copied beside it, so transformers' ``from_pretrained(OUT_DIR)`` and our own
safetensors loader both read OUT_DIR. Every file is written to a temporary name and renamed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_to_bin import build_model  # noqa: E402  (importing hf_to_bin puts ROOT on sys.path)

from causallm.errors import CausalLMError  # noqa: E402
from causallm.io.nntr_bin import bin_nbytes  # noqa: E402
from causallm.io.safetensors import write_safetensors  # noqa: E402
from causallm.io.weight_table import WeightTable  # noqa: E402

SAFETENSORS_DTYPES = ("F32", "F16", "BF16")
COPIED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "vocab.json",
                "merges.txt", "chat_template.jinja", "source.spm", "target.spm",
                "target_vocab.json", "preprocessor_config.json", "processor_config.json")
"""The Hugging Face files copied from MODEL_DIR when present (config.json must be)."""


class ExportResult(NamedTuple):
    path: str        # OUT_DIR/model.safetensors
    tensors: int     # tensors in it
    nbytes: int      # its size
    copied: list     # file names copied from MODEL_DIR


def hf_tensors(model) -> dict[str, np.ndarray]:
    """{Hugging Face name: C-contiguous float32 array} for every weight of a loaded model, from
    its weight table (``WeightTable.export``): transposed entries are turned back to
    [out, in], and a fused tensor split over several weights (GPT-2's c_attn, gpt-oss's
    gate_up_proj) is put back together."""
    return WeightTable.export(model.getHFWeightMap(), model.model.getWeight)


def _copy_atomic(src: str, dst: str) -> None:
    tmp = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _layout_hint(model_dir: str, bin_path: str, tried: str) -> str:
    """' (its size fits --model-tensor-type X)' when another layout explains the file size."""
    found = os.path.getsize(bin_path)
    for tensor_type in ("FP32-FP32", "FP16-FP32"):
        if tensor_type != tried:
            specs = build_model(model_dir, tensor_type).model.getWeightSpecs()
            if sum(bin_nbytes(s.shape, s.dtype) for s in specs) == found:
                return f" (its size fits --model-tensor-type {tensor_type})"
    return ""


def export(model_dir: str, bin_path: str, out_dir: str, dtype: str = "F32",
           model_tensor_type: str | None = None) -> ExportResult:
    """Write OUT_DIR/model.safetensors (floats as ``dtype``) from BIN, plus MODEL_DIR's
    config and tokenizer files; see the module docstring."""
    dtype = dtype.upper()
    if dtype not in SAFETENSORS_DTYPES:
        raise CausalLMError(f"--dtype must be one of {', '.join(SAFETENSORS_DTYPES)}, "
                            f"not {dtype!r}")
    if not os.path.isfile(bin_path):
        raise CausalLMError(f"{bin_path}: no such .bin file")
    if os.path.exists(out_dir) and os.path.samefile(out_dir, model_dir):
        raise CausalLMError(f"{out_dir}: the output folder must differ from MODEL_DIR")
    model = build_model(model_dir, model_tensor_type)
    try:
        model.load_weight(bin_path)
    except CausalLMError as e:
        raise CausalLMError(f"{e}{_layout_hint(model_dir, bin_path, model.MODEL_TENSOR_TYPE)}") \
            from None
    tensors = hf_tensors(model)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.safetensors")
    write_safetensors(path, tensors, metadata={"format": "pt"}, dtype=dtype)
    copied = []
    for name in COPIED_FILES:
        src = os.path.join(model_dir, name)
        if os.path.isfile(src):
            _copy_atomic(src, os.path.join(out_dir, name))
            copied.append(name)
    return ExportResult(path, len(tensors), os.path.getsize(path), copied)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bin_to_hf", description=__doc__.splitlines()[0])
    p.add_argument("model_dir", help="the model folder the .bin belongs to (config.json, ...)")
    p.add_argument("bin", help="the NNTrainer .bin to convert")
    p.add_argument("-o", "--output", required=True, help="the Hugging Face folder to write")
    p.add_argument("--dtype", default="F32", type=str.upper, choices=SAFETENSORS_DTYPES,
                   help="safetensors dtype of the written tensors (default F32)")
    p.add_argument("--model-tensor-type", default=None, choices=("FP32-FP32", "FP16-FP32"),
                   help="the .bin's layout (default: MODEL_DIR/nntr_config.json's)")
    args = p.parse_args(argv)
    try:
        r = export(args.model_dir, args.bin, args.output, args.dtype, args.model_tensor_type)
    except CausalLMError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    print(f"wrote {r.path}: {r.tensors} tensors, {r.nbytes} bytes; copied {', '.join(r.copied)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
