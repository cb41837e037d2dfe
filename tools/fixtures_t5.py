"""Make the T5 (encoder-decoder) parity fixtures under tests/fixtures/ with torch + transformers.

Each folder is a Hugging Face T5ForConditionalGeneration folder (config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json) with small
random weights and the T5-style Unigram tokenizer of tools/train_t5_tokenizer.py (2408 ids:
``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, 2397 pieces, ``<extra_id_7>`` ... ``<extra_id_0>`` = 2407;
encoding appends ``</s>``), plus ``expected.npz`` with what transformers computes in float32
(eager attention, one thread). Decoding starts from decoder_start_token_id 0 (``<pad>``).

    t5-relu-tied   the original T5 layout (t5-small on the Hub): feed_forward_proj "relu",
                   tied head, config.json in the Hub's style without a tie_word_embeddings key
                   (so tied, and the decoder output is scaled by d_model**-0.5 before the head),
                   model.safetensors as save_pretrained writes it (shared.weight and the block
                   tensors; no embed_tokens / lm_head copies); d_model 64, 6 heads, d_kv 16
                   (inner 96 != d_model), d_ff 128, 2 encoder / 3 decoder layers, 32 buckets,
                   max_distance 128; F32 weights. The prompt is 153 tokens, so the encoder's
                   bidirectional buckets saturate past max_distance in both directions
    t5-v11-gated-untied
                   the T5 v1.1 / Flan-T5 layout: feed_forward_proj "gated-gelu" (gelu_new),
                   "tie_word_embeddings": false (no output scaling) and an lm_head.weight that
                   differs from shared.weight; model.safetensors written by hand as google's
                   t5-v1_1 files are (shared, encoder.embed_tokens and decoder.embed_tokens
                   copies of it, lm_head, every block tensor); vocab_size 2413 > the tokenizer's
                   2408 (as 32128 > 32100 in T5; the 5 extra rows are never chosen); d_model 48,
                   4 heads, d_kv 20 (inner 80), d_ff 96, 3 encoder / 2 decoder layers, 8
                   buckets, max_distance 20, so both the 43-token prompt and the 32 decoder
                   steps pass max_distance; BF16 weights
    t5-flan-short  Flan-T5 style (gated-gelu, untied) with the CLI example prompt "translate
                   English to German: The house is small." (27 tokens); model.safetensors as
                   transformers 4's save_pretrained wrote an untied T5: shared.weight,
                   lm_head.weight and the blocks, no embed_tokens copies;
                   d_model 64, 4 heads, d_kv 12 (inner 48 < d_model), d_ff 128, 2 + 2 layers,
                   32 buckets, max_distance 128; BF16 weights

Weights (float32 from a seeded torch generator, then rounded to the stored dtype): T5 layer
norm gains 1 + N(0, 0.1^2), relative_attention_bias N(0, 0.5^2) (so the position bias matters),
shared embedding and untied lm_head N(0, 1) as T5 initialises them, q and k N(0, 0.12^2), the
other projections N(0, std^2) with the fixture's std (0.3 for the tied model, whose greedy
decoding otherwise repeats the input token: the residual stream carries its embedding straight
to the tied head; 0.12 for the others). A seed is kept only if the greedy decoding of N new
tokens never emits ``<pad>``, ``</s>`` or ``<unk>`` (or an id the tokenizer lacks), every step
wins by at least MIN_MARGIN and there are at least MIN_DISTINCT (t5-relu-tied: 16) different
tokens. The written folder is reloaded with transformers and must reproduce the encoder output,
the prefill and the last full-sequence logits.

transformers 5.23 notes: T5Config always sets tie_word_embeddings = True and keeps
``scale_decoder_outputs = (tie_word_embeddings given is not False)``, so an untied model is
built here by giving lm_head its own Parameter, and its folder is written by hand
(save_pretrained would drop lm_head); from_pretrained loads such a folder untied because both
tensors are present and differ. generate() sizes its cache from config.num_layers (the
encoder's depth) and fails when num_decoder_layers is larger, so the generate() check passes a
cache built from the decoder's config.

expected.npz keys (arrays float32, ids int64):

    prompt                  str, 0-d: the prompt text
    prompt_ids              (P,): the tokenizer.json encoding of the prompt, ``</s>`` (1) last
    encoder_output          (P, d_model): the encoder's last hidden state (after its final
                            layer norm) for prompt_ids
    decoder_start_token_id  int64, 0-d: 0
    tokens                  (N,): greedy tokens decoded with the KV cache (EncoderDecoderCache)
                            from [decoder_start_token_id]; new tokens only, no EOS stop
    step_logits             (N, V): the logits that chose tokens[k]; step_logits[0] is the
                            decoder prefill of the start token
    prefill_logits          (V,): step_logits[0]
    full_step_logits        (N, V): a no-cache decoder forward over [start] + tokens[:-1] (given
                            encoder_output), every position; equal to step_logits to 1e-5 of
                            the logit scale (checked)
    full_logits_last        (V,): full_step_logits[-1]
    transformers_version    str, 0-d

model.generate(prompt_ids, max_new_tokens=N, do_sample=False, num_beams=1) returns
[start] + tokens (checked).

``t5-buckets.json``: transformers' relative position buckets (``_relative_position_bucket``) for
the relative positions [-1200, 1200] of several (num_buckets, max_distance) pairs, bidirectional
and causal (see write_buckets).

Usage:  python tools/fixtures_t5.py [--only NAME ...] [--out tests/fixtures]
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_t5_tokenizer as t5tok  # noqa: E402
from fixture_common import (MIN_MARGIN, NORM_STD, WEIGHT_STD, Seq2SeqRun,  # noqa: E402
                            check_safetensors, check_seq2seq_reload, check_tokenizer,
                            fresh_folder, greedy_generate, load_reference, min_margin,
                            random_model, run_cli, save_tensors, save_weights, seq2seq_arrays,
                            seq2seq_search, state_tensors, summary, write_expected, write_json)

PAD_ID, EOS_ID, UNK_ID = t5tok.PAD_ID, t5tok.EOS_ID, t5tok.UNK_ID
START = PAD_ID
"""decoder_start_token_id, as in every T5 checkpoint."""
REL_BIAS_STD = 0.5
EMBED_STD = 1.0
MIN_DISTINCT = 8
"""Fewest different greedy tokens (a spec's min_distinct may ask for more)."""
TOL = 1e-5
"""Reload check: max |difference| / max |expected| for the encoder output and the logits."""

FIXTURES = {
    "t5-relu-tied": dict(
        seed=7040, n_new=32, dtype="float32", untied=False, std=0.3, min_distinct=16,
        prompt="The Python interpreter reads a program as a sequence of logical lines. A "
               "function definition binds the function name to a function object in the "
               "current local namespace. When the function is called, its body runs in a new "
               "frame, and the arguments are bound to the parameters. Exceptions may be raised "
               "at any time; a try statement specifies handlers for them and cleanup code that "
               "always runs. Classes group data and behaviour, and each instance keeps its "
               "attributes in a dictionary unless slots are declared. Modules are loaded once "
               "and cached, so importing them again is cheap and returns the same object. A "
               "comprehension builds a list, set or dictionary from an iterable in one "
               "expression.",
        config=dict(vocab_size=t5tok.VOCAB_SIZE, d_model=64, num_heads=6, d_kv=16, d_ff=128,
                    num_layers=2, num_decoder_layers=3, feed_forward_proj="relu",
                    relative_attention_num_buckets=32, relative_attention_max_distance=128,
                    layer_norm_epsilon=1e-6),
    ),
    "t5-v11-gated-untied": dict(
        seed=8000, n_new=32, dtype="bfloat16", untied=True, std=WEIGHT_STD, embed_copies=True,
        prompt="A generator function returns an iterator. Each call to next runs the body "
               "until the next yield expression, which hands a value back to the caller and "
               "suspends the frame.",
        config=dict(vocab_size=t5tok.VOCAB_SIZE + 5, d_model=48, num_heads=4, d_kv=20, d_ff=96,
                    num_layers=3, num_decoder_layers=2, feed_forward_proj="gated-gelu",
                    relative_attention_num_buckets=8, relative_attention_max_distance=20,
                    layer_norm_epsilon=1e-6),
    ),
    "t5-flan-short": dict(
        seed=9000, n_new=32, dtype="bfloat16", untied=True, std=WEIGHT_STD, embed_copies=False,
        prompt="translate English to German: The house is small.",
        config=dict(vocab_size=t5tok.VOCAB_SIZE, d_model=64, num_heads=4, d_kv=12, d_ff=128,
                    num_layers=2, num_decoder_layers=2, feed_forward_proj="gated-gelu",
                    relative_attention_num_buckets=32, relative_attention_max_distance=128,
                    layer_norm_epsilon=1e-6),
    ),
}


def t5_init(std: float):
    """init(name) -> (mean, std): layer norm gains 1 + N(0, 0.1^2), relative_attention_bias
    N(0, 0.5^2), shared / lm_head N(0, 1), q and k N(0, 0.12^2) (T5 does not scale q.k, so
    larger ones make the softmax needlessly sensitive to rounding), the other projections (v, o,
    wi*, wo) N(0, std^2)."""
    def init(name: str) -> tuple[float, float]:
        if name.endswith("layer_norm.weight"):
            return 1.0, NORM_STD
        if name.endswith("relative_attention_bias.weight"):
            return 0.0, REL_BIAS_STD
        if name in ("shared.weight", "lm_head.weight"):
            return 0.0, EMBED_STD
        if name.endswith((".q.weight", ".k.weight")):
            return 0.0, WEIGHT_STD
        return 0.0, std
    return init


def t5_model(untied: bool):
    """A T5ForConditionalGeneration maker; untied: lm_head gets its own Parameter (transformers
    5 ties it to shared whatever the config says, see T5Config.__post_init__)."""
    import torch
    from transformers import T5ForConditionalGeneration

    def make(cfg):
        model = T5ForConditionalGeneration(cfg)
        if untied:
            model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
        return model
    return make


def config_kwargs(spec: dict) -> dict:
    """T5Config keywords besides spec["config"]."""
    kw = dict(decoder_start_token_id=START, pad_token_id=PAD_ID, eos_token_id=EOS_ID,
              is_encoder_decoder=True, dropout_rate=0.1, attn_implementation="eager")
    if spec["untied"]:
        kw["tie_word_embeddings"] = False
    return kw


def build(spec: dict, seed: int):
    """A float32 T5ForConditionalGeneration with the fixture's random weights (rounded to
    spec["dtype"]), eager attention, eval mode."""
    from transformers import T5Config

    init = t5_init(spec["std"])
    model = random_model(T5Config, t5_model(spec["untied"]), spec, seed, init,
                         **config_kwargs(spec))
    cfg = model.config
    assert cfg.scale_decoder_outputs == (not spec["untied"])
    assert (model.lm_head.weight is model.shared.weight) == (not spec["untied"])
    for stack in (model.encoder, model.decoder):
        assert stack.config._attn_implementation == "eager"
    return model


def encode(text: str) -> np.ndarray:
    return np.array(TOKENIZER.encode(text).ids, dtype=np.int64)


def good(spec: dict, tokens: np.ndarray, step_logits: np.ndarray) -> bool:
    """Every step wins by MIN_MARGIN; no pad, EOS, unk or id past the tokenizer; enough
    different tokens."""
    return (min_margin(step_logits) >= MIN_MARGIN
            and not np.isin(tokens, [PAD_ID, EOS_ID, UNK_ID]).any()
            and int(tokens.max()) < t5tok.VOCAB_SIZE
            and len(set(tokens.tolist())) >= spec.get("min_distinct", MIN_DISTINCT))


def search(name: str, spec: dict) -> Seq2SeqRun:
    """The first seed from spec["seed"] whose greedy decoding is good(), checked against the
    no-cache forward and generate()."""
    prompt_ids = encode(spec["prompt"])
    assert prompt_ids[-1] == EOS_ID
    run = seq2seq_search(name, spec, build, prompt_ids, START,
                         lambda model, tokens, steps: good(spec, tokens, steps),
                         f"a greedy margin >= {MIN_MARGIN} without pad/EOS/unk and enough "
                         f"distinct tokens", abs_tol=1e-4)
    gen = greedy_generate(run.model, prompt_ids, START, spec["n_new"])
    assert gen == run.tokens.tolist(), (name, gen, run.tokens)
    return run


def hub_config(spec: dict) -> dict:
    """config.json as the Hub's T5 folders have it: t5-small's keys (no tie_word_embeddings:
    tied and scaled) or, untied, flan-t5's (dense_act_fn, is_gated_act, "tie_word_embeddings":
    false)."""
    import transformers

    c = spec["config"]
    cfg = {
        "architectures": ["T5ForConditionalGeneration"], "d_ff": c["d_ff"], "d_kv": c["d_kv"],
        "d_model": c["d_model"], "decoder_start_token_id": START, "dropout_rate": 0.1,
        "eos_token_id": EOS_ID, "feed_forward_proj": c["feed_forward_proj"],
        "initializer_factor": 1.0, "is_encoder_decoder": True,
        "layer_norm_epsilon": c["layer_norm_epsilon"], "model_type": "t5", "n_positions": 512,
        "num_decoder_layers": c["num_decoder_layers"], "num_heads": c["num_heads"],
        "num_layers": c["num_layers"], "output_past": True, "pad_token_id": PAD_ID,
        "relative_attention_max_distance": c["relative_attention_max_distance"],
        "relative_attention_num_buckets": c["relative_attention_num_buckets"],
        "torch_dtype": spec["dtype"], "transformers_version": transformers.__version__,
        "use_cache": True, "vocab_size": c["vocab_size"],
    }
    if spec["untied"]:
        assert c["feed_forward_proj"] == "gated-gelu"
        cfg.update(dense_act_fn="gelu_new", is_gated_act=True, tie_word_embeddings=False)
    return dict(sorted(cfg.items()))


def untied_tensors(model, dtype: str, embed_copies: bool) -> dict:
    """The tensors of an untied T5's model.safetensors in dtype: every state_dict tensor
    (shared, the encoder / decoder embed_tokens copies of it, lm_head, the blocks) as google's
    t5-v1_1 files hold them, or without the two embed_tokens copies (embed_copies False) as
    transformers 4's save_pretrained wrote them."""
    copies = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
    tensors = state_tensors(model, dtype, drop=() if embed_copies else copies)
    for k in ("shared.weight", "lm_head.weight") + (copies if embed_copies else ()):
        assert k in tensors, k
    assert not tensors["lm_head.weight"].equal(tensors["shared.weight"])
    return tensors


def write_folder(name: str, spec: dict, run: Seq2SeqRun, out_root: str) -> str:
    """Write out_root/name afresh (weights, configs, tokenizer files, expected.npz)."""
    from transformers import GenerationConfig

    out = fresh_folder(out_root, name)
    if spec["untied"]:
        save_tensors(untied_tensors(run.model, spec["dtype"], spec["embed_copies"]), out)
    else:
        save_weights(run.model, out, spec["dtype"])
    write_json(os.path.join(out, "config.json"), hub_config(spec))
    GenerationConfig(decoder_start_token_id=START, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                     do_sample=False, max_new_tokens=spec["n_new"]).save_pretrained(out)
    t5tok.write_tokenizer(TOKENIZER, out, pretty=False)
    write_expected(out, seq2seq_arrays(spec["prompt"], run))
    return out


def check_reload(name: str, spec: dict, out: str, run: Seq2SeqRun) -> float:
    """Reload the folder (float32, eager) and check it reproduces the encoder output, the
    prefill and the last full-sequence logits to TOL, the tied / untied head and the stored
    dtype, and that tokenizer.json and transformers' AutoTokenizer both give prompt_ids;
    return the largest relative error."""
    import torch
    from transformers import T5ForConditionalGeneration

    back = load_reference(T5ForConditionalGeneration, out)
    assert back.config.scale_decoder_outputs == (not spec["untied"]), name
    if spec["untied"]:
        assert back.lm_head.weight is not back.shared.weight, name
        assert not torch.equal(back.lm_head.weight, back.shared.weight), name
        assert torch.equal(back.lm_head.weight, run.model.lm_head.weight), name
    else:
        assert back.lm_head.weight is back.shared.weight, name
    check_safetensors(out, spec["dtype"])
    err = check_seq2seq_reload(name, back, run, TOL)
    check_tokenizer(out, spec["prompt"], run.prompt_ids)
    return err


def make_fixture(name: str, spec: dict, out_root: str) -> dict:
    """Write one fixture folder and return a summary dict."""
    run = search(name, spec)
    out = write_folder(name, spec, run, out_root)
    err = check_reload(name, spec, out, run)
    return summary(name, run, out, err, text=TOKENIZER.decode(run.tokens.tolist()),
                   vocab=spec["config"]["vocab_size"], dtype=spec["dtype"],
                   untied=spec["untied"])


TOKENIZER = None
"""The tokenizers.Tokenizer of train_t5_tokenizer, trained once by main()."""

BUCKET_CASES = [(32, 128), (8, 20), (16, 64), (6, 7), (128, 1000), (10, 33)]
"""(num_buckets, max_distance) pairs of t5-buckets.json, each bidirectional and causal."""
BUCKET_SPAN = 1200
"""t5-buckets.json covers the relative positions [-BUCKET_SPAN, BUCKET_SPAN]."""


def write_buckets(out_root: str) -> dict:
    """tests/fixtures/t5-buckets.json: transformers' ``T5Attention._relative_position_bucket``
    for every relative position in [-BUCKET_SPAN, BUCKET_SPAN] of each BUCKET_CASES pair, as
    [{"num_buckets", "max_distance", "bidirectional", "buckets": [2 * BUCKET_SPAN + 1 ints]}]."""
    import torch
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-BUCKET_SPAN, BUCKET_SPAN + 1)
    cases = [dict(num_buckets=n, max_distance=m, bidirectional=bi,
                  buckets=T5Attention._relative_position_bucket(rel, bi, n, m).tolist())
             for n, m in BUCKET_CASES for bi in (True, False)]
    path = os.path.join(out_root, "t5-buckets.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cases, f, separators=(",", ":"))
        f.write("\n")
    return dict(name="t5-buckets", cases=len(cases), bytes=os.path.getsize(path))


def main(argv=None) -> int:
    global TOKENIZER
    TOKENIZER = t5tok.build_tokenizer(t5tok.corpus_text())

    def make(name, args):
        if name == "t5-buckets":
            return write_buckets(args.out)
        return make_fixture(name, FIXTURES[name], args.out)
    return run_cli(__doc__, [*FIXTURES, "t5-buckets"], make, argv)


if __name__ == "__main__":
    sys.exit(main())
