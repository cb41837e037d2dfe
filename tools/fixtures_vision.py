r"""Make the vision parity fixtures (T5Gemma 2, Gemma 3 with images) under tests/fixtures/.

Three Hugging Face folders with tiny random models, the Gemma-style tokenizer and processor
files of tools/gemma_vision_tokenizer.py, and ``expected.npz`` with what transformers computes
in float32 (eager attention, one thread), plus the committed test images:

    tests/fixtures/images/rgb-40x24.png    RGB, 40 wide x 24 high (rgb_pixels): ramps, a
                                           checkerboard, a diagonal, a dark grid
    tests/fixtures/images/rgba-20x36.png   RGBA, 20 x 36 (rgba_pixels): alpha 0 in the top 8
                                           rows and left 4 columns (coloured, not white,
                                           underneath), 96 and 176 in two bands, 255 elsewhere

Both are made from integer numpy patterns and rewritten only when the committed file does not
decode to those pixels. Both are resized (bilinear) in both directions to the models' 32 x 32.

    t5gemma2-text   T5Gemma2ForConditionalGeneration, BF16, text prompt (42 ids, no image;
                    the SigLIP tower and projector are in the file all the same). hidden 64;
                    encoder 3 layers [sliding, full, sliding], decoder 2 layers [full,
                    sliding]; 4 heads / 2 KV heads, head_dim 24 (!= 64 / 4),
                    query_pre_attn_scalar 20, intermediate 96 (encoder) / 80 (decoder);
                    rope_parameters sliding {default, theta 1e4}, full {linear, factor 8,
                    theta 1e6} in both stacks; encoder sliding_window 8 (two-sided: keys
                    q-3 .. q+4) over a 42-token prompt, decoder sliding_window 6 over 32
                    steps; final_logit_softcapping 10.0 (it moves the logits by up to 0.33;
                    30 would move them by 0.04 at this logit scale); vision: SigLIP hidden 32,
                    intermediate 48, 2 layers, 4 heads, image 32, patch 8 (16 patches),
                    mm_tokens_per_image 4. model.safetensors in the Hub's layout.
                    seed 1000, smallest greedy margin 0.0057
    t5gemma2-image  T5Gemma2ForConditionalGeneration, F32, prompt
                    "Look at <start_of_image> and describe it:" with rgb-40x24.png (18 ids).
                    hidden 32; encoder 2 layers [full, sliding], decoder 3 layers [sliding,
                    sliding, full]; 4 heads / 1 KV head (GQA 4), head_dim 16 (!= 32 / 4),
                    query_pre_attn_scalar 24, intermediate 64 / 48; rope full {default, theta
                    1e6} (no scaling, as the Gemma 3 270M based T5Gemma 2 270M), sliding
                    {default, 1e4}; encoder sliding_window 5 (odd: keys q-2 .. q+2), decoder
                    sliding_window 10; no final softcapping; vision: SigLIP hidden 48 (!= text
                    hidden 32), intermediate 96, 2 layers, 4 heads, image 32, patch 8,
                    mm_tokens_per_image 4 (2x2 average pool). model.safetensors as transformers
                    5.23's save_pretrained writes it. seed 2005, margin 0.0080
    gemma3-vision   Gemma3ForConditionalGeneration, BF16, prompt "describe:" with both
                    images (no <start_of_image> in the prompt; 46 ids, two blocks of 16 image
                    tokens). text: hidden 64, 4 layers [sliding, sliding, full, sliding]
                    (config.json: sliding_window_pattern 3), 4 heads / 2 KV heads, head_dim 20,
                    query_pre_attn_scalar 24, intermediate 128, sliding_window 6 (< 16, the
                    image block), rope full {linear, factor 8, theta 1e6}, sliding {default,
                    1e4}, tied head, no softcapping; vision: SigLIP hidden 32, intermediate 48,
                    2 layers, 4 heads, image 32, patch 4 (8 x 8 = 64 patches),
                    mm_tokens_per_image 16 (2x2 average pool). config.json and
                    model.safetensors in google/gemma-3-4b-it's layout (see below).
                    seed 3000, margin 0.016

Tokens and special ids (all three; tools/gemma_vision_tokenizer.py): ``<pad>`` 0, ``<eos>`` 1,
``<bos>`` 2, ``<unk>`` 3, the project's byte-level BPE at 4 .. 4004 (llama-gqa3's ids + 4),
``<start_of_image>`` (boi) 4005, ``<end_of_image>`` (eoi) 4006, ``<image_soft_token>`` (image
token) 4007: 4008 tokenizer ids; vocab_size 4016 in every text config (8 rows no token maps
to). The tokenizer prepends ``<bos>`` and appends nothing, as Gemma 3's does (the T5Gemma 2
folders use the same tokenizer; transformers' T5Gemma 2 code adds no EOS either).
Configs: boi_token_index 4005, eoi_token_index 4006, image_token_index 4007 (inside the vocab,
as Gemma 3's 262144 < 262208: transformers only zeroes image ids when image_token_index >=
vocab_size, which does not happen here); pad 0, eos 1, bos 2.

Images -> pixel_values (the reference pipeline): ``PIL.Image.open(path)``,
``PIL.ImageOps.exif_transpose`` (mode kept), then the folder's processor,
``AutoProcessor.from_pretrained(folder)`` = Gemma3Processor with Gemma3ImageProcessorPil
(backend "pil"; torchvision is not installed; recorded in expected.npz as ``image_processor``).
The processor's own defaults apply (preprocessor_config.json says null): do_convert_rgb True,
i.e. an image with alpha is composited on opaque white (``Image.alpha_composite`` over a white
RGBA image, then RGB), no pan-and-scan; then ``Image.resize((S, S), BILINEAR)`` on the uint8
image (Pillow's antialiased bilinear: it averages when shrinking), x * (1/255) in float64 cast
to float32, (x - 0.5) / 0.5 in float32, channels first (manual_pixel_values, checked equal bit
for bit). Dropping alpha instead (``image.convert("RGB")``, what transformers.image_utils.
load_image does) changes rgba-20x36's pixel values by up to 1.99.

Prompt -> processor text (the CLI's rule): without ``<start_of_image>`` in the prompt the text
is " ".join(["<start_of_image>"] * n_images) + prompt, else the prompt itself (one per image).
The processor replaces each ``<start_of_image>`` by "\n\n<start_of_image>" + mm_tokens_per_image
x "<image_soft_token>" + "<end_of_image>\n\n" and tokenizes (``<bos>`` first); token_type_ids
is 1 exactly at the ``<image_soft_token>`` ids. gemma3-vision's ids: 2, 279 ("\n\n"), 4005,
16 x 4007, 4006, 279, 224 (" "), 279, 4005, 16 x 4007, 4006, 279, then "describe:"
(287 1226 72 29). t5gemma2-image's: 2, "Look at" (47 2632 411), 224 (" "), 279, 4005, 4 x 4007,
4006, 279, " and describe it:" (324 3787 72 386 29).

The vision tower (SiglipVisionModel, vision_use_head false): Conv2d(3, Dv, kernel = stride =
patch, no padding) + bias, patches flattened row-major, + position_embedding (one row per
patch, no interpolation); pre-LN encoder layers: x += out_proj(attn(LN1(x))) with q/k/v/out
biases, scale head_dim**-0.5 (Dv / heads), no mask; x += fc2(gelu_tanh(fc1(LN2(x)))); then
post_layernorm (LayerNorm eps layer_norm_eps 1e-6, weight and bias) -> ``vision_output``
(n, patches, Dv). The projector: (n, patches, Dv) -> (n, Dv, s, s) with s = image_size /
patch_size, AvgPool2d(k, stride k), k = s / sqrt(mm_tokens_per_image), flattened row-major ->
(n, mm_tokens, Dv), Gemma RMSNorm ``mm_soft_emb_norm`` (x * rsqrt(mean(x^2) + eps) * (1 + w),
eps = the vision layer_norm_eps), then ``@ mm_input_projection_weight`` (Dv, d_text; x @ W, no
transpose) -> ``image_features`` (n, mm_tokens, d_text). The features replace, in order, the
embeddings at the ``<image_soft_token>`` positions (masked_scatter) AFTER the sqrt(hidden)
embedding scale (features are not scaled).

T5Gemma 2 (transformers' modeling_t5gemma2): token embeddings E[id] * float32(sqrt(hidden))
(the embed_scale buffer, cast to the weights' dtype when running in it: 8 and 5.656854 here),
except that every ``<end_of_image>`` (eoi_token_index, encoder and decoder alike) gets
``eoi_embedding`` as it is (not scaled, N(0, 1) here); image features spliced in as above.
Encoder layer: x += post_self_attn_layernorm(attn(pre_self_attn_layernorm(x))); x +=
post_feedforward_layernorm(down(gelu_tanh(gate(x')) * up(x'))) with x' =
pre_feedforward_layernorm(x); then the final norm -> ``encoder_output``. Every RMSNorm is
x * rsqrt(mean(x^2) + 1e-6) * (1 + w), computed in float32. Attention: q_norm / k_norm
(RMSNorm over head_dim, 1 + w) on q and k, then RoPE (rotate-half, the layer type's
rope_parameters; linear factor 8 divides inv_freq by 8), scores * query_pre_attn_scalar**-0.5,
GQA. Encoder masks: full layers none; sliding layers two-sided, key j allowed for query i iff
0 <= i - j < (W + 1) // 2 or 0 < j - i < W // 2 + 1 (W 8: j in [i - 3, i + 4]; W 5: [i - 2,
i + 2]). token_type_ids are ignored (image tokens get no special mask). Decoder layer: the same
layer with "merged" attention: keys = [k_norm(k_proj(dec)) with RoPE at decoder positions 0, 1,
..; k_norm(k_proj(encoder_output)) WITHOUT RoPE], values = [v_proj(dec); v_proj(encoder_output)]
(the same k_proj / v_proj / k_norm for both parts), one softmax over the concatenation; mask:
self part causal (sliding layers: j > i - W too), encoder part all allowed. Then the final
norm, the tied head (the encoder's embedding matrix, unscaled) and, when
final_logit_softcapping c is set, c * tanh(logits / c). attn_logit_softcapping is never applied.
Decoding starts from ``<bos>`` 2: generation_config.json has no decoder_start_token_id (as
save_pretrained's, which copies the model config's ids) and generate() then falls back to
bos_token_id; decoder.bos_token_id (2) is also what prepare_decoder_input_ids_from_labels
uses. config.json: nested ``encoder`` {text_config, vision_config, mm_tokens_per_image,
boi_token_index, eoi_token_index, image_token_index} and ``decoder`` {...}; the top-level
image_token_index overrides the encoder's (T5Gemma2Config copies it down; its default is
256001), eoi_token_index is taken from the encoder; the top-level bos / eos / pad / vocab_size
are copied from the decoder.

Gemma 3 (modeling_gemma3): embeddings E[id] * sqrt(64); layer: x += post_attention_layernorm(
attn(input_layernorm(x))); x += post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)));
final norm; tied head; q/k norms, RoPE per layer type and query_pre_attn_scalar as above.
Prefill masks with token_type_ids (checked against transformers' eager masks): an image block
is a maximal run of token_type_ids 1 (one image's ``<image_soft_token>`` positions; boi and eoi
are text); full layers allow
key j for query i iff j <= i or i and j are in the same block (image tokens see the whole block,
later tokens of it too); sliding layers additionally require j > i - W (W 6) with no upper
bound: a block token sees every later token of its block but earlier ones only within the
window. Without token_type_ids the prefill logits differ by 13% of their scale. Decode steps:
generate() passes token_type_ids (and pixel_values) only to the prefill; a new token attends
causally to every cached key (full layers) or to the last W keys including itself (sliding
layers, whose DynamicCache keeps W - 1 keys), no block rule.

Weight names. T5Gemma 2 (both folders; L = layer index, d = text hidden, Dv = vision hidden):
    model.encoder.embed_tokens.weight (4016, d), model.encoder.embed_tokens.eoi_embedding (d,)
    model.encoder.layers.L.self_attn.{q,k,v,o}_proj.weight
    model.encoder.layers.L.self_attn.{q,k}_norm.weight (head_dim,)
    model.encoder.layers.L.{pre,post}_self_attn_layernorm.weight
    model.encoder.layers.L.{pre,post}_feedforward_layernorm.weight
    model.encoder.layers.L.mlp.{gate,up,down}_proj.weight, model.encoder.norm.weight
    model.decoder.layers.L.(the same names), model.decoder.norm.weight
    model.encoder.multi_modal_projector.mm_input_projection_weight (Dv, d)
    model.encoder.multi_modal_projector.mm_soft_emb_norm.weight (Dv,)
    model.encoder.vision_tower.vision_model. +
        embeddings.patch_embedding.{weight (Dv, 3, p, p), bias}
        embeddings.position_embedding.weight (patches, Dv)
        encoder.layers.L.{layer_norm1,layer_norm2}.{weight,bias}
        encoder.layers.L.self_attn.{q,k,v,out}_proj.{weight,bias}
        encoder.layers.L.mlp.{fc1,fc2}.{weight,bias}
        post_layernorm.{weight,bias}
t5gemma2-text has the ``vision_tower.vision_model.`` names, as the Hub's files
(google/t5gemma-2-*) do; t5gemma2-image has ``vision_tower.`` without ``vision_model.``, as
transformers 5.23's save_pretrained writes them. Tied and absent from both files: the decoder's
embed_tokens.weight and embed_tokens.eoi_embedding (= the encoder's) and lm_head.out_proj.weight
(= model.encoder.embed_tokens.weight). In memory (transformers >= 5.1) the encoder's text stack
is ``model.encoder.text_model.{embed_tokens,layers,norm}`` and the tower has no vision_model
level; from_pretrained maps either file layout (and the in-memory names) onto it.
Gemma 3 (google/gemma-3-4b-it's names):
    language_model.model.embed_tokens.weight (4016, 64), language_model.model.norm.weight
    language_model.model.layers.L.self_attn.{q,k,v,o}_proj.weight
    language_model.model.layers.L.self_attn.{q,k}_norm.weight
    language_model.model.layers.L.{input_layernorm,post_attention_layernorm}.weight
    language_model.model.layers.L.{pre_feedforward_layernorm,post_feedforward_layernorm}.weight
    language_model.model.layers.L.mlp.{gate,up,down}_proj.weight
    multi_modal_projector.mm_input_projection_weight (32, 64)
    multi_modal_projector.mm_soft_emb_norm.weight (32,)
    vision_tower.vision_model.(the SigLIP names above)
no lm_head.weight (tied to the embedding). transformers 5.23's save_pretrained writes the same
except ``vision_tower.`` without ``vision_model.``; in memory: model.language_model.*,
model.vision_tower.*, model.multi_modal_projector.*, lm_head.weight.

gemma3-vision's config.json is shaped like google/gemma-3-4b-it's (transformers 4.50): only
non-default keys, text_config with rope_theta (full layers), rope_local_base_freq (sliding),
rope_scaling {factor 8, linear} (full layers only) and sliding_window_pattern 3 (layer i slides
unless (i + 1) % 3 == 0) instead of rope_parameters / layer_types; torch_dtype; eos_token_id
[1]; rms_norm_eps (1e-6), hidden_activation (gelu_pytorch_tanh), token ids, tie_word_embeddings
and the vision layer_norm_eps (1e-6), hidden_act (gelu_pytorch_tanh) and num_channels (3) are
left to the defaults. The T5Gemma 2 config.json files are what save_pretrained writes (the model
type is transformers-5 only). generation_config.json: greedy, max_new_tokens 32, bos 2, pad 0,
eos 1 (Gemma 3: [1]).

Weights: see vision_init (small token embeddings, louder post-norms, a quiet T5Gemma 2
encoder output: otherwise the tied head makes nearly every seed repeat one token), rounded to
the folder's dtype. A seed is kept when every greedy step wins by >= MIN_MARGIN (5e-3), no step
emits a special id or an id >= 4008, there are >= MIN_DISTINCT (16) different tokens and, with
images, all-zero pixel_values give other tokens.

expected.npz (float32 arrays, int64 ids, 0-d unicode strings):

    prompt                  the CLI prompt
    prompt_ids              (P,): the processor's input_ids (image tokens expanded; text only:
                            the tokenizer's), <bos> first
    tokens                  (N = 32,): greedy tokens (do_sample False, num_beams 1, the folder's
                            generation config; no EOS occurs)
    step_logits             (N, V): the logits that chose tokens[k] (T5Gemma 2: after the final
                            softcapping); k = 0 is the prefill / first decoder step
    prefill_logits          (V,): step_logits[0]
    full_logits_last        (V,): the no-cache forward's last position (T5Gemma 2: decoder over
                            [start] + tokens[:-1]; Gemma 3: prompt_ids + tokens[:-1] with
                            pixel_values and token_type_ids extended by zeros)
    transformers_version
  T5Gemma 2 also:
    encoder_output          (P, d): the encoder's last hidden state (image features spliced in)
    decoder_start_token_id  0-d: 2
    full_step_logits        (N, V): no-cache decoder forward over [start] + tokens[:-1]
  gemma3-vision also:
    token_type_ids          (P,): as the processor returns them
  image folders also:
    processor_text          the text given to the processor
    images                  (n,): the image paths relative to the repository root, in order
    pixel_values            (n, 3, 32, 32): as the processor returns them
    vision_output           (n, patches, Dv): the vision tower's last_hidden_state
    image_features          (n, mm_tokens_per_image, d): the projector's output
    image_processor         "Gemma3ImageProcessorPil (pil)": the processor's image class, backend

Checks: the cached greedy decoding equals generate()'s; the no-cache forward reproduces every
cached step to 1e-5 of the logit scale; a float64 copy of the model (its RMSNorms still compute
in float32) picks the same tokens (logits within 1.1e-6 of the scale, against margins >= 5.7e-3);
transformers' eager attention masks equal the rules above; AutoProcessor on the written folder
(images read from disk) gives prompt_ids, token_type_ids and pixel_values bit for bit, and
tokenizer.json alone gives the same ids as AutoTokenizer; the folder reloads (Auto classes)
with every parameter bit-equal, the ties, the configs as built, exactly the weight names above
in the folder's dtype, and reproduces the encoder output, vision outputs and logits to 1e-5 and
generate()'s tokens with its own generation config. Re-running writes byte-identical files.

transformers 5.23 notes: save_pretrained writes T5Gemma 2's text encoder under the names the
Hub uses (model.encoder.embed_tokens / layers / norm: the "t5gemma2_encoder" conversion mapping
is reversed on save) but drops SigLIP's ``vision_model.`` level (its PrefixChange is not
reversed), for T5Gemma 2 and Gemma 3 alike. fixture_common's decoder helpers pass
encoder_outputs as a tuple, which T5Gemma 2 cannot read (it needs .last_hidden_state), hence
the Seq2Seq wrapper. generate() needs no cache workaround (T5Gemma2 builds its own
EncoderDecoderCache from the decoder config). The image processor alone
(AutoImageProcessor) keeps preprocessor_config.json's do_convert_rgb null and fails on an RGBA
image (4-channel normalize); only the processor's default (True) composites.
transformers.image_utils.load_image converts RGBA to RGB by dropping alpha.

Usage:  python tools/fixtures_vision.py [--only NAME ...] [--out tests/fixtures]
        (needs Pillow; the images are always written to tests/fixtures/images/)
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemma_vision_tokenizer as gtok  # noqa: E402
from fixture_common import (BIAS_STD, MIN_MARGIN, NORM_STD, ROOT, WEIGHT_STD, Run,  # noqa: E402
                            check_safetensors, decoder_greedy, decoder_logits, first_seed,
                            fresh_folder, generate, load_reference, min_margin, random_model,
                            rel_err, run_cli, save_tensors, save_weights, summary, write_expected,
                            write_json)

N_NEW = 32
MIN_DISTINCT = 16
"""Fewest different greedy tokens."""
TOL = 1e-5
"""Reload check: max |difference| / max |expected| (encoder output, vision output, logits)."""
EMBED_STD = 0.04
EOI_STD = 1.0
"""T5Gemma 2's eoi_embedding replaces the scaled token embedding, unscaled."""
POS_STD = 0.3
"""SigLIP position embeddings, so that patch positions matter."""
POST_NORM_MEAN = 1.0
FINAL_NORM_MEAN = 2.0
ENCODER_NORM_MEAN, ENCODER_NORM_STD = -0.9, 0.05
"""Weight init (see vision_init)."""
START = gtok.BOS_ID
"""T5Gemma 2's decoder start: generate() falls back to bos_token_id (2) without a
decoder_start_token_id in the generation config."""

IMAGES_DIR = "tests/fixtures/images"
RGB_IMAGE = f"{IMAGES_DIR}/rgb-40x24.png"
RGBA_IMAGE = f"{IMAGES_DIR}/rgba-20x36.png"

ROPE_SCALED = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}
ROPE_PLAIN = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
              "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}
TOKEN_IDS = dict(vocab_size=gtok.VOCAB_SIZE, pad_token_id=gtok.PAD_ID, eos_token_id=gtok.EOS_ID,
                 bos_token_id=gtok.BOS_ID)
TEXT_COMMON = dict(TOKEN_IDS, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                   attention_bias=False)
IMAGE_TOKENS = dict(boi_token_index=gtok.BOI_ID, eoi_token_index=gtok.EOI_ID,
                    image_token_index=gtok.IMAGE_ID)


def siglip(**kw) -> dict:
    return dict(model_type="siglip_vision_model", num_channels=3, layer_norm_eps=1e-6,
                hidden_act="gelu_pytorch_tanh", vision_use_head=False, attention_dropout=0.0, **kw)


def t5gemma2_config(encoder_text: dict, vision: dict, mm_tokens_per_image: int,
                    decoder: dict) -> dict:
    """T5Gemma2Config keywords: nested encoder {text_config, vision_config, mm_tokens_per_image,
    boi/eoi/image token indices}, decoder, and the top-level image_token_index (which
    T5Gemma2Config copies into the encoder config, overriding the encoder's own)."""
    return dict(encoder=dict(text_config=dict(TEXT_COMMON, **encoder_text), vision_config=vision,
                             mm_tokens_per_image=mm_tokens_per_image, **IMAGE_TOKENS),
                decoder=dict(TEXT_COMMON, **decoder), image_token_index=gtok.IMAGE_ID,
                dropout_rate=0.0, attention_dropout=0.0, tie_word_embeddings=True)


FIXTURES = {
    "t5gemma2-text": dict(
        family="t5gemma2", seed=1000, n_new=N_NEW, dtype="bfloat16", layout="hub", images=[],
        prompt="The nonlocal statement causes the listed identifiers to refer to previously bound "
               "variables in the nearest enclosing scope excluding globals. This is important "
               "because the default behavior for binding is to search the local namespace first.",
        config=t5gemma2_config(
            encoder_text=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                              query_pre_attn_scalar=20, sliding_window=8,
                              layer_types=["sliding_attention", "full_attention",
                                           "sliding_attention"],
                              rope_parameters=copy.deepcopy(ROPE_SCALED)),
            vision=siglip(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, image_size=32, patch_size=8),
            mm_tokens_per_image=4,
            decoder=dict(hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                         query_pre_attn_scalar=20, sliding_window=6,
                         layer_types=["full_attention", "sliding_attention"],
                         rope_parameters=copy.deepcopy(ROPE_SCALED),
                         final_logit_softcapping=10.0)),
    ),
    "t5gemma2-image": dict(
        family="t5gemma2", seed=2000, n_new=N_NEW, dtype="float32", layout="save_pretrained",
        images=[RGB_IMAGE], prompt="Look at <start_of_image> and describe it:",
        config=t5gemma2_config(
            encoder_text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                              query_pre_attn_scalar=24, sliding_window=5,
                              layer_types=["full_attention", "sliding_attention"],
                              rope_parameters=copy.deepcopy(ROPE_PLAIN)),
            vision=siglip(hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, image_size=32, patch_size=8),
            mm_tokens_per_image=4,
            decoder=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                         query_pre_attn_scalar=24, sliding_window=10,
                         layer_types=["sliding_attention", "sliding_attention",
                                      "full_attention"],
                         rope_parameters=copy.deepcopy(ROPE_PLAIN),
                         final_logit_softcapping=None)),
    ),
    "gemma3-vision": dict(
        family="gemma3", seed=3000, n_new=N_NEW, dtype="bfloat16", layout="hub",
        images=[RGB_IMAGE, RGBA_IMAGE], prompt="describe:",
        # transformers-4 style text keys, as google/gemma-3-4b-it's config.json has them; the
        # model is built from the equivalent transformers-5 keys (layer_types, rope_parameters)
        hub_text=dict(sliding_window_pattern=3, rope_theta=1000000.0,
                      rope_local_base_freq=10000.0,
                      rope_scaling={"factor": 8.0, "rope_type": "linear"}),
        config=dict(
            text_config=dict(TEXT_COMMON, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=20, query_pre_attn_scalar=24, sliding_window=6,
                             layer_types=["sliding_attention", "sliding_attention",
                                          "full_attention", "sliding_attention"],
                             rope_parameters=copy.deepcopy(ROPE_SCALED),
                             final_logit_softcapping=None, tie_word_embeddings=True),
            vision_config=siglip(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, image_size=32, patch_size=4),
            mm_tokens_per_image=16, tie_word_embeddings=True, **IMAGE_TOKENS),
    ),
}


# ------------------------------------------------------------------------------------ images

def rgb_pixels() -> np.ndarray:
    """(24, 40, 3) uint8: red ramps left to right, green top to bottom, blue a 3x5 checkerboard
    of 8x8 cells, plus a white diagonal and a dark 1-pixel grid every 7 columns (fine detail
    for the resize to average)."""
    y, x = np.mgrid[0:24, 0:40]
    r = (x * 255) // 39
    g = (y * 255) // 23
    b = np.where(((x // 8) + (y // 8)) % 2 == 0, 40, 220)
    img = np.stack([r, g, b], axis=-1)
    img[(x - 2 * y + 8) % 40 == 0] = 255
    img[x % 7 == 3] //= 3
    return img.astype(np.uint8)


def rgba_pixels() -> np.ndarray:
    """(36, 20, 4) uint8: saturated stripes and rings; alpha 0 in the top 8 rows and the left
    4 columns (their colours are not white, so compositing matters), 96 and 176 in two bands,
    255 elsewhere."""
    y, x = np.mgrid[0:36, 0:20]
    ring = ((x - 9) ** 2 + (y - 22) ** 2) // 16
    r = np.where(ring % 2 == 0, 230, 20)
    g = (y * 7 + x * 11) % 256
    b = np.where(x % 4 < 2, 200, 60)
    a = np.full((36, 20), 255)
    a[(y >= 14) & (y < 20)] = 96
    a[(y >= 26) & (y < 30)] = 176
    a[y < 8] = 0
    a[:, :4] = 0
    return np.stack([r, g, b, a], axis=-1).astype(np.uint8)


IMAGES = {RGB_IMAGE: ("RGB", rgb_pixels), RGBA_IMAGE: ("RGBA", rgba_pixels)}


def write_images() -> list[str]:
    """Write the test images (PNG) unless the committed files already hold these pixels in this
    mode; return the paths (relative to the repository root)."""
    from PIL import Image

    os.makedirs(os.path.join(ROOT, IMAGES_DIR), exist_ok=True)
    for rel, (mode, pixels) in IMAGES.items():
        path, arr = os.path.join(ROOT, rel), pixels()
        if os.path.isfile(path):
            with Image.open(path) as im:
                if im.mode == mode and np.array_equal(np.array(im), arr):
                    continue
        Image.fromarray(arr, mode).save(path, format="PNG")
    return list(IMAGES)


def load_image(rel: str):
    """The reference loader: PIL.Image.open, then ImageOps.exif_transpose (mode kept: RGBA stays
    RGBA for the processor to composite)."""
    from PIL import Image, ImageOps

    with Image.open(os.path.join(ROOT, rel)) as im:
        img = ImageOps.exif_transpose(im)
        img.load()
    return img


def manual_pixel_values(img, size: int) -> np.ndarray:
    """What Gemma3ImageProcessorPil computes, spelled out: alpha composited on white
    (PIL.Image.alpha_composite over an opaque white RGBA image) when the image has alpha, RGB,
    Image.resize((size, size), BILINEAR) on the uint8 image, x * (1/255) in float64 cast to
    float32, then (x - 0.5) / 0.5 in float32, channels first."""
    from PIL import Image

    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(white, rgba).convert("RGB")
    else:
        img = img.convert("RGB")
    arr = np.array(img.resize((size, size), resample=Image.BILINEAR))
    x = (arr.astype(np.float64) * (1 / 255)).astype(np.float32)
    x = (x - np.float32(0.5)) / np.float32(0.5)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def processor_text(prompt: str, n_images: int) -> str:
    """The CLI's rule: without ``<start_of_image>`` in the prompt, one boi per image joined by
    spaces, then the prompt; otherwise the prompt itself (one boi per image)."""
    if n_images and gtok.BOI not in prompt:
        return " ".join([gtok.BOI] * n_images) + prompt
    assert prompt.count(gtok.BOI) == n_images, (prompt, n_images)
    return prompt


def run_processor(folder: str, spec: dict) -> dict:
    """AutoProcessor.from_pretrained(folder) on the spec's prompt and images: numpy input_ids
    (P,), token_type_ids (P,), pixel_values (n, 3, S, S) or None, the processor text and the
    image processor's class / backend."""
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(folder)
    assert type(proc).__name__ == "Gemma3Processor", type(proc).__name__
    ip = proc.image_processor
    assert ip.backend == "pil", ip.backend
    text = processor_text(spec["prompt"], len(spec["images"]))
    images = [load_image(p) for p in spec["images"]] or None
    out = proc(text=text, images=images, return_tensors="np")
    ids = out["input_ids"][0].astype(np.int64)
    assert out["attention_mask"].all()
    res = dict(text=text, input_ids=ids, token_type_ids=out["token_type_ids"][0].astype(np.int64),
               pixel_values=None, image_processor=f"{type(ip).__name__} ({ip.backend})")
    if images:
        res["pixel_values"] = out["pixel_values"].astype(np.float32)
        assert res["pixel_values"].dtype == out["pixel_values"].dtype
        assert np.array_equal(res["token_type_ids"] == 1, ids == gtok.IMAGE_ID)
    else:
        assert not res["token_type_ids"].any()
    return res


# ------------------------------------------------------------------------------------- models

def vision_init(name: str) -> tuple[float, float]:
    """(mean, std) of parameter ``name``. SigLIP: LayerNorm gains 1 + N(0, 0.1^2), biases
    N(0, 0.1^2), position embeddings N(0, 0.3^2), the rest N(0, 0.12^2). Gemma text stacks
    (RMSNorm gain 1 + w): token embeddings N(0, 0.04^2) (times sqrt(hidden) in the model),
    post-attention / post-feedforward norm weights 1 + N(0, 0.1^2) (gain 2), the decoder's
    final norm weight 2 + N(0, 0.1^2) (gain 3), T5Gemma 2's encoder final norm weight
    -0.9 + N(0, 0.05^2) (gain 0.1), the other norm weights (pre-norms, q/k norms,
    mm_soft_emb_norm) N(0, 0.1^2), T5Gemma 2's eoi_embedding N(0, 1), the rest (projections,
    mm_input_projection_weight) N(0, 0.12^2).

    Why: with the tied head and Gemma's defaults (embeddings as large as the sublayer outputs)
    nearly every seed's greedy decoding repeats one token, either its input token (the residual
    carries the token's own embedding to the tied head) or, in T5Gemma 2, the token the fixed
    cross-attention context favours. Small embeddings, louder sublayers and a quiet encoder
    output give 20+ different tokens; the larger final gain widens the logit margins."""
    if "vision_tower" in name:
        if name.endswith(("layer_norm1.weight", "layer_norm2.weight", "post_layernorm.weight")):
            return 1.0, NORM_STD
        if name.endswith(".bias"):
            return 0.0, BIAS_STD
        if name.endswith("position_embedding.weight"):
            return 0.0, POS_STD
        return 0.0, WEIGHT_STD
    if name.endswith("embed_tokens.weight"):
        return 0.0, EMBED_STD
    if name.endswith("eoi_embedding"):
        return 0.0, EOI_STD
    if name.endswith(("post_self_attn_layernorm.weight", "post_attention_layernorm.weight",
                      "post_feedforward_layernorm.weight")):
        return POST_NORM_MEAN, NORM_STD
    if name in ("model.decoder.norm.weight", "model.language_model.norm.weight"):
        return FINAL_NORM_MEAN, NORM_STD
    if name == "model.encoder.text_model.norm.weight":
        return ENCODER_NORM_MEAN, ENCODER_NORM_STD
    if "norm" in name:
        return 0.0, NORM_STD
    return 0.0, WEIGHT_STD


def build(spec: dict, seed: int):
    """The float32 model (eager attention, eval) with the fixture's random weights, rounded to
    spec["dtype"]."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        T5Gemma2Config,
        T5Gemma2ForConditionalGeneration,
    )

    if spec["family"] == "t5gemma2":
        model = random_model(T5Gemma2Config, T5Gemma2ForConditionalGeneration, spec, seed,
                             vision_init, attn_implementation="eager")
        emb = model.model.encoder.text_model.embed_tokens
        assert model.lm_head.out_proj.weight is emb.weight
        assert model.model.decoder.embed_tokens.weight is emb.weight
        assert model.model.decoder.embed_tokens.eoi_embedding is emb.eoi_embedding
        assert float(emb.eoi_embedding.detach().abs().min()) > 0
        assert model.config.encoder.image_token_index == gtok.IMAGE_ID
        assert model.config.eoi_token_index == gtok.EOI_ID
    else:
        model = random_model(Gemma3Config, Gemma3ForConditionalGeneration, spec, seed,
                             vision_init, attn_implementation="eager")
        assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    for name, mod in model.named_modules():
        cfg = getattr(mod, "config", None)
        assert cfg is None or cfg._attn_implementation == "eager", name
    return model


class Seq2Seq:
    """Calls model(...) with encoder_outputs=(enc,) turned into a BaseModelOutput: T5Gemma 2
    reads encoder_outputs.last_hidden_state (fixture_common's decoder helpers pass a tuple)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, encoder_outputs=None, **kw):
        from transformers.modeling_outputs import BaseModelOutput
        if isinstance(encoder_outputs, tuple):
            encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs[0])
        return self.model(encoder_outputs=encoder_outputs, **kw)


def tensor(a: np.ndarray | None, dtype=None):
    import torch
    if a is None:
        return None
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if dtype is None else t.to(dtype)


def t5_encode(model, inputs: dict, dtype=None):
    """The T5Gemma 2 encoder's last hidden state (1, P, d) for the processor's inputs."""
    import torch
    with torch.no_grad():
        return model.get_encoder()(input_ids=tensor(inputs["input_ids"])[None],
                                   pixel_values=tensor(inputs["pixel_values"], dtype)
                                   ).last_hidden_state


def gemma3_kwargs(inputs: dict, ids: np.ndarray, dtype=None) -> dict:
    """Gemma3ForConditionalGeneration keywords for ids (the prompt, maybe extended by generated
    tokens): pixel_values, and token_type_ids extended by zeros."""
    tt = np.zeros(len(ids), dtype=np.int64)
    tt[:len(inputs["token_type_ids"])] = inputs["token_type_ids"]
    return dict(input_ids=tensor(ids)[None], pixel_values=tensor(inputs["pixel_values"], dtype),
                token_type_ids=tensor(tt)[None])


def gemma3_greedy(model, inputs: dict, n_new: int, dtype=None):
    """Greedy decoding with the KV cache as generate() does it: the prefill gets pixel_values
    and token_type_ids, the steps only the new token. Returns (tokens (N,), float32 step
    logits (N, V))."""
    import torch
    tokens, steps = [], []
    with torch.no_grad():
        out = model(**gemma3_kwargs(inputs, inputs["input_ids"], dtype), use_cache=True)
        for _ in range(n_new):
            raw = out.logits[0, -1].float().numpy()
            tok = int(np.argmax(raw))
            tokens.append(tok)
            steps.append(raw)
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=out.past_key_values,
                        use_cache=True)
    return np.array(tokens, dtype=np.int64), np.stack(steps)


def gemma3_last(model, inputs: dict, ids: np.ndarray, **kw) -> np.ndarray:
    """No-cache forward over ids (pixel_values, token_type_ids extended by zeros): float32
    logits of the last position."""
    import torch
    with torch.no_grad():
        args = gemma3_kwargs(inputs, ids)
        args.update(kw)
        return model(**args, use_cache=False).logits[0, -1].float().numpy()


def decode(spec: dict, model, inputs: dict, n_new: int, dtype=None):
    """(tokens, step_logits, enc or None) of the family's greedy decoding; pixel_values in
    dtype (the float64 check)."""
    if spec["family"] == "t5gemma2":
        enc = t5_encode(model, inputs, dtype)
        tokens, steps = decoder_greedy(Seq2Seq(model), enc, START, n_new)
        return tokens, steps, enc
    tokens, steps = gemma3_greedy(model, inputs, n_new, dtype)
    return tokens, steps, None


def good(tokens: np.ndarray, step_logits: np.ndarray) -> bool:
    """Every step wins by MIN_MARGIN; no special id and no id past the tokenizer; at least
    MIN_DISTINCT different tokens."""
    return (min_margin(step_logits) >= MIN_MARGIN
            and not np.isin(tokens, gtok.SPECIAL_IDS).any()
            and int(tokens.max()) < gtok.TOKENIZER_SIZE
            and len(set(tokens.tolist())) >= MIN_DISTINCT)


def image_sensitive(spec: dict, model, inputs: dict, tokens: np.ndarray) -> bool:
    """With images: greedy decoding from all-zero pixel_values gives other tokens."""
    if inputs["pixel_values"] is None:
        return True
    blank = dict(inputs, pixel_values=np.zeros_like(inputs["pixel_values"]))
    return not np.array_equal(decode(spec, model, blank, spec["n_new"])[0], tokens)


def search(name: str, spec: dict, inputs: dict, tries: int = 300):
    """The first seed from spec["seed"] whose greedy decoding is good() (and image-sensitive);
    returns (seed, model, tokens, step_logits, enc or None)."""
    def attempt(seed: int):
        model = build(spec, seed)
        tokens, steps, enc = decode(spec, model, inputs, spec["n_new"])
        if good(tokens, steps) and image_sensitive(spec, model, inputs, tokens):
            return model, tokens, steps, enc
        return None

    seed, found = first_seed(name, spec, attempt, tries,
                             f"margin >= {MIN_MARGIN}, no special ids, {MIN_DISTINCT} distinct "
                             f"tokens and image-dependent tokens")
    return (seed, *found)


# -------------------------------------------------------------------------------- mask checks

def spy_masks(module_name: str, call) -> dict:
    """Run call() with the family's eager attention wrapped; return {(attention class,
    layer_idx): boolean allowed-mask (q, kv)} of the last call of each layer."""
    import importlib
    mod = importlib.import_module(module_name)
    orig, seen = mod.eager_attention_forward, {}

    def spy(module, query, key, value, attention_mask, **kw):
        allowed = None if attention_mask is None else (attention_mask[0, 0] == 0).numpy()
        seen[(type(module).__name__, module.layer_idx)] = allowed
        return orig(module, query, key, value, attention_mask, **kw)

    mod.eager_attention_forward = spy
    try:
        call()
    finally:
        mod.eager_attention_forward = orig
    return seen


def gemma3_expected_masks(token_type_ids: np.ndarray, window: int):
    """The prefill masks transformers builds with token_type_ids: full layers allow
    j <= i or (i, j in the same image block); sliding layers additionally need j > i - window."""
    is_img = token_type_ids == 1
    starts = is_img & ~np.concatenate([[False], is_img[:-1]])
    blk = np.where(is_img, np.cumsum(starts) - 1, -1)
    i, j = np.mgrid[0:len(blk), 0:len(blk)]
    full = (j <= i) | ((blk[i] == blk[j]) & (blk[i] >= 0))
    return full, full & (j > i - window)


def check_masks(spec: dict, model, inputs: dict, tokens: np.ndarray) -> dict:
    """Check transformers' attention masks against the documented rules: Gemma 3's prefill
    (bidirectional image blocks, sliding lower bound kept) and its decode steps (plain
    causal / sliding); T5Gemma 2's encoder (two-sided window: left (W+1)//2, right W//2+1) and
    decoder (causal self part + the whole encoder output). Returns a few facts for the
    summary."""
    import torch
    P = len(inputs["input_ids"])
    if spec["family"] == "gemma3":
        cfg = model.config.text_config
        seen = spy_masks("transformers.models.gemma3.modeling_gemma3",
                         lambda: gemma3_last(model, inputs, inputs["input_ids"]))
        full, sliding = gemma3_expected_masks(inputs["token_type_ids"], cfg.sliding_window)
        for (_, idx), allowed in seen.items():
            want = sliding if cfg.layer_types[idx] == "sliding_attention" else full
            assert allowed.shape == (P, P) and np.array_equal(allowed, want), idx
        # a decode step (cache filled by a prefill with token_type_ids): token_type_ids None
        with torch.no_grad():
            out = model(**gemma3_kwargs(inputs, inputs["input_ids"]), use_cache=True)
        step = spy_masks("transformers.models.gemma3.modeling_gemma3", lambda: model(
            input_ids=torch.tensor([[int(tokens[0])]]), past_key_values=out.past_key_values,
            use_cache=True))
        kv_len = {}
        for (_, idx), allowed in step.items():
            assert allowed is None or allowed.all(), idx
            kv_len[cfg.layer_types[idx]] = None if allowed is None else allowed.shape[1]
        plain = gemma3_last(model, inputs, inputs["input_ids"], token_type_ids=None)
        with_tt = gemma3_last(model, inputs, inputs["input_ids"])
        return dict(decode_step_kv=kv_len,
                    prefill_change_without_token_type_ids=round(rel_err(plain, with_tt), 4))
    enc_cfg, dec_cfg = model.config.encoder.text_config, model.config.decoder
    seen = spy_masks("transformers.models.t5gemma2.modeling_t5gemma2",
                     lambda: t5_encode(model, inputs))
    i, j = np.mgrid[0:P, 0:P]
    w = enc_cfg.sliding_window
    window = ((i - j >= 0) & (i - j < (w + 1) // 2)) | ((j - i > 0) & (j - i < w // 2 + 1))
    for (_, idx), allowed in seen.items():
        if enc_cfg.layer_types[idx] == "sliding_attention":
            assert np.array_equal(allowed, window), idx
        else:  # no mask at all: every position attends to every position
            assert allowed is None or allowed.all(), idx
    enc = t5_encode(model, inputs)
    seen = spy_masks("transformers.models.t5gemma2.modeling_t5gemma2",
                     lambda: decoder_logits(Seq2Seq(model), enc, tokens, START))
    n = len(tokens)
    qi, kj = np.mgrid[0:n, 0:n]
    for (_, idx), allowed in seen.items():
        self_part = kj <= qi
        if dec_cfg.layer_types[idx] == "sliding_attention":
            self_part &= kj > qi - dec_cfg.sliding_window
        want = np.concatenate([self_part, np.ones((n, P), bool)], axis=1)
        assert np.array_equal(allowed, want), idx
    return dict(encoder_window=[-((w - 1) // 2), w // 2])


# ------------------------------------------------------------------------------------- running

def config_of(spec: dict):
    """The spec's config object (as random_model builds it)."""
    from transformers import Gemma3Config, T5Gemma2Config
    cls = T5Gemma2Config if spec["family"] == "t5gemma2" else Gemma3Config
    return cls(attn_implementation="eager", **copy.deepcopy(spec["config"]))


def vision_params(spec: dict) -> tuple[int, int]:
    """(image_size, mm_tokens_per_image)."""
    c = spec["config"]
    enc = c["encoder"] if spec["family"] == "t5gemma2" else c
    return enc["vision_config"]["image_size"], enc["mm_tokens_per_image"]


def check_pixels(spec: dict, inputs: dict) -> dict:
    """The processor's pixel_values equal manual_pixel_values exactly; for RGBA images, report
    how far dropping alpha (load_image's convert("RGB")) would be from compositing on white."""
    size = vision_params(spec)[0]
    facts = {}
    for k, rel in enumerate(spec["images"]):
        img = load_image(rel)
        assert np.array_equal(inputs["pixel_values"][k], manual_pixel_values(img, size)), rel
        if "A" in img.getbands():
            dropped = manual_pixel_values(img.convert("RGB"), size)
            facts[f"alpha_matters_{os.path.basename(rel)}"] = round(
                float(np.abs(dropped - inputs["pixel_values"][k]).max()), 4)
    return facts


def image_outputs(model, inputs: dict):
    """(vision_output (n, patches, Dv), image_features (n, mm_tokens, d)) as float32 numpy."""
    import torch
    with torch.no_grad():
        out = model.get_image_features(pixel_values=tensor(inputs["pixel_values"]),
                                       return_dict=True)
    return (out.last_hidden_state.float().numpy(), out.pooler_output.float().numpy())


def generation_config(spec: dict):
    """The folder's greedy GenerationConfig. T5Gemma 2: bos 2, eos 1, pad 0 and no
    decoder_start_token_id (generate() then starts the decoder from bos_token_id). Gemma 3:
    eos_token_id a list, as google/gemma-3-4b-it's."""
    from transformers import GenerationConfig
    eos = gtok.EOS_ID if spec["family"] == "t5gemma2" else [gtok.EOS_ID]
    return GenerationConfig(bos_token_id=gtok.BOS_ID, eos_token_id=eos, pad_token_id=gtok.PAD_ID,
                            do_sample=False, num_beams=1, max_new_tokens=spec["n_new"])


def generate_tokens(spec: dict, model, inputs: dict, gen_config=None) -> list[int]:
    """model.generate's new tokens for the processor's inputs (greedy, N new tokens) with
    gen_config (default: the model's own); checks the T5Gemma 2 decoder start / the prompt."""
    import torch
    kw = dict(attention_mask=torch.ones(1, len(inputs["input_ids"]), dtype=torch.long))
    if inputs["pixel_values"] is not None:
        kw["pixel_values"] = tensor(inputs["pixel_values"])
    if spec["family"] == "gemma3":
        kw["token_type_ids"] = tensor(inputs["token_type_ids"])[None]
    out = generate(model, inputs["input_ids"], **kw, generation_config=gen_config,
                   do_sample=False, num_beams=1, max_new_tokens=spec["n_new"])[0].tolist()
    if spec["family"] == "t5gemma2":
        assert out[0] == START, out
        return out[1:]
    assert out[:len(inputs["input_ids"])] == inputs["input_ids"].tolist()
    return out[len(inputs["input_ids"]):]


def reference(spec: dict, model, inputs: dict, tokens: np.ndarray, steps: np.ndarray, enc):
    """What expected.npz holds beyond the greedy run, checked: no-cache logits equal the cached
    ones (1e-5 of the logit scale), generate() gives the tokens, a float64 copy gives the same
    tokens. Returns (arrays dict, facts dict)."""
    import torch
    arrays, facts = {}, {}
    P = len(inputs["input_ids"])
    seq = np.concatenate([inputs["input_ids"], tokens[:-1]])
    if spec["family"] == "t5gemma2":
        full = decoder_logits(Seq2Seq(model), enc, tokens, START)
        assert rel_err(full, steps) < 1e-5, rel_err(full, steps)
        arrays.update(encoder_output=enc[0].numpy().astype(np.float32),
                      decoder_start_token_id=np.array(START, dtype=np.int64),
                      full_step_logits=full, full_logits_last=full[-1])
        facts["nocache_err"] = rel_err(full, steps)
        cap = model.config.decoder.final_logit_softcapping
        if cap is not None:  # how much the cap moved the logits
            moved = cap * np.arctanh(steps / cap) - steps
            facts["softcap_effect"] = round(float(np.abs(moved).max()), 4)
    else:
        with torch.no_grad():
            full = model(**gemma3_kwargs(inputs, seq), use_cache=False).logits[0, P - 1:]
        full = full.float().numpy()
        assert rel_err(full, steps) < 1e-5, rel_err(full, steps)
        prefill = gemma3_last(model, inputs, inputs["input_ids"])
        assert rel_err(prefill, steps[0]) < 1e-5
        arrays.update(full_logits_last=full[-1], token_type_ids=inputs["token_type_ids"])
        facts["nocache_err"] = rel_err(full, steps)
    arrays["prefill_logits"] = steps[0]
    gen = generate_tokens(spec, model, inputs, generation_config(spec))
    assert gen == tokens.tolist(), (gen, tokens.tolist())
    m64 = copy.deepcopy(model).to(torch.float64)
    tokens64, steps64, _ = decode(spec, m64, inputs, spec["n_new"], torch.float64)
    assert np.array_equal(tokens64, tokens), (tokens64, tokens)
    facts["float64_err"] = rel_err(steps64, steps)
    if inputs["pixel_values"] is not None:
        vision, features = image_outputs(model, inputs)
        arrays.update(vision_output=vision, image_features=features)
    facts.update(check_masks(spec, model, inputs, tokens))
    return arrays, facts


def expected_weight_names(spec: dict) -> list[str]:
    """The tensor names the folder's model.safetensors must hold (see the module docstring)."""
    c = spec["config"]
    hub = spec["layout"] == "hub"

    def siglip_names(prefix: str, n_layers: int) -> list[str]:
        p = prefix + ("vision_model." if hub else "")
        names = [p + "embeddings.patch_embedding.weight", p + "embeddings.patch_embedding.bias",
                 p + "embeddings.position_embedding.weight", p + "post_layernorm.weight",
                 p + "post_layernorm.bias"]
        for i in range(n_layers):
            lp = f"{p}encoder.layers.{i}."
            names += [lp + f"{m}.{t}" for m in ("layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2",
                                                "self_attn.q_proj", "self_attn.k_proj",
                                                "self_attn.v_proj", "self_attn.out_proj")
                      for t in ("weight", "bias")]
        return names

    def gemma_layer(prefix: str, norms: tuple[str, ...]) -> list[str]:
        return [prefix + n + ".weight" for n in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj",
            "mlp.down_proj", *norms)]

    if spec["family"] == "t5gemma2":
        norms = ("pre_self_attn_layernorm", "post_self_attn_layernorm",
                 "pre_feedforward_layernorm", "post_feedforward_layernorm")
        enc, dec = c["encoder"], c["decoder"]
        names = ["model.encoder.embed_tokens.weight", "model.encoder.embed_tokens.eoi_embedding",
                 "model.encoder.norm.weight", "model.decoder.norm.weight",
                 "model.encoder.multi_modal_projector.mm_input_projection_weight",
                 "model.encoder.multi_modal_projector.mm_soft_emb_norm.weight"]
        for i in range(enc["text_config"]["num_hidden_layers"]):
            names += gemma_layer(f"model.encoder.layers.{i}.", norms)
        for i in range(dec["num_hidden_layers"]):
            names += gemma_layer(f"model.decoder.layers.{i}.", norms)
        names += siglip_names("model.encoder.vision_tower.",
                              enc["vision_config"]["num_hidden_layers"])
    else:
        norms = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm")
        names = ["language_model.model.embed_tokens.weight", "language_model.model.norm.weight",
                 "multi_modal_projector.mm_input_projection_weight",
                 "multi_modal_projector.mm_soft_emb_norm.weight"]
        for i in range(c["text_config"]["num_hidden_layers"]):
            names += gemma_layer(f"language_model.model.layers.{i}.", norms)
        names += siglip_names("vision_tower.", c["vision_config"]["num_hidden_layers"])
    return sorted(names)


def write_weights(spec: dict, model, out: str) -> dict:
    """model.safetensors in spec["dtype"]: what transformers 5.23's save_pretrained writes
    (layout "save_pretrained"), or that with SigLIP's ``vision_model.`` level put back after
    ``vision_tower.`` (layout "hub", as the Hub's Gemma 3 / T5Gemma 2 files name the tower).
    Returns the config.json dict save_pretrained wrote."""
    from safetensors.torch import load_file

    cfg = save_weights(model, out, spec["dtype"])
    if spec["layout"] == "hub":
        tensors = load_file(os.path.join(out, "model.safetensors"))
        save_tensors({k.replace("vision_tower.", "vision_tower.vision_model.", 1): v
                      for k, v in tensors.items()}, out)
    return cfg


def hub_gemma3_config(spec: dict) -> dict:
    """config.json in google/gemma-3-4b-it's shape (transformers 4.50): the non-default keys
    only, transformers-4 rope / window keys in text_config (rope_theta, rope_local_base_freq,
    rope_scaling, sliding_window_pattern), torch_dtype, eos_token_id a list; rms_norm_eps,
    hidden_activation, token ids, tie_word_embeddings and the SigLIP layer_norm_eps /
    hidden_act are left to the defaults (checked equal to the model's when reloading)."""
    import transformers

    c, t, v = spec["config"], spec["config"]["text_config"], spec["config"]["vision_config"]
    text = {k: t[k] for k in ("head_dim", "hidden_size", "intermediate_size",
                              "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
                              "query_pre_attn_scalar", "sliding_window", "vocab_size")}
    text.update(model_type="gemma3_text", **spec["hub_text"])
    vision = {k: v[k] for k in ("hidden_size", "image_size", "intermediate_size",
                                "num_attention_heads", "num_hidden_layers", "patch_size",
                                "vision_use_head", "model_type")}
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"],
           "boi_token_index": c["boi_token_index"], "eoi_token_index": c["eoi_token_index"],
           "eos_token_id": [gtok.EOS_ID], "image_token_index": c["image_token_index"],
           "initializer_range": 0.02, "mm_tokens_per_image": c["mm_tokens_per_image"],
           "model_type": "gemma3", "text_config": dict(sorted(text.items())),
           "torch_dtype": spec["dtype"], "transformers_version": transformers.__version__,
           "vision_config": dict(sorted(vision.items()))}
    return cfg


def write_folder(name: str, spec: dict, model, inputs: dict, tokens, steps, arrays: dict,
                 out_root: str) -> str:
    """Write out_root/name afresh: weights, config.json, generation_config.json, tokenizer and
    processor files, expected.npz."""
    out = fresh_folder(out_root, name)
    saved_cfg = write_weights(spec, model, out)
    cfg = saved_cfg if spec["family"] == "t5gemma2" else hub_gemma3_config(spec)
    write_json(os.path.join(out, "config.json"), cfg)
    generation_config(spec).save_pretrained(out)
    gtok.write_tokenizer_files(out, *vision_params(spec))
    data = dict(prompt=np.array(spec["prompt"]), prompt_ids=inputs["input_ids"], tokens=tokens,
                step_logits=steps, **arrays)
    if spec["images"]:
        data.update(processor_text=np.array(inputs["text"]), images=np.array(spec["images"]),
                    pixel_values=inputs["pixel_values"],
                    image_processor=np.array(inputs["image_processor"]))
    write_expected(out, data, sort=True)
    return out


CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "query_pre_attn_scalar", "sliding_window",
               "layer_types", "rope_parameters", "final_logit_softcapping",
               "attn_logit_softcapping", "rms_norm_eps", "hidden_activation", "vocab_size",
               "pad_token_id", "eos_token_id", "bos_token_id", "tie_word_embeddings")
VISION_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "image_size", "patch_size", "layer_norm_eps", "hidden_act", "num_channels",
               "vision_use_head")


def check_reload(name: str, spec: dict, out: str, model, inputs: dict, tokens, steps,
                 arrays: dict) -> float:
    """Reload the folder with transformers (Auto classes, float32, eager): same parameters
    bit for bit, the ties, the sub-configs as built, the weight names and dtype, AutoProcessor's
    ids / token types / pixel values exactly, the encoder output, vision outputs and logits to
    TOL, generate() with the folder's generation config; return the largest relative error."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoModelForSeq2SeqLM

    auto = AutoModelForSeq2SeqLM if spec["family"] == "t5gemma2" else AutoModelForImageTextToText
    back = load_reference(auto, out)
    assert type(back) is type(model), type(back)
    sd0, sd1 = model.state_dict(), back.state_dict()
    assert sd0.keys() == sd1.keys() and all(torch.equal(sd0[k], sd1[k]) for k in sd0), name
    assert sorted(check_safetensors(out, spec["dtype"])) == expected_weight_names(spec), name
    if spec["family"] == "t5gemma2":
        emb = back.model.encoder.text_model.embed_tokens
        assert back.lm_head.out_proj.weight is emb.weight
        assert back.model.decoder.embed_tokens.weight is emb.weight
        assert back.model.decoder.embed_tokens.eoi_embedding is emb.eoi_embedding
        pairs = [(back.config.encoder.text_config, model.config.encoder.text_config),
                 (back.config.decoder, model.config.decoder)]
        vis = (back.config.encoder.vision_config, model.config.encoder.vision_config)
        for key in ("mm_tokens_per_image", "boi_token_index", "eoi_token_index",
                    "image_token_index"):
            assert getattr(back.config.encoder, key) == getattr(model.config.encoder, key), key
        assert back.generation_config.decoder_start_token_id is None
        assert back.generation_config.bos_token_id == START
    else:
        assert back.lm_head.weight is back.model.language_model.embed_tokens.weight
        pairs = [(back.config.text_config, model.config.text_config)]
        vis = (back.config.vision_config, model.config.vision_config)
        for key in ("mm_tokens_per_image", "boi_token_index", "eoi_token_index",
                    "image_token_index"):
            assert getattr(back.config, key) == getattr(model.config, key), key
    for a, b in pairs:
        for key in CONFIG_KEYS:
            assert getattr(a, key) == getattr(b, key), (name, key, getattr(a, key), getattr(b, key))
    for key in VISION_KEYS:
        assert getattr(vis[0], key) == getattr(vis[1], key), (name, key)

    again = run_processor(out, spec)
    assert again["text"] == inputs["text"]
    assert np.array_equal(again["input_ids"], inputs["input_ids"])
    assert np.array_equal(again["token_type_ids"], inputs["token_type_ids"])
    if inputs["pixel_values"] is not None:
        assert again["pixel_values"].dtype == np.float32
        assert np.array_equal(again["pixel_values"], inputs["pixel_values"]), name
    gtok.check_tokenizer(out, [spec["prompt"], inputs["text"]])

    errs = []
    if spec["family"] == "t5gemma2":
        enc = t5_encode(back, again)
        full = decoder_logits(Seq2Seq(back), enc, tokens, START)
        errs += [rel_err(enc[0].numpy(), arrays["encoder_output"]),
                 rel_err(full, arrays["full_step_logits"]), rel_err(full[0], steps[0])]
    else:
        seq = np.concatenate([again["input_ids"], tokens[:-1]])
        errs += [rel_err(gemma3_last(back, again, again["input_ids"]), steps[0]),
                 rel_err(gemma3_last(back, again, seq), arrays["full_logits_last"])]
    if inputs["pixel_values"] is not None:
        vision, features = image_outputs(back, again)
        errs += [rel_err(vision, arrays["vision_output"]),
                 rel_err(features, arrays["image_features"])]
    err = max(errs)
    assert err < TOL, f"{name}: reloaded folder differs by {err}"
    assert generate_tokens(spec, back, again) == tokens.tolist(), name
    return err


def make_fixture(name: str, spec: dict, out_root: str) -> dict:
    """Write one fixture folder and return a summary dict."""
    write_images()
    with tempfile.TemporaryDirectory() as tmp:  # a processor folder for the search: the
        config_of(spec).save_pretrained(tmp)     # spec's config.json and the tokenizer files
        gtok.write_tokenizer_files(tmp, *vision_params(spec))
        inputs = run_processor(tmp, spec)
    facts = check_pixels(spec, inputs) if spec["images"] else {}
    seed, model, tokens, steps, enc = search(name, spec, inputs)
    arrays, more = reference(spec, model, inputs, tokens, steps, enc)
    facts.update(more)
    out = write_folder(name, spec, model, inputs, tokens, steps, arrays, out_root)
    err = check_reload(name, spec, out, model, inputs, tokens, steps, arrays)
    from tokenizers import Tokenizer
    text = Tokenizer.from_file(os.path.join(out, "tokenizer.json")).decode(tokens.tolist())
    run = Run(seed, model, inputs["input_ids"], tokens, steps, arrays["full_logits_last"])
    return summary(name, run, out, err, text=text, dtype=spec["dtype"], layout=spec["layout"],
                   **facts)


def main(argv=None) -> int:
    return run_cli(__doc__, FIXTURES,
                   lambda name, args: make_fixture(name, FIXTURES[name], args.out), argv)


if __name__ == "__main__":
    sys.exit(main())
