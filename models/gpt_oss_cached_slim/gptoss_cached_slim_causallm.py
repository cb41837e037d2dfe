"""GPT-OSS cached slim (CausalLM/models/gpt_oss_cached_slim/gptoss_cached_slim_causallm.cpp).

GptOssCachedSlimCausalLM computes what :class:`GptOssForCausalLM` computes (module docstring of
models/gpt_oss/gptoss_causallm.py) and reads the same Hugging Face checkpoint. It differs, as
its C++ twin, in three places:

- each attention block inserts ``layer{i}_wv``, ``_wk``, ``_wq`` in that order (G1), so its
  .bin holds v, k, q (weight, bias each) where GptOssForCausalLM's holds q, k, v;
- the feed-forward layer is ``gpt_oss_moe_slim_cached`` (layers/gpt_oss_moe.py), with the HF
  math: clamped GLU and router bias (the C++ layer drops the bias, G15);
- the experts stay in the weight file: ``load_weight`` records where each expert weight lies
  (.bin or .safetensors) instead of reading it, and each layer reads the experts it routes to
  into an LRU of nntr_config ``moe_expert_cache`` experts (default 16 as nntrainer; 0 keeps
  every expert resident). In a Hugging Face checkpoint an expert's gate and up are interleaved
  columns of one ``gate_up_proj[e]`` block: that block is read and split (:class:`ColumnSlice`).
  Logits are identical either way.
"""

from __future__ import annotations

import os

import numpy as np

from causallm.api import registerFactory, withKey
from causallm.config import JsonConfig
from causallm.errors import CausalLMError
from causallm.lazy_weights import bin_slices, safetensors_slice
from causallm.weights import write_bin
from layers.gpt_oss_moe import CachedSlimGptOssMoELayer
from models.gpt_oss.gptoss_causallm import GptOssForCausalLM
from models.transformer import HFWeight, hfParts

EXPERT_WEIGHTS = ("up", "up_bias", "gate", "gate_bias", "down", "down_bias")  # request order
HF_EXPERTS = ".mlp.experts."  # checkpoint names of the expert tensors


class ColumnSlice:
    """``source.read()[..., columns]`` as a C-contiguous float32 array, read on demand
    (``columns`` = ``slice(0, None, 2)`` is an expert's gate in gpt-oss's gate_up_proj)."""

    __slots__ = ("source", "columns")

    def __init__(self, source, columns: slice) -> None:
        self.source, self.columns = source, columns

    def read(self) -> np.ndarray:
        return np.ascontiguousarray(self.source.read()[..., self.columns])

    def __array__(self, dtype=None, copy=None):
        a = self.read()
        return a if dtype is None else a.astype(dtype, copy=False)


class OnFileWeight(HFWeight):
    """An expert part left in the file: it loads as fresh zeros of its shape, which stay
    untouched (neither read from the file nor made resident by a strided copy)."""

    def to_weight(self, array):
        return np.zeros(super().to_weight(array).shape, dtype=np.float32)


class ExpertsOnFile:
    """A checkpoint whose expert tensors read as never-touched zero placeholders."""

    def __init__(self, ckpt) -> None:
        self.ckpt = ckpt

    def keys(self) -> list[str]:
        return self.ckpt.keys()

    def __contains__(self, name: str) -> bool:
        return name in self.ckpt

    def get(self, name: str) -> np.ndarray:
        if HF_EXPERTS in name:
            return np.zeros(self.ckpt.shape(name), dtype=np.float32)
        return self.ckpt.get(name)

    def file_of(self, name: str) -> str:
        return self.ckpt.file_of(name)


class GptOssCachedSlimCausalLM(GptOssForCausalLM):
    """``GptOssCachedSlimCausalLM``: GPT-OSS with v, k, q insertion order and experts read on
    demand into a per-layer LRU."""

    architectures = "GptOssCachedSlimCausalLM"
    MOE_LAYER_TYPE = CachedSlimGptOssMoELayer.type

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.MOE_EXPERT_CACHE = (nntr_cfg.get_int("moe_expert_cache", minimum=0)
                                 if nntr_cfg.contains("moe_expert_cache") else None)
        self.expert_slices: dict = {}  # expert weights left on file, by full weight name
        self._experts_on_file = False
        self._checkpoint = None

    def createAttention(self, layer_id: int, seq_len: int, n_heads: int, head_dim: int,
                        query_name: str, key_name: str, value_name: str) -> list:
        layers = super().createAttention(layer_id, seq_len, n_heads, head_dim, query_name,
                                         key_name, value_name)
        layers[0:3] = layers[2::-1]  # V layer, K layer, Q layer (the C++ insertion order)
        return layers

    def createMlp(self, layer_id: int, dim: int, hidden_dim: int, input_name: str) -> list:
        layers = super().createMlp(layer_id, dim, hidden_dim, input_name)
        if self.MOE_EXPERT_CACHE is not None:
            layers[0].setProperty([withKey("moe_expert_cache", self.MOE_EXPERT_CACHE)])
        return layers

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(CachedSlimGptOssMoELayer)

    # -- experts on file --------------------------------------------------------------------
    def moeLayers(self) -> list:
        """(name, layer) of every MoE layer, in graph order."""
        found = []

        def collect(layer, context, _):
            if isinstance(layer, CachedSlimGptOssMoELayer):
                found.append((context.getName(), layer))
        self.model.forEachLayer(collect)
        return found

    def expertCacheOn(self) -> bool:
        return any(layer.cache_capacity > 0 for _, layer in self.moeLayers())

    def getHFWeightMap(self) -> dict[str, HFWeight]:
        m = super().getHFWeightMap()
        if self._experts_on_file:
            for name, entry in m.items():
                if HF_EXPERTS in name:
                    m[name] = [OnFileWeight(*part) for part in hfParts(entry)]
        return m

    def load_weight(self, weight_path: str) -> None:
        """As Transformer.load_weight; with the expert cache on, a .bin's experts stay on file."""
        if not self.is_initialized:
            raise CausalLMError("load_weight: call initialize() first")
        if (os.path.isdir(weight_path) or weight_path.endswith(".safetensors")
                or not self.expertCacheOn()):
            super().load_weight(weight_path)
            return
        specs = self.model.getWeightSpecs()
        slices = {}
        for spec, part in zip(specs, bin_slices(weight_path, [(s.full_name, s.shape, s.dtype)
                                                              for s in specs])):
            if ":expert_" in spec.full_name:
                slices[spec.full_name] = part
            else:
                self.model.setWeight(spec.full_name, part.read())
        self.attachExpertSources(slices)
        self.model.warmup()

    def load_hf_weight(self, path: str) -> None:
        """With the expert cache on, the expert tensors are located in their files, not read."""
        self._experts_on_file = self.expertCacheOn()
        try:
            super().load_hf_weight(path)
            on_file, ckpt = self._experts_on_file, self._checkpoint
        finally:
            self._experts_on_file, self._checkpoint = False, None
        if not on_file:
            return
        slices = {}
        for name, entry in self.getHFWeightMap().items():
            if HF_EXPERTS not in name:
                continue
            for part in hfParts(entry):  # index (e,), (e, columns) or (e, :, columns)
                block = safetensors_slice(ckpt.file_of(name), name, part.index[:1])
                slices[part.target] = (block if len(part.index) == 1
                                       else ColumnSlice(block, part.index[-1]))
        self.attachExpertSources(slices)

    def openHFCheckpoint(self, folder: str):
        ckpt = super().openHFCheckpoint(folder)
        self._checkpoint = ckpt
        return ExpertsOnFile(ckpt) if self._experts_on_file else ckpt

    def attachExpertSources(self, slices: dict) -> None:
        """Give every MoE layer its experts' on-file weights (``scope:expert_{w}_{e}``)."""
        self.expert_slices = slices
        for name, layer in self.moeLayers():
            layer.setExpertSources([tuple(slices[f"{name}:expert_{w}_{e}"] for w in EXPERT_WEIGHTS)
                                    for e in range(layer.num_experts)])

    def save_weight(self, weight_path: str, dtype: str | None = None,
                    layer_dtype_map: dict | None = None) -> None:
        """Transformer.save_weight; experts left on file are copied from it one at a time."""
        if not self.expert_slices:
            super().save_weight(weight_path, dtype, layer_dtype_map)
            return
        layer_dtype_map = layer_dtype_map or {}
        specs = self.model.getWeightSpecs()
        arrays = [self.expert_slices.get(s.full_name, None) for s in specs]
        arrays = [a if a is not None else self.model.getWeight(s.full_name)
                  for a, s in zip(arrays, specs)]
        dtypes = [layer_dtype_map.get(s.full_name.split(":", 1)[0]) or dtype or s.dtype
                  for s in specs]
        write_bin(weight_path, arrays, dtypes)
