"""BART (HF ``modeling_bart.py`` ``BartForConditionalGeneration``) on :class:`EncoderDecoder`,
with the LayerNorm blocks of :class:`LayerNormTransformer`; the family NNTrainer's note names
beside T5.

Each stack (encoder, decoder), token ids t at positions p::

    h = LN_e(E[t] * s + P[p + 2])      ``{stack}_embedding0`` (s = sqrt(d_model) with
                                       ``scale_embedding``, else 1),
                                       ``{stack}_position_embedding`` (learned, offset 2),
                                       ``{stack}_embedding_norm`` (``layernorm_embedding``)

then post-norm blocks, ``norm(x + f(x))`` (:class:`EncoderDecoder` with NORMALIZE_BEFORE false):
self-attention (and in the decoder cross-attention) with biases on q, k, v and out, scaled by
head_dim^-1/2, no RoPE; the feed-forward ``fc2(act(fc1(x)))`` with biases, act =
``activation_function`` (gelu: the exact erf form). No final norm. The head is tied to the
shared embedding, plus ``final_logits_bias`` (``logit_bias``). The stacks may have their own
heads and feed-forward widths (``encoder_attention_heads`` / ``decoder_attention_heads``,
``encoder_ffn_dim`` / ``decoder_ffn_dim``).

Generation starts from ``decoder_start_token_id`` (the EOS id, 2); ``forced_bos_token_id`` and
``forced_eos_token_id`` act as in transformers (causallm/generation/processors.py), read from
generation_config.json (transformers 5's BartConfig drops ``forced_bos_token_id`` from
config.json, so a folder without generation_config.json gets it from config.json's raw keys, as
``from_pretrained`` does).

Layer names: :class:`EncoderDecoder`'s post-norm names, the MLP ``{p}_ffn_up`` (fc1),
``_ffn_act``, ``_ffn_down`` (fc2). Hugging Face names: :data:`BART_WEIGHTS`.
Not supported: ``tie_word_embeddings`` false (transformers 5 then unties the encoder and decoder
embeddings as well), mBART's pre-norm layout (``add_final_layer_norm``).
"""

from __future__ import annotations

import math

from causallm.api import createLayer, registerFactory, withKey
from causallm.io.config import JsonConfig
from causallm.io.weight_table import Tensor, WeightTable
from causallm.layers.logit_bias import LogitBiasLayer
from causallm.models.encoder_decoder import DECODER, ENCODER, EncoderDecoder
from causallm.models.language_model import GENERATION_KEYS
from causallm.models.layer_norm_transformer import LayerNormTransformer

BART_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "tanh_gelu",
                    "gelu_pytorch_tanh": "tanh_gelu", "silu": "swish", "swish": "swish",
                    "tanh": "tanh"}
"""``activation_function`` (transformers' ACT2FN name) -> NNTrainer ``activation``."""


def _attention(ours: str, hf: str) -> list[Tensor]:
    """q, k, v, out projections (weight read transposed, bias) of one attention."""
    return [Tensor(f"{ours}_{o}:{kind}", f"{hf}.{h}_proj.{kind}", transpose=kind == "weight")
            for o, h in (("wq", "q"), ("wk", "k"), ("wv", "v"), ("attention_out", "out"))
            for kind in ("weight", "bias")]


def _norm(ours: str, hf: str) -> list[Tensor]:
    return [Tensor(f"{ours}:gamma", f"{hf}.weight"), Tensor(f"{ours}:beta", f"{hf}.bias")]


def _linear(ours: str, hf: str) -> list[Tensor]:
    return [Tensor(f"{ours}:weight", f"{hf}.weight", transpose=True),
            Tensor(f"{ours}:bias", f"{hf}.bias")]


_E, _D = "model.encoder.layers.{i}.", "model.decoder.layers.{i}."
BART_WEIGHTS = WeightTable([
    Tensor("encoder_embedding0:Embedding", "model.shared.weight",
           aliases=("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                    "lm_head.weight")),
    *(Tensor(f"{stack}_position_embedding:Embedding", f"model.{stack}.embed_positions.weight")
      for stack in (ENCODER, DECODER)),
    *(t for stack in (ENCODER, DECODER)
      for t in _norm(f"{stack}_embedding_norm", f"model.{stack}.layernorm_embedding")),
    *_attention("encoder_layer{i}", _E + "self_attn"),
    *_norm("encoder_layer{i}_attention_norm", _E + "self_attn_layer_norm"),
    *_linear("encoder_layer{i}_ffn_up", _E + "fc1"),
    *_linear("encoder_layer{i}_ffn_down", _E + "fc2"),
    *_norm("encoder_layer{i}_encoder_output", _E + "final_layer_norm"),
    *_attention("decoder_layer{i}", _D + "self_attn"),
    *_norm("decoder_layer{i}_self_attn_norm", _D + "self_attn_layer_norm"),
    *_attention("decoder_layer{i}_cross", _D + "encoder_attn"),
    *_norm("decoder_layer{i}_cross_attn_norm", _D + "encoder_attn_layer_norm"),
    *_linear("decoder_layer{i}_ffn_up", _D + "fc1"),
    *_linear("decoder_layer{i}_ffn_down", _D + "fc2"),
    *_norm("decoder_layer{i}_decoder_output", _D + "final_layer_norm"),
    Tensor("final_logits_bias:bias", "final_logits_bias", part=(0,)),
])
"""BartForConditionalGeneration's names. ``model.shared`` is the one embedding (encoder,
decoder, tied head); files may also hold its copies. ``final_logits_bias`` is [1, V]."""


def bartBaseConfig(cfg: JsonConfig) -> JsonConfig:
    """config.json under the key names the base Transformer reads (BartConfig.attribute_map:
    hidden_size = d_model, num_attention_heads = encoder_attention_heads, num_hidden_layers =
    encoder_layers), from BART's own keys; errors name BART's keys."""
    layers = cfg.get_int("encoder_layers", minimum=1)
    return JsonConfig({
        "vocab_size": cfg.get("vocab_size"),
        "hidden_size": cfg.get_int("d_model", minimum=1),
        "intermediate_size": cfg.get_int("encoder_ffn_dim", minimum=1),
        "num_hidden_layers": layers,
        "num_encoder_layers": layers,
        "num_decoder_layers": cfg.get_int("decoder_layers", minimum=1),
        "num_attention_heads": cfg.get_int("encoder_attention_heads", minimum=1),
        "max_position_embeddings": cfg.get_int("max_position_embeddings", minimum=1),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", True),
        **{k: cfg[k] for k in GENERATION_KEYS if k in cfg},
    }, cfg.path, cfg.exists)


class BartForConditionalGeneration(EncoderDecoder, LayerNormTransformer):
    """``BartForConditionalGeneration`` (module docstring)."""

    NORMALIZE_BEFORE = False
    EMBEDDING_NORM = True  # layernorm_embedding after the positions

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(bartBaseConfig(cfg), generation_cfg, nntr_cfg)
        if not self.TIE_WORD_EMBEDDINGS:
            raise cfg.error("tie_word_embeddings", "true (untied BART embeddings are not "
                                                   "supported)")
        if cfg.get_bool("add_final_layer_norm", False):
            raise cfg.error("add_final_layer_norm", "false (mBART's layout is not supported)")
        self.ENCODER_NUM_HEADS = self.NUM_HEADS
        self.DECODER_NUM_HEADS = cfg.get_int("decoder_attention_heads", minimum=1)
        for key, heads in (("encoder_attention_heads", self.ENCODER_NUM_HEADS),
                           ("decoder_attention_heads", self.DECODER_NUM_HEADS)):
            if self.DIM % heads:
                raise cfg.error(key, f"a divisor of d_model ({self.DIM})")
        self.ENCODER_HEAD_DIM = self.DIM // self.ENCODER_NUM_HEADS
        self.DECODER_HEAD_DIM = self.DIM // self.DECODER_NUM_HEADS
        self.ENCODER_INTERMEDIATE_SIZE = self.INTERMEDIATE_SIZE
        self.DECODER_INTERMEDIATE_SIZE = cfg.get_int("decoder_ffn_dim", minimum=1)
        self.NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which BART uses
        self.ATTENTION_BIAS = self.MLP_BIAS = True
        act = cfg.get_str("activation_function", "gelu")
        if act not in BART_ACTIVATIONS:
            raise cfg.error("activation_function", f"one of {', '.join(BART_ACTIVATIONS)}")
        self.HIDDEN_ACT = BART_ACTIVATIONS[act]
        self.EMBEDDING_SCALE = (math.sqrt(self.DIM) if cfg.get_bool("scale_embedding", False)
                                else 1.0)
        self.MAX_POSITIONS = self.MAX_POSITION_EMBEDDINGS  # learned: no position past them

    def readHiddenAct(self, cfg: JsonConfig) -> str:
        return "gelu"  # the feed-forward's activation comes from activation_function

    # -- graph ------------------------------------------------------------------------------
    def createStackInput(self, stack: str, input_name: str) -> tuple[list, str]:
        """The token embedding, the positions added (``{stack}_position_embedding``), and
        ``layernorm_embedding`` (``{stack}_embedding_norm``) when the family has it."""
        layers, name = super().createStackInput(stack, input_name)
        layers.append(self.createPositionEmbedding(f"{stack}_position_embedding", name))
        name = f"{stack}_position_embedding"
        if self.EMBEDDING_NORM:
            layers.append(self.createNorm(f"{stack}_embedding_norm", name))
            name = f"{stack}_embedding_norm"
        return layers, name

    def createPositionEmbedding(self, name: str, input_name: str):
        """BART's learned positions: position p reads row p + 2 of max_position_embeddings + 2."""
        return createLayer("positional_embedding", [
            withKey("name", name), withKey("input_layers", input_name),
            withKey("max_position_embeddings", self.MAX_POSITION_EMBEDDINGS + 2),
            withKey("offset", 2), withKey("weight_dtype", self.EMBEDDING_DTYPE)])

    def createHead(self, input_name: str) -> tuple[list, str]:
        """The tied head, then ``final_logits_bias``."""
        layers, logits = super().createHead(input_name)
        layers.append(createLayer("logit_bias", [withKey("name", "final_logits_bias"),
                                                 withKey("input_layers", logits)]))
        return layers, "final_logits_bias"

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(LogitBiasLayer)

    def getHFWeightTable(self) -> WeightTable:
        return BART_WEIGHTS
