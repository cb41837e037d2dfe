"""Qwen2 (Applications/CausalLM/models/qwen2/qwen2_causallm.cpp; HF ``modeling_qwen2.py``).

Qwen2Transformer is the Llama decoder of :class:`Transformer` with its own attention block:

    q = x Wq + bq,  k = x Wk + bk,  v = x Wv + bv        (q/k/v always have a bias)
    out = mha_core(q, k, v) Wo                           (o never has one; nor has the MLP)

Layer names and insertion (= .bin) order per block: ``layer{i}_wq`` (weight, bias), ``_wk``
(weight, bias), ``_wv`` (weight, bias), ``_attention`` (mha_core), ``_attention_out`` (weight).

Sliding windows follow Hugging Face's Qwen2Config (the C++ gives every layer ``sliding_window``
and ignores ``use_sliding_window``: docs/nntrainer.md, "Qwen2 window on every layer"), see
:func:`readQwenLayerTypes`.
Also beyond the C++: ``rope_scaling`` / ``rope_parameters`` reach mha_core (HF Qwen2 reads
them), the MLP has no bias whatever ``mlp_bias`` says, and an untied checkpoint's
``lm_head.weight`` is loaded (docs/nntrainer.md, "Qwen2 converter without lm_head").
"""

from __future__ import annotations

from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.runtime.properties import UINT_MAX
from causallm.models.causal_lm import CausalLM
from causallm.models.transformer import SELF_ATTENTION, Transformer

QWEN_LAYER_TYPES = ("full_attention", "sliding_attention")
QWEN_SLIDING_WINDOW_DEFAULT = 4096  # HF Qwen2Config / Qwen3Config ``sliding_window`` default
QWEN_MAX_WINDOW_LAYERS_DEFAULT = 28  # HF ``max_window_layers`` default


def readQwenLayerTypes(cfg: JsonConfig, num_layers: int) -> tuple[int, list[str]]:
    """The sliding window and per-layer attention types of a Qwen2/Qwen3 config.json, as
    transformers' ``Qwen2Config`` / ``Qwen3Config.__post_init__`` derive them:

        window      = sliding_window (default 4096) if use_sliding_window (default false)
                      else none
        layer_types = config's ``layer_types`` if given, else
                      ["sliding_attention" if window is set and i >= max_window_layers (28)
                       else "full_attention" for i in 0..L-1]

    Returns ``(window or UINT_MAX, layer_types)``; a ``sliding_attention`` layer attends to the
    last ``window`` positions (its own included), every other layer to all of them.
    Transformers fails on a sliding layer without a window; so does this (one line)."""
    window = None
    if cfg.get_bool("use_sliding_window", False):
        if "sliding_window" not in cfg:
            window = QWEN_SLIDING_WINDOW_DEFAULT
        elif cfg.contains("sliding_window"):
            window = cfg.get_int("sliding_window", minimum=1)
    if cfg.contains("layer_types"):
        layer_types = cfg["layer_types"]
        if (not isinstance(layer_types, list) or len(layer_types) != num_layers
                or any(t not in QWEN_LAYER_TYPES for t in layer_types)):
            raise cfg.error("layer_types", f"a list of {num_layers} (num_hidden_layers) strings, "
                            f"each one of {', '.join(QWEN_LAYER_TYPES)}")
        layer_types = list(layer_types)
        if window is None and "sliding_attention" in layer_types:
            raise CausalLMError(f"{cfg.path}: 'layer_types' has sliding_attention layers but no "
                                f"sliding window is set ('use_sliding_window' is false or "
                                f"'sliding_window' is null)")
    else:
        max_window_layers = cfg.get_int("max_window_layers", QWEN_MAX_WINDOW_LAYERS_DEFAULT,
                                        minimum=0)
        layer_types = ["sliding_attention" if window is not None and i >= max_window_layers
                       else "full_attention" for i in range(num_layers)]
    return (UINT_MAX if window is None else window), layer_types


class Qwen2Transformer(Transformer):
    """Transformer with Qwen2 attention (q/k/v biases, per-layer sliding windows)."""

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        # HF Qwen2Config has no attention_bias / mlp_bias: the biases are fixed (q/k/v yes, o and
        # MLP no), so those keys are ignored. ATTENTION_BIAS False = "o has no bias" for the base
        # weight map; createAttention gives q/k/v theirs.
        self.ATTENTION_BIAS = False
        self.MLP_BIAS = False
        # per-layer windows: Transformer.layerSlidingWindow reads layer_types
        self.SLIDING_WINDOW, self.layer_types = readQwenLayerTypes(cfg, self.NUM_LAYERS)

    def createAttention(self, layer_id: int, seq_len: int, n_heads: int, head_dim: int,
                        query_name: str, key_name: str, value_name: str, prefix: str = "",
                        kind: str = SELF_ATTENTION) -> list:
        """Qwen2's: biases on q, k and v, none on the output projection."""
        return self.attentionLayers(layer_id, n_heads, head_dim, query_name, key_name,
                                    value_name, prefix, kind, qkv_bias=True, out_bias=False)


class Qwen2CausalLM(CausalLM, Qwen2Transformer):
    """``Qwen2ForCausalLM``: CausalLM (LM head, generation) over Qwen2Transformer."""
