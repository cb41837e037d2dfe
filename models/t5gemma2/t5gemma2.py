"""T5Gemma2 (HF ``modeling_t5gemma2.py`` ``T5Gemma2ForConditionalGeneration``): the model
NNTrainer's encoder-decoder note was written for, on :class:`EncoderDecoder`, with the SigLIP
vision tower of Gemma 3 (models/vision_language.py). Where the note and the fork differ from
the real model (docs/nntrainer.md, "Where the plan is wrong", "Fork bugs"), this follows
transformers.

Stages::

    vision    vision_input0 -> SigLIP tower -> vision_projector           (one image per step)
    encoder   encoder_input0 -> encoder_embedding0 (x sqrt(D)) -> encoder_eoi_embedding
              -> encoder_image_merge (image_input0) -> encoder_layer{i} -> encoder_output_norm
              (+ each decoder layer's cross K and V: _cross_wk, _cross_k_norm, _cross_wv)
    decoder   decoder_input0 -> decoder_embedding0 -> decoder_eoi_embedding -> decoder_layer{i}
              -> decoder_output_norm -> output_of_encoder_decoder [-> output_softcapping]

Every block is Gemma 3's sandwich, every norm ``x / rms(x) * (1 + w)`` (eps ``rms_norm_eps``),
the MLP ``down(act(gate(n)) * up(n))`` with ``hidden_activation``::

    a = x + post_attention_norm(attention(attention_norm(x)))     _attention_norm, _wq/_wk/_wv,
                                                                  _q_norm/_k_norm, _attention,
                                                                  _attention_out,
                                                                  _post_attention_norm, _*_add
    y = a + post_ffn_norm(mlp(ffn_norm(a)))                       _ffn_norm, _ffn_*, _post_ffn_norm

(``_encoder_add`` / ``_encoder_output`` in the encoder, ``_self_attn_add`` /
``_decoder_output`` in the decoder, whose norms are ``_self_attn_norm`` and
``_post_self_attn_norm``.) Attention: q and k normalised per head (q_norm, k_norm), RoPE by
layer type (sliding: ``rope_parameters.sliding_attention``, full: ``full_attention``, linear
scaling on the real checkpoints), scores scaled by ``query_pre_attn_scalar^-1/2``:

- encoder: bidirectional; a sliding layer with window W sees keys ``q - ((W+1)//2 - 1) ..
  q + W//2`` (transformers' two-sided window), a full layer every key;
- decoder, merged attention: one softmax over its own causal keys (window W on a sliding
  layer: ``q - W < t <= q``) and every encoder key, the encoder's keys projected with the
  decoder layer's own k_proj, k_norm and v_proj (shared weights, ``shared_from``), without
  RoPE, once per prompt in the encoder stage (mha_core ``merge_cross_attention``). No separate
  cross-attention block, norm or residual.

Embeddings: one table for the encoder, the decoder and the tied head; rows scaled by sqrt(D)
rounded to the table's dtype, then the end-of-image token (``eoi_token_index``) takes the
learned ``eoi_embedding`` unscaled (``special_token_embedding``), then, in the encoder, the image
features replace the image tokens (``embedding_merge``). The head is the table (tied), then
``final_logit_softcapping`` when set. Decoding starts from ``decoder_start_token_id``
(generation_config.json, else config.json, else ``decoder.bos_token_id``).

Config (T5Gemma2Config, nested): ``encoder`` {``text_config``, ``vision_config``,
``mm_tokens_per_image``, ``boi_token_index``, ``eoi_token_index``}, ``decoder`` {...},
``image_token_index`` (256001), ``tie_word_embeddings``; each stack has its own layers, heads,
key-value heads, head_dim, intermediate_size, layer_types, sliding_window, rope_parameters,
query_pre_attn_scalar and hidden_activation; hidden_size and vocab_size must agree, as
transformers requires.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from causallm.api import createLayer, registerFactory, withKey
from causallm.io.config import JsonConfig
from causallm.io.safetensors import RenamedCheckpoint
from causallm.io.weight_table import Tensor, WeightTable
from causallm.runtime.properties import UINT_MAX
from causallm.layers.logit_softcapping import LogitSoftcappingLayer
from causallm.layers.reshaped_rms_norm import ReshapedRMSNormLayer
from causallm.layers.special_token_embedding import SpecialTokenEmbeddingLayer
from causallm.models.encoder_decoder import DECODER, ENCODER, EncoderDecoder
from causallm.models.gemma3.gemma3_causallm import (
    FULL,
    HIDDEN_ACTIVATIONS,
    SLIDING,
    Gemma3Transformer,
)
from causallm.models.gemma3.processor import Gemma3Processor
from causallm.models.language_model import GENERATION_KEYS
from causallm.models.siglip.siglip import SIGLIP_HEAD_IGNORED, siglipWeights
from causallm.models.transformer import ENCODER_ATTENTION, SELF_ATTENTION
from causallm.models.vision_language import IMAGE_INPUT, VisionLanguageModel


@dataclass
class StackConfig:
    """One stack's text settings (``encoder.text_config`` or ``decoder``)."""

    cfg: JsonConfig
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    eps: float
    act: str
    window: int
    layer_types: list
    rope: dict                 # layer type -> (theta, parameters)
    query_pre_attn_scalar: float
    attention_bias: bool

    @classmethod
    def read(cls, cfg: JsonConfig) -> "StackConfig":
        layers = cfg.get_int("num_hidden_layers", 26, minimum=1)
        heads = cfg.get_int("num_attention_heads", 8, minimum=1)
        kv = cfg.get_int("num_key_value_heads", 4, minimum=1)
        if heads % kv:
            raise cfg.error("num_key_value_heads", f"a divisor of num_attention_heads ({heads})")
        act = cfg.get_str("hidden_activation", "gelu_pytorch_tanh")
        if act not in HIDDEN_ACTIVATIONS:
            raise cfg.error("hidden_activation", f"one of {', '.join(HIDDEN_ACTIVATIONS)}")
        window = UINT_MAX if "sliding_window" in cfg and cfg["sliding_window"] is None \
            else cfg.get_int("sliding_window", 4096, minimum=1)
        scalar = cfg.get_float("query_pre_attn_scalar", 256.0)
        if not scalar > 0:
            raise cfg.error("query_pre_attn_scalar", "a positive number")
        return cls(cfg, layers, heads, kv, cfg.get_int("head_dim", 256, minimum=1),
                   cfg.get_int("intermediate_size", 9216, minimum=1),
                   cfg.get_float("rms_norm_eps", 1e-6), HIDDEN_ACTIVATIONS[act], window,
                   Gemma3Transformer.readLayerTypes(cfg, layers),
                   Gemma3Transformer.readRopeParameters(cfg), scalar,
                   cfg.get_bool("attention_bias", False))


def t5gemma2BaseConfig(cfg: JsonConfig, encoder: JsonConfig, decoder: JsonConfig) -> JsonConfig:
    """The flat keys the base Transformer reads (the decoder's shapes, the encoder's depth),
    from T5Gemma2's nested config."""
    text = encoder.get_dict("text_config", {})
    for key in ("hidden_size", "vocab_size"):
        a, b = text.get_int(key, 2304 if key == "hidden_size" else 262_208, minimum=1), \
            decoder.get_int(key, 2304 if key == "hidden_size" else 262_208, minimum=1)
        if a != b:
            raise decoder.error(key, f"encoder.text_config's ({a}): T5Gemma2 needs one {key}")
    start = cfg.get("decoder_start_token_id")
    if start is None:
        start = decoder.get_int("bos_token_id", 2, minimum=0)
    flat = {
        "vocab_size": decoder.get_int("vocab_size", 262_208, minimum=1),
        "hidden_size": decoder.get_int("hidden_size", 2304, minimum=1),
        "intermediate_size": decoder.get_int("intermediate_size", 9216, minimum=1),
        "num_hidden_layers": decoder.get_int("num_hidden_layers", 26, minimum=1),
        "num_encoder_layers": text.get_int("num_hidden_layers", 26, minimum=1),
        "num_decoder_layers": decoder.get_int("num_hidden_layers", 26, minimum=1),
        "num_attention_heads": decoder.get_int("num_attention_heads", 8, minimum=1),
        "num_key_value_heads": decoder.get_int("num_key_value_heads", 4, minimum=1),
        "head_dim": decoder.get_int("head_dim", 256, minimum=1),
        "rms_norm_eps": decoder.get_float("rms_norm_eps", 1e-6),
        "max_position_embeddings": decoder.get_int("max_position_embeddings", 131_072),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", True),
        "eos_token_id": cfg.get("eos_token_id", decoder.get("eos_token_id", 1)),
        "bos_token_id": cfg.get("bos_token_id", decoder.get("bos_token_id", 2)),
        "pad_token_id": cfg.get("pad_token_id", decoder.get("pad_token_id", 0)),
        **{k: cfg[k] for k in GENERATION_KEYS if k in cfg and cfg[k] is not None},
        "decoder_start_token_id": start,
    }
    return JsonConfig(flat, cfg.path, cfg.exists)


def _text_rows(stack: str, hf: str, names: dict[str, str]) -> list[Tensor]:
    """One text stack's rows: ``hf`` its HF prefix (``model.encoder.text_model.`` or
    ``model.decoder.``), ``names`` our norm names by HF norm."""
    L = hf + "layers.{i}."
    rows = [Tensor(f"{stack}_output_norm:gamma", hf + "norm.weight", offset=1.0)]
    for p in ("q", "k", "v"):
        rows += [Tensor(f"{stack}_layer{{i}}_w{p}:weight", L + f"self_attn.{p}_proj.weight",
                        transpose=True),
                 Tensor(f"{stack}_layer{{i}}_w{p}:bias", L + f"self_attn.{p}_proj.bias")]
    rows += [Tensor(f"{stack}_layer{{i}}_attention_out:weight", L + "self_attn.o_proj.weight",
                    transpose=True),
             Tensor(f"{stack}_layer{{i}}_attention_out:bias", L + "self_attn.o_proj.bias"),
             Tensor(f"{stack}_layer{{i}}_q_norm:gamma", L + "self_attn.q_norm.weight",
                    offset=1.0),
             Tensor(f"{stack}_layer{{i}}_k_norm:gamma", L + "self_attn.k_norm.weight",
                    offset=1.0)]
    rows += [Tensor(f"{stack}_layer{{i}}_{ours}:gamma", L + f"{theirs}.weight", offset=1.0)
             for theirs, ours in names.items()]
    rows += [Tensor(f"{stack}_layer{{i}}_ffn_{p}:weight", L + f"mlp.{p}_proj.weight",
                    transpose=True) for p in ("gate", "up", "down")]
    return rows


_ENC, _DEC = "model.encoder.", "model.decoder."
T5GEMMA2_WEIGHTS = WeightTable([
    Tensor("encoder_embedding0:Embedding", _ENC + "embed_tokens.weight",
           aliases=(_DEC + "embed_tokens.weight", "lm_head.out_proj.weight")),
    Tensor("encoder_eoi_embedding:embedding", _ENC + "embed_tokens.eoi_embedding",
           aliases=(_DEC + "embed_tokens.eoi_embedding",)),
    *_text_rows(ENCODER, _ENC, {"pre_self_attn_layernorm": "attention_norm",
                                "post_self_attn_layernorm": "post_attention_norm",
                                "pre_feedforward_layernorm": "ffn_norm",
                                "post_feedforward_layernorm": "post_ffn_norm"}),
    *_text_rows(DECODER, _DEC, {"pre_self_attn_layernorm": "self_attn_norm",
                                "post_self_attn_layernorm": "post_self_attn_norm",
                                "pre_feedforward_layernorm": "ffn_norm",
                                "post_feedforward_layernorm": "post_ffn_norm"}),
    *siglipWeights("model.encoder.vision_tower.", "model.encoder.multi_modal_projector."),
], ignore=[f"model.encoder.vision_tower.{i}" for i in SIGLIP_HEAD_IGNORED])
"""T5Gemma2ForConditionalGeneration's names as transformers saves them (its checkpoint layout:
the text encoder's and the vision tower's modules, ``text_model`` and ``vision_model``, do not
appear): the one embedding (``lm_head.out_proj`` and the decoder's are its tied copies, as is
the decoder's eoi_embedding), the two text stacks, the vision tower and projector."""

MODULE_NAMES = (("model.encoder.text_model.", "model.encoder."),
                ("model.encoder.vision_tower.vision_model.", "model.encoder.vision_tower."))
"""The module tree's names (a ``state_dict()`` saved as is; the Hub's SigLIP tower keeps its
``vision_model``): prefix there -> prefix here."""


class T5Gemma2ForConditionalGeneration(VisionLanguageModel, EncoderDecoder):
    """``T5Gemma2ForConditionalGeneration`` (module docstring)."""

    PROCESSOR = Gemma3Processor  # the fork's T5Gemma2Processor is Gemma 3's

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        encoder, decoder = cfg.get_dict("encoder", {}), cfg.get_dict("decoder", {})
        text = encoder.get_dict("text_config", {})
        self.stacks = {ENCODER: StackConfig.read(text), DECODER: StackConfig.read(decoder)}
        super().setupParameters(t5gemma2BaseConfig(cfg, encoder, decoder), generation_cfg,
                                nntr_cfg)
        for stack, sc in self.stacks.items():
            prefix = stack.upper()
            setattr(self, f"{prefix}_NUM_HEADS", sc.num_heads)
            setattr(self, f"{prefix}_HEAD_DIM", sc.head_dim)
            setattr(self, f"{prefix}_INTERMEDIATE_SIZE", sc.intermediate_size)
        self.FINAL_LOGIT_SOFTCAPPING = decoder.get_float("final_logit_softcapping", 0.0)
        if self.FINAL_LOGIT_SOFTCAPPING < 0:
            raise decoder.error("final_logit_softcapping", "a positive number or null")
        # transformers multiplies by sqrt(hidden) cast to the embedding table's dtype
        scale_dtype = np.float16 if self.EMBEDDING_DTYPE.upper() == "FP16" else np.float32
        self.EMBEDDING_SCALE = float(scale_dtype(math.sqrt(self.DIM)))
        self.setupVision(encoder.get_dict("vision_config", {}), encoder,
                         cfg.get_int("image_token_index", 256_001, minimum=0), self.DIM)

    def readHiddenAct(self, cfg: JsonConfig) -> str:
        return self.stacks[DECODER].act

    @staticmethod
    def readRope(cfg: JsonConfig) -> tuple[float, dict]:
        return 10_000.0, {"rope_type": "default"}  # per stack and layer type: StackConfig

    # -- graph ------------------------------------------------------------------------------
    def constructModel(self) -> None:
        super().constructModel()
        self.createVisionStage()

    def createStackInput(self, stack: str, input_name: str) -> tuple[list, str]:
        """The scaled embedding, the eoi vector, and in the encoder the image features."""
        layers, name = super().createStackInput(stack, input_name)
        eoi = f"{stack}_eoi_embedding"
        props = [withKey("name", eoi), withKey("token_id", self.EOI_TOKEN_ID),
                 withKey("input_layers", f"{input_name},{name}")]
        if stack == DECODER:
            props.append(withKey("shared_from", f"{ENCODER}_eoi_embedding"))
        layers.append(createLayer("special_token_embedding", props))
        if stack == DECODER:
            return layers, eoi
        layers += self.createImageMerge(f"{ENCODER}_image_merge", input_name,
                                        self.IMAGE_TOKEN_ID, eoi, self.INIT_SEQ_LEN)
        return layers, f"{ENCODER}_image_merge"

    def createStackOutput(self, stack: str, input_name: str) -> tuple[list, str]:
        name = f"{stack}_output_norm"
        return [self.stackNorm(stack, name, input_name)], name

    def createHead(self, input_name: str) -> tuple[list, str]:
        layers, logits = super().createHead(input_name)
        if self.FINAL_LOGIT_SOFTCAPPING:
            layers.append(createLayer("logit_softcapping", [
                withKey("name", "output_softcapping"), withKey("input_layers", logits),
                withKey("softcapping", self.FINAL_LOGIT_SOFTCAPPING)]))
            logits = "output_softcapping"
        return layers, logits

    def stackNorm(self, stack: str, name: str, input_name: str):
        return createLayer("rms_norm", [
            withKey("name", name), withKey("input_layers", input_name),
            withKey("epsilon", self.stacks[stack].eps), withKey("packed", "false")])

    def createSandwichBlock(self, stack: str, layer_id: int, input_name: str,
                            attention: list, names: tuple[str, str, str, str]) -> list:
        """norm -> attention -> post norm -> add -> norm -> MLP -> post norm -> add; ``names``:
        the pre-attention norm, the post-attention norm, the first and the second sum."""
        p = f"{stack}_layer{layer_id}"
        pre, post, add, out = (f"{p}_{n}" for n in names)
        sc = self.stacks[stack]
        return [self.stackNorm(stack, pre, input_name), *attention,
                self.stackNorm(stack, post, f"{p}_attention_out"),
                self.createAddition(add, input_name, post),
                self.stackNorm(stack, f"{p}_ffn_norm", add),
                *self.createMlp(layer_id, self.DIM, sc.intermediate_size, f"{p}_ffn_norm",
                                prefix=p),
                self.stackNorm(stack, f"{p}_post_ffn_norm", f"{p}_ffn_down"),
                self.createAddition(out, add, f"{p}_post_ffn_norm")]

    def createTransformerEncoderBlock(self, layer_id: int, input_name: str) -> list:
        p = f"{ENCODER}_layer{layer_id}"
        attention = self.createStackAttention(ENCODER, layer_id, f"{p}_attention_norm")
        return self.createSandwichBlock(ENCODER, layer_id, input_name, attention,
                                        ("attention_norm", "post_attention_norm", "encoder_add",
                                         "encoder_output"))

    def createTransformerDecoderBlock(self, layer_id: int, input_name: str,
                                      encoder_output_name: str = "encoder_output_norm") -> list:
        p = f"{DECODER}_layer{layer_id}"
        attention = self.createStackAttention(DECODER, layer_id, f"{p}_self_attn_norm",
                                              encoder_output_name)
        return self.createSandwichBlock(DECODER, layer_id, input_name, attention,
                                        ("self_attn_norm", "post_self_attn_norm",
                                         "self_attn_add", "decoder_output"))

    def createStackAttention(self, stack: str, layer_id: int, input_name: str,
                             encoder_output: str | None = None) -> list:
        """Q, K, V, the per-head q/k norms, the core and O of one layer; with
        ``encoder_output`` (the decoder), the merged attention's cross K and V from it through
        the same K, k_norm and V weights."""
        sc = self.stacks[stack]
        p = f"{stack}_layer{layer_id}"
        kv_width = sc.num_kv_heads * sc.head_dim

        def linear(name, unit, source, shared=None):
            return self.createFullyConnected(name, unit, source, sc.attention_bias, shared)

        def head_norm(name, source, shared=None):
            props = [withKey("name", name), withKey("input_layers", source),
                     withKey("packed", "false"), withKey("epsilon", sc.eps),
                     withKey("feature_size", sc.head_dim)]
            if shared:
                props.append(withKey("shared_from", shared))
            return createLayer("reshaped_rms_norm", props)

        layers = [linear(f"{p}_wq", sc.num_heads * sc.head_dim, input_name),
                  linear(f"{p}_wk", kv_width, input_name),
                  linear(f"{p}_wv", kv_width, input_name),
                  head_norm(f"{p}_q_norm", f"{p}_wq"), head_norm(f"{p}_k_norm", f"{p}_wk")]
        inputs = [f"{p}_q_norm", f"{p}_k_norm", f"{p}_wv"]
        if encoder_output is not None:
            layers += [linear(f"{p}_cross_wk", kv_width, encoder_output, shared=f"{p}_wk"),
                       head_norm(f"{p}_cross_k_norm", f"{p}_cross_wk", shared=f"{p}_k_norm"),
                       linear(f"{p}_cross_wv", kv_width, encoder_output, shared=f"{p}_wv")]
            inputs += [f"{p}_cross_k_norm", f"{p}_cross_wv"]
        kind = ENCODER_ATTENTION if stack == ENCODER else SELF_ATTENTION
        layers.append(self.createAttentionCore(f"{p}_attention", layer_id, sc.num_heads,
                                               inputs, kind))
        layers.append(linear(f"{p}_attention_out", self.DIM, f"{p}_attention"))
        return layers

    def attentionCoreProperties(self, layer_id: int, n_heads: int,
                                kind: str = SELF_ATTENTION) -> dict:
        """The stack's heads, RoPE and window by layer type; the encoder bidirectional with
        transformers' two-sided window, the decoder causal and merged with the encoder."""
        stack = ENCODER if kind == ENCODER_ATTENTION else DECODER
        sc = self.stacks[stack]
        sliding = sc.layer_types[layer_id] == SLIDING
        theta, scaling = sc.rope[SLIDING if sliding else FULL]
        props = {"num_heads": n_heads, "num_heads_KV": sc.num_kv_heads,
                 "rope_theta": theta, "query_pre_attn_scalar": sc.query_pre_attn_scalar,
                 "max_new_tokens": self.NUM_TO_GENERATE,
                 "max_position_embeddings": self.MAX_POSITION_EMBEDDINGS,
                 **self.ropeProperties(scaling)}
        W = sc.window if sliding else UINT_MAX
        if stack == ENCODER:
            props.update(max_timestep=self.INIT_SEQ_LEN, is_causal=False,
                         sliding_window=(W + 1) // 2 if sliding else UINT_MAX,
                         sliding_window_right=W // 2 + 1 if sliding else 0)
        else:
            props.update(max_timestep=self.DECODER_SEQ_LEN, is_causal=True, sliding_window=W,
                         merge_cross_attention=True)
        return props

    def createMlp(self, layer_id: int, dim: int, hidden_dim: int, input_name: str,
                  prefix: str = "") -> list:
        """Gemma 3's gated MLP with the stack's activation."""
        stack = ENCODER if prefix.startswith(ENCODER) else DECODER
        p = prefix
        return [
            self.createFullyConnected(f"{p}_ffn_gate", hidden_dim, input_name),
            createLayer("activation", [withKey("name", f"{p}_ffn_gate_act"),
                                       withKey("activation", self.stacks[stack].act),
                                       withKey("input_layers", f"{p}_ffn_gate")]),
            self.createFullyConnected(f"{p}_ffn_up", hidden_dim, input_name),
            createLayer("multiply", [withKey("name", f"{p}_ffn_geglu"),
                                     withKey("input_layers", f"{p}_ffn_gate_act,{p}_ffn_up")]),
            self.createFullyConnected(f"{p}_ffn_down", dim, f"{p}_ffn_geglu"),
        ]

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        for layer_class in (ReshapedRMSNormLayer, SpecialTokenEmbeddingLayer,
                            LogitSoftcappingLayer):
            registerFactory(layer_class)

    # -- weights and inputs -----------------------------------------------------------------
    def getHFWeightTable(self) -> WeightTable:
        return T5GEMMA2_WEIGHTS

    def openHFCheckpoint(self, folder: str):
        return RenamedCheckpoint(super().openHFCheckpoint(folder), MODULE_NAMES)

    def encoderInputNames(self) -> list[str]:
        return ["encoder_input0", IMAGE_INPUT]

    def encoderInputs(self, ids: np.ndarray) -> list:
        """The ids and the image feature rows at their image tokens."""
        rows, _ = self.imageRows(ids)
        return [ids, rows.reshape(rows.shape[0], -1)]
