"""The SigLIP vision tower and Gemma 3's multimodal projector, as registry layers (HF
``modeling_siglip.py`` ``SiglipVisionModel`` and ``Gemma3MultiModalProjector``); Gemma 3's
image-text model and T5Gemma2 build them into a ``vision`` stage.

An image x (3, S, S), patch P, g = S / P patches a side, N = g^2, hidden D::

    h = conv(x) + E_pos                  vision_patch_embedding (conv2d, kernel = stride = P),
                                         vision_patch_flatten (reshape D:1:N), vision_patch_rows
                                         (permute 2,3,1: N rows of D, row-major),
                                         vision_position_embedding
    per layer i:                         vision_layer{i}_*
      a = h + Wo attn(LN1(h)) + bo       _attention_norm, _wq/_wk/_wv (biased), _attention
                                         (bidirectional, no RoPE, scale d^-1/2), _attention_out,
                                         _attention_add
      h = a + W2 act(W1 LN2(a) + b1) + b2      _ffn_norm, _ffn_up, _ffn_act (hidden_act),
                                               _ffn_down, _output
    v = LN_post(h)                       vision_output_norm  (SigLIP's last_hidden_state)

LN is ``layer_normalization`` with bias, eps ``layer_norm_eps``; no pooling head (Gemma 3 sets
``vision_use_head`` false; a head in the file is ignored). The projector turns the N rows into
M = ``mm_tokens_per_image`` text embeddings (k = g / sqrt(M))::

    grid  = v as (D, g, g)               vision_projector_grid (reshape g:g:D, permute 3,1,2)
    p     = avg_pool_k(grid)             vision_projector_pool (pooling2d average, k x k)
    rows  = p as M rows of D             vision_projector_flatten (reshape D:1:M),
                                         vision_projector_rows (permute 2,3,1)
    out   = RMSNorm(rows) @ W            vision_projector_norm (rms_norm, (1 + w), eps
                                         layer_norm_eps), vision_projector (fully_connected,
                                         W = mm_input_projection_weight [D, text hidden], no bias)

The stage runs one image per step over its N patch rows (``from_`` 0, ``to`` N).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from causallm.api import createLayer, withKey
from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.io.weight_table import Tensor
from causallm.runtime.properties import UINT_MAX
from causallm.models.gemma3.gemma3_causallm import HIDDEN_ACTIVATIONS

VISION = "vision"
"""The stage."""


@dataclass(frozen=True)
class SiglipVisionConfig:
    """``vision_config`` (transformers' SiglipVisionConfig defaults) and the projector's
    ``mm_tokens_per_image``."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_channels: int
    image_size: int
    patch_size: int
    eps: float
    act: str
    mm_tokens_per_image: int

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.patches_per_side ** 2

    @property
    def pool(self) -> int:
        return self.patches_per_side // math.isqrt(self.mm_tokens_per_image)

    @classmethod
    def read(cls, vc: JsonConfig, mm_tokens_per_image: int,
             where: JsonConfig) -> "SiglipVisionConfig":
        """From ``vision_config`` (``vc``) and ``mm_tokens_per_image`` (a key of ``where``);
        shapes that do not tile are errors naming the key."""
        act = vc.get_str("hidden_act", "gelu_pytorch_tanh")
        if act not in HIDDEN_ACTIVATIONS:
            raise vc.error("hidden_act", f"one of {', '.join(HIDDEN_ACTIVATIONS)}")
        size, patch = (vc.get("image_size", 224), vc.get("patch_size", 16))
        for key, value in (("image_size", size), ("patch_size", patch)):
            if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:
                vc = JsonConfig({**vc, key: value[0]}, vc.path, vc.exists, vc.section)
        out = cls(hidden_size=vc.get_int("hidden_size", 768, minimum=1),
                  intermediate_size=vc.get_int("intermediate_size", 3072, minimum=1),
                  num_layers=vc.get_int("num_hidden_layers", 12, minimum=1),
                  num_heads=vc.get_int("num_attention_heads", 12, minimum=1),
                  num_channels=vc.get_int("num_channels", 3, minimum=1),
                  image_size=vc.get_int("image_size", 224, minimum=1),
                  patch_size=vc.get_int("patch_size", 16, minimum=1),
                  eps=vc.get_float("layer_norm_eps", 1e-6),
                  act=HIDDEN_ACTIVATIONS[act],
                  mm_tokens_per_image=where.get_int("mm_tokens_per_image", 256, minimum=1))
        if out.num_channels != 3:
            raise vc.error("num_channels", "3 (RGB images)")
        if out.image_size % out.patch_size:
            raise vc.error("patch_size", f"a divisor of image_size {out.image_size}")
        if out.hidden_size % out.num_heads:
            raise vc.error("num_attention_heads", f"a divisor of hidden_size {out.hidden_size}")
        side = math.isqrt(out.mm_tokens_per_image)
        if side * side != out.mm_tokens_per_image or out.patches_per_side % side:
            raise where.error("mm_tokens_per_image", f"a square whose side divides the "
                                                     f"{out.patches_per_side} patches a side")
        return out


def createVisionTower(vc: SiglipVisionConfig, createFullyConnected) -> tuple[list, str]:
    """The tower's layers from ``vision_input0`` (the image) and the name of its output; its
    projections from ``createFullyConnected(name, unit, input_name, bias)`` (the model's
    hook, Transformer.createFullyConnected)."""
    D, N = vc.hidden_size, vc.num_patches

    def norm(name, source):
        return createLayer("layer_normalization", [
            withKey("name", name), withKey("input_layers", source), withKey("axis", 3),
            withKey("epsilon", vc.eps)])

    def linear(name, unit, source):
        return createFullyConnected(name, unit, source, True)

    layers = [
        createLayer("input", [withKey("name", f"{VISION}_input0"),
                              withKey("input_shape", f"3:{vc.image_size}:{vc.image_size}")]),
        createLayer("conv2d", [withKey("name", f"{VISION}_patch_embedding"),
                               withKey("input_layers", f"{VISION}_input0"),
                               withKey("filters", D),
                               withKey("kernel_size", f"{vc.patch_size},{vc.patch_size}"),
                               withKey("stride", f"{vc.patch_size},{vc.patch_size}"),
                               withKey("padding", "valid")]),
        createLayer("reshape", [withKey("name", f"{VISION}_patch_flatten"),
                                withKey("input_layers", f"{VISION}_patch_embedding"),
                                withKey("target_shape", f"{D}:1:{N}")]),
        createLayer("permute", [withKey("name", f"{VISION}_patch_rows"),
                                withKey("input_layers", f"{VISION}_patch_flatten"),
                                withKey("direction", "2,3,1")]),
        createLayer("positional_embedding", [withKey("name", f"{VISION}_position_embedding"),
                                             withKey("input_layers", f"{VISION}_patch_rows"),
                                             withKey("max_position_embeddings", N)]),
    ]
    h = f"{VISION}_position_embedding"
    for i in range(vc.num_layers):
        p = f"{VISION}_layer{i}"
        layers += [norm(f"{p}_attention_norm", h),
                   linear(f"{p}_wq", D, f"{p}_attention_norm"),
                   linear(f"{p}_wk", D, f"{p}_attention_norm"),
                   linear(f"{p}_wv", D, f"{p}_attention_norm"),
                   createLayer("mha_core", [
                       withKey("name", f"{p}_attention"), withKey("num_heads", vc.num_heads),
                       withKey("num_heads_KV", vc.num_heads), withKey("max_timestep", N),
                       withKey("sliding_window", UINT_MAX), withKey("is_causal", "false"),
                       withKey("use_rope", "false"),
                       withKey("input_layers", f"{p}_wq,{p}_wk,{p}_wv")]),
                   linear(f"{p}_attention_out", D, f"{p}_attention"),
                   createLayer("addition", [withKey("name", f"{p}_attention_add"),
                                            withKey("input_layers", f"{h},{p}_attention_out")]),
                   norm(f"{p}_ffn_norm", f"{p}_attention_add"),
                   linear(f"{p}_ffn_up", vc.intermediate_size, f"{p}_ffn_norm"),
                   createLayer("activation", [withKey("name", f"{p}_ffn_act"),
                                              withKey("activation", vc.act),
                                              withKey("input_layers", f"{p}_ffn_up")]),
                   linear(f"{p}_ffn_down", D, f"{p}_ffn_act"),
                   createLayer("addition", [withKey("name", f"{p}_output"),
                                            withKey("input_layers",
                                                    f"{p}_attention_add,{p}_ffn_down")])]
        h = f"{p}_output"
    layers.append(norm(f"{VISION}_output_norm", h))
    return layers, f"{VISION}_output_norm"


def createMultiModalProjector(vc: SiglipVisionConfig, text_hidden: int, input_name: str,
                              createFullyConnected) -> tuple[list, str]:
    """Gemma 3's projector over the tower's output: average-pool the patch grid to
    mm_tokens_per_image rows, RMS-normalise, project to the text width (createVisionTower's
    ``createFullyConnected``)."""
    D, g, k = vc.hidden_size, vc.patches_per_side, vc.pool
    P = f"{VISION}_projector"
    return [
        createLayer("reshape", [withKey("name", f"{P}_grid_rows"),
                                withKey("input_layers", input_name),
                                withKey("target_shape", f"{g}:{g}:{D}")]),
        createLayer("permute", [withKey("name", f"{P}_grid"),
                                withKey("input_layers", f"{P}_grid_rows"),
                                withKey("direction", "3,1,2")]),
        createLayer("pooling2d", [withKey("name", f"{P}_pool"),
                                  withKey("input_layers", f"{P}_grid"),
                                  withKey("pooling", "average"), withKey("pool_size", f"{k},{k}"),
                                  withKey("stride", f"{k},{k}")]),
        createLayer("reshape", [withKey("name", f"{P}_flatten"),
                                withKey("input_layers", f"{P}_pool"),
                                withKey("target_shape", f"{D}:1:{vc.mm_tokens_per_image}")]),
        createLayer("permute", [withKey("name", f"{P}_rows"),
                                withKey("input_layers", f"{P}_flatten"),
                                withKey("direction", "2,3,1")]),
        createLayer("rms_norm", [withKey("name", f"{P}_norm"), withKey("input_layers", f"{P}_rows"),
                                 withKey("epsilon", vc.eps), withKey("packed", "false")]),
        createFullyConnected(P, text_hidden, f"{P}_norm"),
    ], P


def siglipWeights(tower: str, projector: str) -> list[Tensor]:
    """Weight-table rows of the tower (HF prefix ``tower``, e.g.
    ``model.vision_tower.vision_model.``) and the projector (``projector``, e.g.
    ``model.multi_modal_projector.``)."""
    L = tower + "encoder.layers.{i}."
    rows = [
        Tensor(f"{VISION}_patch_embedding:filter", tower + "embeddings.patch_embedding.weight"),
        Tensor(f"{VISION}_patch_embedding:bias", tower + "embeddings.patch_embedding.bias"),
        Tensor(f"{VISION}_position_embedding:Embedding",
               tower + "embeddings.position_embedding.weight"),
        Tensor(f"{VISION}_output_norm:gamma", tower + "post_layernorm.weight"),
        Tensor(f"{VISION}_output_norm:beta", tower + "post_layernorm.bias"),
        Tensor(f"{VISION}_projector_norm:gamma", projector + "mm_soft_emb_norm.weight",
               offset=1.0),
        Tensor(f"{VISION}_projector:weight", projector + "mm_input_projection_weight"),
    ]
    for ours, hf in (("attention_norm", "layer_norm1"), ("ffn_norm", "layer_norm2")):
        rows += [Tensor(f"{VISION}_layer{{i}}_{ours}:gamma", L + f"{hf}.weight"),
                 Tensor(f"{VISION}_layer{{i}}_{ours}:beta", L + f"{hf}.bias")]
    for ours, hf in (("wq", "self_attn.q_proj"), ("wk", "self_attn.k_proj"),
                     ("wv", "self_attn.v_proj"), ("attention_out", "self_attn.out_proj"),
                     ("ffn_up", "mlp.fc1"), ("ffn_down", "mlp.fc2")):
        rows += [Tensor(f"{VISION}_layer{{i}}_{ours}:weight", L + f"{hf}.weight", transpose=True),
                 Tensor(f"{VISION}_layer{{i}}_{ours}:bias", L + f"{hf}.bias")]
    return rows


SIGLIP_HEAD_IGNORED = ("head.*",)
"""A pooling head's tensors (``vision_use_head``), which these models never run: suffixes of
the tower prefix."""


def checkImageTokens(n_tokens: int, n_images: int, per_image: int) -> None:
    """The prompt must hold per_image image tokens for each image given."""
    if n_tokens != n_images * per_image:
        raise CausalLMError(
            f"the prompt holds {n_tokens} image tokens for {n_images} image(s) of {per_image} "
            f"tokens each" + ("; give the images with --image" if n_images == 0 else ""))
