"""``qwen_moe``: Applications/CausalLM/models/qwen3_moe MoELayer, Qwen3-MoE's sparse feed-forward;
also ``moe_slim`` (qwen3_slim_moe SlimMoELayer) and ``moe_cached_slim`` (qwen3_cached_slim_moe
CachedSlimMoELayer), the same math with experts read from the weight file on demand.

For each token row x (H,) of rows [0, step), as transformers' ``Qwen3MoeSparseMoeBlock``::

    p   = softmax(x @ gate)                                  (E,) router, float32
    top = the num_experts_per_token (k) largest p, descending
    w_e = p_e / sum_{e' in top} p_e'   if norm_topk_prob   else   p_e
    y   = sum_{e in top} w_e * ((silu(x @ expert_gate_e) * (x @ expert_up_e)) @ expert_down_e)

silu(g) = g * sigmoid(g) (``moe_activation=swish``). Experts are added in increasing index, as
transformers does. Input ``(B, 1, S, H)``; output the same dims.

Weights, in request order (= .bin order, docs/nntrainer.md, "Qwen MoE layers"): ``gate`` (H, E) FP32
[in, out]; then for each expert i: ``expert_up_i`` (H, I), ``expert_gate_i`` (H, I),
``expert_down_i`` (I, H), in the weight dtype. Properties: ``num_experts`` (E),
``num_experts_per_token`` (k), ``unit`` (I), ``moe_activation`` (swish), all required;
``norm_topk_prob`` (default true: nntrainer always renormalises, docs/nntrainer.md, "Qwen MoE always
renormalises"; transformers' Qwen3-MoE reads it from config.json); ``moe_expert_cache`` (experts
kept in memory: 0 = all resident, the ``qwen_moe`` default; ``moe_slim`` defaults to k,
``moe_cached_slim`` to 32 as nntrainer's LRU, both capped at E).

Expert cache (``moe_expert_cache`` > 0): the model hands the layer, through
``setExpertSources``, where each expert's three weights lie in the weight file; a step reads
the experts it routes to into an :class:`causallm.io.lazy_weights.ExpertCache` (LRU) and never
touches the memory map of the others, so resident memory holds the router, the attention and
at most ``moe_expert_cache`` experts per layer. Results are identical to the resident layer.
Without sources (a graph loaded by ``Model.load`` alone) the experts come from the loaded
weights.

Work: the router is a ``linear`` into ``router_logits`` (B, S, E); ``moe_topk`` routes,
``moe_group`` lists each expert's tokens, ``expert_ffn`` adds each hit expert's scaled output
(numba for a few tokens, BLAS for many). nntrainer's cached layer prefetches experts with a
wrong stride (docs/nntrainer.md, "Expert prefetch stride"); no prefetch is ported.
"""

import numpy as np

from causallm.io.lazy_weights import ExpertCache
from causallm.kernels import linear
from causallm.kernels.moe import expert_ffn, moe_group, moe_topk
from causallm.runtime.layer import Layer
from causallm.runtime.properties import bool_, str_, uint

NO_BIAS = np.zeros(0, dtype=np.float32)
WEIGHTS_PER_EXPERT = 3  # up, gate, down
CACHED_SLIM_CAPACITY = 32  # nntrainer CachedSlimMoELayer's LRU size


class MoELayer(Layer):
    type = "qwen_moe"
    layer_impl = True
    properties = {
        "num_experts": uint(required=True),
        "num_experts_per_token": uint(required=True),
        "unit": uint(required=True),
        "moe_activation": str_(required=True, choices=("swish", "silu")),
        "norm_topk_prob": bool_(True),
        "moe_expert_cache": uint(None),
    }

    def defaultExpertCache(self, num_experts: int, topk: int) -> int:
        """``moe_expert_cache`` when the property is not given (0: every expert resident)."""
        return 0

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        x = dims[0]
        E, k, I = (self.props[p] for p in ("num_experts", "num_experts_per_token", "unit"))
        if E < 1 or not 1 <= k <= E or I < 1:
            raise context.error(f"needs num_experts >= 1, 1 <= num_experts_per_token <= "
                                f"num_experts and unit >= 1; got {E}, {k}, {I}")
        H, B, S = x.width, x.batch, x.channel * x.height
        self.num_experts, self.topk, self.norm_topk_prob = E, k, self.props["norm_topk_prob"]
        cache = self.props["moe_expert_cache"]
        self.cache_capacity = min(E, self.defaultExpertCache(E, k) if cache is None else cache)

        context.requestWeight("gate", (H, E), "FP32")
        for i in range(E):
            context.requestWeight(f"expert_up_{i}", (H, I))
            context.requestWeight(f"expert_gate_{i}", (H, I))
            context.requestWeight(f"expert_down_{i}", (I, H))
        context.requestTensor("router_logits", (B, S, E))
        context.requestTensor("expert_gate_out", (B * S, I))
        context.requestTensor("expert_up_out", (B * S, I))
        context.setOutputDimensions([x])

        self.topk_idx = np.zeros((B, S, k), dtype=np.int64)
        self.topk_weight = np.zeros((B, S, k), dtype=np.float32)
        self.starts = np.zeros(E + 1, dtype=np.int64)
        self.rows = np.zeros(B * S * k, dtype=np.int64)
        self.scales = np.zeros(B * S * k, dtype=np.float32)
        self.hit = np.zeros(E, dtype=np.int64)
        self.expert_cache = None

    def setExpertSources(self, sources: list) -> None:
        """``sources[e]`` = expert e's (up, gate, down) as FileSlices of their logical shapes.
        With ``moe_expert_cache`` > 0 the experts are read from them from now on."""
        if len(sources) != self.num_experts or any(len(s) != WEIGHTS_PER_EXPERT for s in sources):
            raise ValueError(f"setExpertSources: need {self.num_experts} (up, gate, down) tuples")
        if self.cache_capacity > 0:
            self.expert_cache = ExpertCache(sources, self.cache_capacity)

    def expertWeights(self, weights: list, e: int) -> tuple:
        """Expert e's (up, gate, down): from the cache when it is on, else the loaded weights."""
        if self.expert_cache is not None:
            return self.expert_cache.get(e)
        i = 1 + WEIGHTS_PER_EXPERT * e
        return weights[i], weights[i + 1], weights[i + 2]

    def incremental_forwarding(self, context, from_, to):
        x, y = context.inputs[0], context.outputs[0]
        step = min(to - from_, y.shape[1])
        logits, h, u = context.tensors
        linear(x, context.weights[0], NO_BIAS, logits, 0, 0, step)
        moe_topk(logits, step, self.norm_topk_prob, self.topk_idx, self.topk_weight)
        n_hit = moe_group(self.topk_idx, self.topk_weight, step, self.starts, self.rows,
                          self.scales, self.hit)
        y[:, :step] = 0
        for e in self.hit[:n_hit]:
            s0, s1 = self.starts[e], self.starts[e + 1]
            up, gate, down = self.expertWeights(context.weights, e)
            expert_ffn(x, self.rows[s0:s1], self.scales[s0:s1], step, gate, up, down, h, u, y)


class SlimMoELayer(MoELayer):
    """``moe_slim``: by default only the k experts of the latest token stay in memory."""

    type = "moe_slim"

    def defaultExpertCache(self, num_experts: int, topk: int) -> int:
        return topk


class CachedSlimMoELayer(MoELayer):
    """``moe_cached_slim``: by default the 32 most recently used experts stay in memory."""

    type = "moe_cached_slim"

    def defaultExpertCache(self, num_experts: int, topk: int) -> int:
        return CACHED_SLIM_CAPACITY
