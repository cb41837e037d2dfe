"""Qwen3 Slim MoE (Applications/CausalLM/models/qwen3_slim_moe/qwen3_slim_moe_causallm.cpp).

``Qwen3SlimMoeForCausalLM``: :class:`Qwen3MoECausalLM` whose MoE layers are ``moe_slim``: the
experts stay in the weight file and are read when routed to. nntr_config ``moe_expert_cache``
defaults to num_experts_per_tok (the experts of the latest token stay in memory); the math,
the graph and the .bin layout are Qwen3-MoE's (see models/qwen3_moe and layers/qwen_moe.py).
"""

from causallm.layers.qwen_moe import SlimMoELayer
from causallm.models.qwen3_moe.qwen3_moe_causallm import Qwen3MoECausalLM


class Qwen3SlimMoECausalLM(Qwen3MoECausalLM):
    MOE_LAYER = SlimMoELayer
