"""The load path: the precision each weight is held in, and the weights read into a graph.

**Precision** (``WeightPrecision``). A packable weight (a ``fully_connected`` layer's, the token
embedding, the LM head: the weights the kernels also take packed) is held in the first of

    1. ``--dtype`` / ``causallm.load(dtype=)`` (``setWeightFormat``): every packable weight;
    2. nntr_config's key for its kind of weight, when not FP32 (the default):
           fully connected   ``fc_layer_dtype``, else ``model_tensor_type``'s weight part
           embedding         ``embedding_dtype``
           head              ``lmhead_dtype``, else ``embedding_dtype``
    3. the checkpoint's own: a safetensors' F32, BF16 or F16, a GGUF's type; a .bin's is 2.
       (the dtypes it was written in).

FP32 at 1. widens every packable weight to float32; at 2. it keeps the checkpoint's precision.
Each family gives a layer its kind's dtype as the node's ``weight_dtype``
(``Transformer.createFullyConnected``, the embedding and head layers), so a compiled
``WeightSpec``'s dtype is the answer of 2. (and a .bin is read in it), and ``heldFormat(spec)``
needs nothing else. Experts of a mixture of experts are not packable (their kernels take
float32): a .bin holds them in model_tensor_type's weight dtype, as the C++ reads them.

**Conversion** (``convertWeight``): a float32 array or a ``PackedMatrix`` held as a format of
WEIGHT_FORMATS; a weight converted from a memory-mapped file gives the file's pages back
(``io/files.release_pages``), so the process holds the conversion, not both.

**Loading** (``WeightLoader``, made for a compiled graph): ``load`` reads the file a model's
configs name (``default_weight_path``) or the one given, by its kind: an NNTrainer .bin (every
weight in its spec's dtype, in graph order), a safetensors file or folder or a GGUF file
(through the family's weight table, ``io/weight_table.py``), each weight stored as
``heldFormat`` says; a load that fails leaves the graph without weights.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from causallm.errors import CausalLMError
from causallm.io.config import NNTR_DEFAULTS, JsonConfig
from causallm.io.files import release_pages
from causallm.io.safetensors import Checkpoint, float_dtype
from causallm.kernels import quant
from causallm.kernels.packed import QUANTIZABLE, PackedMatrix
from causallm.progress import files_size, progress
from causallm.runtime.kv_cache import CACHE_DTYPES

if TYPE_CHECKING:  # the GGUF reader is imported when a GGUF is read
    from causallm.io.gguf_file import GGUFCheckpoint, GGUFFile

WEIGHT_FORMATS = ("FP32", "BF16", "FP16", *QUANTIZABLE)
"""What ``--dtype`` and the nntr_config dtype keys may hold a packable weight as."""

FULLY_CONNECTED, EMBEDDING, HEAD = "fully_connected", "embedding", "head"
"""The kinds of packable weight, each with its nntr_config key (module docstring)."""


def _packed_name(fmt: str) -> str:
    """A WEIGHT_FORMATS name as PackedMatrix's format (FP16 -> F16)."""
    return "F16" if fmt == "FP16" else fmt


class WeightPrecision:
    """The precision policy of one model's settings (module docstring): ``dtype(kind)`` is
    nntr_config's answer for a kind of weight, ``heldFormat(spec)`` the format a packable
    weight is held in, ``setWeightFormat`` the ``--dtype`` one; ``kvCacheDtype()`` the KV
    caches' precision, which follows the fully connected weights' (``fullyConnected()``)
    unless set. ``cfg`` and ``nntr_cfg`` are the model's configs: where its weights are
    (``default_weight_path``) and the dtypes."""

    def __init__(self, cfg: JsonConfig, nntr_cfg: JsonConfig) -> None:
        self.cfg, self.nntr_cfg = cfg, nntr_cfg
        self.override: str | None = None
        embedding = self._read("embedding_dtype", NNTR_DEFAULTS["embedding_dtype"])
        fc = self._read("fc_layer_dtype", NNTR_DEFAULTS["fc_layer_dtype"])
        if fc == "FP32":
            tensor_type = nntr_cfg.get_str("model_tensor_type", NNTR_DEFAULTS["model_tensor_type"])
            fc = tensor_type.split("-")[0].upper()
            if fc not in WEIGHT_FORMATS:
                raise nntr_cfg.error("model_tensor_type", f"W-A with W one of "
                                                          f"{', '.join(WEIGHT_FORMATS)} (the "
                                                          f"fully connected weights' dtype when "
                                                          f"fc_layer_dtype is FP32)")
        self.dtypes = {FULLY_CONNECTED: fc, EMBEDDING: embedding,
                       HEAD: self._read("lmhead_dtype", embedding)}
        self.kv_cache: str | None = None  # as set (kv_cache_dtype, --kv-dtype), else the rule
        if nntr_cfg.contains("kv_cache_dtype"):
            self.kv_cache = nntr_cfg.get_str("kv_cache_dtype").upper()
            if self.kv_cache not in CACHE_DTYPES:
                raise nntr_cfg.error("kv_cache_dtype", f"one of {', '.join(CACHE_DTYPES)}")
        self.stored: str | None = None  # the weight file's precision, read when first asked

    def _read(self, key: str, default: str) -> str:
        value = self.nntr_cfg.get_str(key, default).upper()
        if value not in WEIGHT_FORMATS:
            raise self.nntr_cfg.error(key, f"one of {', '.join(WEIGHT_FORMATS)}")
        return value

    def dtype(self, kind: str) -> str:
        """nntr_config's dtype of a kind of weight (FULLY_CONNECTED, EMBEDDING, HEAD): the
        ``weight_dtype`` its layers get, the dtype a .bin holds it in."""
        return self.dtypes[kind]

    def setWeightFormat(self, fmt: str | None) -> None:
        """Hold every packable weight (fully connected, embedding, head) as ``fmt`` (one of
        WEIGHT_FORMATS; ``--dtype``, ``causallm.load(dtype=)``), converting at load; None: the
        rule of the nntr_config keys and the checkpoint."""
        if fmt is not None and fmt.upper() not in WEIGHT_FORMATS:
            raise CausalLMError(f"weight format {fmt!r} is not one of "
                                f"{', '.join(WEIGHT_FORMATS)}")
        self.override = None if fmt is None else fmt.upper()

    def setKVCacheDtype(self, dtype: str | None) -> None:
        """Hold the self-attention KV caches as ``dtype`` (FP32 or FP16; ``--kv-dtype``),
        before the model's initialize(); None: nntr_config's ``kv_cache_dtype``, else
        kvCacheDtype's rule."""
        if dtype is not None:
            if dtype.upper() not in CACHE_DTYPES:
                raise CausalLMError(f"KV cache dtype {dtype!r} is not one of "
                                    f"{', '.join(CACHE_DTYPES)}")
            self.kv_cache = dtype.upper()

    def kvCacheDtype(self) -> str:
        """The self-attention caches' precision (mha_core ``cache_dtype``): as set
        (``kv_cache_dtype``, ``--kv-dtype``); else FP32 when the weights compute in float32
        (results then match a float32 transformers run to rounding) and FP16 when they are held
        in 16 bits or fewer (as llama.cpp's and nntrainer's caches: half the memory and
        bandwidth, well inside the weights' own precision)."""
        if self.kv_cache is not None:
            return self.kv_cache
        return "FP32" if self.fullyConnected() == "FP32" else "FP16"

    def heldFormat(self, spec) -> str | None:
        """The format packable weight ``spec`` is held in, or None to keep the checkpoint's."""
        if self.override is not None:
            return self.override
        return None if spec.dtype == "FP32" else spec.dtype

    def fullyConnected(self) -> str:
        """The precision the fully connected weights are held in: the override, else
        nntr_config's when not FP32, else that of the weights ``default_weight_path`` names
        (FP32 for a .bin or when there are none yet)."""
        if self.override is not None:
            return self.override
        fc = self.dtypes[FULLY_CONNECTED]
        if fc != "FP32":
            return fc
        if self.stored is None:
            try:
                path = default_weight_path(self.cfg, self.nntr_cfg)
            except CausalLMError:  # load_weight says so
                path = None
            self.stored = "FP32" if path is None else stored_precision(path, self.cfg.gguf)
        return self.stored


def default_weight_path(cfg: JsonConfig, nntr_cfg: JsonConfig) -> str:
    """Where a model's weights are: nntr_config's ``model_file_name`` (relative to the model
    folder; an error when it is not there), else the GGUF file the configs came from, else the
    folder itself (its safetensors)."""
    if nntr_cfg.contains("model_file_name"):
        path = nntr_cfg.resolve_path(nntr_cfg.get_str("model_file_name"))
        if not os.path.exists(path):
            raise CausalLMError(f"{nntr_cfg.where('model_file_name')}: {path} does not exist")
        return path
    return cfg.gguf.path if cfg.gguf is not None else cfg.directory


def is_checkpoint(path: str) -> bool:
    """Whether a weight path is a Hugging Face safetensors file or folder (one that is neither
    this nor a .gguf is an NNTrainer .bin)."""
    return os.path.isdir(path) or path.endswith(".safetensors")


def stored_precision(path: str, gguf: GGUFFile | None = None) -> str:
    """The precision of the weights at ``path``: a .bin's FP32 (its other dtypes come from
    nntr_config), a GGUF's "FP32" or "quantized" (GGUFFile.weightPrecision), a safetensors
    folder's BF16, FP16 or FP32 (what holds most of its elements; FP32 when it has none)."""
    if path.lower().endswith(".gguf"):
        from causallm.io.gguf_file import GGUFFile

        same = gguf is not None and os.path.abspath(gguf.path) == os.path.abspath(path)
        return (gguf if same else GGUFFile(path)).weightPrecision()
    if not is_checkpoint(path):
        return "FP32"
    try:
        dtype = float_dtype(Checkpoint(checkpoint_folder(path)))
    except CausalLMError:
        dtype = None
    return {"BF16": "BF16", "F16": "FP16"}.get(dtype, "FP32")


def checkpoint_folder(path: str) -> str:
    """The folder of a safetensors file, or the folder itself."""
    return path if os.path.isdir(path) else os.path.dirname(path) or "."


def convertWeight(value, fmt: str, transposed: bool):
    """A weight (float32 array of its logical shape, or a PackedMatrix) held as ``fmt``:
    float32 for FP32, else a PackedMatrix whose rows are the logical (K, N)'s columns
    (``transposed``: a fully connected weight) or rows (an embedding). A block type's weight
    whose rows are not a multiple of its block stays as it is."""
    if fmt == "FP32":
        return value.toFloat() if isinstance(value, PackedMatrix) else value
    if fmt not in WEIGHT_FORMATS:
        raise CausalLMError(f"weight format {fmt!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    packed = _packed_name(fmt)
    qtype = quant.QTYPES.get(packed)
    if qtype is not None and value.shape[0 if transposed else 1] % qtype.qk:
        return value
    if isinstance(value, PackedMatrix):
        return value.to(packed)
    return PackedMatrix.fromFloat(packed, value.T if transposed else value, transposed)


class WeightLoader:
    """Weights into one compiled ``graph``, each packable one held as ``precision`` says, from
    the files of the model whose configs are ``cfg`` and ``nntr_cfg``; ``owner`` names the
    model in errors."""

    def __init__(self, graph, precision: WeightPrecision, cfg: JsonConfig, nntr_cfg: JsonConfig,
                 owner: str) -> None:
        self.graph, self.precision, self.owner = graph, precision, owner
        self.cfg, self.nntr_cfg = cfg, nntr_cfg
        self.specs = {s.full_name: s for s in graph.getWeightSpecs()}

    def defaultPath(self) -> str:
        """``default_weight_path`` of the model's configs."""
        return default_weight_path(self.cfg, self.nntr_cfg)

    def load(self, path: str | None, family) -> str:
        """The weights at ``path`` (default ``defaultPath()``) by the kind of file: a .gguf
        (``loadGGUF``), a safetensors file or folder (the family's ``load_hf_weight``), else an
        NNTrainer .bin (``loadBin``). ``family`` is the model: its weight table
        (``getHFWeightTable``, ``getHFWeightMap``) and its way of reading a Hugging Face
        checkpoint. A load that fails leaves the graph without weights (half the weights are no
        model: it runs only after a new load). Returns the absolute path read."""
        if path is None:
            path = self.defaultPath()
        try:
            if path.lower().endswith(".gguf"):
                self.loadGGUF(path, family.getHFWeightTable(), family.getHFWeightMap())
            elif is_checkpoint(path):
                family.load_hf_weight(path)
            else:
                self.loadBin(path)
        except BaseException:
            self.graph.forgetWeights()
            raise
        return os.path.abspath(path)

    def store(self, target: str, value) -> None:
        """``graph.setWeight`` after converting a packable weight to its held format; a
        conversion that replaces a view of a mapped file gives the file's pages back."""
        spec = self.specs[target]
        fmt = self.precision.heldFormat(spec) if spec.packable else None
        if fmt is not None:
            held = convertWeight(value, fmt, transposed=not target.endswith(":Embedding"))
            if held is not value:
                release_pages(value.data if isinstance(value, PackedMatrix) else value)
            value = held
        self.graph.setWeight(target, value)

    def loadBin(self, path: str) -> None:
        """An NNTrainer .bin, every weight in its spec's dtype; with an override, the packable
        ones converted after."""
        self.graph.load(path)
        fmt = self.precision.override
        if fmt is None:
            return
        packable = [name for name, s in self.specs.items() if s.packable]
        with progress(len(packable), f"converting weights to {fmt}", "tensor",
                      files_size([path])) as bar:
            for name in packable:
                self.store(name, self.graph.getWeight(name))
                bar.update()

    def loadCheckpoint(self, ckpt, table, weight_map: dict) -> None:
        """Every weight of ``weight_map`` (the family's ``table`` expanded) from ``ckpt``, a
        safetensors or GGUF checkpoint; packable ones come as stored and are held as
        ``store`` says."""
        orientation = {name: not name.endswith(":Embedding")
                       for name, s in self.specs.items() if s.packable}
        table.load(ckpt, weight_map, self.store, self.owner, orientation)

    def loadGGUF(self, path: str, table, weight_map: dict) -> None:
        """The weights of a GGUF file under the Hugging Face names of the weight table
        (causallm/io/gguf_file.py)."""
        ckpt = self.openGGUF(path, [*weight_map, *table.aliasMap(weight_map)])
        self.loadCheckpoint(ckpt, table, weight_map)
        self.reportRequantized(ckpt)

    def openGGUF(self, path: str, names) -> GGUFCheckpoint:
        """The GGUF checkpoint at ``path`` (the configs' own file when it is that one) under the
        Hugging Face ``names``: a type without a kernel is held as Q8_0 unless an override is
        set."""
        from causallm.io.gguf_file import GGUFCheckpoint, GGUFFile

        gguf = self.cfg.gguf
        if gguf is None or os.path.abspath(gguf.path) != os.path.abspath(path):
            gguf = GGUFFile(path)
        return GGUFCheckpoint(gguf, names, None if self.precision.override else "Q8_0")

    @staticmethod
    def reportRequantized(ckpt: GGUFCheckpoint) -> None:
        for kind, n in ckpt.requantized.items():
            print(f"[gguf] {n} {kind} tensor(s) held as {ckpt.requantize} (no {kind} kernel; "
                  f"--dtype chooses another format)", file=sys.stderr)

    def heldTypes(self) -> dict[str, int]:
        """{type: count} of the packable weights as held: F32, BF16, F16, Q8_0, ..."""
        count: dict[str, int] = {}
        for spec in self.graph.getWeightSpecs():
            if spec.packable:
                w = self.graph.getWeight(spec.full_name)
                kind = w.format if isinstance(w, PackedMatrix) else "F32"
                count[kind] = count.get(kind, 0) + 1
        return dict(sorted(count.items()))
