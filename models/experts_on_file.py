"""Experts left in the weight file: the model side of the MoE expert cache, one mechanism for
Qwen3MoECausalLM (and its slim variants) and GptOssCachedSlimCausalLM.

When an MoE layer keeps at most N experts in memory (nntr_config ``moe_expert_cache`` N > 0, or
a layer type whose default is > 0; the layer reads the routed ones into an
:class:`causallm.io.lazy_weights.ExpertCache`), the model never reads or memory-maps the expert
weights; it records where each lies and hands that to its layer (``setExpertSources``):

- ``load_weight`` of an NNTrainer .bin locates every weight (``bin_slices``), reads all but the
  experts (``scope:expert_*``) and keeps the experts' FileSlices;
- ``load_hf_weight`` loads the checkpoint through :class:`ExpertPlaceholders` (expert tensors,
  the ``.mlp.experts.`` names, read as zeros) with every expert part mapped by
  :class:`OnFileWeight`, then locates each part in its .safetensors file (``expertSource``);
- ``save_weight`` writes the .bin, copying such experts from their file one at a time.

Logits are identical either way. The graph's own expert weights are zero placeholders then
(``model.getWeight``): code that reads weights directly must build the model with
``moe_expert_cache`` 0.
"""

from __future__ import annotations

import math
import os

import numpy as np

from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.io.files import map_file
from causallm.io.lazy_weights import bin_slices, safetensors_slice
from causallm.io.nntr_bin import bin_nbytes, read_weight, write_bin
from causallm.io.weight_table import HFWeight
from causallm.io.weights import is_checkpoint

HF_EXPERTS = ".mlp.experts."  # checkpoint names of the expert tensors


class ExpertPlaceholders:
    """A checkpoint whose expert tensors (``.mlp.experts.`` names) read as zeros: C-contiguous
    views of one zero buffer as large as the largest of them, so neither the placeholders nor
    the file's map take memory per expert."""

    def __init__(self, ckpt) -> None:
        self.ckpt = ckpt
        self._zeros = np.zeros(0, dtype=np.float32)

    def keys(self) -> list[str]:
        return self.ckpt.keys()

    def __contains__(self, name: str) -> bool:
        return name in self.ckpt

    def get(self, name: str, zeros: bool = False) -> np.ndarray:
        if HF_EXPERTS not in name:
            return self.ckpt.get(name, zeros)
        shape = self.ckpt.shape(name)
        n = math.prod(shape)
        if self._zeros.size < n:
            self._zeros = np.zeros(n, dtype=np.float32)
        return self._zeros[:n].reshape(shape)

    def raw(self, name: str, zeros: bool = False):
        """The checkpoint's ``raw`` (a BF16 matrix kept as stored, as the resident model keeps
        it); an expert tensor as ``get``."""
        return self.get(name, zeros) if HF_EXPERTS in name else self.ckpt.raw(name, zeros)

    def file_of(self, name: str) -> str:
        return self.ckpt.file_of(name)


class OnFileWeight(HFWeight):
    """An expert part left in the file. ``array`` is its tensor's placeholder (a C-contiguous
    view of zeros); the weight is the first ``prod(shape)`` of those zeros in the part's shape,
    so it is kept as it is (never copied), whatever strides the part has in the tensor."""

    def to_weight(self, array):
        shape = super().to_weight(array).shape
        return array.reshape(-1)[:math.prod(shape)].reshape(shape)


class ExpertsOnFileMixin:
    """Expert weights left on file (see the module docstring), for a model class listed after
    it in the bases. The model sets ``EXPERT_LAYER``, its MoE layer class (``num_experts``,
    ``cache_capacity`` and ``setExpertSources`` once finalized), and ``EXPERT_WEIGHTS``, an
    expert's weight names ``expert_{w}_{e}`` in the layer's request order."""

    EXPERT_LAYER: type
    EXPERT_WEIGHTS: tuple[str, ...]

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.MOE_EXPERT_CACHE = (nntr_cfg.get_int("moe_expert_cache", minimum=0)
                                 if nntr_cfg.contains("moe_expert_cache") else None)
        self.expert_slices: dict = {}  # expert weights left on file, by full weight name
        self._experts_on_file = False  # while load_hf_weight runs with the cache on
        self._hf_checkpoint = None  # the checkpoint load_hf_weight opened

    def moeLayers(self) -> list:
        """(name, layer) of every MoE layer, in graph order."""
        found = []

        def collect(layer, context, _):
            if isinstance(layer, self.EXPERT_LAYER):
                found.append((context.getName(), layer))
        self.model.forEachLayer(collect)
        return found

    def expertCacheOn(self) -> bool:
        return any(layer.cache_capacity > 0 for _, layer in self.moeLayers())

    def getHFWeightMap(self) -> dict[str, HFWeight]:
        """The model's map; while a checkpoint loads with the experts on file, each expert part
        is an :class:`OnFileWeight`."""
        m = super().getHFWeightMap()
        if self._experts_on_file:
            for name, entry in m.items():
                if HF_EXPERTS in name:
                    m[name] = tuple(OnFileWeight(*part) for part in entry)
        return m

    def load_weight(self, weight_path: str | None = None) -> None:
        """As Transformer.load_weight; with the expert cache on, a .bin's experts stay on file."""
        if not self.is_initialized:
            raise CausalLMError("load_weight: call initialize() first")
        if weight_path is None:
            weight_path = self.loader.defaultPath()
        if is_checkpoint(weight_path) or not self.expertCacheOn():
            super().load_weight(weight_path)
            return
        specs = self.model.getWeightSpecs()
        slices = {}
        try:
            mm = map_file(weight_path)
            for spec, part in zip(specs, bin_slices(weight_path, [(s.full_name, s.shape, s.dtype)
                                                                  for s in specs])):
                if ":expert_" in spec.full_name:
                    slices[spec.full_name] = part
                else:
                    nb = bin_nbytes(spec.shape, spec.dtype)
                    self.loader.store(spec.full_name, read_weight(
                        spec.full_name, spec.shape, spec.dtype, spec.packable,
                        mm[part.offset:part.offset + nb].view(np.ndarray), part.offset,
                        weight_path))
        except BaseException:  # as Transformer.load_weight: no half-loaded model
            self.model.forgetWeights()
            raise
        self.weight_path = os.path.abspath(weight_path)
        self.attachExpertSources(slices)
        self.model.warmup()

    def load_hf_weight(self, path: str) -> None:
        """With the expert cache on, the expert tensors are located in their files instead of
        read (their graph weights stay zero placeholders)."""
        self._experts_on_file = self.expertCacheOn()
        try:
            super().load_hf_weight(path)
            on_file, ckpt = self._experts_on_file, self._hf_checkpoint
        finally:
            self._experts_on_file, self._hf_checkpoint = False, None
        if on_file:
            self.attachExpertSources({
                part.target: self.expertSource(ckpt, name, part)
                for name, entry in self.getHFWeightMap().items() if HF_EXPERTS in name
                for part in entry})

    def openHFCheckpoint(self, folder: str):
        """The checkpoint (kept to locate the experts after the load), with placeholder experts
        while they stay on file."""
        ckpt = self._hf_checkpoint = super().openHFCheckpoint(folder)
        return ExpertPlaceholders(ckpt) if self._experts_on_file else ckpt

    def expertSource(self, ckpt, name: str, part: HFWeight):
        """Where expert part ``part`` of checkpoint tensor ``name`` lies: a FileSlice of its
        bytes (the part must be contiguous there: see ``safetensors_slice``), read transposed
        as the part is."""
        return safetensors_slice(ckpt.file_of(name), name, part.resolve(ckpt.shape(name)),
                                 part.transpose)

    def attachExpertSources(self, slices: dict) -> None:
        """Give every MoE layer its experts' on-file weights (``scope:expert_{w}_{e}``)."""
        self.expert_slices = slices
        for name, layer in self.moeLayers():
            layer.setExpertSources([tuple(slices[f"{name}:expert_{w}_{e}"]
                                          for w in self.EXPERT_WEIGHTS)
                                    for e in range(layer.num_experts)])

    def save_weight(self, weight_path: str, dtype: str | None = None,
                    layer_dtype_map: dict | None = None) -> None:
        """Transformer.save_weight; experts left on file are copied from it one at a time."""
        if not self.is_initialized or not self.expert_slices:
            super().save_weight(weight_path, dtype, layer_dtype_map)
            return
        layer_dtype_map = layer_dtype_map or {}
        specs = self.model.getWeightSpecs()
        arrays = [self.expert_slices[s.full_name] if s.full_name in self.expert_slices
                  else self.model.getWeight(s.full_name) for s in specs]
        dtypes = [layer_dtype_map.get(s.full_name.split(":", 1)[0]) or dtype or s.dtype
                  for s in specs]
        write_bin(weight_path, arrays, dtypes, [s.full_name for s in specs])
