"""Make the BART (encoder-decoder) parity fixtures under tests/fixtures/ with torch + transformers.

Each folder is a Hugging Face BartForConditionalGeneration folder (config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json) with small
random weights and the BART / RoBERTa-style byte-level BPE tokenizer of
tools/train_bart_tokenizer.py (2501 ids: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, the
256 bytes and 2240 merges, ``<mask>`` = 2500 last; RobertaProcessing: encoding gives
``<s> ... </s>``), plus ``expected.npz`` with what transformers computes in float32 (eager
attention, one thread). Decoding starts from decoder_start_token_id 2 (``</s>``), as in every
BART checkpoint. All folders: post-layer-norm blocks, learned positions with BART's offset of 2
(max_position_embeddings + 2 rows, row p + 2 for position p), ``layernorm_embedding`` after
token + position embeddings in both stacks, no final encoder / decoder layer norm, q/k/v/out and
fc1/fc2 biases, tied head (lm_head = model.shared) plus ``final_logits_bias`` (a [1, V] buffer
added to the logits), activation "gelu" (exact erf GELU).

    bart-forced    d_model 48, 2 encoder layers with 4 heads (head_dim 12) and ffn 96, 3
                   decoder layers with 6 heads (head_dim 8) and ffn 80, scale_embedding false,
                   max_position_embeddings 64 (66 position rows); forced_bos_token_id 0 and
                   forced_eos_token_id 2 (config.json and generation_config.json), so
                   generate()'s first new token is ``<s>`` (ForcedBOSTokenLogitsProcessor) and its
                   N-th is ``</s>`` (ForcedEOSTokenLogitsProcessor); model.safetensors as
                   transformers 5's save_pretrained writes it (model.shared.weight and
                   final_logits_bias; no embed_tokens / lm_head copies); config.json with
                   transformers 5's "dtype" key; F32 weights. The prompt is 48 tokens with a
                   newline and a double space
    bart-scaled    scale_embedding true (token embeddings times sqrt(64) = 8 in both stacks; the
                   tied head uses the unscaled table), d_model 64, 2 + 2 layers, 4 heads both,
                   ffn 128, max_position_embeddings 128; "forced_bos_token_id": null and
                   forced_eos_token_id 2 (only the last new token is forced); model.safetensors
                   written by hand with model.encoder.embed_tokens.weight and
                   model.decoder.embed_tokens.weight copies of model.shared.weight (every
                   state_dict entry but lm_head.weight, as a torch.save'd state_dict holds the
                   tied copies);
                   config.json with transformers 4's "torch_dtype" key; BF16 weights (the
                   final_logits_bias buffer too). The prompt is 11 tokens

Weights (float32 from a seeded torch generator, then rounded to the stored dtype): LayerNorm
gains (every ``*layer_norm`` and ``layernorm_embedding``) 1 + N(0, 0.1^2), every bias N(0,
0.1^2), model.shared and embed_positions N(0, 1), the decoder's cross-attention projections
(``encoder_attn``) N(0, 0.1^2) and the other projections (q, k, v, out_proj, fc1, fc2)
N(0, 0.3^2); final_logits_bias (a buffer, which transformers initialises to zeros and loads from
the file when present) N(0, 0.5^2) from a second generator, so it matters. With every projection
at one std the greedy decoding of nearly every seed repeats one token: at 0.1-0.2 the tied head
reads the input token's embedding back from the residual stream, at 0.3-0.5 the post-LN
sublayers drown the residual and the (fixed) cross-attention context picks the same token each
step; a weaker cross-attention gives 15-17 different tokens.

Greedy decoding, as generate(do_sample=False, num_beams=1, max_new_tokens=N) does with the
folder's generation config: step k feeds [start] + tokens[:k] (cached), takes the raw logits
(lm_head + final_logits_bias) and picks their argmax, except that step 0 is forced to
forced_bos_token_id when set and step N - 1 to forced_eos_token_id when set (the processors
fire at decoder length 1 and at max_length - 1 = N, max_length being N + 1 for a 1-token
decoder start). A seed is kept only if every unforced step wins by at least MIN_MARGIN on the
raw logits, no unforced step emits a special id (``<s>``, ``<pad>``, ``</s>``, ``<unk>``,
``<mask>``), the raw argmax of every forced step is NOT the forced token (so a decoder that
ignores the processors fails), and there are at least MIN_DISTINCT different unforced tokens.
The written folder is reloaded with transformers and must reproduce the encoder output, the
prefill and the last full-sequence logits, final_logits_bias and generate()'s tokens.

expected.npz keys (arrays float32, ids int64):

    prompt                  str, 0-d: the prompt text
    prompt_ids              (P,): the tokenizer.json encoding of the prompt, ``<s>`` (0) first,
                            ``</s>`` (2) last
    encoder_output          (P, d_model): model.get_encoder()(prompt_ids).last_hidden_state
    decoder_start_token_id  int64, 0-d: 2
    tokens                  (N,): the new tokens of model.generate(prompt_ids, do_sample=False,
                            num_beams=1, max_new_tokens=N) with the folder's generation config
                            (forced tokens included; generate() returns [start] + tokens)
    step_logits             (N, V): the RAW logits (lm_head + final_logits_bias, before any
                            logits processor) of cached decoder step k, fed [start] +
                            tokens[:k] with an EncoderDecoderCache; step_logits[0] is the
                            decoder prefill of the start token. On unforced steps
                            tokens[k] == argmax(step_logits[k])
    prefill_logits          (V,): step_logits[0]
    full_step_logits        (N, V): a no-cache decoder forward over [start] + tokens[:-1] (given
                            encoder_output), every position; equal to step_logits to 1e-5 of
                            the logit scale (checked)
    full_logits_last        (V,): full_step_logits[-1]
    transformers_version    str, 0-d

transformers 5.23 notes: BartConfig drops forced_bos_token_id (a generation parameter it does
not declare; forced_eos_token_id is a declared field and stays), so the model's config object
never has it; from_pretrained still builds the generation config from generation_config.json or,
without one, from config.json's raw keys, forced_bos_token_id included. A model.safetensors
without final_logits_bias loads silently with zeros (_keys_to_ignore_on_load_missing), hence
the non-zero check. "tie_word_embeddings": false would untie encoder/decoder embed_tokens from
model.shared as well as lm_head (three tables, unlike transformers 4), so no untied fixture is
made. Unlike T5, generate() needs no cache workaround when the decoder is deeper than the
encoder.

Usage:  python tools/fixtures_bart.py [--only NAME ...] [--out tests/fixtures]
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_bart_tokenizer as barttok  # noqa: E402
from fixture_common import (BIAS_STD, MIN_MARGIN, NORM_STD, Seq2SeqRun,  # noqa: E402
                            check_safetensors, check_seq2seq_reload, check_tokenizer,
                            fresh_folder, greedy_generate, load_reference, random_model, run_cli,
                            save_tensors, save_weights, seq2seq_arrays, seq2seq_search,
                            state_tensors, summary, torch_dtype, write_expected, write_json)
from train_tokenizer import corpus_text  # noqa: E402

BOS_ID, PAD_ID, EOS_ID = barttok.BOS_ID, barttok.PAD_ID, barttok.EOS_ID
START = EOS_ID
"""decoder_start_token_id, as in every BART checkpoint."""
SPECIAL_IDS = [BOS_ID, PAD_ID, EOS_ID, barttok.UNK_ID, barttok.MASK_ID]
FINAL_BIAS_STD = 0.5
MIN_DISTINCT = 8
"""Fewest different unforced greedy tokens."""
TOL = 1e-5
"""Reload check: max |difference| / max |expected| for the encoder output and the logits."""

FIXTURES = {
    "bart-forced": dict(
        seed=1000, n_new=32, dtype="float32", std=0.3, embed_std=1.0, cross_std=0.1,
        forced_bos=BOS_ID, forced_eos=EOS_ID, layout="save_pretrained", dtype_key="dtype",
        prompt="The with statement wraps the execution of a block with methods defined by a "
               "context manager.\n  The context expression is evaluated to obtain the manager, "
               "whose enter method is called before the body of the block runs.",
        config=dict(vocab_size=barttok.VOCAB_SIZE, d_model=48, encoder_layers=2,
                    decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=6,
                    encoder_ffn_dim=96, decoder_ffn_dim=80, activation_function="gelu",
                    scale_embedding=False, max_position_embeddings=64),
    ),
    "bart-scaled": dict(
        seed=2000, n_new=32, dtype="bfloat16", std=0.3, embed_std=1.0, cross_std=0.1,
        forced_bos=None, forced_eos=EOS_ID, layout="embed_copies", dtype_key="torch_dtype",
        prompt="A list is a mutable sequence of items.",
        config=dict(vocab_size=barttok.VOCAB_SIZE, d_model=64, encoder_layers=2,
                    decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                    encoder_ffn_dim=128, decoder_ffn_dim=128, activation_function="gelu",
                    scale_embedding=True, max_position_embeddings=128),
    ),
}


def bart_init(std: float, embed_std: float, cross_std: float):
    """init(name) -> (mean, std): LayerNorm gains 1 + N(0, 0.1^2), biases N(0, 0.1^2),
    model.shared and the position tables N(0, embed_std^2), the decoder's cross-attention
    projections N(0, cross_std^2), the other projections N(0, std^2)."""
    def init(name: str) -> tuple[float, float]:
        if name.endswith(("layer_norm.weight", "layernorm_embedding.weight")):
            return 1.0, NORM_STD
        if name.endswith(".bias"):
            return 0.0, BIAS_STD
        if name.endswith(("shared.weight", "embed_positions.weight")):
            return 0.0, embed_std
        if ".encoder_attn." in name:
            return 0.0, cross_std
        return 0.0, std
    return init


def config_kwargs(spec: dict) -> dict:
    """BartConfig keywords besides spec["config"] (BART's defaults, written out)."""
    return dict(pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                decoder_start_token_id=START, forced_eos_token_id=spec["forced_eos"],
                is_encoder_decoder=True, tie_word_embeddings=True, dropout=0.1,
                attention_dropout=0.0, activation_dropout=0.0, attn_implementation="eager")


def build(spec: dict, seed: int):
    """A float32 BartForConditionalGeneration with the fixture's random weights and
    final_logits_bias (rounded to spec["dtype"]), eager attention, eval mode."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    init = bart_init(spec["std"], spec["embed_std"], spec["cross_std"])
    model = random_model(BartConfig, BartForConditionalGeneration, spec, seed, init,
                         **config_kwargs(spec))
    gen = torch.Generator().manual_seed(seed + 1_000_000)
    with torch.no_grad():
        bias = FINAL_BIAS_STD * torch.randn(model.final_logits_bias.shape, generator=gen)
        model.final_logits_bias.copy_(bias.to(torch_dtype(spec["dtype"])).to(torch.float32))
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared
    assert model.model.encoder.embed_tokens.weight is shared
    assert model.model.decoder.embed_tokens.weight is shared
    c = spec["config"]
    assert model.model.encoder.embed_positions.weight.shape[0] == c["max_position_embeddings"] + 2
    scale = float(np.sqrt(c["d_model"])) if c["scale_embedding"] else 1.0
    assert model.model.encoder.embed_tokens.embed_scale == scale
    assert model.model.decoder.embed_tokens.embed_scale == scale
    assert model.config._attn_implementation == "eager"
    return model


def encode(text: str) -> np.ndarray:
    return np.array(TOKENIZER.encode(text).ids, dtype=np.int64)


def forced_steps(spec: dict) -> dict[int, int]:
    """{step: forced token}: step 0 -> forced_bos, step N - 1 -> forced_eos (when set)."""
    forced = {}
    if spec["forced_bos"] is not None:
        forced[0] = spec["forced_bos"]
    if spec["forced_eos"] is not None:
        forced[spec["n_new"] - 1] = spec["forced_eos"]
    return forced


def unforced(spec: dict) -> np.ndarray:
    """Indices of the steps no logits processor forces."""
    forced = forced_steps(spec)
    return np.array([k for k in range(spec["n_new"]) if k not in forced], dtype=np.int64)


def margin(spec: dict, step_logits: np.ndarray) -> float:
    """Smallest (top1 - top2) raw-logit gap over the unforced steps."""
    top2 = np.sort(step_logits[unforced(spec)], axis=1)[:, -2:]
    return float((top2[:, 1] - top2[:, 0]).min())


def good(spec: dict, tokens: np.ndarray, step_logits: np.ndarray) -> bool:
    """Every unforced step wins by MIN_MARGIN and emits no special id; every forced step's raw
    argmax is another token; enough different unforced tokens."""
    free = tokens[unforced(spec)]
    return (margin(spec, step_logits) >= MIN_MARGIN
            and not np.isin(free, SPECIAL_IDS).any()
            and all(int(np.argmax(step_logits[k])) != t for k, t in forced_steps(spec).items())
            and len(set(free.tolist())) >= MIN_DISTINCT)


def generation_config(spec: dict):
    """The folder's greedy GenerationConfig (BART's token ids, the fixture's forced ids)."""
    from transformers import GenerationConfig

    kw = dict(bos_token_id=BOS_ID, decoder_start_token_id=START, eos_token_id=EOS_ID,
              pad_token_id=PAD_ID, forced_eos_token_id=spec["forced_eos"], do_sample=False,
              num_beams=1, max_new_tokens=spec["n_new"])
    if spec["forced_bos"] is not None:
        kw["forced_bos_token_id"] = spec["forced_bos"]
    return GenerationConfig(**kw)


def search(name: str, spec: dict) -> Seq2SeqRun:
    """The first seed from spec["seed"] whose greedy decoding (forced steps included) is
    good(), checked against the no-cache forward and generate()."""
    prompt_ids = encode(spec["prompt"])
    assert prompt_ids[0] == BOS_ID and prompt_ids[-1] == EOS_ID, prompt_ids
    assert len(prompt_ids) + 2 <= spec["config"]["max_position_embeddings"] + 2
    forced = forced_steps(spec)
    run = seq2seq_search(name, spec, build, prompt_ids, START,
                         lambda model, tokens, steps: good(spec, tokens, steps),
                         f"a greedy margin >= {MIN_MARGIN} without special ids, with forcing "
                         f"that matters and enough distinct tokens",
                         choose=lambda k, raw: forced.get(k, int(np.argmax(raw))), tries=300)
    gen = greedy_generate(run.model, prompt_ids, START, spec["n_new"],
                          generation_config=generation_config(spec))
    assert gen == run.tokens.tolist(), (name, gen, run.tokens)
    return run


def hub_config(spec: dict) -> dict:
    """config.json in the style of the Hub's BART folders (facebook/bart-base's keys, minus its
    beam-search task parameters), forced_bos_token_id / forced_eos_token_id included."""
    import transformers

    c = spec["config"]
    cfg = {
        "activation_dropout": 0.0, "activation_function": c["activation_function"],
        "add_bias_logits": False, "add_final_layer_norm": False,
        "architectures": ["BartForConditionalGeneration"], "attention_dropout": 0.0,
        "bos_token_id": BOS_ID, "classifier_dropout": 0.0, "d_model": c["d_model"],
        "decoder_attention_heads": c["decoder_attention_heads"],
        "decoder_ffn_dim": c["decoder_ffn_dim"], "decoder_layerdrop": 0.0,
        "decoder_layers": c["decoder_layers"], "decoder_start_token_id": START, "dropout": 0.1,
        "encoder_attention_heads": c["encoder_attention_heads"],
        "encoder_ffn_dim": c["encoder_ffn_dim"], "encoder_layerdrop": 0.0,
        "encoder_layers": c["encoder_layers"], "eos_token_id": EOS_ID,
        "forced_bos_token_id": spec["forced_bos"], "forced_eos_token_id": spec["forced_eos"],
        "init_std": 0.02, "is_encoder_decoder": True,
        "max_position_embeddings": c["max_position_embeddings"], "model_type": "bart",
        "normalize_before": False, "num_hidden_layers": c["encoder_layers"],
        "pad_token_id": PAD_ID, "scale_embedding": c["scale_embedding"],
        "tie_word_embeddings": True, spec["dtype_key"]: spec["dtype"],
        "transformers_version": transformers.__version__, "use_cache": True,
        "vocab_size": c["vocab_size"],
    }
    return dict(sorted(cfg.items()))


def embed_copy_tensors(model, dtype: str) -> dict:
    """The tensors of model.safetensors in dtype: every state_dict tensor (model.shared, its
    encoder / decoder embed_tokens copies, final_logits_bias, the rest) except the tied
    lm_head.weight."""
    tensors = state_tensors(model, dtype, drop=("lm_head.weight",))
    for k in ("model.shared.weight", "model.encoder.embed_tokens.weight",
              "model.decoder.embed_tokens.weight", "final_logits_bias"):
        assert k in tensors, k
    return tensors


def write_folder(name: str, spec: dict, run: Seq2SeqRun, out_root: str) -> str:
    """Write out_root/name afresh (weights, configs, tokenizer files, expected.npz)."""
    out = fresh_folder(out_root, name)
    if spec["layout"] == "save_pretrained":
        save_weights(run.model, out, spec["dtype"])
    else:
        save_tensors(embed_copy_tensors(run.model, spec["dtype"]), out)
    write_json(os.path.join(out, "config.json"), hub_config(spec))
    generation_config(spec).save_pretrained(out)
    barttok.write_tokenizer(TOKENIZER, out, pretty=False,
                            model_max_length=spec["config"]["max_position_embeddings"])
    write_expected(out, seq2seq_arrays(spec["prompt"], run))
    return out


def check_reload(name: str, spec: dict, out: str, run: Seq2SeqRun) -> tuple[float, list]:
    """Reload the folder (float32, eager) and check it reproduces the encoder output, the
    prefill and the last full-sequence logits to TOL, final_logits_bias (not zeros), the tied
    embeddings, the stored dtype, the forced ids of its generation config and generate()'s
    tokens, and that tokenizer.json and transformers' AutoTokenizer both give prompt_ids;
    return (the largest relative error, the tensor names outside the encoder / decoder
    layers)."""
    import torch
    from transformers import BartForConditionalGeneration

    back = load_reference(BartForConditionalGeneration, out)
    shared = back.model.shared.weight
    assert back.lm_head.weight is shared and back.model.encoder.embed_tokens.weight is shared
    assert back.model.decoder.embed_tokens.weight is shared
    assert torch.equal(shared, run.model.model.shared.weight), name
    assert back.final_logits_bias.abs().max() > 0.1, f"{name}: final_logits_bias not loaded"
    assert torch.equal(back.final_logits_bias, run.model.final_logits_bias), name
    for stack in (back.model.encoder, back.model.decoder):
        assert stack.embed_tokens.embed_scale == run.model.model.encoder.embed_tokens.embed_scale
    keys = check_safetensors(out, spec["dtype"])
    assert "lm_head.weight" not in keys and "final_logits_bias" in keys, name
    gc = back.generation_config
    assert (gc.forced_bos_token_id, gc.forced_eos_token_id, gc.decoder_start_token_id) == (
        spec["forced_bos"], spec["forced_eos"], START), gc
    err = check_seq2seq_reload(name, back, run, TOL)
    assert greedy_generate(back, run.prompt_ids, START, spec["n_new"]) == run.tokens.tolist()
    check_tokenizer(out, spec["prompt"], run.prompt_ids)
    return err, sorted(k for k in keys if ".layers." not in k)


def make_fixture(name: str, spec: dict, out_root: str) -> dict:
    """Write one fixture folder and return a summary dict."""
    run = search(name, spec)
    out = write_folder(name, spec, run, out_root)
    err, tensors = check_reload(name, spec, out, run)
    return summary(name, run, out, err, margin=margin(spec, run.step_logits),
                   distinct_of=run.tokens[unforced(spec)],
                   text=TOKENIZER.decode(run.tokens.tolist(), skip_special_tokens=False),
                   vocab=spec["config"]["vocab_size"], dtype=spec["dtype"],
                   forced={str(k): v for k, v in forced_steps(spec).items()}, tensors=tensors)


TOKENIZER = None
"""The tokenizers.Tokenizer of train_bart_tokenizer, trained once by main()."""


def main(argv=None) -> int:
    global TOKENIZER
    TOKENIZER = barttok.build_tokenizer(corpus_text())
    return run_cli(__doc__, FIXTURES, lambda name, args: make_fixture(name, FIXTURES[name],
                                                                      args.out), argv)


if __name__ == "__main__":
    sys.exit(main())
