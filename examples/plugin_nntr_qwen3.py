"""NNTRQwen3ForCausalLM as a plugin: NNTrainer's Qwen3 with one fused Q/K/V layer.

    python main.py QWEN3_DIR "prompt" --plugin examples/plugin_nntr_qwen3.py

Ports Applications/CausalLM/nntr_qwen3_causallm.cpp (``NNTRQwen3CausalLM``, registered in
main.cpp as ``NNTRQwen3ForCausalLM``) and its custom layer layers/qkv_layer.cpp
(``QKVLayer``, type ``qkv_layer``), walked through in docs/porting.md. The model is Qwen3; only
the attention's projections differ:

    q, k, v = x Wq, x Wk, x Wv        one layer, three outputs: layer{i}_qkv(0), (1), (2)

so a folder whose config.json names ``NNTRQwen3ForCausalLM`` runs a Hugging Face Qwen3
checkpoint unchanged (q_proj, k_proj and v_proj feed the layer's three weights) and gives
transformers' Qwen3 tokens (tests/test_plugins.py checks it).
"""

from __future__ import annotations

import numpy as np

from causallm.api import createLayer, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.io.weight_table import Tensor
from causallm.kernels import linear
from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import uint
from causallm.factory import Factory
from causallm.models.qwen3.qwen3_causallm import QWEN3_WEIGHTS, Qwen3CausalLM
from causallm.models.transformer import SELF_ATTENTION

NO_BIAS = np.zeros(0, dtype=np.float32)


class QKVLayer(Layer):
    """``qkv_layer`` (layers/qkv_layer.cpp): three projections of one input.

        x (B, 1, H, K) -> q = x Wq (B, 1, H, q_unit), k = x Wk (.., k_unit), v = x Wv (.., v_unit)

    Weights, in order: ``qweight`` (K, q_unit), ``kweight`` (K, k_unit), ``vweight``
    (K, v_unit), each [in, out] as NNTrainer stores a fully connected weight; no biases.
    Properties: ``q_unit``, ``k_unit``, ``v_unit`` (required), and LayerImpl's keys."""

    type = "qkv_layer"
    layer_impl = True
    properties = {"q_unit": uint(required=True), "k_unit": uint(required=True),
                  "v_unit": uint(required=True)}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        x = dims[0]
        units = [self.props["q_unit"], self.props["k_unit"], self.props["v_unit"]]
        for name, unit in zip(("qweight", "kweight", "vweight"), units):
            context.requestWeight(name, (x.width, unit), packable=True)
        context.setOutputDimensions([TensorDim(x.batch, x.channel, x.height, u) for u in units])

    def incremental_forwarding(self, context, from_, to):
        x = context.inputs[0]
        for weight, out in zip(context.weights, context.outputs):
            linear(x, weight, NO_BIAS, out, 0, 0, min(to - from_, out.shape[1]))


NNTR_QWEN3_WEIGHTS = QWEN3_WEIGHTS.extend([
    Tensor("layer{i}_qkv:qweight", "model.layers.{i}.self_attn.q_proj.weight", transpose=True),
    Tensor("layer{i}_qkv:kweight", "model.layers.{i}.self_attn.k_proj.weight", transpose=True),
    Tensor("layer{i}_qkv:vweight", "model.layers.{i}.self_attn.v_proj.weight", transpose=True),
])
"""Qwen3's names, with the three projections feeding the fused layer's weights."""


class NNTRQwen3CausalLM(Qwen3CausalLM):
    """``NNTRQwen3ForCausalLM``: Qwen3CausalLM whose attention starts with one ``qkv_layer``."""

    architectures = "NNTRQwen3ForCausalLM"

    def setupParameters(self, cfg, generation_cfg, nntr_cfg) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        if self.ATTENTION_BIAS:
            raise CausalLMError(f"{cfg.path}: attention_bias is true, but {self.architectures}'s "
                                f"qkv_layer has no biases")

    def createAttention(self, layer_id, seq_len, n_heads, head_dim, query_name, key_name,
                        value_name, prefix="", kind=SELF_ATTENTION):
        layers = []
        prefix = prefix or f"layer{layer_id}"
        QKV = f"{prefix}_qkv"
        Q, K, V = f"{QKV}(0)", f"{QKV}(1)", f"{QKV}(2)"
        K_norm, Q_norm = f"{prefix}_k_norm", f"{prefix}_q_norm"
        A, O = f"{prefix}_attention", f"{prefix}_attention_out"

        layers.append(createLayer("qkv_layer", [
            withKey("name", QKV), withKey("q_unit", head_dim * n_heads),
            withKey("k_unit", head_dim * n_heads // self.GQA_SIZE),
            withKey("v_unit", head_dim * n_heads // self.GQA_SIZE),
            withKey("input_layers", query_name),
            withKey("weight_dtype", self.FC_LAYER_DTYPE)]))  # held as every projection

        # K-reshaped-norm layer: k_norm(k_proj.view(hidden_shape))
        layers.append(createLayer("reshaped_rms_norm", [
            withKey("name", K_norm), withKey("input_layers", K), withKey("packed", "false"),
            withKey("epsilon", self.NORM_EPS), withKey("feature_size", head_dim)]))

        # Q-reshaped-norm layer: q_norm(q_proj.view(hidden_shape))
        layers.append(createLayer("reshaped_rms_norm", [
            withKey("name", Q_norm), withKey("input_layers", Q), withKey("packed", "false"),
            withKey("epsilon", self.NORM_EPS), withKey("feature_size", head_dim)]))

        # Attention core layer
        layers.append(self.createAttentionCore(A, layer_id, n_heads, [Q_norm, K_norm, V], kind))

        # O layer
        layers.append(self.createFullyConnected(O, self.DIM, A))
        return layers

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(QKVLayer)

    def getHFWeightTable(self):
        return NNTR_QWEN3_WEIGHTS


Factory.Instance().registerModel("NNTRQwen3ForCausalLM", NNTRQwen3CausalLM)
