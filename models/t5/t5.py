"""T5 (original, v1.1 and Flan): HF ``modeling_t5.py`` ``T5ForConditionalGeneration`` on
:class:`EncoderDecoder`; the architecture NNTrainer's encoder-decoder note names first.

The note's T5 is wrong in several places (docs/nntrainer.md, "Where the plan is wrong"); this
follows transformers:

- Embedding ``shared`` without a scale (the note multiplies by sqrt(d_model)); the encoder and
  decoder embeddings are the same tensor.
- Norms are RMS norms without bias or mean, eps ``layer_norm_epsilon`` (``rms_norm``).
- Attention, per head of d_kv (``d_kv * num_heads`` may differ from d_model), with no RoPE and
  no 1/sqrt(d) scaling (``query_pre_attn_scalar`` 1)::

      s[h, p, t] = q_p . k_t + W[bucket(t - p), h]         self-attention
      s[h, p, t] = q_p . k_t                               cross-attention (no bias)

  where W is the stack's ``relative_attention_bias`` [num_buckets, heads], computed once per
  stack (``encoder_position_bias``, ``decoder_position_bias``: layers/relative_position_bias.py)
  and added by every layer, with bidirectional buckets in the encoder and causal ones in the
  decoder; distances past ``relative_attention_max_distance`` share the last buckets.
- Feed-forward ``feed_forward_proj``: ``relu`` (original T5: wo(relu(wi x))) or ``gated-gelu``
  (v1.1, Flan: wo(gelu_new(wi_0 x) * wi_1 x)); ``gated-{act}`` / ``{act}`` in general.
- The head: tied to ``shared`` with the decoder output scaled by d_model^-1/2 (config
  ``tie_word_embeddings`` true, the default), or its own ``lm_head`` unscaled (v1.1 and Flan set
  it false). Decoding starts from ``decoder_start_token_id`` (the pad id, 0).

Layer names: :class:`EncoderDecoder`'s, with the MLP ``{p}_ffn_up`` (wi), ``_ffn_act``,
``_ffn_down`` (wo), or gated ``{p}_ffn_gate`` (wi_0), ``_ffn_gate_act``, ``_ffn_up`` (wi_1),
``_ffn_geglu``, ``_ffn_down`` (wo). Hugging Face names: :data:`T5_WEIGHTS`.

Config keys (T5Config): vocab_size, d_model, d_kv, d_ff, num_layers, num_decoder_layers
(default num_layers), num_heads, relative_attention_num_buckets (32),
relative_attention_max_distance (128), feed_forward_proj (relu), layer_norm_epsilon (1e-6),
tie_word_embeddings (true), decoder_start_token_id (0 when absent, as T5 decodes from pad),
eos_token_id (1).
"""

from __future__ import annotations

from causallm.api import createLayer, registerFactory, withKey
from causallm.io.config import JsonConfig
from causallm.io.weight_table import Tensor, WeightTable
from causallm.runtime.properties import UINT_MAX
from causallm.layers.relative_position_bias import RelativePositionBiasLayer
from causallm.models.encoder_decoder import DECODER, ENCODER, EncoderDecoder
from causallm.models.language_model import GENERATION_KEYS
from causallm.models.transformer import CROSS_ATTENTION, ENCODER_ATTENTION, SELF_ATTENTION

T5_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "tanh_gelu",
                  "gelu_pytorch_tanh": "tanh_gelu", "silu": "swish", "swish": "swish",
                  "tanh": "tanh", "sigmoid": "sigmoid"}
"""``feed_forward_proj``'s activation (transformers' ACT2FN name) -> NNTrainer ``activation``."""

_ENC, _DEC = "encoder.block.{i}.layer.", "decoder.block.{i}.layer."
T5_WEIGHTS = WeightTable([
    Tensor("encoder_embedding0:Embedding", "shared.weight",
           aliases=("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                    "lm_head.weight")),
    Tensor("encoder_position_bias:weight",
           "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
    Tensor("encoder_layer{i}_attention_norm:gamma", _ENC + "0.layer_norm.weight"),
    Tensor("encoder_layer{i}_w{p}:weight", _ENC + "0.SelfAttention.{p}.weight", transpose=True),
    Tensor("encoder_layer{i}_attention_out:weight", _ENC + "0.SelfAttention.o.weight",
           transpose=True),
    Tensor("encoder_layer{i}_ffn_norm:gamma", _ENC + "1.layer_norm.weight"),
    Tensor("encoder_output_norm:gamma", "encoder.final_layer_norm.weight"),
    Tensor("decoder_position_bias:weight",
           "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"),
    Tensor("decoder_layer{i}_self_attn_norm:gamma", _DEC + "0.layer_norm.weight"),
    Tensor("decoder_layer{i}_w{p}:weight", _DEC + "0.SelfAttention.{p}.weight", transpose=True),
    Tensor("decoder_layer{i}_attention_out:weight", _DEC + "0.SelfAttention.o.weight",
           transpose=True),
    Tensor("decoder_layer{i}_cross_attn_norm:gamma", _DEC + "1.layer_norm.weight"),
    Tensor("decoder_layer{i}_cross_w{p}:weight", _DEC + "1.EncDecAttention.{p}.weight",
           transpose=True),
    Tensor("decoder_layer{i}_cross_attention_out:weight", _DEC + "1.EncDecAttention.o.weight",
           transpose=True),
    Tensor("decoder_layer{i}_ffn_norm:gamma", _DEC + "2.layer_norm.weight"),
    Tensor("decoder_output_norm:gamma", "decoder.final_layer_norm.weight"),
    Tensor("output_of_encoder_decoder:weight", "lm_head.weight", transpose=True),
], ignore=["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"])
"""T5ForConditionalGeneration's names, without the feed-forward (T5_RELU_WEIGHTS,
T5_GATED_WEIGHTS). ``shared`` is the one embedding (encoder, decoder and a tied head); files
may also hold its copies ``encoder.embed_tokens``, ``decoder.embed_tokens`` and, tied,
``lm_head``. Old checkpoints carry an unused cross-attention bias table."""


def _ffn(*rows: tuple[str, str]) -> list[Tensor]:
    """The feed-forward rows of both stacks (encoder sub-layer 1, decoder sub-layer 2)."""
    return [Tensor(f"{stack}_layer{{i}}_{ours}:weight", f"{prefix}{sub}.DenseReluDense.{hf}.weight",
                   transpose=True)
            for stack, prefix, sub in (("encoder", _ENC, 1), ("decoder", _DEC, 2))
            for ours, hf in rows]


T5_RELU_WEIGHTS = T5_WEIGHTS.extend(_ffn(("ffn_up", "wi"), ("ffn_down", "wo")))
"""Original T5: ``DenseReluDense.wi``, ``.wo``."""
T5_GATED_WEIGHTS = T5_WEIGHTS.extend(_ffn(("ffn_gate", "wi_0"), ("ffn_up", "wi_1"),
                                          ("ffn_down", "wo")))
"""T5 v1.1 and Flan: ``DenseReluDense.wi_0`` (gated), ``.wi_1``, ``.wo``."""


def t5BaseConfig(cfg: JsonConfig) -> JsonConfig:
    """config.json under the key names the base Transformer reads (T5Config.attribute_map:
    hidden_size = d_model, num_attention_heads = num_heads, num_hidden_layers = num_layers,
    head_dim = d_kv), built from T5's own keys; errors name T5's keys."""
    num_layers = cfg.get_int("num_layers", minimum=1)
    return JsonConfig({
        "vocab_size": cfg.get("vocab_size"),
        "hidden_size": cfg.get_int("d_model", minimum=1),
        "intermediate_size": cfg.get_int("d_ff", minimum=1),
        "num_hidden_layers": num_layers,
        "num_encoder_layers": num_layers,
        "num_decoder_layers": cfg.get_int("num_decoder_layers", num_layers, minimum=1),
        "num_attention_heads": cfg.get_int("num_heads", minimum=1),
        "head_dim": cfg.get_int("d_kv", minimum=1),
        "rms_norm_eps": cfg.get_float("layer_norm_epsilon", 1e-6),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", True),
        **{k: cfg[k] for k in GENERATION_KEYS if k in cfg},
        "eos_token_id": cfg.get("eos_token_id", 1),
        "decoder_start_token_id": next((cfg[k] for k in ("decoder_start_token_id", "pad_token_id")
                                        if cfg.contains(k)), 0),
    }, cfg.path, cfg.exists)


class T5ForConditionalGeneration(EncoderDecoder):
    """``T5ForConditionalGeneration``: the T5 encoder-decoder (module docstring)."""

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(t5BaseConfig(cfg), generation_cfg, nntr_cfg)
        self.NUM_BUCKETS = cfg.get_int("relative_attention_num_buckets", 32, minimum=2)
        self.MAX_DISTANCE = cfg.get_int("relative_attention_max_distance", 128, minimum=1)
        proj = cfg.get_str("feed_forward_proj", "relu")
        parts = proj.split("-")
        act = "gelu_new" if proj == "gated-gelu" else parts[-1]
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated") or act not in T5_ACTIVATIONS:
            raise cfg.error("feed_forward_proj", f"'ACT' or 'gated-ACT' with ACT one of "
                                                 f"{', '.join(T5_ACTIVATIONS)}")
        self.IS_GATED_ACT = len(parts) == 2
        self.HIDDEN_ACT = T5_ACTIVATIONS[act]
        self.ATTENTION_BIAS = False
        self.MLP_BIAS = False
        # transformers scales the decoder output before a tied head (scale_decoder_outputs)
        self.LM_HEAD_SCALE = self.DIM ** -0.5 if self.TIE_WORD_EMBEDDINGS else 1.0

    def readHiddenAct(self, cfg: JsonConfig) -> str:
        return "relu"  # the feed-forward's activation comes from feed_forward_proj

    # -- graph ------------------------------------------------------------------------------
    def createPositionBias(self, stack: str, input_name: str) -> list:
        """``{stack}_position_bias``: the stack's bucketed relative position bias."""
        T = self.INIT_SEQ_LEN if stack == ENCODER else self.DECODER_SEQ_LEN
        return [createLayer("relative_position_bias", [
            withKey("name", f"{stack}_position_bias"), withKey("input_layers", input_name),
            withKey("num_heads", self.NUM_HEADS), withKey("max_timestep", T),
            withKey("num_buckets", self.NUM_BUCKETS), withKey("max_distance", self.MAX_DISTANCE),
            withKey("bidirectional", stack == ENCODER)])]

    def attentionBiasInput(self, kind: str) -> str | None:
        return {ENCODER_ATTENTION: f"{ENCODER}_position_bias",
                SELF_ATTENTION: f"{DECODER}_position_bias", CROSS_ATTENTION: None}[kind]

    def attentionCoreProperties(self, layer_id: int, n_heads: int,
                                kind: str = SELF_ATTENTION) -> dict:
        """No RoPE and no score scaling (the bias carries the positions)."""
        props = {k: v for k, v in super().attentionCoreProperties(layer_id, n_heads, kind).items()
                 if not k.startswith("rope_")}
        props.update(use_rope=False, query_pre_attn_scalar=1.0, sliding_window=UINT_MAX)
        return props

    def createMlp(self, layer_id: int, dim: int, hidden_dim: int, input_name: str,
                  prefix: str = "") -> list:
        p = prefix or f"layer{layer_id}"
        down = self.createFullyConnected(
            f"{p}_ffn_down", dim, f"{p}_ffn_geglu" if self.IS_GATED_ACT else f"{p}_ffn_act")
        if not self.IS_GATED_ACT:  # T5DenseActDense: wo(act(wi x))
            return [self.createFullyConnected(f"{p}_ffn_up", hidden_dim, input_name),
                    createLayer("activation", [withKey("name", f"{p}_ffn_act"),
                                               withKey("activation", self.HIDDEN_ACT),
                                               withKey("input_layers", f"{p}_ffn_up")]),
                    down]
        return [  # T5DenseGatedActDense: wo(act(wi_0 x) * wi_1 x)
            self.createFullyConnected(f"{p}_ffn_gate", hidden_dim, input_name),
            createLayer("activation", [withKey("name", f"{p}_ffn_gate_act"),
                                       withKey("activation", self.HIDDEN_ACT),
                                       withKey("input_layers", f"{p}_ffn_gate")]),
            self.createFullyConnected(f"{p}_ffn_up", hidden_dim, input_name),
            createLayer("multiply", [withKey("name", f"{p}_ffn_geglu"),
                                     withKey("input_layers", f"{p}_ffn_gate_act,{p}_ffn_up")]),
            down]

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(RelativePositionBiasLayer)

    def getHFWeightTable(self) -> WeightTable:
        return T5_GATED_WEIGHTS if self.IS_GATED_ACT else T5_RELU_WEIGHTS
