"""Gemma 3 text models (Applications/CausalLM/models/gemma3/gemma3_causallm.cpp).

``Gemma3Transformer`` is the decoder stack shared by ``Gemma3CausalLM`` (registered as
``Gemma3ForCausalLM``) and EmbeddingGemma. Block i, x its input (docs/nntrainer.md, "Block
order by family"):

    h   = x + post_attention_norm(attention(attention_norm(x)))
    out = h + post_ffn_norm(down(act(gate(n)) * up(n))),   n = pre_ffn_norm(h)

- embedding: ``E[id] * sqrt(hidden_size)``, the scale rounded to the embedding's weight dtype
  (transformers casts it to the table's dtype);
- every norm is ``x / sqrt(mean(x^2) + eps) * (1 + w)``, including the per-head q/k norms
  (``reshaped_rms_norm``); NNTrainer stores ``1 + w`` as gamma, so the Hugging Face map adds 1;
- attention: ``softmax(q.k * query_pre_attn_scalar^-1/2)``; a ``sliding_attention`` layer sees
  the keys ``p - W < t <= p`` and uses the local RoPE, a ``full_attention`` layer sees every
  earlier key and uses the global RoPE with its scaling (linear factor 8 on Gemma3-4B);
  ``attn_logit_softcapping`` is not applied (transformers' Gemma 3, unlike Gemma 2, ignores it);
- ``act`` is ``hidden_activation`` (``gelu_pytorch_tanh`` -> NNTrainer ``tanh_gelu``).

``Gemma3CausalLM`` adds the tied (default) or untied head and, when ``final_logit_softcapping``
is set, ``logits = tanh(logits / c) * c``.

Fixed against the C++ to match transformers' Gemma3ForCausalLM: the attention scale comes from
``query_pre_attn_scalar``; local layers use ``rope_local_base_freq`` (not a hard-coded 10000)
and global layers apply ``rope_scaling``; without ``layer_types`` the layer kinds follow
``sliding_window_pattern`` (default 6) instead of every layer sliding;
``final_logit_softcapping`` is applied; an nntr_config ``model_type`` of "CausalLM" is accepted;
``attention_bias`` gives q/k/v/o their biases (docs/nntrainer.md, "Attention scale ignores
query_pre_attn_scalar", "Integer rope_theta and no RoPE scaling", "Gemma 3 final logit
softcapping", "Strict model_type"). Missing config keys take transformers'
Gemma3TextConfig defaults (head_dim 256, sliding_window 4096, query_pre_attn_scalar 256, tied
embeddings, rope thetas 1e6 / 1e4).
"""

from __future__ import annotations

import math

import numpy as np

from causallm.api import createLayer, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.io.weight_table import Tensor, WeightTable
from causallm.runtime.properties import UINT_MAX
from causallm.layers.logit_softcapping import LogitSoftcappingLayer
from causallm.layers.mha_core import ROPE_TYPES
from causallm.layers.reshaped_rms_norm import ReshapedRMSNormLayer
from causallm.models.causal_lm import CausalLM
from causallm.models.gemma3.function import function_gemma_prompt
from causallm.models.transformer import LLAMA_WEIGHTS, SELF_ATTENTION, ModelType, Transformer

SLIDING, FULL = "sliding_attention", "full_attention"
DEFAULT_ROPE_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}
"""transformers' Gemma3TextConfig.default_theta: global ``rope_theta``, local
``rope_local_base_freq``."""

_LAYER = "model.layers.{i}."
GEMMA3_WEIGHTS = LLAMA_WEIGHTS.extend([
    Tensor("layer{i}_attention_norm:gamma", _LAYER + "input_layernorm.weight", offset=1.0),
    Tensor("layer{i}_q_norm:gamma", _LAYER + "self_attn.q_norm.weight", offset=1.0),
    Tensor("layer{i}_k_norm:gamma", _LAYER + "self_attn.k_norm.weight", offset=1.0),
    Tensor("layer{i}_post_attention_norm:gamma", _LAYER + "post_attention_layernorm.weight",
           offset=1.0),
    Tensor("layer{i}pre_ffn_norm:gamma", _LAYER + "pre_feedforward_layernorm.weight", offset=1.0),
    Tensor("layer{i}post_ffn_norm:gamma", _LAYER + "post_feedforward_layernorm.weight",
           offset=1.0),
    Tensor("output_norm:gamma", "model.norm.weight", offset=1.0),
])
"""Gemma3TextModel's names (``model.`` prefix): Llama's projections and embedding; every norm
stores w for ``1 + w`` (NNTrainer stores 1 + w as gamma), hence offset 1."""

HIDDEN_ACTIVATIONS = {"gelu_pytorch_tanh": "tanh_gelu", "gelu_new": "tanh_gelu", "gelu": "gelu"}
"""config.json ``hidden_activation`` -> NNTrainer ``activation`` computing the same function."""


class Gemma3Transformer(Transformer):
    """The Gemma 3 decoder stack (see the module docstring); no head, no generation."""

    # -- parameters -------------------------------------------------------------------------
    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.HEAD_DIM = cfg.get_int("head_dim", 256, minimum=1)
        self.MAX_POSITION_EMBEDDINGS = cfg.get_int("max_position_embeddings", 131072, minimum=1)
        self.TIE_WORD_EMBEDDINGS = cfg.get_bool("tie_word_embeddings", True)  # sanitizeConfig
        if "sliding_window" in cfg and cfg["sliding_window"] is None:
            self.SLIDING_WINDOW = UINT_MAX
        else:
            self.SLIDING_WINDOW = cfg.get_int("sliding_window", 4096, minimum=1)
        self.layer_types = self.readLayerTypes(cfg, self.NUM_LAYERS)
        self.ROPE_LOCAL_THETA, self.ROPE_LOCAL_SCALING = self.readRopeParameters(cfg)[SLIDING]
        self.QUERY_PRE_ATTN_SCALAR = cfg.get_float("query_pre_attn_scalar", 256.0)
        if not self.QUERY_PRE_ATTN_SCALAR > 0:
            raise cfg.error("query_pre_attn_scalar", "a positive number")
        # attn_logit_softcapping stays 0 (off): transformers' Gemma3Attention never passes the
        # config's value to the attention function, and the C++ never reads it
        # (docs/nntrainer.md, "Gemma 3 attention softcapping")
        self.ATTN_LOGIT_SOFTCAPPING = 0.0
        # transformers multiplies by sqrt(hidden) cast to the embedding table's dtype
        scale_dtype = np.float16 if self.EMBEDDING_DTYPE.upper() == "FP16" else np.float32
        self.EMBEDDING_SCALE = float(scale_dtype(math.sqrt(self.DIM)))

    def readHiddenAct(self, cfg: JsonConfig) -> str:
        """``hidden_activation`` (transformers' Gemma 3 key; ``hidden_act`` is not read) as the
        NNTrainer activation of the gated MLP."""
        act = cfg.get_str("hidden_activation", "gelu_pytorch_tanh")
        if act not in HIDDEN_ACTIVATIONS:
            raise cfg.error("hidden_activation", f"one of {', '.join(HIDDEN_ACTIVATIONS)}")
        return HIDDEN_ACTIVATIONS[act]

    @staticmethod
    def readLayerTypes(cfg: JsonConfig, num_layers: int) -> list[str]:
        """``layer_types`` as given, else layer i slides unless ``(i + 1) % sliding_window_pattern
        == 0`` (pattern default 6), as transformers' Gemma3TextConfig."""
        if not cfg.contains("layer_types"):
            pattern = cfg.get_int("sliding_window_pattern", 6, minimum=1)
            return [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
        types = cfg["layer_types"]
        if (not isinstance(types, list) or len(types) != num_layers
                or any(t not in (SLIDING, FULL) for t in types)):
            raise cfg.error("layer_types", f"a list of {num_layers} (num_hidden_layers) entries, "
                                           f"each '{SLIDING}' or '{FULL}'")
        return list(types)

    @staticmethod
    def readRopeParameters(cfg: JsonConfig) -> dict[str, tuple[float, dict]]:
        """``{layer type: (theta, rope parameters)}`` as transformers 5 builds Gemma 3's
        ``rope_parameters``: the nested ``{"full_attention": {...}, "sliding_attention": {...}}``
        (a missing entry is the default RoPE); the transformers-4 ``rope_scaling`` updates the
        full-attention entry; a missing theta is ``rope_theta`` (default 1e6) for full attention
        and ``rope_local_base_freq`` (default 1e4) for sliding attention; the type is
        ``rope_type``, else ``type``, else default. Keys of a flat ``rope_parameters`` are not
        read (transformers ignores them for Gemma 3 too)."""
        params = cfg.get_dict("rope_parameters", {})
        out = {}
        for layer_type in (SLIDING, FULL):
            entry = params.get(layer_type)
            if entry is not None and not isinstance(entry, dict):
                raise cfg.error("rope_parameters", f"an object per layer type ('{layer_type}')")
            out[layer_type] = dict(entry) if entry else {"rope_type": "default"}
        if cfg.contains("rope_scaling"):
            out[FULL].update(cfg.get_dict("rope_scaling"))
        out[FULL].setdefault("rope_theta", cfg.get_float("rope_theta", DEFAULT_ROPE_THETA[FULL]))
        out[SLIDING].setdefault("rope_theta", cfg.get_float("rope_local_base_freq",
                                                            DEFAULT_ROPE_THETA[SLIDING]))
        result = {}
        for layer_type, p in out.items():
            p.setdefault("rope_type", p.get("type", "default"))
            if p["rope_type"] not in ROPE_TYPES:
                raise CausalLMError(f"{cfg.path}: {layer_type} rope type '{p['rope_type']}' is "
                                    f"not supported (supported: {', '.join(ROPE_TYPES)})")
            theta = p["rope_theta"]
            if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
                raise CausalLMError(f"{cfg.path}: {layer_type} rope_theta must be a positive "
                                    f"number, got {theta!r}")
            result[layer_type] = (float(theta), p)
        return result

    @staticmethod
    def readRope(cfg: JsonConfig) -> tuple[float, dict]:
        """The global (full-attention) layers' theta and scaling; see readRopeParameters."""
        return Gemma3Transformer.readRopeParameters(cfg)[FULL]

    # -- graph ------------------------------------------------------------------------------
    def createTransformerDecoderBlock(self, layer_id: int, input_name: str) -> list:
        i = layer_id
        layers = []
        layers.append(createLayer("rms_norm", [
            withKey("name", f"layer{i}_attention_norm"), withKey("input_layers", input_name),
            withKey("epsilon", self.NORM_EPS), withKey("packed", "false")]))

        layers += self.createAttention(i, self.INIT_SEQ_LEN, self.NUM_HEADS, self.HEAD_DIM,
                                       f"layer{i}_attention_norm", f"layer{i}_attention_norm",
                                       f"layer{i}_attention_norm")

        layers.append(createLayer("rms_norm", [
            withKey("name", f"layer{i}_post_attention_norm"),
            withKey("input_layers", f"layer{i}_attention_out"),
            withKey("epsilon", self.NORM_EPS), withKey("packed", "false")]))

        layers.append(createLayer("addition", [
            withKey("name", f"layer{i}_post_attention"),
            withKey("input_layers", f"{input_name},layer{i}_post_attention_norm")]))

        # "pre_ffn_norm" / "post_ffn_norm" carry no underscore after the index, as in the C++
        layers.append(createLayer("rms_norm", [
            withKey("name", f"layer{i}pre_ffn_norm"),
            withKey("input_layers", f"layer{i}_post_attention"),
            withKey("epsilon", self.NORM_EPS), withKey("packed", "false")]))

        layers += self.createMlp(i, self.DIM, self.INTERMEDIATE_SIZE, f"layer{i}pre_ffn_norm")

        # no input_layers: takes the previous layer (layer{i}_ffn_down), as in the C++
        layers.append(createLayer("rms_norm", [
            withKey("name", f"layer{i}post_ffn_norm"),
            withKey("epsilon", self.NORM_EPS), withKey("packed", "false")]))

        layers.append(createLayer("addition", [
            withKey("name", f"layer{i}_decoder_output"),
            withKey("input_layers", f"layer{i}_post_attention,layer{i}post_ffn_norm")]))
        return layers

    def createAttention(self, layer_id: int, seq_len: int, n_heads: int, head_dim: int,
                        query_name: str, key_name: str, value_name: str, prefix: str = "",
                        kind: str = SELF_ATTENTION) -> list:
        """Gemma 3's: q and k normed per head, the norms after the v projection."""
        return self.attentionLayers(layer_id, n_heads, head_dim, query_name, key_name,
                                    value_name, prefix, kind, qk_norm="after")

    def attentionCoreProperties(self, layer_id: int, n_heads: int,
                                kind: str = SELF_ATTENTION) -> dict:
        """A sliding layer: the window and the local RoPE; a full layer: no window and the
        global RoPE with its scaling; every layer: query_pre_attn_scalar, the softcap (off)."""
        sliding = self.layer_types[layer_id] == SLIDING
        theta, scaling = ((self.ROPE_LOCAL_THETA, self.ROPE_LOCAL_SCALING) if sliding
                          else (self.ROPE_THETA, self.ROPE_SCALING))
        props = {key: value for key, value in super().attentionCoreProperties(
            layer_id, n_heads, kind).items() if not key.startswith("rope_scaling_")}
        props.update(sliding_window=self.SLIDING_WINDOW if sliding else UINT_MAX,
                     rope_theta=theta, attn_logit_softcapping=self.ATTN_LOGIT_SOFTCAPPING,
                     query_pre_attn_scalar=self.QUERY_PRE_ATTN_SCALAR,
                     **self.ropeProperties(scaling))
        return props

    def createMlp(self, layer_id: int, dim: int, hidden_dim: int, input_name: str,
                  prefix: str = "") -> list:
        p = prefix or f"layer{layer_id}"
        return [
            self.createFullyConnected(f"{p}_ffn_gate", hidden_dim, input_name),
            createLayer("activation", [withKey("name", f"{p}_ffn_gate_gelu"),
                                       withKey("activation", self.HIDDEN_ACT),
                                       withKey("input_layers", f"{p}_ffn_gate")]),
            self.createFullyConnected(f"{p}_ffn_up", hidden_dim, input_name),
            createLayer("multiply", [withKey("name", f"{p}_ffn_geglu"),
                                     withKey("input_layers",
                                             f"{p}_ffn_gate_gelu,{p}_ffn_up")]),
            self.createFullyConnected(f"{p}_ffn_down", dim, f"{p}_ffn_geglu"),
        ]

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(ReshapedRMSNormLayer)

    # -- weights ----------------------------------------------------------------------------
    def getHFWeightTable(self) -> WeightTable:
        return GEMMA3_WEIGHTS


class Gemma3CausalLM(CausalLM, Gemma3Transformer):
    """``Gemma3ForCausalLM``: Gemma3Transformer + the LM head (+ final logit soft-capping)."""

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.FINAL_LOGIT_SOFTCAPPING = cfg.get_float("final_logit_softcapping", 0.0)
        if self.FINAL_LOGIT_SOFTCAPPING < 0:
            raise cfg.error("final_logit_softcapping", "a positive number or null")

    def checkModelType(self, nntr_cfg: JsonConfig) -> None:
        """The C++ Gemma3CausalLM only accepts "Model" (docs/nntrainer.md, "Strict model_type");
        "CausalLM" is accepted too."""
        if nntr_cfg.contains("model_type") and \
                nntr_cfg.get_str("model_type").lower() == ModelType.MODEL.lower():
            return
        super().checkModelType(nntr_cfg)

    def constructModel(self) -> None:
        super().constructModel()
        if self.FINAL_LOGIT_SOFTCAPPING:
            self.model.addLayer(createLayer("logit_softcapping", [
                withKey("name", "output_softcapping"),
                withKey("softcapping", self.FINAL_LOGIT_SOFTCAPPING),
                withKey("input_layers", "output_of_causallm")]))

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(LogitSoftcappingLayer)

    def chatPrompt(self, chat_input: JsonConfig) -> str:
        """nntr_config ``chat_input`` through the FunctionGemma template (main.cpp step 6)."""
        return function_gemma_prompt(chat_input, self.tokenizer)
