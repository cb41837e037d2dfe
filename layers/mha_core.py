"""``mha_core``: Applications/CausalLM/layers/mha_core (MHACoreLayer), attention with RoPE and a KV cache.

Inputs ``[Q, K, V]``, then in this order when present: a position bias, the cross keys and
values (``merge_cross_attention``), the step's token types (``block_bidirectional``). Q
``(B, 1, H, nQ*d)``, K and V ``(B, 1, H', nKV*d)``; output ``(B, 1, H, nQ*d)``, head h at
columns [h*d, (h+1)*d). For the step's row i of batch b, the token at position p of the sequence
in a cache slot (``context.step``: p = from_ + i and slot b, unless the step carries the rows of
several sequences, each at its own position):

    k_p = RoPE(K_i, p)  and  v_p = V_i  are written to row p of its slot's cache
    q   = RoPE(Q_i, p)
    s_t = (q . k_t) * a^-1/2 [+ bias[h, t - p]]   t over the allowed keys of the kv head
                                              g = h // (nQ/nKV); a = query_pre_attn_scalar, or
                                              d when unset (T5 passes 1: no scaling)
    s_t = tanh(s_t / c) * c                   if attn_logit_softcapping c > 0
    out_i = sum_t softmax(s)_t v_t            a sink logit (use_sink) joins the softmax, no value

Allowed keys (W = sliding_window, W' = sliding_window_right, W when 0): causal ->
``max(0, p - W + 1) <= t <= p`` (HF's ``kv > q - W``); not causal -> ``p - W < t < p + W'``
with ``t < to``: HF's bidirectional sliding window ``|q - kv| < W`` (Gemma 3
``use_bidirectional_attention``; its config turns ``sliding_window`` S into S // 2 + 1 before
the mask, and the model passes that), or T5Gemma2's encoder window S with W = (S + 1) // 2
and W' = S // 2 + 1. RoPE is rotate-half over the halves [0, d/2) and [d/2, d):
a' = a cos - b sin, b' = b cos + a sin, with ``cos[p, j] = cos(p * inv_freq[j]) *
attention_scaling``. ``inv_freq`` and the scaling follow Hugging Face's rope types: default,
linear, llama3 and yarn.

Position bias (``(B, 1, nQ, 2C + 1)``, e.g. ``relative_position_bias``): the score of key t for
the query at p gets ``bias[b, 0, h, C + t - p]``; C >= max_timestep - 1.

Cross-attention (``is_cross_attention=true``, the decoder reading the encoder): K and V are the
keys and values an earlier stage projected from its sequence (the encoder output), read as they
are; the query at any position sees all of that stage's last step rows, no mask, no window, no
RoPE (``use_rope`` must be false), no cache of its own: its KV cache is those inputs (kind
"cross"), projected once per prompt. With B_q query rows and B_k key rows (B_k dividing B_q),
query row b reads key row b // (B_q / B_k): the beams of a prompt share its encoder rows.

Merged attention (``merge_cross_attention=true``, T5Gemma2's decoder): self-attention as above
(its own cache, RoPE, causal mask and window), and the two extra inputs are cross keys and
values as in cross-attention, which every query also sees, in the same softmax: the scores of
the allowed self keys and of all the cross keys are normalized together. The layer holds both a
"self" and a "cross" KV cache.

Token-type blocks (``block_bidirectional=true``, Gemma 3's images): the last input is the
step's token types ``(B, 1, 1, L)``; a causal query whose type is not 0 also sees the later keys
of its run of equal non-zero types (the rest of its image), as transformers masks the prefill
given ``token_type_ids``; the window's lower bound still applies. A run must lie within one
step.

Cache (self-attention): ``cache_key`` and ``cache_value`` ``(S, nKV, max_timestep, d)``, [s, j, t]
= kv head j at position t of the sequence in slot s (S: the model's ``slots``, its batch unless
set) (each head's positions contiguous, which attention streams; nntrainer
lays a position's heads side by side, ``rows`` of the KV cache gives that layout), a KV cache of
kind "self"; keys are cached after RoPE. ``cache_dtype`` FP32, or FP16 as nntrainer's (values
rounded to nearest even, held as uint16 bits): half the memory and bandwidth. A bidirectional
layer without RoPE (an encoder: BERT, T5, BART, SigLIP) keeps no cache: it runs over the whole
sequence in one step (``from_`` 0) and reads K and V from its inputs; with no window, bias,
sink or softcap either, a step of DENSE_MIN_ROWS rows or more runs as matrix products
(``attention_dense``). Weights: ``sink``
``(nQ,)`` only with ``use_sink``.

Fixed against nntrainer: the cache row and the RoPE position come from ``from_``, not an
internal counter, so a saved system-prompt cache continues correctly; each layer uses its own
theta and scaling; the sliding-window mask is right for any step length, and two-sided as HF's
when not causal (nntrainer's is one-sided "the last W keys"); ``rope_theta`` is a float; ``to``
may reach ``max_timestep`` (docs/nntrainer.md, "KV cache position from an internal counter",
"One RoPE table for every layer", "Sliding-window mask", "Integer rope_theta and no RoPE
scaling", "Last KV cache row unused").

Properties (default): num_heads (1), num_heads_KV (1; every model passes it), max_timestep
(required), sliding_window (UINT_MAX = none), sliding_window_right (0 = sliding_window),
rope_theta (500000), max_position_embeddings (40960; positions are bounded by max_timestep
here), use_sink (false), is_causal (true), is_cross_attention (false), merge_cross_attention
(false), block_bidirectional (false), use_rope (true), attn_logit_softcapping (0 = off),
query_pre_attn_scalar (0 = head_dim; Gemma's attention scale, which nntrainer ignores:
docs/nntrainer.md, "Attention scale ignores query_pre_attn_scalar"),
rope_scaling_type (default | linear | llama3 | yarn), rope_scaling_factor (1),
rope_scaling_max_position_embeddings (4096, the original context of llama3/yarn),
rope_scaling_low_freq_factor (1), rope_scaling_high_freq_factor (4), rope_scaling_beta_fast
(32), rope_scaling_beta_slow (1), rope_scaling_truncate (false, as nntrainer's yarn; HF's
default is true and the models pass the config's value), rope_scaling_attention_factor /
rope_scaling_mscale / rope_scaling_mscale_all_dim (0 = unset), cache_dtype (FP32 | FP16; ours:
nntrainer's cache is always FP16). Accepted and unused as in
nntrainer: max_new_tokens, projected_key_dim, projected_value_dim, output_shape, dropout_rate,
return_attention_weight, average_attention_weight.
"""

import math

import numpy as np

from causallm.kernels import attention, rope_inv_freq, rope_tables
from causallm.kernels.attention import (
    NO_BIAS,
    NO_CROSS,
    NO_KEY_END,
    NO_KV,
    NO_SINKS,
    attention_dense,
    attention_ops,
)
from causallm.runtime.kv_cache import CACHE_DTYPES
from causallm.runtime.layer import Layer
from causallm.runtime.properties import UINT_MAX, bool_, float_, str_, uint

ROPE_TYPES = ("default", "linear", "llama3", "yarn")

DENSE_MIN_ROWS = 64
"""Rows from which a bidirectional step without RoPE, window or bias runs on BLAS
(attention_dense). On the 2-core machine, 16 heads of 72 (SigLIP so400m's), per-row kernel ->
BLAS: 64 rows 0.65 -> 0.64 ms, 256 rows 12.4 -> 3.2 ms, 4096 rows (a 896-pixel image) 2.9 ->
0.66 s."""


class MHACoreLayer(Layer):
    type = "mha_core"
    layer_impl = True
    properties = {
        "num_heads": uint(1),
        "num_heads_KV": uint(1),
        "max_timestep": uint(required=True),
        "sliding_window": uint(UINT_MAX),
        "sliding_window_right": uint(0),
        "max_new_tokens": uint(1),
        "rope_theta": float_(500000.0),
        "max_position_embeddings": uint(40960),
        "use_sink": bool_(False),
        "use_rope": bool_(True),
        "is_causal": bool_(True),
        "is_cross_attention": bool_(False),
        "merge_cross_attention": bool_(False),
        "block_bidirectional": bool_(False),
        "attn_logit_softcapping": float_(0.0),
        "query_pre_attn_scalar": float_(0.0),
        "rope_scaling_type": str_("default", choices=ROPE_TYPES),
        "rope_scaling_factor": float_(1.0),
        "rope_scaling_max_position_embeddings": uint(4096),
        "rope_scaling_low_freq_factor": float_(1.0),
        "rope_scaling_high_freq_factor": float_(4.0),
        "rope_scaling_beta_fast": float_(32.0),
        "rope_scaling_beta_slow": float_(1.0),
        "rope_scaling_truncate": bool_(False),
        "rope_scaling_attention_factor": float_(0.0),
        "rope_scaling_mscale": float_(0.0),
        "rope_scaling_mscale_all_dim": float_(0.0),
        "projected_key_dim": uint(0),
        "projected_value_dim": uint(0),
        "output_shape": uint(0),
        "dropout_rate": float_(0.0),
        "return_attention_weight": str_("none"),
        "average_attention_weight": bool_(False),
        "cache_dtype": str_("FP32", choices=CACHE_DTYPES),
    }

    def finalize(self, context):
        p = self.props
        dims = context.getInputDimensions()
        self.merged, self.blocks = p["merge_cross_attention"], p["block_bidirectional"]
        extra = 2 * self.merged + self.blocks
        if len(dims) not in (3 + extra, 4 + extra):
            raise context.error(f"needs inputs [query, key, value], an optional position bias"
                                f"{', cross key, cross value' if self.merged else ''}"
                                f"{', token types' if self.blocks else ''}; got {len(dims)}")
        self.has_bias = len(dims) == 4 + extra
        q, k, v = dims[:3]
        for label, dim in (("query", q), ("key", k), ("value", v)):
            if dim.channel != 1:
                raise context.error(f"{label} dims {dim}: rows are the height, channel must be "
                                    f"1")
        n_heads, n_kv = p["num_heads"], p["num_heads_KV"]
        if n_heads < 1 or n_kv < 1 or n_heads % n_kv:
            raise context.error(f"num_heads {n_heads} must be a positive multiple of "
                                f"num_heads_KV {n_kv}")
        if q.width % n_heads:
            raise context.error(f"query width {q.width} is not a multiple of num_heads {n_heads}")
        d = q.width // n_heads
        self.cross = p["is_cross_attention"]
        self.cross_inputs = (1, 2) if self.cross else None
        if self.merged:
            first = 4 if self.has_bias else 3
            self.cross_inputs = (first, first + 1)
        for label, dim in (("key", k), ("value", v)):
            if dim.width != n_kv * d:
                raise context.error(f"{label} width {dim.width} != num_heads_KV {n_kv} x "
                                    f"head_dim {d}")
            if (dim.height != q.height or dim.batch != q.batch) and not self.cross:
                raise context.error(f"{label} dims {dim} do not match query dims {q}")
        if self.cross_inputs is not None:
            ck, cv = (dims[i] for i in self.cross_inputs)
            for label, dim in (("cross key", ck), ("cross value", cv)):
                if dim.width != n_kv * d:
                    raise context.error(f"{label} width {dim.width} != num_heads_KV {n_kv} x "
                                        f"head_dim {d}")
                if q.batch % dim.batch:
                    raise context.error(f"{label} batch {dim.batch} does not divide the "
                                        f"query's {q.batch} (each group of query rows reads "
                                        f"one key row)")
            if ck.height != cv.height:
                raise context.error(f"cross key dims {ck} and cross value dims {cv} differ")
        if k.height != v.height:
            raise context.error(f"key dims {k} and value dims {v} differ")
        if d % 2 and p["use_rope"]:
            raise context.error(f"RoPE needs an even head_dim, got {d}")
        T = p["max_timestep"]
        if T < 1:
            raise context.error("max_timestep must be at least 1")
        if p["sliding_window"] < 1:
            raise context.error("sliding_window must be at least 1")

        self.n_heads, self.n_kv, self.head_dim, self.max_timestep = n_heads, n_kv, d, T
        self.window = p["sliding_window"]
        self.window_right = p["sliding_window_right"] or self.window
        self.causal = p["is_causal"]
        self.softcap = p["attn_logit_softcapping"]
        scalar = p["query_pre_attn_scalar"]
        if scalar < 0:
            raise context.error(f"query_pre_attn_scalar must be positive, got {scalar}")
        self.scale = 1.0 / math.sqrt(scalar or d)
        if self.cross and (p["use_rope"] or p["is_causal"] or p["use_sink"] or self.merged
                           or p["sliding_window"] != UINT_MAX):
            raise context.error("is_cross_attention needs use_rope=false and is_causal=false, "
                                "and takes no sink, no sliding window and no merged keys")
        if self.merged and not self.causal:
            raise context.error("merge_cross_attention is a decoder's: it needs is_causal=true")
        if self.blocks and not self.causal:
            raise context.error("block_bidirectional needs is_causal=true (a bidirectional "
                                "layer already sees every key)")
        # an encoder layer without RoPE reads K and V from its inputs: no cache to fill
        self.cacheless = not self.causal and not self.cross and not p["use_rope"]
        # ... and, with nothing but the scores to compute, matrix products for long steps
        self.dense = (self.cacheless and self.window >= T and len(dims) == 3
                      and not p["use_sink"] and not self.softcap)
        self.cos, self.sin = self._rope_tables(context)
        if self.has_bias:
            bias = dims[3]
            if bias.height != n_heads or bias.width % 2 == 0 or bias.width < 2 * T - 1:
                raise context.error(f"position bias dims {bias} must be B:1:{n_heads}:2C+1 with "
                                    f"C >= max_timestep - 1 = {T - 1}")

        self.sink_index = None
        if p["use_sink"]:
            self.sink_index = context.requestWeight("sink", (n_heads,), context.activation_dtype)
        keys = k.height if self.cross or self.cacheless else T
        if not self.cross and not self.cacheless:
            context.requestKVCache("self", (context.slots, n_kv, T, d),
                                   dtype=CACHE_DTYPES[p["cache_dtype"]])
        cross_keys = 0
        if self.cross_inputs is not None:
            context.requestKVCache("cross", inputs=self.cross_inputs)
            cross_keys = dims[self.cross_inputs[0]].height
        if self.cross:
            keys, cross_keys = cross_keys, 0
        self.scores = context.requestTensor("scores", (q.batch * n_heads,
                                                       keys + cross_keys + d))
        context.setOutputDimensions([q])

    def _rope_tables(self, context):
        p, d, T = self.props, self.head_dim, self.max_timestep
        if not p["use_rope"]:  # the identity rotation; read-only like rope_tables' (one compile)
            cos, sin = np.ones((T, d // 2), dtype=np.float32), np.zeros((T, d // 2), dtype=np.float32)
            cos.flags.writeable = sin.flags.writeable = False
            return cos, sin
        if p["rope_theta"] <= 0:
            raise context.error(f"rope_theta must be positive, got {p['rope_theta']}")
        inv_freq, scaling = rope_inv_freq(
            d, p["rope_theta"], p["rope_scaling_type"], factor=p["rope_scaling_factor"],
            original_max_position_embeddings=p["rope_scaling_max_position_embeddings"],
            low_freq_factor=p["rope_scaling_low_freq_factor"],
            high_freq_factor=p["rope_scaling_high_freq_factor"],
            beta_fast=p["rope_scaling_beta_fast"], beta_slow=p["rope_scaling_beta_slow"],
            truncate=p["rope_scaling_truncate"],
            attention_factor=p["rope_scaling_attention_factor"] or None,
            mscale=p["rope_scaling_mscale"] or None,
            mscale_all_dim=p["rope_scaling_mscale_all_dim"] or None)
        return rope_tables(inv_freq, scaling, T)

    def check_step(self, context):
        """Raise when the step reaches past the KV cache (runtime/runner.StageState)."""
        if context.step.end > self.max_timestep:
            raise context.error(f"position {context.step.end - 1} is past max_timestep "
                                f"{self.max_timestep} (the KV cache length)")

    def team_ops(self, context, step):
        """A decode step of a causal layer over its own cache, as team ops (runtime/runner.py,
        ``team_plan``; kernels.attention.attention_ops); None for any other layer."""
        if (self.cross_inputs is not None or self.cross or self.cacheless or self.has_bias
                or self.blocks or not self.causal):
            return None
        rows, inputs = context.step, context.inputs
        sinks = NO_SINKS if self.sink_index is None else context.weights[self.sink_index]
        # kv_len: a causal step's keys end at each row's position (read when the ops run)
        return attention_ops(inputs[0], context.tensors[0], context.tensors[1],
                             context.outputs[0], self.cos, self.sin, context.tensors[self.scores],
                             step, self.max_timestep, self.n_heads, self.n_kv, self.head_dim,
                             scale=self.scale, window=self.window, softcap=self.softcap,
                             sinks=sinks, slots=rows.slots, positions=rows.positions,
                             k=inputs[1], v=inputs[2])

    def incremental_forwarding(self, context, from_, to):
        rows = context.step  # each row's cache slot and position (runtime/runner.StageState)
        self.check_step(context)
        step = to - from_
        inputs, tensors = context.inputs, context.tensors
        sinks = NO_SINKS if self.sink_index is None else context.weights[self.sink_index]
        bias = inputs[3] if self.has_bias else NO_BIAS
        cross_k = cross_v = NO_CROSS
        cross_len = 0
        new_k = new_v = NO_KV
        slots = rows.slots
        if self.cross_inputs is not None:
            ki, vi = self.cross_inputs
            source = context.input_stages[ki]
            if source.to == 0 or source.from_ != 0:
                raise context.error(f"cross-attention needs stage '{source.name}' run once over "
                                    f"its whole sequence first")
            cross_k, cross_v, cross_len = inputs[ki], inputs[vi], source.to
        if self.cross:
            k_cache, v_cache, kv_len = cross_k, cross_v, cross_len
            cross_k = cross_v = NO_CROSS
            cross_len = 0
            slots = None  # the keys of query row b are row b // (B / B') of the inputs
        elif self.cacheless:
            if from_ != 0:
                raise context.error(f"a bidirectional layer without RoPE runs over the whole "
                                    f"sequence in one step (from 0), got from {from_}")
            if self.dense and step >= DENSE_MIN_ROWS:
                attention_dense(inputs[0], inputs[1], inputs[2], context.outputs[0], step,
                                self.n_heads, self.n_kv, self.head_dim, self.scale)
                return
            k_cache, v_cache, kv_len = inputs[1], inputs[2], to
            slots = None
        else:  # the step's keys and values are written by the attention call
            k_cache, v_cache = tensors[0], tensors[1]
            new_k, new_v = inputs[1], inputs[2]
            kv_len = rows.end
        key_end = self._key_end(inputs[-1], rows.positions, step) if self.blocks else NO_KEY_END
        attention(inputs[0], k_cache, v_cache, context.outputs[0], self.cos, self.sin,
                  tensors[self.scores], from_, step, kv_len, self.n_heads, self.n_kv,
                  self.head_dim, scale=self.scale, window=self.window,
                  window_right=self.window_right, causal=self.causal, softcap=self.softcap,
                  sinks=sinks, bias=bias, cross_k=cross_k, cross_v=cross_v,
                  cross_len=cross_len, key_end=key_end, slots=slots, positions=rows.positions,
                  k=new_k, v=new_v)

    @staticmethod
    def _key_end(types, positions, step):
        """(B, step) int64: for a row of non-zero type, one past the position of the last row
        of its run of that type (the run's end), else 0; NO_KEY_END when the step has no such
        row."""
        t = types.reshape(types.shape[0], -1)[:, :step]
        if not t.any():
            return NO_KEY_END
        end = np.zeros(t.shape, dtype=np.int64)
        for b in range(t.shape[0]):
            i = 0
            while i < step:
                j = i + 1
                while j < step and t[b, j] == t[b, i]:
                    j += 1
                if t[b, i] != 0:
                    end[b, i:j] = positions[b, j - 1] + 1
                i = j
        return end
