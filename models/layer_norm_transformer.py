"""LayerNormTransformer: the blocks GPT-2 and BERT share (neither model is in nntrainer's
CausalLM; both follow its model files). Each subclass builds its own embeddings (with learned
``positional_embedding``) and block order; this class gives them:

- norms (``createNorm``): ``layer_normalization`` over the hidden axis,
  LN(x) = (x - mean) / sqrt(var + eps) * gamma + beta, eps = NORM_EPS;
- attention without RoPE (positions came in with the embeddings)::

      q|k|v = x Wq|Wk|Wv + b                       ``layer{i}_wq``, ``_wk``, ``_wv``
      a     = softmax(q k^T / sqrt(s) [+ causal mask]) v   per head, ``_attention`` (mha_core)
      out   = a Wo + bo                             ``_attention_out``

  with s = ``attentionScalar(layer_id)`` (head_dim unless a subclass scales otherwise), the
  causal mask iff IS_CAUSAL, and ``MAX_SEQ_LEN`` KV-cache rows;
- an ungated MLP: ``down(act(x Wup + bup)) + bdown``, act = HIDDEN_ACT (``layer{i}_ffn_up``,
  ``_ffn_act``, ``_ffn_down``).

Biases follow ATTENTION_BIAS / MLP_BIAS (both families set them).
"""

from __future__ import annotations

from causallm.api import createLayer, registerFactory, withKey
from causallm.runtime.properties import UINT_MAX
from causallm.layers.layer_normalization import LayerNormalizationLayer
from causallm.layers.positional_embedding import PositionalEmbeddingLayer
from causallm.models.transformer import SELF_ATTENTION, Transformer


class LayerNormTransformer(Transformer):
    """Transformer with LayerNorm, RoPE-free attention and an ungated MLP (module docstring)."""

    def attentionScalar(self, layer_id: int) -> float:
        """mha_core ``query_pre_attn_scalar`` s of layer ``layer_id`` (scores are scaled by
        s^-1/2): 0, mha_core's default, which is head_dim."""
        return 0.0

    def createNorm(self, name: str, input_name: str):
        return createLayer("layer_normalization", [
            withKey("name", name), withKey("input_layers", input_name), withKey("axis", 3),
            withKey("epsilon", self.NORM_EPS), withKey("packed", "false")])

    def attentionCoreProperties(self, layer_id: int, n_heads: int,
                                kind: str = SELF_ATTENTION) -> dict:
        """The base attention core without RoPE (positions came in with the position
        embeddings) or window, scaled by attentionScalar, with MAX_SEQ_LEN rows."""
        props = {key: value for key, value in super().attentionCoreProperties(
            layer_id, n_heads, kind).items() if not key.startswith("rope_")}
        props.update(max_timestep=self.MAX_SEQ_LEN, sliding_window=UINT_MAX, use_rope=False,
                     query_pre_attn_scalar=self.attentionScalar(layer_id))
        return props

    def createMlp(self, layer_id: int, dim: int, hidden_dim: int, input_name: str,
                  prefix: str = "") -> list:
        p = prefix or f"layer{layer_id}"
        return [
            self.createFullyConnected(f"{p}_ffn_up", hidden_dim, input_name, self.MLP_BIAS),
            createLayer("activation", [withKey("name", f"{p}_ffn_act"),
                                       withKey("activation", self.HIDDEN_ACT),
                                       withKey("input_layers", f"{p}_ffn_up")]),
            self.createFullyConnected(f"{p}_ffn_down", dim, f"{p}_ffn_act", self.MLP_BIAS),
        ]

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(LayerNormalizationLayer)
        registerFactory(PositionalEmbeddingLayer)
