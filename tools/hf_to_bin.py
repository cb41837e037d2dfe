"""Convert a Hugging Face safetensors model folder into an NNTrainer .bin (no torch).

    python tools/hf_to_bin.py MODEL_DIR [-o OUT.bin] [--dtype FP32|FP16] [--write-nntr-config]

The model is built from MODEL_DIR's config.json (and generation_config.json / nntr_config.json)
through the Factory, as main.py builds it, but with ``model_tensor_type = "<dtype>-FP32"``. Its
weights are read from the folder's safetensors (F32, F16 or BF16; one file or shards) through
the family's weight table (``getHFWeightTable``), and ``Model.save`` writes every weight once, in graph order, each in the dtype
its layer requested (porting spec 7.1, 2.2):

    FP32-FP32   every weight FP32 (4 bytes an element).
    FP16-FP32   FC weights (q, k, v, o, up, gate, down) FP16; RMSNorm gammas (packed=false)
                and FC biases (activation dtype) FP32; the embedding and the LM head in
                embedding_dtype / lmhead_dtype (FP32 unless nntr_config.json says FP16).

FC weights are stored [in, out] (the PyTorch [out, in] transposed), the embedding [vocab, hidden];
a tied LM head shares the embedding and adds no bytes. The .bin is written atomically.

``--write-nntr-config`` writes (or updates, keeping every other key) MODEL_DIR/nntr_config.json
with ``model_file_name`` (relative to MODEL_DIR when the .bin is inside it) and
``model_tensor_type``, so ``python main.py MODEL_DIR`` runs the .bin.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from causallm.errors import CausalLMError  # noqa: E402
from causallm.io.config import load_json  # noqa: E402
from causallm.io.files import write_json_atomic  # noqa: E402
from causallm.io.nntr_bin import bin_nbytes  # noqa: E402

BIN_DTYPES = ("FP32", "FP16")

# nntr_config keys that do not change the .bin layout; kept small so building the graph for a
# conversion allocates no large KV cache or activation buffers.
_SMALL_RUNTIME = {"batch_size": 1, "init_seq_len": 1, "num_to_generate": 1, "max_seq_len": 2,
                  "fsu": False, "moe_expert_cache": 0}  # every expert resident: tools read them all


class ConvertResult(NamedTuple):
    path: str                 # the .bin written
    tensors: int              # weights in it
    nbytes: int               # its size
    model_tensor_type: str    # what nntr_config.json must say to load it


def build_model(model_dir: str, model_tensor_type: str | None = None):
    """The initialized model for MODEL_DIR's configs, as main.py makes it (Factory keyed by
    ``architectures[0]``), with ``model_tensor_type`` overridden when given and the runtime
    sizes made small (they do not change the weights or their order). Weights are still zero."""
    from factory import Factory

    overrides = dict(_SMALL_RUNTIME)
    if model_tensor_type is not None:
        overrides["model_tensor_type"] = model_tensor_type
    model = Factory.Instance().createFromFolder(model_dir, **overrides)
    model.initialize()
    return model


def default_output(model_dir: str, dtype: str) -> str:
    """MODEL_DIR/nntr_<folder name>_<fp32|fp16>.bin, as the C++ converters name their output."""
    base = re.sub(r"[^0-9a-z]+", "_", os.path.basename(os.path.abspath(model_dir)).lower())
    return os.path.join(model_dir, f"nntr_{base.strip('_') or 'model'}_{dtype.lower()}.bin")


def convert(model_dir: str, out: str | None = None, dtype: str = "FP32",
            write_nntr_config: bool = False) -> ConvertResult:
    """Write MODEL_DIR's safetensors as an NNTrainer .bin of FC dtype ``dtype`` (see the module
    docstring); optionally point MODEL_DIR/nntr_config.json at it."""
    dtype = dtype.upper()
    if dtype not in BIN_DTYPES:
        raise CausalLMError(f"--dtype must be one of {', '.join(BIN_DTYPES)}, not {dtype!r}")
    tensor_type = f"{dtype}-FP32"
    out = out or default_output(model_dir, dtype)
    model = build_model(model_dir, tensor_type)
    specs = model.model.getWeightSpecs()
    for spec in specs:
        if spec.dtype not in BIN_DTYPES:
            raise CausalLMError(
                f"{model.nntr_cfg.path}: weight '{spec.full_name}' would be stored as "
                f"{spec.dtype}; this tool writes FP32 or FP16 only (check embedding_dtype / lmhead_dtype)")
    model.load_weight(model_dir)
    model.save_weight(out)  # dtype None: each weight in its requested dtype
    expected = sum(bin_nbytes(s.shape, s.dtype) for s in specs)
    found = os.path.getsize(out)
    if found != expected:  # Model.save and the spec disagree: a bug, not a user error
        raise RuntimeError(f"{out}: wrote {found} bytes, expected {expected}")
    if write_nntr_config:
        update_nntr_config(model_dir, out, tensor_type)
    return ConvertResult(out, len(specs), found, tensor_type)


def update_nntr_config(model_dir: str, bin_path: str, tensor_type: str) -> str:
    """Set ``model_file_name`` and ``model_tensor_type`` in MODEL_DIR/nntr_config.json (created
    if missing), keeping every other key and the key order; written atomically."""
    path = os.path.join(model_dir, "nntr_config.json")
    data = dict(load_json(path, required=False))
    folder, target = os.path.realpath(model_dir), os.path.realpath(bin_path)
    rel = os.path.relpath(target, folder)
    data["model_file_name"] = target if rel.startswith(os.pardir) else rel
    data["model_tensor_type"] = tensor_type
    write_json_atomic(path, data)
    return path


def configured_tensor_type(model_dir: str) -> str:
    """The model_tensor_type MODEL_DIR/nntr_config.json gives (FP32-FP32 when unset)."""
    nntr = load_json(os.path.join(model_dir, "nntr_config.json"), required=False)
    return nntr.get_str("model_tensor_type", "FP32-FP32")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hf_to_bin", description=__doc__.splitlines()[0])
    p.add_argument("model_dir", help="Hugging Face model folder (config.json + safetensors)")
    p.add_argument("-o", "--output", default=None,
                   help="the .bin to write (default: MODEL_DIR/nntr_<name>_<dtype>.bin)")
    p.add_argument("--dtype", default="FP32", type=str.upper, choices=BIN_DTYPES,
                   help="dtype of the FC weights (FP16 gives model_tensor_type FP16-FP32)")
    p.add_argument("--write-nntr-config", action="store_true",
                   help="set model_file_name and model_tensor_type in MODEL_DIR/nntr_config.json")
    args = p.parse_args(argv)
    try:
        r = convert(args.model_dir, args.output, args.dtype, args.write_nntr_config)
        configured = configured_tensor_type(args.model_dir)
    except CausalLMError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    print(f"wrote {r.path}: {r.tensors} tensors, {r.nbytes} bytes, "
          f"model_tensor_type {r.model_tensor_type}")
    if configured != r.model_tensor_type:
        sys.stderr.write(f"note: {os.path.join(args.model_dir, 'nntr_config.json')} says "
                         f"model_tensor_type {configured}; this .bin needs "
                         f"{r.model_tensor_type} (use --write-nntr-config)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
