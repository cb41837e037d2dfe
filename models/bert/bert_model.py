"""BERT encoders: ``BertModel`` read as a sentence encoder (HF ``modeling_bert.py``).

nntrainer's CausalLM has no BERT; this file follows its model files (a Transformer subclass
building the graph with the same layer types and naming). BertTransformer is a post-norm,
bidirectional encoder with learned absolute positions, biased projections and a GELU MLP:

    h0 = LN_e(E[id_i] + T[0] + P[i])                     word + token type 0 + position
    a  = LN_a(h + softmax(q k^T / sqrt(d)) v Wo + bo)    q|k|v = h Wq|Wk|Wv + b, every key seen
    h' = LN_o(a + act(a Wi + bi) Wd + bd)                act = hidden_act (gelu: exact erf)

LN(x) = (x - mean) / sqrt(var + eps) * gamma + beta (``layer_normalization``, eps =
layer_norm_eps); no RoPE (mha_core ``use_rope=false``, ``is_causal=false``); token types are
all 0, the default of HF's ``token_type_ids``. There is no final norm: the last block's output
is the token embeddings a sentence-transformers Pooling reads. BertModel's pooler (dense + tanh
on [CLS]) is not part of a sentence embedding and is not built.

Layer names in insertion (= .bin) order: input0, embedding0 (word embeddings),
embedding_position (positions, then token types), embedding_norm (gamma, beta), then per block
layer{i}_wq, _wk, _wv (weight, bias each), _attention (mha_core), _attention_out,
_decoder_add, _attention_norm (gamma, beta), _ffn_up, _ffn_act (activation), _ffn_down,
_ffn_add, _decoder_output (the block's output LayerNorm: gamma, beta).

Hugging Face names: ``embeddings.*`` and ``encoder.layer.{i}.*`` as a saved ``BertModel``
has them (a ``bert.`` prefix, as in BertFor* checkpoints, is dropped when loading through
SentenceTransformer); ``pooler.*`` and the ``embeddings.position_ids`` buffer are ignored.

Config keys (BertConfig): vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
intermediate_size, max_position_embeddings (512), type_vocab_size (2), layer_norm_eps (1e-12),
hidden_act (gelu, gelu_new, gelu_pytorch_tanh, relu, silu). ``position_embedding_type`` other
than absolute and ``is_decoder`` are rejected.
"""

from __future__ import annotations

from causallm.api import createLayer, createModel, withKey
from causallm.io.config import JsonConfig
from causallm.io.weight_table import Tensor, WeightTable
from causallm.models.layer_norm_transformer import LayerNormTransformer
from causallm.models.sentence_transformer import SentenceTransformer

BERT_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "tanh_gelu", "gelu_pytorch_tanh": "tanh_gelu",
                    "relu": "relu", "silu": "swish", "swish": "swish"}
"""HF ``hidden_act`` -> NNTrainer ``activation`` (gelu is the exact erf form)."""

_LAYER = "encoder.layer.{i}."
BERT_WEIGHTS = WeightTable([
    Tensor("embedding0:Embedding", "embeddings.word_embeddings.weight"),
    Tensor("embedding_position:Embedding", "embeddings.position_embeddings.weight"),
    Tensor("embedding_position:TokenTypeEmbedding", "embeddings.token_type_embeddings.weight"),
    Tensor("embedding_norm:gamma", "embeddings.LayerNorm.weight"),
    Tensor("embedding_norm:beta", "embeddings.LayerNorm.bias"),
    Tensor("layer{i}_wq:weight", _LAYER + "attention.self.query.weight", transpose=True),
    Tensor("layer{i}_wq:bias", _LAYER + "attention.self.query.bias"),
    Tensor("layer{i}_wk:weight", _LAYER + "attention.self.key.weight", transpose=True),
    Tensor("layer{i}_wk:bias", _LAYER + "attention.self.key.bias"),
    Tensor("layer{i}_wv:weight", _LAYER + "attention.self.value.weight", transpose=True),
    Tensor("layer{i}_wv:bias", _LAYER + "attention.self.value.bias"),
    Tensor("layer{i}_attention_out:weight", _LAYER + "attention.output.dense.weight",
           transpose=True),
    Tensor("layer{i}_attention_out:bias", _LAYER + "attention.output.dense.bias"),
    Tensor("layer{i}_attention_norm:gamma", _LAYER + "attention.output.LayerNorm.weight"),
    Tensor("layer{i}_attention_norm:beta", _LAYER + "attention.output.LayerNorm.bias"),
    Tensor("layer{i}_ffn_up:weight", _LAYER + "intermediate.dense.weight", transpose=True),
    Tensor("layer{i}_ffn_up:bias", _LAYER + "intermediate.dense.bias"),
    Tensor("layer{i}_ffn_down:weight", _LAYER + "output.dense.weight", transpose=True),
    Tensor("layer{i}_ffn_down:bias", _LAYER + "output.dense.bias"),
    Tensor("layer{i}_decoder_output:gamma", _LAYER + "output.LayerNorm.weight"),
    Tensor("layer{i}_decoder_output:beta", _LAYER + "output.LayerNorm.bias"),
], ignore=["pooler.*", "embeddings.position_ids"])
"""BertModel's names (a ``bert.`` prefix, as in BertFor* checkpoints, is dropped when loading
through SentenceTransformer); Linear weights are read transposed; the pooler is not part of a
sentence embedding and the position ids are a buffer."""


class BertTransformer(LayerNormTransformer):
    """The BERT encoder stack (see the module docstring; the attention and MLP are
    :class:`LayerNormTransformer`'s); no pooling, no head."""

    # -- parameters -------------------------------------------------------------------------
    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.NORM_EPS = cfg.get_float("layer_norm_eps", 1e-12)
        if not self.NORM_EPS > 0:
            raise cfg.error("layer_norm_eps", "a positive number")
        self.MAX_POSITION_EMBEDDINGS = cfg.get_int("max_position_embeddings", 512, minimum=1)
        self.TYPE_VOCAB_SIZE = cfg.get_int("type_vocab_size", 2, minimum=0)
        if cfg.get_str("position_embedding_type", "absolute") != "absolute":
            raise cfg.error("position_embedding_type", "'absolute' (learned positions)")
        if cfg.get_bool("is_decoder", False):
            raise cfg.error("is_decoder", "false (BERT runs here as a bidirectional encoder)")
        self.IS_CAUSAL = False
        self.ATTENTION_BIAS = True
        self.MLP_BIAS = True

    def readHiddenAct(self, cfg: JsonConfig) -> str:
        act = cfg.get_str("hidden_act", "gelu")
        if act not in BERT_ACTIVATIONS:
            raise cfg.error("hidden_act", f"one of {', '.join(BERT_ACTIVATIONS)}")
        return BERT_ACTIVATIONS[act]

    # -- graph ------------------------------------------------------------------------------
    def constructModel(self) -> None:
        layers = []
        self.model = createModel()

        layers.append(createLayer("input", [withKey("name", "input0"),
                                            withKey("input_shape", f"1:1:{self.INIT_SEQ_LEN}")]))

        # word embeddings
        layers.append(createLayer("embedding_layer", [
            "name=embedding0", withKey("in_dim", self.NUM_VOCAB),
            withKey("weight_dtype", self.EMBEDDING_DTYPE), withKey("out_dim", self.DIM)]))

        # + token type 0 + position embeddings
        layers.append(createLayer("positional_embedding", [
            withKey("name", "embedding_position"), withKey("input_layers", "embedding0"),
            withKey("max_position_embeddings", self.MAX_POSITION_EMBEDDINGS),
            withKey("type_vocab_size", self.TYPE_VOCAB_SIZE),
            withKey("weight_dtype", self.EMBEDDING_DTYPE)]))

        layers.append(self.createNorm("embedding_norm", "embedding_position"))

        for i in range(self.NUM_LAYERS):
            input_name = "embedding_norm" if i == 0 else f"layer{i - 1}_decoder_output"
            layers += self.createTransformerDecoderBlock(i, input_name)

        for layer in layers:
            self.model.addLayer(layer)

    def createTransformerDecoderBlock(self, layer_id: int, input_name: str) -> list:
        i = layer_id
        layers = self.createAttention(i, self.INIT_SEQ_LEN, self.NUM_HEADS, self.HEAD_DIM,
                                      input_name, input_name, input_name)

        layers.append(createLayer("addition", [
            withKey("name", f"layer{i}_decoder_add"),
            withKey("input_layers", f"{input_name},layer{i}_attention_out")]))

        layers.append(self.createNorm(f"layer{i}_attention_norm", f"layer{i}_decoder_add"))

        layers += self.createMlp(i, self.DIM, self.INTERMEDIATE_SIZE, f"layer{i}_attention_norm")

        layers.append(createLayer("addition", [
            withKey("name", f"layer{i}_ffn_add"),
            withKey("input_layers", f"layer{i}_attention_norm,layer{i}_ffn_down")]))

        layers.append(self.createNorm(f"layer{i}_decoder_output", f"layer{i}_ffn_add"))
        return layers

    def getHFWeightTable(self) -> WeightTable:
        return BERT_WEIGHTS


class BertEmbedding(SentenceTransformer, BertTransformer):
    """A sentence-transformers BERT (``BertModel`` + modules.json: Pooling, Dense, Normalize),
    e.g. all-MiniLM-L6-v2; the pipeline of :class:`SentenceTransformer` over BertTransformer."""
