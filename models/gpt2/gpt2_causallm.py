"""GPT-2 (HF ``modeling_gpt2.py``, GPT2LMHeadModel). NNTrainer's CausalLM has no GPT-2; this file
follows its model files (a Transformer subclass for the decoder, CausalLM for the head and run).

GPT2Transformer is a pre-norm decoder with learned positions, LayerNorm and a GELU MLP:

    h    = wte[ids] + wpe[p]                              p = absolute position (from_ + i)
    q|k|v = LN_1(h) W_attn + b_attn                       c_attn [D, 3D], split into wq, wk, wv
    h   += softmax(q k^T * s + causal mask) v W_o + b_o   per head; s = head_dim^-1/2 (or 1
                                                          without scale_attn_weights), / (i + 1)
                                                          with scale_attn_by_inverse_layer_idx
    h   += act(LN_2(h) W_fc + b_fc) W_proj + b_proj       act = activation_function (gelu_new:
                                                          the tanh approximation)
    out  = LN_f(h)    logits = out wte^T                  (lm_head instead if untied)

LN(x) = (x - mean) / sqrt(var + eps) * gamma + beta (``layer_normalization``, eps =
layer_norm_epsilon); there is no RoPE (mha_core ``use_rope=false``).

Layer names in insertion (= .bin) order: input0, embedding0 (wte), position_embedding0 (wpe),
per block layer{i}_attention_norm (gamma, beta), _wq, _wk, _wv, _attention (mha_core),
_attention_out, _decoder_add, _ffn_norm (gamma, beta), _ffn_up, _ffn_act (activation),
_ffn_down, _decoder_output (every FC with weight then bias), then output_norm (gamma, beta) and
output_of_causallm (tied to embedding0 unless ``tie_word_embeddings`` is false).

Weights (:data:`GPT2_WEIGHTS`): transformers' Conv1D stores [in, out], the NNTrainer layout, so
nothing is transposed; ``c_attn`` ([D, 3D] and its bias [3D]) is split by columns into
wq | wk | wv. Names are ``transformer.*`` as transformers saves them, or unprefixed as in the
OpenAI checkpoints on the Hub; the causal-mask buffers ``attn.bias`` / ``attn.masked_bias`` are
skipped. Positions stop at n_positions: generation ends there (finish reason ``cache_full``).

Config keys (GPT2Config): vocab_size, n_embd, n_layer, n_head, n_positions (all required),
n_inner (null -> 4 n_embd), layer_norm_epsilon (1e-5), activation_function (gelu_new,
gelu_pytorch_tanh, gelu, relu), scale_attn_weights (true), scale_attn_by_inverse_layer_idx
(false), tie_word_embeddings (true). reorder_and_upcast_attn changes nothing in float32.
add_cross_attention=true (an encoder-decoder block) is rejected.
"""

from __future__ import annotations

from causallm.api import createLayer, createModel, withKey
from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.io.weight_table import Split, Tensor, WeightTable
from causallm.models.causal_lm import CausalLM
from causallm.models.language_model import GENERATION_KEYS
from causallm.models.layer_norm_transformer import LayerNormTransformer

GPT2_ACTIVATIONS = {"gelu_new": "tanh_gelu", "gelu_pytorch_tanh": "tanh_gelu", "gelu": "gelu",
                    "relu": "relu"}
"""HF ``activation_function`` -> NNTrainer ``activation`` (gelu_new is the tanh approximation)."""

_H = "transformer.h.{i}."
GPT2_WEIGHTS = WeightTable([
    Tensor("embedding0:Embedding", "transformer.wte.weight", aliases=("lm_head.weight",)),
    Tensor("position_embedding0:Embedding", "transformer.wpe.weight"),
    Tensor("layer{i}_attention_norm:gamma", _H + "ln_1.weight"),
    Tensor("layer{i}_attention_norm:beta", _H + "ln_1.bias"),
    Tensor("layer{i}_wq:weight", _H + "attn.c_attn.weight", part=(..., Split(0, 3))),
    Tensor("layer{i}_wk:weight", _H + "attn.c_attn.weight", part=(..., Split(1, 3))),
    Tensor("layer{i}_wv:weight", _H + "attn.c_attn.weight", part=(..., Split(2, 3))),
    Tensor("layer{i}_wq:bias", _H + "attn.c_attn.bias", part=(..., Split(0, 3))),
    Tensor("layer{i}_wk:bias", _H + "attn.c_attn.bias", part=(..., Split(1, 3))),
    Tensor("layer{i}_wv:bias", _H + "attn.c_attn.bias", part=(..., Split(2, 3))),
    Tensor("layer{i}_attention_out:weight", _H + "attn.c_proj.weight"),
    Tensor("layer{i}_attention_out:bias", _H + "attn.c_proj.bias"),
    Tensor("layer{i}_ffn_norm:gamma", _H + "ln_2.weight"),
    Tensor("layer{i}_ffn_norm:beta", _H + "ln_2.bias"),
    Tensor("layer{i}_ffn_up:weight", _H + "mlp.c_fc.weight"),
    Tensor("layer{i}_ffn_up:bias", _H + "mlp.c_fc.bias"),
    Tensor("layer{i}_ffn_down:weight", _H + "mlp.c_proj.weight"),
    Tensor("layer{i}_ffn_down:bias", _H + "mlp.c_proj.bias"),
    Tensor("output_norm:gamma", "transformer.ln_f.weight"),
    Tensor("output_norm:beta", "transformer.ln_f.bias"),
    Tensor("output_of_causallm:weight", "lm_head.weight", transpose=True),
], ignore=[_H + "attn.bias", _H + "attn.masked_bias"], prefixes=["transformer."])
"""GPT-2's names as transformers saves them (``transformer.*``; the OpenAI checkpoints on the
Hub lack the prefix). Conv1D weights are [in, out] already, so nothing is transposed but the
untied head; ``attn.c_attn`` ([D, 3D] and its bias [3D]) is q | k | v by columns; the
causal-mask buffers ``attn.bias`` / ``attn.masked_bias`` are not weights."""


def gpt2BaseConfig(cfg: JsonConfig) -> JsonConfig:
    """config.json under the key names the base Transformer reads (transformers'
    GPT2Config.attribute_map: hidden_size = n_embd, num_hidden_layers = n_layer, ...), built
    from GPT-2's own keys; errors name GPT-2's keys."""
    dim = cfg.get_int("n_embd", minimum=1)
    heads = cfg.get_int("n_head", minimum=1)
    if dim % heads:
        raise cfg.error("n_head", f"a divisor of n_embd ({dim})")
    return JsonConfig({
        "vocab_size": cfg.get("vocab_size"),
        "hidden_size": dim,
        "intermediate_size": cfg.get_int("n_inner", 4 * dim, minimum=1),
        "num_hidden_layers": cfg.get_int("n_layer", minimum=1),
        "num_attention_heads": heads,
        "max_position_embeddings": cfg.get_int("n_positions", minimum=1),
        "tie_word_embeddings": cfg.get_bool("tie_word_embeddings", True),
        **{k: cfg[k] for k in GENERATION_KEYS if k in cfg},
    }, cfg.path, cfg.exists)


class GPT2Transformer(LayerNormTransformer):
    """Transformer with GPT-2's embeddings, LayerNorms, biased attention and GELU MLP (the
    blocks: :class:`LayerNormTransformer`, pre-norm as the base decoder block)."""

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(gpt2BaseConfig(cfg), generation_cfg, nntr_cfg)
        self.NORM_EPS = cfg.get_float("layer_norm_epsilon", 1e-5)
        self.ATTENTION_BIAS = True
        self.MLP_BIAS = True
        act = cfg.get_str("activation_function", "gelu_new")
        if act not in GPT2_ACTIVATIONS:
            raise cfg.error("activation_function", f"one of {', '.join(GPT2_ACTIVATIONS)}")
        self.HIDDEN_ACT = GPT2_ACTIVATIONS[act]
        self.SCALE_ATTN_WEIGHTS = cfg.get_bool("scale_attn_weights", True)
        self.SCALE_ATTN_BY_INVERSE_LAYER_IDX = cfg.get_bool("scale_attn_by_inverse_layer_idx",
                                                            False)
        if cfg.get_bool("add_cross_attention", False):
            raise cfg.error("add_cross_attention", "false (cross-attention needs an encoder)")

    def contextLength(self) -> tuple[int, str]:
        return self.MAX_POSITION_EMBEDDINGS, f"n_positions in {self.cfg.name}"

    def positionLimit(self) -> int:
        """n_positions: a position past them has no learned embedding, so the context (the KV
        cache rows) is at most that."""
        return self.MAX_POSITION_EMBEDDINGS

    def attentionScalar(self, layer_id: int) -> float:
        """mha_core ``query_pre_attn_scalar`` a (scores are scaled by a^-1/2): head_dim, or 1
        without scale_attn_weights, times (layer_id + 1)^2 with scale_attn_by_inverse_layer_idx."""
        scalar = float(self.HEAD_DIM) if self.SCALE_ATTN_WEIGHTS else 1.0
        if self.SCALE_ATTN_BY_INVERSE_LAYER_IDX:
            scalar *= float((layer_id + 1) ** 2)
        return scalar

    def constructModel(self) -> None:
        layers = []
        self.model = createModel()

        layers.append(createLayer("input", [withKey("name", "input0"),
                                            withKey("input_shape", f"1:1:{self.INIT_SEQ_LEN}")]))

        # token embedding (wte)
        embedding_type = "tie_word_embeddings" if self.TIE_WORD_EMBEDDINGS else "embedding_layer"
        layers.append(createLayer(embedding_type, [
            "name=embedding0", withKey("in_dim", self.NUM_VOCAB),
            withKey("weight_dtype", self.EMBEDDING_DTYPE), withKey("out_dim", self.DIM),
            withKey("scale", self.EMBEDDING_SCALE)]))

        # + position embedding (wpe) of each row's absolute position
        layers.append(createLayer("positional_embedding", [
            withKey("name", "position_embedding0"), withKey("input_layers", "embedding0"),
            withKey("max_position_embeddings", self.MAX_POSITION_EMBEDDINGS),
            withKey("weight_dtype", self.EMBEDDING_DTYPE)]))

        for i in range(self.NUM_LAYERS):
            input_name = "position_embedding0" if i == 0 else f"layer{i - 1}_decoder_output"
            layers += self.createTransformerDecoderBlock(i, input_name)

        # final LayerNorm (ln_f)
        layers.append(self.createNorm("output_norm",
                                      f"layer{self.NUM_LAYERS - 1}_decoder_output"))

        for layer in layers:
            self.model.addLayer(layer)

    def getHFWeightTable(self) -> WeightTable:
        return GPT2_WEIGHTS


class GPT2CausalLM(CausalLM, GPT2Transformer):
    """``GPT2LMHeadModel``: CausalLM (LM head tied to wte, generation) over GPT2Transformer.

    The cooperative ``super()`` chain runs GPT2CausalLM -> CausalLM -> GPT2Transformer ->
    Transformer, as the C++ diamond of the other families does."""

    def cacheLimit(self) -> str:
        """CausalLM.cacheLimit, unless the learned positions end there (no setting raises
        those)."""
        if self.MAX_SEQ_LEN == self.MAX_POSITION_EMBEDDINGS:
            return (f"the model has n_positions = {self.MAX_POSITION_EMBEDDINGS} learned "
                    f"positions ({self.cfg.path}), prompt and new tokens together")
        return super().cacheLimit()

    def start(self, prompt_ids, start_pos, context_ids, metrics):
        """CausalLM.start, after checking the prompt fits GPT-2's learned positions."""
        n = start_pos + prompt_ids.shape[1]
        if n > self.MAX_POSITION_EMBEDDINGS:
            raise CausalLMError(f"{self.cfg.path}: the prompt has {n} tokens but the model has "
                                f"n_positions = {self.MAX_POSITION_EMBEDDINGS} learned positions")
        return super().start(prompt_ids, start_pos, context_ids, metrics)
