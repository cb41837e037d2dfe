"""GPT-OSS (Applications/CausalLM/models/gpt_oss/gptoss_causallm.cpp; HF ``modeling_gpt_oss.py``).

GptOssForCausalLM is the pre-norm decoder of :class:`Transformer` with its own attention and a
mixture-of-experts feed-forward:

    q = x Wq + bq,  k = x Wk + bk,  v = x Wv + bv           (biases while ``attention_bias``)
    a = mha_core(q, k, v)    with a per-head sink logit in the softmax (``self_attn.sinks``),
                             yarn RoPE and, on ``sliding_attention`` layers, a sliding window
    out = a Wo + bo
    ffn = gpt_oss_moe(x)     top-k router with bias, clamped-GLU experts (layers/gpt_oss_moe.py)

Layer names and insertion (= .bin) order per block (docs/nntrainer.md, "Block order by family"):
``layer{i}_attention_norm``, ``_wq`` (weight, bias), ``_wk``, ``_wv``, ``_attention`` (sink),
``_attention_out`` (weight, bias), ``_decoder_add``, ``_ffn_norm``, ``_ffn_down`` (the gpt_oss_moe
layer), ``_decoder_output``.

Beyond the C++: the RoPE scaling comes from the config's ``rope_scaling`` / ``rope_parameters`` (the
C++ hard-codes yarn with original_max_position_embeddings 4096 and reads only ``factor``:
docs/nntrainer.md, "Integer rope_theta and no RoPE scaling"), a config without them gets
transformers' GptOssConfig defaults (yarn, factor 32, beta 32/1, truncate false, original 4096,
theta 150000), as do ``layer_types``, ``sliding_window`` (128), ``rms_norm_eps`` (1e-5) and
``attention_bias`` (true); the experts clamp and add the router bias as transformers does
(docs/nntrainer.md, "GPT-OSS expert clamp and router bias"); ``swiglu_alpha`` / ``swiglu_limit`` are
read. The Hugging Face checkpoint's fused experts are split into the layer's per-expert weights by
:data:`GPT_OSS_WEIGHTS`. The Hub's checkpoints (openai/gpt-oss-20b, -120b) store the experts as
MXFP4 ``_blocks`` / ``_scales`` pairs (config.json ``quantization_config``);
causallm.io.safetensors.Checkpoint shows each pair as the float32 tensor transformers dequantizes it
to (causallm/io/mxfp4.py), so the same map reads them, and the expert cache is on by default for
them (see the class).
"""

from __future__ import annotations

import sys

import numpy as np

from causallm.api import createLayer, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.io.lazy_weights import safetensors_slice
from causallm.io.mxfp4 import MXFP4_DTYPE
from causallm.io.weight_table import Every, HFWeight, Tensor, WeightTable
from causallm.runtime.properties import UINT_MAX
from causallm.layers.gpt_oss_moe import GptOssMoELayer
from causallm.models.causal_lm import CausalLM
from causallm.models.experts_on_file import ExpertsOnFileMixin
from causallm.models.transformer import LLAMA_WEIGHTS, SELF_ATTENTION

GPT_OSS_LAYER_TYPES = ("sliding_attention", "full_attention")
GPT_OSS_SLIDING_WINDOW = 128           # HF GptOssConfig defaults, used when config.json lacks them
GPT_OSS_RMS_NORM_EPS = 1e-5
GPT_OSS_MAX_POSITION_EMBEDDINGS = 131072
GPT_OSS_ROPE_THETA = 150000.0
GPT_OSS_ROPE_SCALING = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                        "truncate": False, "original_max_position_embeddings": 4096}
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0

_ALL = slice(None)

_MOE = "model.layers.{i}.mlp."
GPT_OSS_WEIGHTS = LLAMA_WEIGHTS.extend([
    Tensor("layer{i}_attention:sink", "model.layers.{i}.self_attn.sinks"),
    Tensor("layer{i}_ffn_down:gate", _MOE + "router.weight", transpose=True),
    Tensor("layer{i}_ffn_down:gate_bias", _MOE + "router.bias"),
    Tensor("layer{i}_ffn_down:expert_gate_{e}", _MOE + "experts.gate_up_proj",
           part=("e", _ALL, Every(0, 2))),
    Tensor("layer{i}_ffn_down:expert_up_{e}", _MOE + "experts.gate_up_proj",
           part=("e", _ALL, Every(1, 2))),
    Tensor("layer{i}_ffn_down:expert_gate_bias_{e}", _MOE + "experts.gate_up_proj_bias",
           part=("e", Every(0, 2))),
    Tensor("layer{i}_ffn_down:expert_up_bias_{e}", _MOE + "experts.gate_up_proj_bias",
           part=("e", Every(1, 2))),
    Tensor("layer{i}_ffn_down:expert_down_{e}", _MOE + "experts.down_proj", part=("e",)),
    Tensor("layer{i}_ffn_down:expert_down_bias_{e}", _MOE + "experts.down_proj_bias",
           part=("e",)),
])
"""Llama's names (no dense MLP) plus, per layer i (E experts; targets in ``layer{i}_attention``
and ``layer{i}_ffn_down``): the sinks [nQ]; the router [E, H] (transposed) and its bias; the
fused ``gate_up_proj`` [E, H, 2I] whose even columns are expert e's gate and odd ones its up,
its bias [E, 2I] likewise; ``down_proj`` [E, I, H] (already [in, out]) and its bias [E, H]."""


def readGptOssLayerTypes(cfg: JsonConfig, num_layers: int) -> list[str]:
    """``layer_types`` of config.json, or transformers' default: layer i is sliding when i is
    even (``"sliding_attention" if (i + 1) % 2 else "full_attention"``)."""
    if not cfg.contains("layer_types"):
        return ["sliding_attention" if (i + 1) % 2 else "full_attention"
                for i in range(num_layers)]
    layer_types = cfg["layer_types"]
    if (not isinstance(layer_types, list) or len(layer_types) != num_layers
            or any(t not in GPT_OSS_LAYER_TYPES for t in layer_types)):
        raise cfg.error("layer_types", f"a list of {num_layers} (num_hidden_layers) strings, "
                        f"each one of {', '.join(GPT_OSS_LAYER_TYPES)}")
    return list(layer_types)


def readQuantMethod(cfg: JsonConfig) -> str | None:
    """config.json ``quantization_config.quant_method``: None, or "mxfp4" (openai/gpt-oss-20b
    and -120b store the experts as MXFP4, read by causallm/io/mxfp4.py); others are errors."""
    if not cfg.contains("quantization_config"):
        return None
    method = cfg.get_dict("quantization_config").get("quant_method")
    if method != "mxfp4":
        raise CausalLMError(f"{cfg.path}: 'quantization_config' has quant_method {method!r}; "
                            f"only \"mxfp4\" checkpoints can be read")
    return method


class ColumnSlice:
    """``source.read()[..., columns]`` as a C-contiguous float32 array, read on demand
    (``columns`` = ``slice(0, None, 2)`` is an expert's gate in gpt-oss's gate_up_proj)."""

    __slots__ = ("source", "columns")

    def __init__(self, source, columns: slice) -> None:
        self.source, self.columns = source, columns

    def read(self) -> np.ndarray:
        return np.ascontiguousarray(self.source.read()[..., self.columns])

    def __array__(self, dtype=None, copy=None):
        a = self.read()
        return a if dtype is None else a.astype(dtype, copy=False)


class GptOssForCausalLM(ExpertsOnFileMixin, CausalLM):
    """``GptOssForCausalLM``: sink attention with sliding windows, yarn RoPE, MoE feed-forward.

    nntr_config ``moe_expert_cache`` N > 0 keeps the experts in their file and at most N per
    layer in memory (models/experts_on_file.py); the default is 0 (all resident), except for
    an MXFP4 checkpoint (config.json ``quantization_config``): every expert dequantized to
    float32 would take 8x its file size (~80 GB for gpt-oss-20b), so there the default is the
    experts of one token, ``num_experts_per_tok``, announced on stderr."""

    MOE_LAYER_TYPE = GptOssMoELayer.type  # the feed-forward layer createMlp creates
    EXPERT_LAYER = GptOssMoELayer
    EXPERT_WEIGHTS = ("up", "up_bias", "gate", "gate_bias", "down", "down_bias")  # request order

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.NUM_EXPERTS = cfg.get_int("num_local_experts", minimum=1)
        self.NUM_EXPERTS_PER_TOK = cfg.get_int("num_experts_per_tok", minimum=1)
        if self.NUM_EXPERTS_PER_TOK > self.NUM_EXPERTS:
            raise cfg.error("num_experts_per_tok",
                            f"at most num_local_experts ({self.NUM_EXPERTS})")
        # per-layer windows: Transformer.layerSlidingWindow reads layer_types
        self.layer_types = readGptOssLayerTypes(cfg, self.NUM_LAYERS)
        if "sliding_window" not in cfg:
            self.SLIDING_WINDOW = GPT_OSS_SLIDING_WINDOW
        elif self.SLIDING_WINDOW == UINT_MAX and "sliding_attention" in self.layer_types:
            raise CausalLMError(f"{cfg.path}: 'layer_types' has sliding_attention layers but "
                                f"'sliding_window' is null")
        if "rms_norm_eps" not in cfg:
            self.NORM_EPS = GPT_OSS_RMS_NORM_EPS
        if "max_position_embeddings" not in cfg:
            self.MAX_POSITION_EMBEDDINGS = GPT_OSS_MAX_POSITION_EMBEDDINGS
        if not cfg.contains("rope_theta") and "rope_theta" not in self.ROPE_SCALING:
            self.ROPE_THETA = GPT_OSS_ROPE_THETA
        if not (cfg.contains("rope_scaling") or cfg.contains("rope_parameters")):
            self.ROPE_SCALING = dict(GPT_OSS_ROPE_SCALING)
        self.ATTENTION_BIAS = cfg.get_bool("attention_bias", True)
        self.MLP_BIAS = False  # no dense MLP: the experts always have biases
        self.SWIGLU_ALPHA = cfg.get_float("swiglu_alpha", SWIGLU_ALPHA)
        self.SWIGLU_LIMIT = cfg.get_float("swiglu_limit", SWIGLU_LIMIT)
        if self.SWIGLU_LIMIT <= 0:
            raise cfg.error("swiglu_limit", "a positive number")
        self.QUANT_METHOD = readQuantMethod(cfg)
        if (self.QUANT_METHOD == "mxfp4" and self.MOE_EXPERT_CACHE is None
                and self.MOE_LAYER_TYPE == GptOssMoELayer.type):
            self.MOE_EXPERT_CACHE = self.NUM_EXPERTS_PER_TOK
            print(f"[gpt-oss] {cfg.path}: MXFP4 experts are read from the file when routed to, "
                  f"{self.MOE_EXPERT_CACHE} per layer kept in memory (nntr_config "
                  f"\"moe_expert_cache\": N keeps N, 0 dequantizes them all at load)",
                  file=sys.stderr)

    def attentionCoreProperties(self, layer_id: int, n_heads: int,
                                kind: str = SELF_ATTENTION) -> dict:
        """The base attention core with a sink logit per head (``self_attn.sinks``). The C++
        twin overrides createAttention for that alone; the projections are the base's (with
        biases while ``attention_bias``), and the window follows ``layer_types``."""
        return {**super().attentionCoreProperties(layer_id, n_heads, kind), "use_sink": True}

    def createMlp(self, layer_id: int, dim: int, hidden_dim: int, input_name: str,
                  prefix: str = "") -> list:
        return [createLayer(self.MOE_LAYER_TYPE, [
            withKey("name", f"{prefix or f'layer{layer_id}'}_ffn_down"),
            withKey("input_layers", input_name),
            withKey("unit", hidden_dim),
            withKey("num_experts", self.NUM_EXPERTS),
            withKey("num_experts_per_token", self.NUM_EXPERTS_PER_TOK),
            withKey("swiglu_alpha", self.SWIGLU_ALPHA),
            withKey("swiglu_limit", self.SWIGLU_LIMIT),
            *([withKey("moe_expert_cache", self.MOE_EXPERT_CACHE)]
              if self.MOE_EXPERT_CACHE is not None else [])])]

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(GptOssMoELayer)

    def getHFWeightTable(self) -> WeightTable:
        return GPT_OSS_WEIGHTS

    def expertSource(self, ckpt, name: str, part: HFWeight):
        """Where expert part ``part`` of ``name`` lies, in the layout its loaded weight has: a
        part ``(e,)`` is expert e's block (a FileSlice, or for MXFP4 an Mxfp4Slice, whose
        read() is the F-contiguous transpose of the dequantized rows, as Checkpoint.get gives
        it); every other column of it (index ``(e, columns)`` or ``(e, :, columns)``) is a
        ColumnSlice, C-contiguous, of that block, or for MXFP4 of the Mxfp4Slice of just those
        columns (only those rows are dequantized)."""
        path = ckpt.file_of(name)
        index = part.resolve(ckpt.shape(name))
        if len(index) == 1:
            return safetensors_slice(path, name, index)
        if ckpt.dtype(name) == MXFP4_DTYPE:
            return ColumnSlice(safetensors_slice(path, name, index), _ALL)
        return ColumnSlice(safetensors_slice(path, name, index[:1]), index[-1])
