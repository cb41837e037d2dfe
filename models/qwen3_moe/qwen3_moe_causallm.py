"""Qwen3-MoE (Applications/CausalLM/models/qwen3_moe/qwen3_moe_causallm.cpp; HF
``modeling_qwen3_moe.py``).

Qwen3MoECausalLM is :class:`Qwen3CausalLM` (q/k-normed attention) whose feed-forward is one
``qwen_moe`` layer named ``layer{i}_ffn_down`` (router + experts, see layers/qwen_moe.py):

    h = x + Attention(RMSNorm(x));   out = h + MoE(RMSNorm(h))       (MoE layers)
                                     out = h + SwiGLU-MLP(RMSNorm(h)) (dense layers)

Config keys: ``num_experts`` (``num_local_experts`` as transformers 5 writes it),
``num_experts_per_tok``, ``moe_intermediate_size`` (INTERMEDIATE_SIZE, as in C++),
``norm_topk_prob`` (default false, as transformers), ``decoder_sparse_step`` (1) and
``mlp_only_layers`` ([]). Layer i is MoE iff ``i not in mlp_only_layers and num_experts > 0 and
(i + 1) % decoder_sparse_step == 0`` (transformers' rule); the others get the base SwiGLU MLP of
width ``intermediate_size`` (``layer{i}_ffn_up/_ffn_gate/_ffn_swiglu/_ffn_down``). A set
``use_sliding_window`` gives every layer the window (Qwen3MoeConfig has no ``layer_types``).

Beyond the C++ (docs/nntrainer.md, "Qwen MoE always renormalises"): ``norm_topk_prob=false`` is
honoured, and so are ``decoder_sparse_step`` and ``mlp_only_layers``.

.bin order per MoE block (docs/nntrainer.md, "Block order by family"): attention as Qwen3,
``ffn_norm``, then the router ``gate`` [H, E] (FP32) and per expert ``up``, ``gate`` [H, I],
``down`` [I, H].
Hugging Face checkpoints: the Hub's per-expert tensors
``mlp.experts.{e}.{gate,up,down}_proj.weight``, or transformers 5's fused
``mlp.experts.gate_up_proj`` [E, 2I, H] (gate rows, then up rows) and ``mlp.experts.down_proj``
[E, H, I] (``save_pretrained(save_original_format=False)``).

nntr_config ``moe_expert_cache`` (N): experts kept in memory per layer (0 = all resident, the
default here; Qwen3SlimMoeForCausalLM and Qwen3CachedSlimMoeForCausalLM turn it on). With N > 0
the experts stay in the weight file (.bin or .safetensors, per-expert or fused) and the layers
read the routed ones into an LRU of N (models/experts_on_file.py: loading, saving, and the zero
placeholders ``model.getWeight`` then gives for the experts). Logits are identical either way.
"""

from __future__ import annotations

from causallm.api import createLayer, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.io.weight_table import Split, Tensor, WeightTable
from causallm.layers.qwen_moe import MoELayer
from causallm.models.experts_on_file import ExpertsOnFileMixin
from causallm.models.qwen3.qwen3_causallm import QWEN3_WEIGHTS, Qwen3CausalLM

EXPERT_WEIGHTS = ("up", "gate", "down")  # a qwen_moe expert's weights, in request order

_ROUTER = Tensor("layer{i}_ffn_down:gate", "model.layers.{i}.mlp.gate.weight", transpose=True)
QWEN3_MOE_WEIGHTS = QWEN3_WEIGHTS.extend([
    _ROUTER,
    Tensor("layer{i}_ffn_down:expert_{w}_{e}", "model.layers.{i}.mlp.experts.{e}.{w}_proj.weight",
           transpose=True),
])
"""Qwen3's names (dense layers keep its MLP rows) plus the router [E, H] and the Hub's
per-expert tensors, each [out, in]."""
QWEN3_MOE_FUSED_WEIGHTS = QWEN3_WEIGHTS.extend([
    _ROUTER,
    Tensor("layer{i}_ffn_down:expert_gate_{e}", "model.layers.{i}.mlp.experts.gate_up_proj",
           transpose=True, part=("e", Split(0, 2))),
    Tensor("layer{i}_ffn_down:expert_up_{e}", "model.layers.{i}.mlp.experts.gate_up_proj",
           transpose=True, part=("e", Split(1, 2))),
    Tensor("layer{i}_ffn_down:expert_down_{e}", "model.layers.{i}.mlp.experts.down_proj",
           transpose=True, part=("e",)),
])
"""transformers 5's fused experts: ``gate_up_proj`` [E, 2I, H] (gate rows, then up rows) and
``down_proj`` [E, H, I]."""


class Qwen3MoECausalLM(ExpertsOnFileMixin, Qwen3CausalLM):
    """``Qwen3MoeForCausalLM``: Qwen3CausalLM with sparse MoE feed-forward layers (their
    experts optionally left on file, see models/experts_on_file.py)."""

    MOE_LAYER = MoELayer  # its type string is what createMlp creates
    EXPERT_LAYER = MoELayer  # the slim variants' layers are MoELayers too
    EXPERT_WEIGHTS = EXPERT_WEIGHTS

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        experts_key = "num_experts" if cfg.contains("num_experts") else "num_local_experts"
        for key in (experts_key, "num_experts_per_tok", "moe_intermediate_size"):
            if not cfg.contains(key):
                raise CausalLMError(f"{cfg.path}: Qwen3MoE needs 'num_experts' (or "
                                    f"'num_local_experts'), 'num_experts_per_tok' and "
                                    f"'moe_intermediate_size'; '{key}' is missing")
        self.NUM_EXPERTS = cfg.get_int(experts_key, minimum=0)
        self.NUM_EXPERTS_PER_TOK = cfg.get_int("num_experts_per_tok", minimum=1)
        if self.NUM_EXPERTS and self.NUM_EXPERTS_PER_TOK > self.NUM_EXPERTS:
            raise cfg.error("num_experts_per_tok", f"at most {experts_key} ({self.NUM_EXPERTS})")
        self.DENSE_INTERMEDIATE_SIZE = self.INTERMEDIATE_SIZE  # config intermediate_size
        self.INTERMEDIATE_SIZE = cfg.get_int("moe_intermediate_size", minimum=1)
        self.NORM_TOPK_PROB = cfg.get_bool("norm_topk_prob", False)
        self.DECODER_SPARSE_STEP = cfg.get_int("decoder_sparse_step", 1, minimum=1)
        self.MLP_ONLY_LAYERS = (cfg.get_int_list("mlp_only_layers")
                                if cfg.contains("mlp_only_layers") else [])
        self.hf_fused_experts = False  # set by openHFCheckpoint from the checkpoint's names

    def isMoELayer(self, layer_id: int) -> bool:
        """transformers' Qwen3MoeDecoderLayer rule for a sparse (MoE) feed-forward."""
        return (layer_id not in self.MLP_ONLY_LAYERS and self.NUM_EXPERTS > 0
                and (layer_id + 1) % self.DECODER_SPARSE_STEP == 0)

    def layerSlidingWindow(self, layer_id: int) -> int:
        return self.SLIDING_WINDOW  # UINT_MAX unless use_sliding_window: then every layer

    def createMlp(self, layer_id: int, dim: int, hidden_dim: int, input_name: str,
                  prefix: str = "") -> list:
        if not self.isMoELayer(layer_id):
            return super().createMlp(layer_id, dim, self.DENSE_INTERMEDIATE_SIZE, input_name,
                                     prefix)
        props = [withKey("name", f"{prefix or f'layer{layer_id}'}_ffn_down"),
                 withKey("input_layers", input_name),
                 withKey("unit", hidden_dim), withKey("num_experts", self.NUM_EXPERTS),
                 withKey("num_experts_per_token", self.NUM_EXPERTS_PER_TOK),
                 withKey("moe_activation", "swish"),
                 withKey("norm_topk_prob", self.NORM_TOPK_PROB)]
        if self.MOE_EXPERT_CACHE is not None:
            props.append(withKey("moe_expert_cache", self.MOE_EXPERT_CACHE))
        return [createLayer(self.MOE_LAYER.type, props)]

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(self.MOE_LAYER)

    # -- weights ----------------------------------------------------------------------------
    def getHFWeightTable(self) -> WeightTable:
        """Qwen3's table with each MoE layer's router and experts, per expert or fused as the
        checkpoint has them (``hf_fused_experts``, set when it is opened)."""
        return QWEN3_MOE_FUSED_WEIGHTS if self.hf_fused_experts else QWEN3_MOE_WEIGHTS

    def openHFCheckpoint(self, folder: str):
        """The checkpoint; its names tell per-expert from fused experts (``hf_fused_experts``,
        read by getHFWeightMap)."""
        ckpt = super().openHFCheckpoint(folder)
        self.hf_fused_experts = any(n.endswith(".mlp.experts.gate_up_proj") for n in ckpt.keys())
        return ckpt
