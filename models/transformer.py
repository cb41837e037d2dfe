"""Transformer: the decoder stack every model builds on (Applications/CausalLM/models/transformer.cpp).

``constructModel`` lists the graph as the C++ does: ``input0`` -> ``embedding0`` -> N blocks of
``createTransformerDecoderBlock`` (pre-norm attention + pre-norm SwiGLU MLP, each with a residual
add) -> ``output_norm``. Subclasses override ``setupParameters``, ``createAttention``,
``createMlp``, ``createTransformerDecoderBlock`` and ``registerCustomLayers`` like their C++ twins,
and the hooks the C++ writes inline: ``createNorm`` (the norm layer), ``layerSlidingWindow``,
``createFullyConnected`` (every projection, held in ``fc_layer_dtype``) and
``attentionCoreProperties`` (the one ``mha_core`` property block, which families override by
value). ``createAttention`` and ``createMlp`` take a name prefix (``layer{i}`` by default) and
an attention kind, so an encoder-decoder's stacks build their blocks with the same methods.

Beyond the C++: ``rope_theta`` is a float and ``rope_scaling`` / ``rope_parameters`` are read;
``attention_bias`` / ``mlp_bias`` of Hugging Face Llama configs give the projections their
biases; the tokenizer path is resolved against the model folder; a Hugging Face safetensors
folder loads directly through the family's weight table (``getHFWeightTable``,
causallm/io/weight_table.py); ``fc_layer_dtype`` holds every family's projections, not only
Gemma 3's (docs/nntrainer.md, "Integer rope_theta and no RoPE scaling", "Tokenizer path from the
working directory", "fc_layer_dtype in Gemma 3 only").

The class declares; what is not the graph is done by objects the model holds: ``context``
(causallm/runtime/context.py: MAX_SEQ_LEN, the new tokens that fit in it, the memory its KV
caches need), ``precision`` and ``loader`` (causallm/io/weights.py: the precision policy, the
load path; ``load_weight`` and ``save_weight`` are the C++ calls over them) and ``tokenizer``
(causallm/tokenizer.py, ``Tokenizer.forModel``).
"""

from __future__ import annotations

import os

from causallm.api import createLayer, createModel, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.io.config import NNTR_DEFAULTS, JsonConfig
from causallm.io.safetensors import Checkpoint
from causallm.io.weight_table import HFWeight, Tensor, WeightTable
from causallm.io.weights import (EMBEDDING, FULLY_CONNECTED, WeightLoader, WeightPrecision,
                                 checkpoint_folder)
from causallm.runtime.context import Context
from causallm.runtime.graph import MODEL_TENSOR_TYPES, ExecutionMode, ModelFormat
from causallm.runtime.properties import UINT_MAX
from causallm.tokenizer import Tokenizer
from causallm.layers.embedding_layer import EmbeddingLayer
from causallm.layers.mha_core import ROPE_TYPES, MHACoreLayer
from causallm.layers.rms_norm import RMSNormLayer
from causallm.layers.swiglu import SwiGLULayer
from causallm.layers.tie_word_embeddings import TieWordEmbedding

SELF_ATTENTION, ENCODER_ATTENTION, CROSS_ATTENTION = "self", "encoder", "cross"
"""The attention kinds createAttention builds: a decoder's (causal) self-attention, an encoder's
(bidirectional) self-attention, and a decoder's cross-attention over the encoder output."""


class ModelType:
    """``causallm::ModelType``: what a model class is, which nntr_config's ``model_type`` must
    name (``checkModelType``; the graph's own kind is causallm.api's ``NEURAL_NET``)."""

    MODEL = "Model"
    CAUSALLM = "CausalLM"
    EMBEDDING = "embedding"


LLAMA_WEIGHTS = WeightTable([
    Tensor("embedding0:Embedding", "model.embed_tokens.weight", aliases=("lm_head.weight",)),
    Tensor("layer{i}_attention_norm:gamma", "model.layers.{i}.input_layernorm.weight"),
    Tensor("layer{i}_wq:weight", "model.layers.{i}.self_attn.q_proj.weight", transpose=True),
    Tensor("layer{i}_wq:bias", "model.layers.{i}.self_attn.q_proj.bias"),
    Tensor("layer{i}_wk:weight", "model.layers.{i}.self_attn.k_proj.weight", transpose=True),
    Tensor("layer{i}_wk:bias", "model.layers.{i}.self_attn.k_proj.bias"),
    Tensor("layer{i}_wv:weight", "model.layers.{i}.self_attn.v_proj.weight", transpose=True),
    Tensor("layer{i}_wv:bias", "model.layers.{i}.self_attn.v_proj.bias"),
    Tensor("layer{i}_attention_out:weight", "model.layers.{i}.self_attn.o_proj.weight",
           transpose=True),
    Tensor("layer{i}_attention_out:bias", "model.layers.{i}.self_attn.o_proj.bias"),
    Tensor("layer{i}_ffn_norm:gamma", "model.layers.{i}.post_attention_layernorm.weight"),
    Tensor("layer{i}_ffn_up:weight", "model.layers.{i}.mlp.up_proj.weight", transpose=True),
    Tensor("layer{i}_ffn_up:bias", "model.layers.{i}.mlp.up_proj.bias"),
    Tensor("layer{i}_ffn_gate:weight", "model.layers.{i}.mlp.gate_proj.weight", transpose=True),
    Tensor("layer{i}_ffn_gate:bias", "model.layers.{i}.mlp.gate_proj.bias"),
    Tensor("layer{i}_ffn_down:weight", "model.layers.{i}.mlp.down_proj.weight", transpose=True),
    Tensor("layer{i}_ffn_down:bias", "model.layers.{i}.mlp.down_proj.bias"),
    Tensor("output_norm:gamma", "model.norm.weight"),
    Tensor("output_of_causallm:weight", "lm_head.weight", transpose=True),
], ignore=["model.layers.{i}.self_attn.rotary_emb.inv_freq"])
"""Llama's Hugging Face names (and Qwen2's, whose q/k/v biases are rows here too). Projections
are stored [out, in] by PyTorch and [in, out] by NNTrainer, hence the transposes (taken as
views, so memory-mapped weights stay mapped); a tied checkpoint may still carry the head, an
alias of the embedding; older checkpoints store the RoPE table, which is not a weight."""


class Transformer:
    """The base model: configs in, an nntrainer-style graph out (see the module docstring)."""

    MODEL_TYPE = ModelType.MODEL

    def __init__(self, cfg: JsonConfig, generation_cfg: JsonConfig, nntr_cfg: JsonConfig) -> None:
        self.cfg, self.generation_cfg, self.nntr_cfg = cfg, generation_cfg, nntr_cfg
        self.architecture = type(self).__name__  # the Factory's key when it made the model
        self.is_initialized = False
        self.model = None
        self.loader: WeightLoader | None = None  # the compiled graph's (initialize)
        self.weight_path: str | None = None  # what load_weight read
        self.checkModelType(nntr_cfg)
        self.setupParameters(cfg, generation_cfg, nntr_cfg)
        self.setupContext(nntr_cfg)
        self.tokenizer = Tokenizer.forModel(cfg, nntr_cfg, self.tokenizerHint())

    def tokenizerHint(self) -> str:
        """What to add to the "tokenizer file not found" error (a family whose folders ship
        another tokenizer format says how to make a tokenizer.json)."""
        return ""

    def checkModelType(self, nntr_cfg: JsonConfig) -> None:
        """nntr_config's ``model_type`` (case-insensitive) must fit the class, as in C++."""
        if not nntr_cfg.contains("model_type"):
            return
        given = nntr_cfg.get_str("model_type")
        if given.lower() != self.MODEL_TYPE.lower():
            raise CausalLMError(f"{nntr_cfg.where('model_type')} is '{given}', which does not "
                                f"fit {type(self).__name__} (expects '{self.MODEL_TYPE}')")

    # -- parameters -------------------------------------------------------------------------
    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        d = NNTR_DEFAULTS
        self.BATCH_SIZE = nntr_cfg.get_int("batch_size", d["batch_size"], minimum=1)
        # sequences the KV caches hold (0: one per batch row); a server's slots
        self.SLOTS = nntr_cfg.get_int("slots", 0, minimum=0)
        self.MODEL_TENSOR_TYPE = nntr_cfg.get_str("model_tensor_type", d["model_tensor_type"])
        if self.MODEL_TENSOR_TYPE not in MODEL_TENSOR_TYPES:
            raise nntr_cfg.error("model_tensor_type", f"one of {', '.join(MODEL_TENSOR_TYPES)}")
        # rows of the step buffer and new tokens; setupContext fits both to the context
        self.INIT_SEQ_LEN = nntr_cfg.get_int("init_seq_len", d["init_seq_len"], minimum=1)
        # new tokens: nntr_config's num_to_generate, else generation_config's max_new_tokens
        # (transformers' own default for the folder), else NNTrainer's default
        self.NUM_TO_GENERATE = nntr_cfg.get_int(
            "num_to_generate",
            generation_cfg.get_int("max_new_tokens", d["num_to_generate"], minimum=1), minimum=1)
        self.MEMORY_SWAP = nntr_cfg.get_bool("fsu", d["fsu"])
        self.FSU_LOOKAHEAD = nntr_cfg.get_int("fsu_lookahead", d["fsu_lookahead"])
        # the weights' precision (causallm/io/weights.py): nntr_config's dtype of each kind
        # and the KV caches' (kv_cache_dtype)
        self.precision = WeightPrecision(cfg, nntr_cfg)
        self.EMBEDDING_DTYPE = self.precision.dtype(EMBEDDING)
        self.FC_LAYER_DTYPE = self.precision.dtype(FULLY_CONNECTED)

        self.IS_CAUSAL = True
        if cfg.contains("is_causal"):
            self.IS_CAUSAL = cfg.get_bool("is_causal")
        elif cfg.contains("use_bidirectional_attention"):
            self.IS_CAUSAL = not cfg.get_bool("use_bidirectional_attention")

        self.NUM_VOCAB = cfg.get_int("vocab_size", minimum=1)
        self.DIM = cfg.get_int("hidden_size", minimum=1)
        self.INTERMEDIATE_SIZE = cfg.get_int("intermediate_size", minimum=1)
        self.NUM_LAYERS = cfg.get_int("num_hidden_layers", minimum=1)
        self.NUM_HEADS = cfg.get_int("num_attention_heads", minimum=1)
        self.HEAD_DIM = cfg.get_int("head_dim", self.DIM // self.NUM_HEADS, minimum=1)
        self.NUM_KEY_VALUE_HEADS = cfg.get_int("num_key_value_heads", self.NUM_HEADS, minimum=1)
        if self.NUM_HEADS % self.NUM_KEY_VALUE_HEADS:
            raise cfg.error("num_key_value_heads",
                            f"a divisor of num_attention_heads ({self.NUM_HEADS})")
        self.SLIDING_WINDOW = cfg.get_int("sliding_window", UINT_MAX, minimum=1)
        self.SLIDING_WINDOW_PATTERN = cfg.get_int("sliding_window_pattern", 1, minimum=1)
        self.layer_types = None  # per-layer attention types, for families whose config has them
        self.MAX_POSITION_EMBEDDINGS = cfg.get_int("max_position_embeddings", 40960, minimum=1)
        self.ROPE_THETA, self.ROPE_SCALING = self.readRope(cfg)
        self.TIE_WORD_EMBEDDINGS = cfg.get_bool("tie_word_embeddings", False)
        self.NORM_EPS = cfg.get_float("rms_norm_eps", 1e-6)
        self.GQA_SIZE = self.NUM_HEADS // self.NUM_KEY_VALUE_HEADS
        self.ATTENTION_BIAS = cfg.get_bool("attention_bias", False)
        self.MLP_BIAS = cfg.get_bool("mlp_bias", False)
        self.EMBEDDING_SCALE = 1.0
        self.ATTN_LOGIT_SOFTCAPPING = 0.0
        self.HIDDEN_ACT = self.readHiddenAct(cfg)

    def readHiddenAct(self, cfg: JsonConfig) -> str:
        """config.json ``hidden_act`` as the NNTrainer activation of the MLP; the base SwiGLU
        MLP computes silu only (a model with another MLP overrides this)."""
        act = cfg.get_str("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise cfg.error("hidden_act", "'silu' for a SwiGLU MLP")
        return "swish"

    @staticmethod
    def readRope(cfg: JsonConfig) -> tuple[float, dict]:
        """``rope_theta`` and the scaling dict, from transformers-4 keys (``rope_theta``,
        ``rope_scaling``) or transformers-5 ``rope_parameters``."""
        params = cfg.get_dict("rope_parameters", {}) if cfg.contains("rope_parameters") else {}
        if params and all(isinstance(v, dict) for v in params.values()):
            raise cfg.error("rope_parameters", "one set of RoPE parameters for this model")
        scaling = dict(cfg.get_dict("rope_scaling", {})) if cfg.contains("rope_scaling") else {}
        merged = {**params, **scaling}
        if cfg.contains("rope_theta"):
            theta = cfg.get_float("rope_theta")
        elif "rope_theta" in merged:
            theta = float(merged["rope_theta"])
        else:
            theta = 10000.0
        rope_type = merged.get("rope_type", merged.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise CausalLMError(f"{cfg.path}: rope type '{rope_type}' is not supported "
                                f"(supported: {', '.join(ROPE_TYPES)})")
        merged["rope_type"] = rope_type
        return theta, merged

    def ropeProperties(self, scaling: dict | None = None) -> dict:
        """mha_core properties (key -> value) for this model's rope scaling, or ``scaling``
        (none for the default type)."""
        s = self.ROPE_SCALING if scaling is None else scaling
        rope_type = s.get("rope_type", "default")
        if rope_type == "default":
            return {}
        original = s.get("original_max_position_embeddings")
        factor = s.get("factor")
        if factor is None:
            if rope_type != "yarn" or not original:
                raise CausalLMError(f"{self.cfg.path}: rope scaling '{rope_type}' needs a 'factor'")
            factor = self.MAX_POSITION_EMBEDDINGS / original  # transformers' rule for yarn
        props = {"rope_scaling_type": rope_type, "rope_scaling_factor": float(factor)}
        if rope_type in ("llama3", "yarn"):
            if original is None:
                original = self.MAX_POSITION_EMBEDDINGS
            props["rope_scaling_max_position_embeddings"] = int(original)
        if rope_type == "llama3":
            props["rope_scaling_low_freq_factor"] = float(s.get("low_freq_factor", 1.0))
            props["rope_scaling_high_freq_factor"] = float(s.get("high_freq_factor", 4.0))
        if rope_type == "yarn":
            props["rope_scaling_beta_fast"] = float(s.get("beta_fast", 32.0))
            props["rope_scaling_beta_slow"] = float(s.get("beta_slow", 1.0))
            props["rope_scaling_truncate"] = bool(s.get("truncate", True))
            for key in ("attention_factor", "mscale", "mscale_all_dim"):
                if s.get(key) is not None:
                    props[f"rope_scaling_{key}"] = float(s[key])
        return props

    # -- context ----------------------------------------------------------------------------
    def contextLength(self) -> tuple[int, str]:
        """The model's own context (the positions it was trained for) and what says so, for
        messages: config.json's ``max_position_embeddings`` (a family reading another key
        overrides this)."""
        key, gguf = "max_position_embeddings", self.cfg.gguf
        if gguf is not None:  # config.json made from the file's metadata
            where = f"{gguf.architecture}.context_length in {os.path.basename(gguf.path)}"
        elif self.cfg.contains(key):
            where = f"{key} in {self.cfg.name}"
        else:
            where = f"the default, {self.cfg.name} has no {key}"
        return self.MAX_POSITION_EMBEDDINGS, where

    def positionLimit(self) -> int | None:
        """Positions past which the model has no position at all (a learned position table's
        rows), or None: RoPE and relative positions go on past the trained context."""
        return None

    def setupContext(self, nntr_cfg: JsonConfig) -> None:
        """The context ``MAX_SEQ_LEN`` (causallm/runtime/context.py): the positions one sequence
        holds, the prompt and the new tokens together, and so the rows of every self-attention
        KV cache and RoPE table. The step buffer's INIT_SEQ_LEN rows and the new tokens fit in
        it. Runs after setupParameters, so a family's own values count."""
        self.context = self.readContext(nntr_cfg)
        self.MAX_SEQ_LEN = self.context.length
        self.INIT_SEQ_LEN = min(self.INIT_SEQ_LEN, self.MAX_SEQ_LEN)
        self.NUM_TO_GENERATE = self.context.fitNewTokens(self.NUM_TO_GENERATE)

    def readContext(self, nntr_cfg: JsonConfig, default: int | None = None) -> Context:
        """The context of this model's numbers: nntr_config ``max_seq_len``, else ``default``,
        else its own context (contextLength) at most CONTEXT_CAP; at most positionLimit()."""
        return Context(nntr_cfg, *self.contextLength(), self.positionLimit(), self.cfg.path,
                       default)

    def kvBytesPerPosition(self) -> int:
        """Bytes one position of one sequence takes in the self-attention KV caches: every
        layer's key and value (a family with other layer counts or head sizes may differ a
        little)."""
        per = 2 if self.precision.kvCacheDtype() == "FP16" else 4
        return 2 * self.NUM_LAYERS * self.NUM_KEY_VALUE_HEADS * self.HEAD_DIM * per

    # -- graph ------------------------------------------------------------------------------
    def initialize(self) -> None:
        self.context.checkMemory(self.kvBytesPerPosition(), self.HEAD_DIM, self.BATCH_SIZE,
                                 self.rowsPerPrompt(), self.SLOTS)
        self.registerCustomLayers()
        self.constructModel()
        model_props = [withKey("batch_size", self.BATCH_SIZE * self.rowsPerPrompt()),
                       withKey("epochs", "1"),
                       withKey("model_tensor_type", self.MODEL_TENSOR_TYPE)]
        if self.MEMORY_SWAP:
            model_props += [withKey("fsu", "true"), withKey("fsu_lookahead", self.FSU_LOOKAHEAD)]
        if self.SLOTS:
            model_props.append(withKey("slots", self.SLOTS))
        self.model.setProperty(model_props)
        try:
            self.model.compile(ExecutionMode.INFERENCE)
            self.model.initialize(ExecutionMode.INFERENCE)
        except MemoryError as e:
            raise self.context.outOfMemory(e, self.INIT_SEQ_LEN, self.BATCH_SIZE,
                                           self.rowsPerPrompt(), self.SLOTS) from None
        self.loader = WeightLoader(self.model, self.precision, self.cfg, self.nntr_cfg,
                                   type(self).__name__)
        self.is_initialized = True

    def constructModel(self) -> None:
        layers = []
        self.model = createModel()

        layers.append(createLayer("input", [withKey("name", "input0"),
                                            withKey("input_shape", f"1:1:{self.INIT_SEQ_LEN}")]))

        embedding_type = "tie_word_embeddings" if self.TIE_WORD_EMBEDDINGS else "embedding_layer"
        layers.append(createLayer(embedding_type, [
            "name=embedding0", withKey("in_dim", self.NUM_VOCAB),
            withKey("weight_dtype", self.EMBEDDING_DTYPE), withKey("out_dim", self.DIM),
            withKey("scale", self.EMBEDDING_SCALE)]))
        extra, input_name = self.createEmbeddingInputs("input0", "embedding0")
        layers += extra

        for i in range(self.NUM_LAYERS):
            layers += self.createTransformerDecoderBlock(i, input_name)
            input_name = f"layer{i}_decoder_output"

        layers.append(self.createNorm("output_norm",
                                      f"layer{self.NUM_LAYERS - 1}_decoder_output"))

        for layer in layers:
            self.model.addLayer(layer)

    def createEmbeddingInputs(self, ids: str, embedding: str) -> tuple[list, str]:
        """Layers between the token embedding and the first block, and the first block's
        input: none here (a vision family merges its image features in)."""
        return [], embedding

    def createTransformerDecoderBlock(self, layer_id: int, input_name: str) -> list:
        layers = []
        layers.append(self.createNorm(f"layer{layer_id}_attention_norm", input_name))

        layers += self.createAttention(layer_id, self.INIT_SEQ_LEN, self.NUM_HEADS, self.HEAD_DIM,
                                       f"layer{layer_id}_attention_norm",
                                       f"layer{layer_id}_attention_norm",
                                       f"layer{layer_id}_attention_norm")

        layers.append(createLayer("addition", [
            withKey("name", f"layer{layer_id}_decoder_add"),
            withKey("input_layers", f"{input_name},layer{layer_id}_attention_out")]))

        layers.append(self.createNorm(f"layer{layer_id}_ffn_norm",
                                      f"layer{layer_id}_decoder_add"))

        layers += self.createMlp(layer_id, self.DIM, self.INTERMEDIATE_SIZE,
                                 f"layer{layer_id}_ffn_norm")

        layers.append(createLayer("addition", [
            withKey("name", f"layer{layer_id}_decoder_output"),
            withKey("input_layers", f"layer{layer_id}_decoder_add,layer{layer_id}_ffn_down")]))
        return layers

    def createNorm(self, name: str, input_name: str):
        """The decoder's norm layer ``name`` over ``input_name``: ``rms_norm`` (a family with
        LayerNorm overrides this)."""
        return createLayer("rms_norm", [
            withKey("name", name), withKey("input_layers", input_name),
            withKey("epsilon", self.NORM_EPS), withKey("packed", "false")])

    def layerSlidingWindow(self, layer_id: int) -> int:
        """mha_core ``sliding_window`` of layer ``layer_id`` (UINT_MAX = full attention): the
        window on every layer but each SLIDING_WINDOW_PATTERN-th, as the C++; where a family
        sets ``layer_types``, on its ``sliding_attention`` layers."""
        if self.layer_types is not None:
            return (self.SLIDING_WINDOW if self.layer_types[layer_id] == "sliding_attention"
                    else UINT_MAX)
        return self.SLIDING_WINDOW if (layer_id + 1) % self.SLIDING_WINDOW_PATTERN else UINT_MAX

    def createAttention(self, layer_id: int, seq_len: int, n_heads: int, head_dim: int,
                        query_name: str, key_name: str, value_name: str, prefix: str = "",
                        kind: str = SELF_ATTENTION) -> list:
        """Q, K, V projections, the attention core and the output projection of layer
        ``layer_id``, named ``{prefix}_wq`` ... ``{prefix}_attention_out`` (prefix: ``layer{i}``
        when empty; an encoder-decoder passes ``encoder_layer{i}``, ``decoder_layer{i}`` or
        ``decoder_layer{i}_cross``). ``kind`` says which attention it is
        (attentionCoreProperties)."""
        return self.attentionLayers(layer_id, n_heads, head_dim, query_name, key_name,
                                    value_name, prefix, kind)

    def attentionLayers(self, layer_id: int, n_heads: int, head_dim: int, query_name: str,
                        key_name: str, value_name: str, prefix: str = "",
                        kind: str = SELF_ATTENTION, qkv_bias: bool | None = None,
                        out_bias: bool | None = None, qk_norm: str | None = None) -> list:
        """What every family's ``createAttention`` builds, in insertion (= .bin) order:

            {prefix}_wq, _wk, _wv        fully connected: n_heads x head_dim, and n_heads /
                                         GQA_SIZE x head_dim for k and v (bias ``qkv_bias``,
                                         default ATTENTION_BIAS)
            {prefix}_q_norm, _k_norm     with ``qk_norm``: reshaped_rms_norm of each head of q
                                         and k (Qwen3, Gemma 3), inserted right after their
                                         projection ("interleaved": q, q_norm, k, k_norm, v)
                                         or after v ("after": q, k, v, q_norm, k_norm)
            {prefix}_attention           mha_core over q (normed), k (normed), v
            {prefix}_attention_out       fully connected back to DIM (bias ``out_bias``,
                                         default ATTENTION_BIAS)"""
        prefix = prefix or f"layer{layer_id}"
        Q, K, V = f"{prefix}_wq", f"{prefix}_wk", f"{prefix}_wv"
        A, O = f"{prefix}_attention", f"{prefix}_attention_out"
        qkv_bias = self.ATTENTION_BIAS if qkv_bias is None else qkv_bias
        out_bias = self.ATTENTION_BIAS if out_bias is None else out_bias
        kv_unit = head_dim * n_heads // self.GQA_SIZE
        q = self.createFullyConnected(Q, head_dim * n_heads, query_name, qkv_bias)
        k = self.createFullyConnected(K, kv_unit, key_name, qkv_bias)
        v = self.createFullyConnected(V, kv_unit, value_name, qkv_bias)
        if qk_norm is None:
            layers, inputs = [q, k, v], [Q, K, V]
        else:
            q_norm = self.createHeadNorm(f"{prefix}_q_norm", Q, head_dim)
            k_norm = self.createHeadNorm(f"{prefix}_k_norm", K, head_dim)
            layers = [q, q_norm, k, k_norm, v] if qk_norm == "interleaved" else \
                [q, k, v, q_norm, k_norm]
            inputs = [f"{prefix}_q_norm", f"{prefix}_k_norm", V]
        return [*layers, self.createAttentionCore(A, layer_id, n_heads, inputs, kind),
                self.createFullyConnected(O, self.DIM, A, out_bias)]

    def createHeadNorm(self, name: str, input_name: str, head_dim: int):
        """``reshaped_rms_norm`` ``name``: the RMS norm of each head_dim-wide head of
        ``input_name`` (q_norm(q_proj(x).view(..., heads, head_dim)))."""
        return createLayer("reshaped_rms_norm", [
            withKey("name", name), withKey("input_layers", input_name),
            withKey("packed", "false"), withKey("epsilon", self.NORM_EPS),
            withKey("feature_size", head_dim)])

    def createFullyConnected(self, name: str, unit: int, input_name: str, bias: bool = False,
                             shared_from: str | None = None):
        """The ``fully_connected`` layer ``name``: ``unit`` outputs over ``input_name``, a bias
        when ``bias``, the weight of ``shared_from`` when given. Every projection of every
        family comes from here, so all are held alike: ``weight_dtype`` FC_LAYER_DTYPE
        (nntr_config's ``fc_layer_dtype``, else ``model_tensor_type``'s weight part;
        causallm/io/weights.py). The C++ writes the property block inline; only Gemma 3's
        sets ``weight_dtype`` (docs/nntrainer.md, "fc_layer_dtype in Gemma 3 only")."""
        props = [withKey("name", name), withKey("unit", unit),
                 withKey("disable_bias", "false" if bias else "true"),
                 withKey("input_layers", input_name), withKey("weight_initializer", "ones"),
                 withKey("weight_dtype", self.FC_LAYER_DTYPE)]
        if shared_from:
            props.append(withKey("shared_from", shared_from))
        return createLayer("fully_connected", props)

    def createAttentionCore(self, name: str, layer_id: int, n_heads: int, input_layers: list,
                            kind: str = SELF_ATTENTION):
        """The ``mha_core`` every family's attention uses: inputs ``[Q, K, V]``, properties
        ``attentionCoreProperties(layer_id, n_heads, kind)``."""
        props = self.attentionCoreProperties(layer_id, n_heads, kind)
        return createLayer("mha_core", [withKey("name", name),
                                        *(withKey(k, v) for k, v in props.items()),
                                        withKey("input_layers", input_layers)])

    def attentionCoreProperties(self, layer_id: int, n_heads: int,
                                kind: str = SELF_ATTENTION) -> dict:
        """The mha_core properties of layer ``layer_id`` (key -> value). A family overrides the
        values it computes differently (its windows, RoPE, scale, sinks) and keeps the rest:

            num_heads, num_heads_kv    n_heads and n_heads / GQA_SIZE
            max_timestep               MAX_SEQ_LEN, the context (setupContext)
            cache_dtype                precision.kvCacheDtype()
            sliding_window             layerSlidingWindow(layer_id)
            rope_theta, rope_scaling_* ROPE_THETA and ropeProperties()
            is_causal                  IS_CAUSAL
            max_position_embeddings, max_new_tokens   (accepted, unused, as in nntrainer)

        ``kind`` is "self" in a decoder-only model; an encoder-decoder also asks for "encoder"
        (bidirectional self-attention) and "cross" attention."""
        return {"num_heads": n_heads, "num_heads_kv": n_heads // self.GQA_SIZE,
                "max_timestep": self.MAX_SEQ_LEN,
                "sliding_window": self.layerSlidingWindow(layer_id),
                "rope_theta": self.ROPE_THETA,
                "max_position_embeddings": self.MAX_POSITION_EMBEDDINGS,
                "max_new_tokens": self.NUM_TO_GENERATE,
                "is_causal": self.IS_CAUSAL,
                "cache_dtype": self.precision.kvCacheDtype(),
                **self.ropeProperties()}

    def createMlp(self, layer_id: int, dim: int, hidden_dim: int, input_name: str,
                  prefix: str = "") -> list:
        """The SwiGLU MLP of layer ``layer_id``: ``{prefix}_ffn_up``, ``_ffn_gate``,
        ``_ffn_swiglu``, ``_ffn_down`` (prefix: ``layer{i}`` when empty)."""
        p = prefix or f"layer{layer_id}"
        layers = []
        layers.append(self.createFullyConnected(f"{p}_ffn_up", hidden_dim, input_name,
                                                self.MLP_BIAS))
        layers.append(self.createFullyConnected(f"{p}_ffn_gate", hidden_dim, input_name,
                                                self.MLP_BIAS))
        layers.append(createLayer("swiglu", [
            withKey("name", f"{p}_ffn_swiglu"),
            withKey("input_layers", f"{p}_ffn_gate,{p}_ffn_up")]))
        layers.append(self.createFullyConnected(f"{p}_ffn_down", dim, f"{p}_ffn_swiglu",
                                                self.MLP_BIAS))
        return layers

    def registerCustomLayers(self) -> None:
        for layer_class in (SwiGLULayer, RMSNormLayer, MHACoreLayer, TieWordEmbedding,
                            EmbeddingLayer):
            registerFactory(layer_class)

    # -- weights (the load path and the precision policy: causallm/io/weights.py) ----------
    def getHFWeightTable(self) -> WeightTable:
        """The family's Hugging Face weight table (causallm/io/weight_table.py)."""
        return LLAMA_WEIGHTS

    def getHFWeightMap(self) -> dict[str, tuple[HFWeight, ...]]:
        """{Hugging Face tensor name: the weights it feeds}: the table expanded against this
        model's compiled weights (every weight must be covered)."""
        if self.model is None:
            raise CausalLMError("getHFWeightMap: call initialize() first")
        return self.getHFWeightTable().weightMap(
            [s.full_name for s in self.model.getWeightSpecs()], type(self).__name__)

    def openHFCheckpoint(self, folder: str) -> Checkpoint:
        """The safetensors checkpoint ``load_hf_weight`` reads (a model whose weights span
        several folders returns a merged view with the same methods)."""
        return Checkpoint(folder)

    def load_hf_weight(self, path: str) -> None:
        """Map every tensor of a safetensors file or folder onto a layer weight through the
        weight table; every weight must be covered and every tensor used (the error names the
        ones that are not)."""
        self.loader.loadCheckpoint(self.openHFCheckpoint(checkpoint_folder(path)),
                                   self.getHFWeightTable(), self.getHFWeightMap())

    def load_weight(self, weight_path: str | None = None) -> None:
        """Load an NNTrainer .bin file, a Hugging Face safetensors file or folder, or a GGUF
        file (by default nntr_config's ``model_file_name``, else the GGUF or the folder the
        configs came from; kept as ``weight_path``), each weight held as the precision policy
        says (``WeightLoader.load``)."""
        if not self.is_initialized:
            raise CausalLMError("load_weight: call initialize() first")
        self.weight_path = self.loader.load(weight_path, self)
        self.model.warmup()

    def save_weight(self, weight_path: str, dtype: str | None = None,
                    layer_dtype_map: dict | None = None) -> None:
        """Write the NNTrainer .bin (optionally converting dtypes, e.g. to FP16)."""
        if not self.is_initialized:
            raise CausalLMError("save_weight: call initialize() first")
        self.model.save(weight_path, ModelFormat.MODEL_FORMAT_BIN, dtype, layer_dtype_map)

    def requireWeights(self, what: str) -> None:
        """An error naming ``what`` (run, generate, encode) unless the model is initialized and
        its weights loaded: a graph's weights start as zeros, which would compute one token
        over and over."""
        if not self.is_initialized:
            raise CausalLMError(f"{what}: call initialize() and load_weight() first")
        if not self.model.weightsGiven():
            raise CausalLMError(f"{what}: load_weight() was not called (or did not complete): "
                                f"the model has no weights")

    def rowsPerPrompt(self) -> int:
        """Graph rows per prompt (LanguageModel: one per beam); the graph's batch is
        BATCH_SIZE times this."""
        return 1

    def setGenerationOptions(self, **options) -> None:
        """Generation options (temperature, top_k, ...: causallm/generation/options.py): a
        model that does not generate takes none (LanguageModel overrides this); None values
        are options not given."""
        given = [k for k, v in options.items() if v is not None and v is not False]
        if given:
            raise CausalLMError(f"{self.architecture} does not generate text: it takes no generation "
                                f"options ({', '.join(given)})")

    def setImages(self, images) -> None:
        """The images of the next run (a vision model's: models/vision_language.py); a text
        model takes none."""
        if len(images):
            raise CausalLMError(f"{self.architecture} takes no images (it has no vision tower)")

    def chatPrompt(self, chat_input: JsonConfig) -> str | None:
        """The prompt nntr_config's ``chat_input`` stands for, or None when this model has no
        chat template for it (main.cpp then falls back to ``sample_input``)."""
        return None

    def run(self, prompt: str, do_sample: bool = False, system_prompt: str = "",
            tail_prompt: str = "", log_output: bool = True):
        """What a model does with a prompt: CausalLM generates, SentenceTransformer embeds. The
        bare Transformer (no head) has nothing to run, as in C++, and says so."""
        raise CausalLMError(f"{type(self).__name__}.run: a bare Transformer has no head; use "
                            f"CausalLM or SentenceTransformer")
