"""Qwen3 (Applications/CausalLM/models/qwen3/qwen3_causallm.cpp; HF ``modeling_qwen3.py``).

Qwen3Transformer is the Llama decoder of :class:`Transformer` with per-head q/k RMS norms:

    q = RMSNorm_d(x Wq [+ bq]) per head,  k = RMSNorm_d(x Wk [+ bk]) per head,  v = x Wv [+ bv]
    out = mha_core(q, k, v) Wo [+ bo]                  (biases iff config ``attention_bias``)

where RMSNorm_d normalises each head's d = head_dim values with one shared gamma (d,)
(``reshaped_rms_norm``, eps = rms_norm_eps). head_dim is its own config key (default 128, as in
HF), so nQ * head_dim need not equal hidden_size.

Layer names and insertion (= .bin) order per block: ``layer{i}_wq``, ``_q_norm`` (gamma),
``_wk``, ``_k_norm`` (gamma), ``_wv``, ``_attention`` (mha_core), ``_attention_out``.

Beyond the C++ (which hard-codes no biases, one window for every layer and always-causal
attention: docs/nntrainer.md, "Qwen2 window on every layer", "Attention direction from
config.json"): ``attention_bias`` gives q/k/v/o their biases, sliding windows follow HF
(:func:`models.qwen2.qwen2_causallm.readQwenLayerTypes`), ``is_causal`` and rope scaling
reach mha_core, and the MLP has no bias whatever ``mlp_bias`` says.
"""

from __future__ import annotations

from causallm.api import registerFactory
from causallm.io.config import JsonConfig
from causallm.io.weight_table import Tensor, WeightTable
from causallm.layers.reshaped_rms_norm import ReshapedRMSNormLayer
from causallm.models.causal_lm import CausalLM
from causallm.models.qwen2.qwen2_causallm import readQwenLayerTypes
from causallm.models.transformer import LLAMA_WEIGHTS, SELF_ATTENTION, Transformer

QWEN3_HEAD_DIM_DEFAULT = 128  # HF Qwen3Config ``head_dim`` default

QWEN3_WEIGHTS = LLAMA_WEIGHTS.extend([
    Tensor("layer{i}_q_norm:gamma", "model.layers.{i}.self_attn.q_norm.weight"),
    Tensor("layer{i}_k_norm:gamma", "model.layers.{i}.self_attn.k_norm.weight"),
])
"""Llama's names plus the per-head q/k norms."""


class Qwen3Transformer(Transformer):
    """Transformer with Qwen3 attention (q/k per-head RMS norms, per-layer sliding windows)."""

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.HEAD_DIM = cfg.get_int("head_dim", QWEN3_HEAD_DIM_DEFAULT, minimum=1)
        self.MLP_BIAS = False  # HF Qwen3MLP has no biases and no mlp_bias key
        # per-layer windows: Transformer.layerSlidingWindow reads layer_types
        self.SLIDING_WINDOW, self.layer_types = readQwenLayerTypes(cfg, self.NUM_LAYERS)

    def createAttention(self, layer_id: int, seq_len: int, n_heads: int, head_dim: int,
                        query_name: str, key_name: str, value_name: str, prefix: str = "",
                        kind: str = SELF_ATTENTION) -> list:
        """Qwen3's: q and k normed per head, each norm right after its projection."""
        return self.attentionLayers(layer_id, n_heads, head_dim, query_name, key_name,
                                    value_name, prefix, kind, qk_norm="interleaved")

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(ReshapedRMSNormLayer)

    def getHFWeightTable(self) -> WeightTable:
        return QWEN3_WEIGHTS


class Qwen3CausalLM(CausalLM, Qwen3Transformer):
    """``Qwen3ForCausalLM``: CausalLM (LM head, generation) over Qwen3Transformer.

    The C++ class overrides registerCustomLayers to call both parents; the cooperative
    ``super()`` chain (Qwen3CausalLM -> CausalLM -> Qwen3Transformer -> Transformer) does that."""
