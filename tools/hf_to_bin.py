"""Convert a Hugging Face safetensors model folder into an NNTrainer .bin (no torch).

    python tools/hf_to_bin.py MODEL_DIR [-o OUT.bin] [--dtype FP32|FP16|Q8_0|Q4_0|Q4_K]
        [--embd-dtype FP32|FP16|Q8_0|Q4_0|Q6_K] [--lmhead-dtype ...] [--write-nntr-config]

The model is built from MODEL_DIR's config.json (and generation_config.json / nntr_config.json)
through the Factory, as main.py builds it, but with ``model_tensor_type = "<dtype>-FP32"`` and
``fc_layer_dtype = <dtype>`` (and ``embedding_dtype`` / ``lmhead_dtype`` when given), as
nntrainer's ``nntr_quantize`` sets them. Its weights are read from the folder's safetensors
(F32, F16 or BF16; one file or shards) through the family's weight table
(``getHFWeightTable``), and ``Model.save`` writes every weight once, in graph order, each in the
dtype its layer requested (docs/nntrainer.md, "The .bin file", "Weight dtypes"):

    FP32-FP32   every weight FP32 (4 bytes an element).
    FP16-FP32   FC weights (q, k, v, o, up, gate, down) FP16; RMSNorm gammas (packed=false)
                and FC biases (activation dtype) FP32; the embedding and the LM head in
                embedding_dtype / lmhead_dtype (FP32 unless nntr_config.json or --embd-dtype
                says otherwise).
    Q4_0-FP32   FC weights as ggml Q4_0 blocks along K in nntrainer's x86 ``block_q4_0x8``
                repack (18 bytes per 32 values); the rest as above. An embedding or head in
                Q4_0 is plain ``block_q4_0`` rows, as nntrainer writes tables.
    Q8_0-FP32   FC weights as plain ggml ``block_q8_0`` rows (34 bytes per 32 values). Our
                extension: nntrainer has no Q8_0 type, so only this project reads these files.
    Q4_K-FP32   FC weights as ggml Q4_K blocks (144 bytes per 256 values) after a 2-byte
                QScheme (3), in nntrainer's ``block_q4_Kx8`` repack (nntrainer has no Q4_K
                table). Q6_K: plain ``block_q6_K`` rows (210 bytes per 256 values), what
                ``nntr_quantize --embd_dtype Q6_K`` and nntrainer's tied embedding write.

Quantizing needs rows of a multiple of 32 values (256 for Q4_K / Q6_K; and, for a Q4_0 or Q4_K
FC weight, a multiple of 8 outputs); a weight that is not gets a one-line error naming it. No
torch is needed: the quantizers are numba's, byte-identical to ggml's
(causallm/kernels/quantize.py).

FC weights are stored [in, out] (the PyTorch [out, in] transposed), the embedding [vocab, hidden];
a tied LM head shares the embedding and adds no bytes. The .bin is written atomically.

``-o`` names the .bin in an existing folder: a missing folder (or ``-o`` naming a folder) is a
one-line error before anything is converted, so a mistyped path creates nothing.

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
from causallm.io.nntr_bin import bin_nbytes, block_shape_error  # noqa: E402

FC_DTYPES = ("FP32", "FP16", "Q8_0", "Q4_0", "Q4_K")
"""--dtype: what fully connected weights are written in (each a ``model_tensor_type`` weight
part; Q8_0 is ours)."""
BIN_DTYPES = (*FC_DTYPES, "Q6_K")
"""--embd-dtype / --lmhead-dtype, and every dtype this tool writes: Q6_K too (tables)."""

# nntr_config keys that do not change the .bin layout; kept small so building the graph for a
# conversion allocates no large KV cache or activation buffers.
_SMALL_RUNTIME = {"batch_size": 1, "init_seq_len": 1, "num_to_generate": 1, "max_seq_len": 2,
                  "fsu": False, "moe_expert_cache": 0}  # every expert resident: tools read them all


class ConvertResult(NamedTuple):
    path: str                 # the .bin written
    tensors: int              # weights in it
    nbytes: int               # its size
    model_tensor_type: str    # what nntr_config.json must say to load it


def build_model(model_dir: str, model_tensor_type: str | None = None, **nntr):
    """The initialized model for MODEL_DIR's configs, as main.py makes it (Factory keyed by
    ``architectures[0]``), with ``model_tensor_type`` and the ``nntr`` keys overridden when
    given and the runtime sizes made small (they do not change the weights or their order).
    Weights are still zero."""
    from causallm.factory import Factory

    overrides = {**_SMALL_RUNTIME, **nntr}
    if model_tensor_type is not None:
        overrides["model_tensor_type"] = model_tensor_type
    model = Factory.Instance().createFromFolder(model_dir, **overrides)
    model.initialize()
    return model


def _tag(dtype: str) -> str:
    return dtype.lower().replace("_", "")


def default_output(model_dir: str, dtype: str, embd_dtype: str = "FP32") -> str:
    """MODEL_DIR/nntr_<folder name>_<fp32|fp16|q80|q40>[_embd<dtype>].bin, as the C++
    converters and ``nntr_quantize`` name their output."""
    base = re.sub(r"[^0-9a-z]+", "_", os.path.basename(os.path.abspath(model_dir)).lower())
    embd = "" if embd_dtype == "FP32" else f"_embd{_tag(embd_dtype)}"
    return os.path.join(model_dir, f"nntr_{base.strip('_') or 'model'}_{_tag(dtype)}{embd}.bin")


def _dtype(value: str | None, flag: str, choices=BIN_DTYPES) -> str | None:
    if value is None:
        return None
    if value.upper() not in choices:
        raise CausalLMError(f"{flag} must be one of {', '.join(choices)}, not {value!r}")
    return value.upper()


def convert(model_dir: str, out: str | None = None, dtype: str = "FP32",
            write_nntr_config: bool = False, embd_dtype: str | None = None,
            lmhead_dtype: str | None = None) -> ConvertResult:
    """Write MODEL_DIR's safetensors as an NNTrainer .bin of FC dtype ``dtype``, the embedding
    in ``embd_dtype`` and an untied head in ``lmhead_dtype`` (by default nntr_config.json's,
    else FP32 and the embedding's; see the module docstring); optionally point
    MODEL_DIR/nntr_config.json at it."""
    dtype = _dtype(dtype, "--dtype", FC_DTYPES)
    if out is not None:  # refuse before the conversion, which takes a while
        folder = os.path.dirname(os.path.abspath(out))
        if os.path.isdir(out):
            raise CausalLMError(f"{out}: is a folder; give the path of the .bin to write")
        if not os.path.isdir(folder):
            raise CausalLMError(f"{out}: no folder {folder} to write it in (create it first)")
    embd_dtype, lmhead_dtype = _dtype(embd_dtype, "--embd-dtype"), \
        _dtype(lmhead_dtype, "--lmhead-dtype")
    tensor_type = f"{dtype}-FP32"
    overrides = {"fc_layer_dtype": dtype}
    if embd_dtype is not None:
        overrides["embedding_dtype"] = embd_dtype
    if lmhead_dtype is not None or embd_dtype is not None:
        overrides["lmhead_dtype"] = lmhead_dtype or embd_dtype
    model = build_model(model_dir, tensor_type, **overrides)
    out = out or default_output(model_dir, dtype, model.EMBEDDING_DTYPE.upper())
    specs = model.model.getWeightSpecs()
    for spec in specs:
        if spec.dtype not in BIN_DTYPES:
            raise CausalLMError(
                f"{model.nntr_cfg.path}: weight '{spec.full_name}' would be stored as "
                f"{spec.dtype}; this tool writes {', '.join(BIN_DTYPES)} (check "
                f"embedding_dtype / lmhead_dtype)")
    for spec in specs:  # refuse before reading any weight
        problem = block_shape_error(spec.full_name, spec.shape, spec.dtype)
        if problem:
            raise CausalLMError(problem)
    model.load_weight(model_dir)
    model.save_weight(out)  # dtype None: each weight in its requested dtype
    expected = sum(bin_nbytes(s.shape, s.dtype) for s in specs)
    found = os.path.getsize(out)
    if found != expected:  # Model.save and the spec disagree: a bug, not a user error
        raise RuntimeError(f"{out}: wrote {found} bytes, expected {expected}")
    if write_nntr_config:
        update_nntr_config(model_dir, out, tensor_type, {
            "fc_layer_dtype": dtype, "embedding_dtype": model.EMBEDDING_DTYPE.upper(),
            "lmhead_dtype": getattr(model, "LMHEAD_DTYPE", model.EMBEDDING_DTYPE).upper()})
    return ConvertResult(out, len(specs), found, tensor_type)


def update_nntr_config(model_dir: str, bin_path: str, tensor_type: str,
                       dtypes: dict[str, str] | None = None) -> str:
    """Set ``model_file_name``, ``model_tensor_type`` and the ``dtypes`` keys
    (fc_layer_dtype, embedding_dtype, lmhead_dtype; one at its default, FP32 or for the head
    the embedding's, only when the file has the key)
    in MODEL_DIR/nntr_config.json (created if missing), keeping every other key and the key
    order; written atomically."""
    path = os.path.join(model_dir, "nntr_config.json")
    data = dict(load_json(path, required=False))
    folder, target = os.path.realpath(model_dir), os.path.realpath(bin_path)
    rel = os.path.relpath(target, folder)
    data["model_file_name"] = target if rel.startswith(os.pardir) else rel
    data["model_tensor_type"] = tensor_type
    dtypes = dtypes or {}
    for key, value in dtypes.items():  # a default only to replace another value
        default = dtypes.get("embedding_dtype", "FP32") if key == "lmhead_dtype" else "FP32"
        if value != default or key in data:
            data[key] = value
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
                   help="the .bin to write, in an existing folder "
                        "(default: MODEL_DIR/nntr_<name>_<dtype>.bin)")
    p.add_argument("--dtype", default="FP32", type=str.upper, choices=FC_DTYPES,
                   help="dtype of the FC weights (FP16 gives model_tensor_type FP16-FP32, "
                        "Q4_0 Q4_0-FP32, ...)")
    p.add_argument("--embd-dtype", default=None, type=str.upper, choices=BIN_DTYPES,
                   help="dtype of the embedding (default: nntr_config.json's, else FP32)")
    p.add_argument("--lmhead-dtype", default=None, type=str.upper, choices=BIN_DTYPES,
                   help="dtype of an untied LM head (default: the embedding's)")
    p.add_argument("--write-nntr-config", action="store_true",
                   help="set model_file_name and model_tensor_type in MODEL_DIR/nntr_config.json")
    args = p.parse_args(argv)
    try:
        r = convert(args.model_dir, args.output, args.dtype, args.write_nntr_config,
                    args.embd_dtype, args.lmhead_dtype)
        configured = configured_tensor_type(args.model_dir)
    except CausalLMError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    except OSError as e:  # e.g. a folder it may not write in
        sys.stderr.write(f"error: {f'{e.filename}: ' if e.filename else ''}{e.strerror}\n")
        return 1
    print(f"wrote {r.path}: {r.tensors} tensors, {r.nbytes} bytes, "
          f"model_tensor_type {r.model_tensor_type}")
    if configured != r.model_tensor_type:
        sys.stderr.write(f"note: {os.path.join(args.model_dir, 'nntr_config.json')} says "
                         f"model_tensor_type {configured}; this .bin needs "
                         f"{r.model_tensor_type} (use --write-nntr-config)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
