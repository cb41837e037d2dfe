"""GPT-OSS cached slim (CausalLM/models/gpt_oss_cached_slim/gptoss_cached_slim_causallm.cpp).

GptOssCachedSlimCausalLM computes what :class:`GptOssForCausalLM` computes (module docstring of
models/gpt_oss/gptoss_causallm.py) and reads the same Hugging Face checkpoint. It differs, as
its C++ twin, in three places:

- each attention block inserts ``layer{i}_wv``, ``_wk``, ``_wq`` in that order (docs/nntrainer.md,
  "Weight order from an old topological sort"), so its .bin holds v, k, q (weight, bias each)
  where GptOssForCausalLM's holds q, k, v;
- the feed-forward layer is ``gpt_oss_moe_slim_cached`` (layers/gpt_oss_moe.py), with the HF
  math: clamped GLU and router bias (the C++ layer drops the bias: docs/nntrainer.md, "GPT-OSS
  expert clamp and router bias");
- the experts stay in the weight file by default: ``load_weight`` records where each expert
  weight lies (.bin or .safetensors) instead of reading it, and each layer reads the experts it
  routes to into an LRU of nntr_config ``moe_expert_cache`` experts (default 16 as nntrainer;
  0 keeps every expert resident). GptOssForCausalLM does the same when ``moe_expert_cache`` is
  set (models/experts_on_file.py; an expert's gate and up, interleaved columns of one
  ``gate_up_proj[e]`` block, are split by its ``expertSource``). Logits are identical either way.
"""

from __future__ import annotations

from causallm.api import registerFactory
from causallm.layers.gpt_oss_moe import CachedSlimGptOssMoELayer
from causallm.models.gpt_oss.gptoss_causallm import GptOssForCausalLM
from causallm.models.transformer import SELF_ATTENTION


class GptOssCachedSlimCausalLM(GptOssForCausalLM):
    """``GptOssCachedSlimCausalLM``: GPT-OSS with v, k, q insertion order and experts read on
    demand into a per-layer LRU (models/experts_on_file.py)."""

    MOE_LAYER_TYPE = CachedSlimGptOssMoELayer.type

    def createAttention(self, layer_id: int, seq_len: int, n_heads: int, head_dim: int,
                        query_name: str, key_name: str, value_name: str, prefix: str = "",
                        kind: str = SELF_ATTENTION) -> list:
        layers = super().createAttention(layer_id, seq_len, n_heads, head_dim, query_name,
                                         key_name, value_name, prefix, kind)
        layers[0:3] = layers[2::-1]  # V layer, K layer, Q layer (the C++ insertion order)
        return layers

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(CachedSlimGptOssMoELayer)
