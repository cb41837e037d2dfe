"""Qwen3 Cached Slim MoE
(Applications/CausalLM/models/qwen3_cached_slim_moe/qwen3_cached_slim_moe_causallm.cpp).

``Qwen3CachedSlimMoeForCausalLM``: :class:`Qwen3MoECausalLM` whose MoE layers are
``moe_cached_slim``: the experts stay in the weight file and the most recently routed ones are
kept in an LRU, 32 per layer by default as in nntrainer (nntr_config ``moe_expert_cache``
overrides it). The math, the graph and the .bin layout are Qwen3-MoE's.
"""

from causallm.layers.qwen_moe import CachedSlimMoELayer
from causallm.models.qwen3_moe.qwen3_moe_causallm import Qwen3MoECausalLM


class Qwen3CachedSlimMoECausalLM(Qwen3MoECausalLM):
    MOE_LAYER = CachedSlimMoELayer
