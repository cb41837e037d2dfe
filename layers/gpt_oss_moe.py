"""``gpt_oss_moe``: GptOssMoELayer of Applications/CausalLM/models/gpt_oss, the MoE feed-forward.

For each token row x (H,) of rows [0, step), as transformers' ``GptOssMLP`` (router + experts)::

    logits = x @ gate + gate_bias                                   (E,)
    top    = the num_experts_per_token largest logits
    w_e    = softmax over the top logits                            (= softmax, top-k, renormalise)
    g      = min(x @ expert_gate_e + expert_gate_bias_e, limit)     (I,)
    u      = clip(x @ expert_up_e + expert_up_bias_e, -limit, limit)
    a      = (u + 1) * g * sigmoid(alpha * g)
    y      = sum_{e in top} w_e * (a @ expert_down_e + expert_down_bias_e)

with alpha = ``swiglu_alpha`` (1.702) and limit = ``swiglu_limit`` (7.0). Experts are added in
increasing index, as transformers does. Input ``(B, 1, S, H)``; output the same dims.

Weights, in request order (= .bin order, docs/nntrainer.md, "GPT-OSS MoE layers"): ``gate`` (H, E)
FP32 [in, out]; ``gate_bias`` (E,); then for each expert i: ``expert_up_i`` (H, I),
``expert_up_bias_i`` (I,), ``expert_gate_i`` (H, I), ``expert_gate_bias_i`` (I,), ``expert_down_i``
(I, H), ``expert_down_bias_i`` (H,). Projections are in the weight dtype, biases in the activation
dtype.
Transformers stores the experts fused (``gate_up_proj`` (E, H, 2I) with gate in the even
columns and up in the odd ones, ``down_proj`` (E, I, H)); models/gpt_oss maps them here.

Properties: ``num_experts`` (E), ``num_experts_per_token`` (k), ``unit`` (I), all required;
``swiglu_alpha`` (1.702) and ``swiglu_limit`` (7.0), which nntrainer hard-codes;
``moe_expert_cache`` (0; capped at E), experts kept in memory: with N > 0, once the model hands
over where each expert's six weights lie in the weight file (``setExpertSources``), a step reads
the experts it routes to into a :class:`causallm.io.lazy_weights.ExpertCache` of N experts (least
recently used out) and never touches the others; 0 (or no sources) uses the loaded weights.

Fixed against nntrainer (docs/nntrainer.md, "GPT-OSS expert clamp and router bias"): the clamps
are applied (nntrainer's ``gpt_oss_moe`` skips them) and the router bias is added (its cached
variant drops it).

Work: the router is a ``linear`` into ``router_logits`` (B, S, E); ``moe_route`` groups the
tokens by expert; each routed expert gathers its rows (``CHUNK_ROWS`` at a time) and runs
``linear`` (numba matvec for a few rows, BLAS for many) for gate, up and down, ``clamped_glu``
between them and ``scatter_add_rows`` to add its weighted output to its tokens.
"""

import numpy as np

from causallm.io.lazy_weights import ExpertCache
from causallm.kernels import linear
from causallm.kernels.gpt_oss_moe import clamped_glu, moe_route, scatter_add_rows
from causallm.runtime.layer import Layer
from causallm.runtime.properties import float_, uint

CHUNK_ROWS = 64
"""Rows of an expert gathered at once (bounds the scratch to 64 rows of H or I values)."""

WEIGHTS_PER_EXPERT = 6  # up, up_bias, gate, gate_bias, down, down_bias
CACHED_SLIM_CAPACITY = 16  # nntrainer CachedSlimGptOssMoELayer's LRU size


class GptOssMoELayer(Layer):
    type = "gpt_oss_moe"
    layer_impl = True
    properties = {
        "num_experts": uint(required=True),
        "num_experts_per_token": uint(required=True),
        "unit": uint(required=True),
        "swiglu_alpha": float_(1.702),
        "swiglu_limit": float_(7.0),
        "moe_expert_cache": uint(0),
    }

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"MoE layer only supports a single input, got {len(dims)}")
        x = dims[0]
        p = self.props
        E, k, I, H = p["num_experts"], p["num_experts_per_token"], p["unit"], x.width
        if E < 1 or I < 1:
            raise context.error("num_experts and unit must be at least 1")
        if not 1 <= k <= E:
            raise context.error(f"num_experts_per_token must be in [1, num_experts={E}], got {k}")
        if p["swiglu_limit"] <= 0:
            raise context.error(f"swiglu_limit must be positive, got {p['swiglu_limit']}")
        self.hidden, self.alpha, self.limit = H, p["swiglu_alpha"], p["swiglu_limit"]
        self.num_experts = E
        self.cache_capacity = min(p["moe_expert_cache"], E)
        self.expert_cache = None

        act = context.activation_dtype
        context.requestWeight("gate", (H, E), "FP32")
        context.requestWeight("gate_bias", (E,), act)
        for i in range(E):
            context.requestWeight(f"expert_up_{i}", (H, I))
            context.requestWeight(f"expert_up_bias_{i}", (I,), act)
            context.requestWeight(f"expert_gate_{i}", (H, I))
            context.requestWeight(f"expert_gate_bias_{i}", (I,), act)
            context.requestWeight(f"expert_down_{i}", (I, H))
            context.requestWeight(f"expert_down_bias_{i}", (H,), act)

        B, S = x.batch, x.channel * x.height
        chunk = min(B * S, CHUNK_ROWS)
        context.requestTensor("router_logits", (B, S, E))
        context.requestTensor("expert_input", (1, chunk, H))
        context.requestTensor("expert_gate", (1, chunk, I))
        context.requestTensor("expert_up", (1, chunk, I))
        context.requestTensor("expert_output", (1, chunk, H))
        # routing bookkeeping (integers, so not graph tensors): see kernels/gpt_oss_moe.py
        self.top = np.zeros(k, dtype=np.int32)
        self.counts = np.zeros(E, dtype=np.int32)
        self.rows = np.zeros((E, B * S), dtype=np.int32)
        self.coefs = np.zeros((E, B * S), dtype=np.float32)
        context.setOutputDimensions([x])

    def setExpertSources(self, sources: list) -> None:
        """``sources[e]``: expert e's (up, up_bias, gate, gate_bias, down, down_bias), each with
        a ``read()`` giving the float32 weight (e.g. a FileSlice). With ``moe_expert_cache`` > 0
        the experts are read from them from now on."""
        if len(sources) != self.num_experts or any(len(s) != WEIGHTS_PER_EXPERT for s in sources):
            raise ValueError(f"setExpertSources: need {self.num_experts} tuples of "
                             f"{WEIGHTS_PER_EXPERT} weights")
        if self.cache_capacity > 0:
            self.expert_cache = ExpertCache(sources, self.cache_capacity)

    def expert_weights(self, context, e):
        """(up, up_bias, gate, gate_bias, down, down_bias) of expert e: from the expert cache
        when it is on, else the loaded weights."""
        if self.expert_cache is not None:
            return self.expert_cache.get(e)
        start = 2 + WEIGHTS_PER_EXPERT * e
        return context.weights[start:start + WEIGHTS_PER_EXPERT]

    def incremental_forwarding(self, context, from_, to):
        x, out = context.inputs[0], context.outputs[0]
        step = min(to - from_, out.shape[1])
        logits, xs, g, u, ys = context.tensors
        linear(x, context.weights[0], context.weights[1], logits, 0, 0, step)
        moe_route(logits, step, self.top, self.counts, self.rows, self.coefs)
        out[:, :step] = 0
        flat = x.reshape(-1, self.hidden)
        chunk = xs.shape[1]
        for e in np.flatnonzero(self.counts):  # increasing expert index, as transformers
            n = int(self.counts[e])
            wu, bu, wg, bg, wd, bd = self.expert_weights(context, e)
            for c in range(0, n, chunk):
                m = min(chunk, n - c)
                rows = self.rows[e, c:c + m]
                np.take(flat, rows, axis=0, out=xs[0, :m])
                linear(xs, wg, bg, g, 0, 0, m)
                linear(xs, wu, bu, u, 0, 0, m)
                clamped_glu(g[0], u[0], m, self.alpha, self.limit)
                linear(g, wd, bd, ys, 0, 0, m)
                scatter_add_rows(out, rows, self.coefs[e, c:c + m], ys[0], m)


class CachedSlimGptOssMoELayer(GptOssMoELayer):
    """``gpt_oss_moe_slim_cached`` (models/gpt_oss_cached_slim CachedSlimGptOssMoELayer): the
    properties, weights (same order and shapes) and math of ``gpt_oss_moe`` - the router bias
    included, which nntrainer's cached layer drops (docs/nntrainer.md, "GPT-OSS expert clamp
    and router bias") - with the expert cache on by default:
    ``moe_expert_cache`` 16, nntrainer's LRU size."""

    type = "gpt_oss_moe_slim_cached"
    properties = {**GptOssMoELayer.properties, "moe_expert_cache": uint(CACHED_SLIM_CAPACITY)}
