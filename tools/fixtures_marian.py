"""Make the Marian (opus-mt style encoder-decoder) parity fixtures under tests/fixtures/.

Each folder is a Hugging Face MarianMTModel folder laid out like a Helsinki-NLP/opus-mt-* one:
config.json (the Hub's transformers-4 style, with legacy BART keys such as
``static_position_embeddings``, ``normalize_before``, ``extra_pos_embeddings`` and the
generation keys ``bad_words_ids``, ``num_beams``, ``max_length``), generation_config.json (as
opus-mt's: ``bad_words_ids`` [[pad]], ``bos_token_id`` 0, ``decoder_start_token_id`` = pad,
``eos_token_id`` 0, ``forced_eos_token_id`` 0, ``max_length`` 512, ``num_beams`` 4,
``pad_token_id``, ``renormalize_logits`` true), model.safetensors, source.spm, target.spm,
vocab.json and tokenizer_config.json (written by MarianTokenizer.save_pretrained), the
tokenizer.json that tools/marian_tokenizer.py makes of them, and ``expected.npz`` with what
transformers computes in float32 (eager attention, one thread).

Tokenizer files (the same in both folders): two sentencepiece Unigram models trained here on
pydoc_data.topics (sorted keys, as tools/train_tokenizer.py joins them), nmt_nfkc, character
coverage 1, one thread, fixed seed (trained twice and compared): source.spm on the first half
of the topics (1000 pieces), target.spm on the second half (800); vocab.json a joint Marian
vocabulary of 1254 ids: ``</s>`` 0, ``<unk>`` 1, the language codes ``>>deu<<`` 2,
``>>fra<<`` 3, ``>>nld<<`` 4, the union of both spms' pieces by descending frequency in the
spm-encoded halves (so ids differ from spm ids; 251 pieces only the target spm has, "J", "\\"
and "ß" among them, which the source spm does not know at all), ``<pad>`` 1253 = V - 1 (pad,
decoder start). Prompts are encoded by transformers' MarianTokenizer (``</s>`` = 0 last;
tokenizer.json must give the same ids).

    marian-positions-in-file
                   F32 weights; model.safetensors holds model.encoder.embed_positions.weight and
                   model.decoder.embed_positions.weight (the sinusoid tables, as converted
                   opus-mt checkpoints do), final_logits_bias, model.shared.weight and the
                   layers; a 46-token prompt that goes through the tokenizer's corners (the
                   "ﬁ" ligature and "…" rewritten by nmt_nfkc, a double space, "’", and "J",
                   which only the target spm has: MarianTokenizer maps the source spm's unknown
                   piece "J" to vocab.json's "J")
    marian-no-positions
                   BF16 weights; model.safetensors as save_pretrained writes it: no
                   embed_positions (transformers computes the tables when loading); the short
                   prompt ">>deu<< A module is an object and a type." (11 tokens, a leading
                   language code); ``final_logits_bias`` of ``<pad>`` set to 2.5, so that the
                   raw top logit is ``<pad>`` at 4 or more greedy steps (generate() masks it:
                   bad_words_ids; the beam cases' renormalize_logits then matters too)

Both: d_model 64, 2 encoder / 3 decoder layers, 4 heads each (head_dim 16), FFN 128 / 96,
swish, scale_embedding (token embeddings times 8), max_position_embeddings 128, post-LN
(normalize_before false), shared and tied embeddings, vocab 1254.

Weights (float32 from a seeded torch generator, rounded to the stored dtype): LayerNorm
gains 1 + N(0, 0.1^2), biases N(0, 0.1^2), ``final_logits_bias`` (a [1, V] buffer, saved in
the file) N(0, 0.5^2) (but see marian-no-positions), shared embedding N(0, 0.15^2), q_proj and
k_proj N(0, 0.3^2) (peaked attention, so that the decoder's output moves from step to step),
v_proj, out_proj, fc1 and fc2 N(0, 0.125^2) (= d_model^-0.5: sublayer outputs about as large
as their input, so token and position survive the post-LN residual stream; larger ones drown
them and every step predicts the same token, smaller ones let the tied head repeat its input
token). The sinusoid tables are transformers' own. Real converted checkpoints have a zero
embedding row and a zero bias for ``<pad>`` (the decoder start); here that row is random like
the others. A seed is kept only if greedy decoding of N = 32 tokens (generate's processing:
pad masked by bad_words_ids, EOS forced at the last step) has every unforced step winning by
>= MIN_MARGIN on the processed logits, no EOS before the forced last one, no ``<unk>``, at
least 12 (marian-positions-in-file) or 8 different tokens, ``<pad>`` as the raw top logit where
asked for, and a float64 copy of the model gives the same encoder output and no-cache logits
to COND_TOL (1e-5, relative to the largest value; the runtime tests compare at 2e-4). The
written folder is reloaded with MarianMTModel.from_pretrained (float32, eager) and must
reproduce the encoder output, the prefill, the last full-sequence logits and the greedy
generate() tokens, with final_logits_bias and the sinusoid tables.

transformers 5.23 notes: save_pretrained leaves out both embed_positions tables
(``_keys_to_ignore_on_save``) and the tied copies (encoder / decoder embed_tokens, lm_head):
it writes final_logits_bias, model.shared.weight and the layers. from_pretrained recomputes a
missing table (``_init_weights`` -> ``create_weight``: sin of pos / 10000^(2i/d) in columns
[0, d/2), cos in [d/2, d), float64 rounded to float32, positions from 0 without offset) and
takes a table present in the file as stored. Encoder and decoder multiply token embeddings by
sqrt(d_model) and add the table; logits are lm_head(h) + final_logits_bias. The model's
generation_config.json has num_beams 4, so greedy decoding must pass num_beams=1; pad never
appears because bad_words_ids masks it; with max_new_tokens N the last token is always the
forced EOS; renormalize_logits applies log_softmax after the processors (greedy order and
margins unchanged; beam scores use the renormalized values).

expected.npz keys (arrays float32, ids int64):

    prompt                  str, 0-d: the prompt text
    prompt_ids              (P,): MarianTokenizer's encoding of the prompt, ``</s>`` (0) last
                            (tokenizer.json gives the same, checked)
    encoder_output          (P, d_model): the encoder's last hidden state
    decoder_start_token_id  int64, 0-d: V - 1 (``<pad>``)
    tokens                  (N,): generate(prompt_ids, do_sample=False, num_beams=1,
                            max_new_tokens=N) with the folder's generation config, new tokens
                            only; tokens[-1] is the forced EOS, no EOS before
    step_logits             (N, V): the RAW logits (lm_head + final_logits_bias, before the
                            logits processors) of each cached decoder step feeding
                            [start] + tokens[:k]; step_logits[0] is the prefill of the start
    prefill_logits          (V,): step_logits[0]
    full_step_logits        (N, V): a no-cache decoder forward over [start] + tokens[:-1],
                            every position; equal to step_logits to 1e-5 of the logit scale
    full_logits_last        (V,): full_step_logits[-1]
    positions               (max_position_embeddings, d_model): the sinusoid table of
                            MarianSinusoidalPositionalEmbedding after loading (encoder and
                            decoder use the same)
    transformers_version    str, 0-d

``beams-marian.json``: beam-search expectations for these folders, a list of cases (the
keys of tools/fixtures_beams.py's cases): "name", "folder", "prompt_from", "prompt_ids" (the
folder's expected.npz prompt_ids), "generate" (the exact keyword arguments given to
model.generate: num_beams, max_new_tokens, length_penalty, early_stopping, no_repeat_ngram_size,
min_new_tokens, num_return_sequences, do_sample and, where set, eos_token_id),
"decoder_prompt_len" (1), "eos_token_id" (the EOS id(s) in effect), "sequences" (the new tokens
of each returned hypothesis, best first: no decoder start, cut at the hypothesis' own length =
its count of beam_indices >= 0, so no pad filler), "scores" (sequences_scores: the sum of the
processed, renormalized log-probabilities of the hypothesis' tokens divided by its length **
length_penalty), "eos_ended" (per hypothesis: its last token is an EOS id; with
forced_eos_token_id a hypothesis that runs to max_new_tokens ends on the forced EOS 0 too) and
"steps" (decoding steps run, len(output.scores)); from generate(...,
return_dict_in_generate=True, output_scores=True) on the reloaded float32 folder with its
generation config (bad_words_ids, forced EOS at max length, renormalize_logits). Cases, all
with 4 beams and 24 new tokens: the folder's defaults; length_penalty 2 returning 3 hypotheses;
length_penalty 0.5 with no_repeat_ngram_size 2; an extra EOS id X (eos_token_id [0, X], X found
by extra_eos() in a first run so that beams end a few steps in) with early_stopping true
returning 4 hypotheses; early_stopping "never", length_penalty 1.5 and min_new_tokens 5 with
the same extra EOS (min_new_tokens changes the scores only: a length penalty above 1 keeps the
short EOS-ended hypotheses out); the same with length_penalty 0.5 returning 4 hypotheses
(min_new_tokens 0 returns other, shorter ones). Each case is re-run with the model in float64
and must give the same sequences, and a control run without the setting that makes the case
(no_repeat_ngram_size 0, the real EOS only, min_new_tokens 0) must give other sequences or
scores.

Usage:  python tools/fixtures_marian.py [--only NAME ...] [--out tests/fixtures]
        (--only beams-marian reloads the two folders from --out)
"""

from __future__ import annotations

import collections
import io
import json
import os
import sys
import tempfile
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import marian_tokenizer as mtok  # noqa: E402
from fixture_common import (BIAS_STD, MIN_MARGIN, NORM_STD, Seq2SeqRun, beam_search,  # noqa: E402
                            check_safetensors, check_seq2seq_reload, check_tokenizer,
                            decoder_logits, encoder_output, fresh_folder, generate,
                            greedy_generate, load_reference, random_model, rel_err, run_cli,
                            save_tensors, save_weights, seq2seq_arrays, seq2seq_search,
                            state_tensors, summary, torch_dtype, write_expected, write_json)

SOURCE_VOCAB, TARGET_VOCAB = 1000, 800
"""sentencepiece vocab_size of source.spm (first half of the corpus) and target.spm (second)."""
LANGUAGE_CODES = [">>deu<<", ">>fra<<", ">>nld<<"]
"""Target-language tokens of vocab.json (ids 2-4), as multilingual opus-mt models have."""
EOS_ID, UNK_ID = 0, 1
EOS, UNK, PAD = "</s>", "<unk>", "<pad>"
SPM_SEED = 1234
FINAL_BIAS_STD = 0.5
PAD_WINS = 4
"""With a spec's pad_bias: the fewest greedy steps whose raw top logit must be ``<pad>``."""
MIN_DISTINCT = 8
"""Fewest different greedy tokens (a spec's min_distinct may ask for more)."""
COND_TOL = 1e-5
"""A seed is kept only if its float64 copy gives the same no-cache logits and encoder output
to this relative error (the runtime tests compare at 2e-4 of the logit scale)."""
TOL = 1e-5
"""Reload check: max |difference| / max |expected| for the encoder output and the logits."""
N_NEW = 32

FIXTURES = {
    "marian-positions-in-file": dict(
        seed=100, n_new=N_NEW, dtype="float32", positions_in_file=True, std=0.125, embed_std=0.15,
        qk_std=0.3, min_distinct=12,
        prompt="The ﬁrst statement of a function body can be a string literal… it becomes "
               "the function’s docstring, as Java and  Python programmers expect.",
        config=dict(d_model=64, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                    decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=96,
                    max_position_embeddings=128),
    ),
    "marian-no-positions": dict(
        seed=200, n_new=N_NEW, dtype="bfloat16", positions_in_file=False, std=0.125, embed_std=0.15,
        qk_std=0.3, pad_bias=2.5,
        prompt=">>deu<< A module is an object and a type.",
        config=dict(d_model=64, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                    decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=96,
                    max_position_embeddings=128),
    ),
}


# ---------------------------------------------------------------- tokenizer files


def corpus_halves() -> tuple[str, str]:
    """pydoc_data.topics as tools/train_tokenizer.py joins it, split by sorted key: the first
    half of the topics (source side) and the second half (target side)."""
    import pydoc_data.topics as topics

    keys = sorted(topics.topics)
    half = len(keys) // 2
    return ("\n\n".join(topics.topics[k] for k in keys[:half]),
            "\n\n".join(topics.topics[k] for k in keys[half:]))


def train_spm(text: str, vocab_size: int) -> bytes:
    """A sentencepiece Unigram model (serialized proto) trained on the non-empty lines of
    text: nmt_nfkc normalization, character coverage 1, one thread, fixed seed."""
    import sentencepiece as spm

    spm.set_random_generator_seed(SPM_SEED)
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([line for line in text.split("\n") if line.strip()]),
        model_writer=out, vocab_size=vocab_size, model_type="unigram", character_coverage=1.0,
        num_threads=1, minloglevel=2)
    return out.getvalue()


def spm_pieces(proto: bytes) -> list[str]:
    """The NORMAL pieces of a serialized spm model, in spm id order."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=proto)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i))]


def joint_vocab(src: bytes, tgt: bytes, src_text: str, tgt_text: str) -> dict:
    """vocab.json as opus-mt's joint vocabularies: ``</s>`` 0, ``<unk>`` 1, the language
    codes, the union of both spms' pieces by descending frequency in the spm-encoded corpus
    halves (ties by piece; as Marian orders its vocabulary by frequency, so ids are unrelated to
    the spm ids), ``<pad>`` last."""
    import sentencepiece as spm

    count = collections.Counter()
    for proto, text in ((src, src_text), (tgt, tgt_text)):
        sp = spm.SentencePieceProcessor(model_proto=proto)
        for line in text.split("\n"):
            count.update(sp.encode(line, out_type=str))
    pieces = set(spm_pieces(src)) | set(spm_pieces(tgt))
    vocab = {EOS: 0, UNK: 1}
    for piece in LANGUAGE_CODES + sorted(pieces, key=lambda p: (-count[p], p)):
        vocab[piece] = len(vocab)
    vocab[PAD] = len(vocab)
    return vocab


def make_tokenizer_files() -> dict:
    """Train both spms (twice, to check determinism) and build vocab.json; return
    {"source", "target" (spm bytes), "vocab"}."""
    src_text, tgt_text = corpus_halves()
    src, tgt = train_spm(src_text, SOURCE_VOCAB), train_spm(tgt_text, TARGET_VOCAB)
    if (train_spm(src_text, SOURCE_VOCAB), train_spm(tgt_text, TARGET_VOCAB)) != (src, tgt):
        raise SystemExit("sentencepiece training is not deterministic")
    return dict(source=src, target=tgt, vocab=joint_vocab(src, tgt, src_text, tgt_text))


def write_tokenizer_files(files: dict, out: str):
    """source.spm, target.spm, vocab.json and tokenizer_config.json as MarianTokenizer's
    save_pretrained writes them, then tokenizer.json by tools/marian_tokenizer.py; return the
    reloaded MarianTokenizer."""
    from transformers import MarianTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f) for f in ("source.spm", "target.spm", "vocab.json")]
        for path, data in zip(paths[:2], (files["source"], files["target"])):
            with open(path, "wb") as f:
                f.write(data)
        with open(paths[2], "w", encoding="utf-8") as f:
            json.dump(files["vocab"], f, ensure_ascii=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses."
            MarianTokenizer(*paths, source_lang="en", target_lang="mul").save_pretrained(out)
    assert sorted(os.listdir(out)) == ["source.spm", "target.spm", "tokenizer_config.json",
                                       "vocab.json"], os.listdir(out)
    mtok.write_tokenizer(out, mtok.build_tokenizer(out))
    return marian_tokenizer(out)


def marian_tokenizer(folder: str):
    """transformers' MarianTokenizer of a folder (sentencepiece; no sacremoses warning)."""
    from transformers import MarianTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MarianTokenizer.from_pretrained(folder)


# ---------------------------------------------------------------- the model


def config_kwargs(vocab_size: int) -> dict:
    """MarianConfig keywords besides spec["config"]: opus-mt's fixed settings."""
    pad = vocab_size - 1
    return dict(vocab_size=vocab_size, decoder_vocab_size=vocab_size,
                activation_function="swish", scale_embedding=True,
                static_position_embeddings=True, share_encoder_decoder_embeddings=True,
                tie_word_embeddings=True, normalize_before=False, normalize_embedding=False,
                add_bias_logits=False, add_final_layer_norm=False, pad_token_id=pad,
                eos_token_id=EOS_ID, bos_token_id=EOS_ID, decoder_start_token_id=pad,
                forced_eos_token_id=EOS_ID, dropout=0.1, attention_dropout=0.0,
                activation_dropout=0.0, is_encoder_decoder=True)


def marian_init(std: float, embed_std: float, qk_std: float):
    """init(name) -> (mean, std): LayerNorm gains 1 + N(0, 0.1^2), biases (LayerNorm's too)
    N(0, 0.1^2), the shared embedding (= tied head) N(0, embed_std^2), q_proj and k_proj
    N(0, qk_std^2), the other projections (v_proj, out_proj, fc1, fc2) N(0, std^2); None (kept)
    for the sinusoidal position tables."""
    def init(name: str) -> tuple[float, float] | None:
        if "embed_positions" in name:
            return None
        if name.endswith("layer_norm.weight"):
            return 1.0, NORM_STD
        if name.endswith(".bias"):
            return 0.0, BIAS_STD
        if name == "model.shared.weight":
            return 0.0, embed_std
        if name.endswith((".q_proj.weight", ".k_proj.weight")):
            return 0.0, qk_std
        return 0.0, std
    return init


def build(spec: dict, seed: int, vocab_size: int):
    """A float32 MarianMTModel (eval, eager attention) with the fixture's random weights rounded
    to spec["dtype"]: every parameter but the sinusoidal position tables drawn by marian_init
    from a generator seeded with seed, then final_logits_bias N(0, FINAL_BIAS_STD^2) (that of
    ``<pad>`` = spec["pad_bias"] when given)."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    init = marian_init(spec["std"], spec["embed_std"], spec["qk_std"])
    gen = torch.Generator()
    model = random_model(MarianConfig, MarianMTModel, spec, seed, init, generator=gen,
                         **config_kwargs(vocab_size))
    with torch.no_grad():
        bias = FINAL_BIAS_STD * torch.randn(model.final_logits_bias.shape, generator=gen)
        if spec.get("pad_bias") is not None:
            bias[0, vocab_size - 1] = spec["pad_bias"]
        model.final_logits_bias.copy_(bias.to(torch_dtype(spec["dtype"])).to(torch.float32))
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared and model.model.encoder.embed_tokens.weight is shared
    assert model.model.decoder.embed_tokens.weight is shared
    for stack in (model.model.encoder, model.model.decoder):
        table = stack.embed_positions.weight
        assert torch.equal(table, sinusoids(*table.shape)), "transformers' sinusoid changed"
    return model


def sinusoids(n_pos: int, dim: int):
    """The float32 table MarianSinusoidalPositionalEmbedding computes, written out: row p,
    column j < dim/2 is sin(p / 10000^(2j/dim)), column dim/2 + j is cos(same angle),
    evaluated in float64 and rounded to float32."""
    import torch

    j = np.arange(dim // 2)
    angle = np.arange(n_pos)[:, None] / np.power(10000.0, 2 * j / dim)[None, :]
    table = np.concatenate([np.sin(angle), np.cos(angle)], axis=1)
    return torch.from_numpy(table.astype(np.float32))


def processed(raw: np.ndarray, step: int, n_new: int, pad: int) -> np.ndarray:
    """What greedy generate() ranks at step (0-based) of n_new with the folder's generation
    config: pad (bad_words_ids) at -inf, and at the last step everything but EOS at -inf
    (forced_eos_token_id); renormalize_logits' log_softmax does not change the order or the
    gaps."""
    out = raw.astype(np.float64).copy()
    out[pad] = -np.inf
    if step == n_new - 1:
        out[np.arange(len(out)) != EOS_ID] = -np.inf
    return out


def margins(step_logits: np.ndarray, pad: int) -> np.ndarray:
    """(N - 1,): top-1 minus top-2 processed logit of each unforced step."""
    n_new = len(step_logits)
    top2 = [np.sort(processed(step_logits[k], k, n_new, pad))[-2:] for k in range(n_new - 1)]
    return np.array([float(b - a) for a, b in top2])


def pad_wins(step_logits: np.ndarray) -> int:
    """How many unforced steps have ``<pad>`` (the last id) as the raw top logit."""
    return int((step_logits[:-1].argmax(axis=1) == step_logits.shape[1] - 1).sum())


def good(spec: dict, tokens: np.ndarray, step_logits: np.ndarray, pad: int) -> bool:
    """Every unforced step wins by MIN_MARGIN; EOS only as the forced last token; no <unk>;
    at least spec["min_distinct"] (default MIN_DISTINCT) different tokens; with
    spec["pad_bias"], ``<pad>`` the raw top logit of at least PAD_WINS steps."""
    return (margins(step_logits, pad).min() >= MIN_MARGIN and tokens[-1] == EOS_ID
            and not np.isin(tokens[:-1], [EOS_ID, UNK_ID]).any()
            and len(set(tokens.tolist())) >= spec.get("min_distinct", MIN_DISTINCT)
            and (spec.get("pad_bias") is None or pad_wins(step_logits) >= PAD_WINS))


def conditioning(model, prompt_ids: np.ndarray, tokens: np.ndarray, pad: int) -> float:
    """Largest relative difference of the encoder output and the no-cache logits between the
    model and its float64 copy: how much float32 rounding moves the expected values."""
    import copy

    wide = copy.deepcopy(model).double()
    enc, enc64 = encoder_output(model, prompt_ids), encoder_output(wide, prompt_ids)
    return max(rel_err(enc.numpy(), enc64.numpy()),
               rel_err(decoder_logits(model, enc, tokens, pad),
                       decoder_logits(wide, enc64, tokens, pad)))


def search(name: str, spec: dict, prompt_ids: np.ndarray, vocab_size: int) -> Seq2SeqRun:
    """The first seed from spec["seed"] whose greedy decoding, as generate() does it with the
    folder's generation config, is good() and well conditioned, checked against the no-cache
    forward and against generate() (tokens, raw logits)."""
    from transformers import GenerationConfig

    pad = vocab_size - 1
    run = seq2seq_search(
        name, spec, lambda spec, seed: build(spec, seed, vocab_size), prompt_ids, pad,
        lambda model, tokens, steps: (good(spec, tokens, steps, pad) and conditioning(
            model, prompt_ids, tokens, pad) <= COND_TOL),
        f"a greedy margin >= {MIN_MARGIN} without EOS / <unk>, enough distinct tokens and "
        f"float64 agreement {COND_TOL}",
        choose=lambda k, raw: int(np.argmax(processed(raw, k, N_NEW, pad))), abs_tol=1e-4)
    run.model.generation_config = GenerationConfig(**generation_config(vocab_size))
    gen = generate(run.model, prompt_ids, do_sample=False, num_beams=1, max_new_tokens=N_NEW,
                   return_dict_in_generate=True, output_logits=True)
    assert gen.sequences[0].tolist() == [pad] + run.tokens.tolist(), (name, gen.sequences)
    raw = np.stack([x[0].numpy() for x in gen.logits])
    assert rel_err(raw, run.step_logits) < 1e-5, name
    return run


# ---------------------------------------------------------------- the folder


def generation_config(vocab_size: int) -> dict:
    """generation_config.json as Helsinki-NLP's opus-mt folders have it."""
    import transformers

    pad = vocab_size - 1
    return {"bad_words_ids": [[pad]], "bos_token_id": EOS_ID, "decoder_start_token_id": pad,
            "eos_token_id": EOS_ID, "forced_eos_token_id": EOS_ID, "max_length": 512,
            "num_beams": 4, "pad_token_id": pad, "renormalize_logits": True,
            "transformers_version": transformers.__version__}


def hub_config(spec: dict, vocab_size: int) -> dict:
    """config.json in the style of the opus-mt folders on the Hub (written by transformers 4,
    with their legacy BART keys and generation settings)."""
    import transformers

    c = spec["config"]
    pad = vocab_size - 1
    cfg = {
        "activation_dropout": 0.0,
        "activation_function": "swish", "add_bias_logits": False,
        "add_final_layer_norm": False, "architectures": ["MarianMTModel"],
        "attention_dropout": 0.0, "bad_words_ids": [[pad]], "bos_token_id": EOS_ID,
        "classif_dropout": 0.0, "classifier_dropout": 0.0, "d_model": c["d_model"],
        "decoder_attention_heads": c["decoder_attention_heads"],
        "decoder_ffn_dim": c["decoder_ffn_dim"], "decoder_layerdrop": 0.0,
        "decoder_layers": c["decoder_layers"], "decoder_start_token_id": pad,
        "decoder_vocab_size": vocab_size, "dropout": 0.1,
        "encoder_attention_heads": c["encoder_attention_heads"],
        "encoder_ffn_dim": c["encoder_ffn_dim"], "encoder_layerdrop": 0.0,
        "encoder_layers": c["encoder_layers"], "eos_token_id": EOS_ID,
        "extra_pos_embeddings": vocab_size, "forced_eos_token_id": EOS_ID,
        "id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}, "init_std": 0.02,
        "is_encoder_decoder": True, "label2id": {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2},
        "max_length": 512, "max_position_embeddings": c["max_position_embeddings"],
        "model_type": "marian", "normalize_before": False, "normalize_embedding": False,
        "num_beams": 4, "num_hidden_layers": c["encoder_layers"], "pad_token_id": pad,
        "scale_embedding": True, "share_encoder_decoder_embeddings": True,
        "static_position_embeddings": True, "tie_word_embeddings": True,
        "torch_dtype": spec["dtype"], "transformers_version": transformers.__version__,
        "use_cache": True, "vocab_size": vocab_size,
    }
    return dict(sorted(cfg.items()))


POSITION_KEYS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
TIED_COPIES = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
               "lm_head.weight")


def weight_tensors(model, spec: dict) -> dict:
    """The tensors of model.safetensors: every state_dict entry in spec["dtype"] but the tied
    copies of model.shared.weight, with the two sinusoid tables (float32 values; stored in the
    fixture dtype) only if spec["positions_in_file"]. Checked against what save_pretrained
    writes (the same names without the tables)."""
    tensors = state_tensors(model, spec["dtype"], drop=TIED_COPIES)
    with tempfile.TemporaryDirectory() as tmp:
        save_weights(model, tmp, spec["dtype"])
        saved = set(check_safetensors(tmp, spec["dtype"]))
    assert saved == set(tensors) - set(POSITION_KEYS), sorted(saved ^ set(tensors))
    if not spec["positions_in_file"]:
        for k in POSITION_KEYS:
            del tensors[k]
    return tensors


def write_folder(name: str, spec: dict, files: dict, run: Seq2SeqRun, out_root: str) -> str:
    """Write out_root/name afresh (tokenizer files, weights, configs, expected.npz)."""
    out = fresh_folder(out_root, name)
    write_tokenizer_files(files, out)
    vocab_size = len(files["vocab"])
    save_tensors(weight_tensors(run.model, spec), out)
    write_json(os.path.join(out, "config.json"), hub_config(spec, vocab_size))
    write_json(os.path.join(out, "generation_config.json"), generation_config(vocab_size))
    positions = run.model.model.encoder.embed_positions.weight.detach().numpy()
    write_expected(out, seq2seq_arrays(spec["prompt"], run,
                                       positions=positions.astype(np.float32)))
    return out


def check_reload(name: str, spec: dict, out: str, run: Seq2SeqRun):
    """Reload the folder (float32, eager) and check it reproduces the encoder output, the
    prefill, the last full-sequence logits and the greedy generate() tokens to TOL, with
    final_logits_bias, the sinusoid tables (from the file or computed), the tied head and the
    stored dtype / names; tokenizer.json must give prompt_ids. Return (reloaded model, largest
    relative error)."""
    import torch
    from transformers import MarianMTModel

    back = load_reference(MarianMTModel, out)
    model = run.model
    assert back.lm_head.weight is back.model.shared.weight, name
    assert torch.equal(back.model.shared.weight, model.model.shared.weight), name
    assert torch.equal(back.final_logits_bias, model.final_logits_bias), name
    assert back.final_logits_bias.abs().max() > 0, name
    table = sinusoids(*model.model.encoder.embed_positions.weight.shape)
    for stack in (back.model.encoder, back.model.decoder):
        assert torch.equal(stack.embed_positions.weight, table), name
    gen = back.generation_config
    pad = back.config.pad_token_id
    assert (gen.bad_words_ids, gen.forced_eos_token_id, gen.num_beams, gen.renormalize_logits,
            gen.decoder_start_token_id) == ([[pad]], EOS_ID, 4, True, pad), gen
    keys = set(check_safetensors(out, spec["dtype"]))
    assert (set(POSITION_KEYS) <= keys) == spec["positions_in_file"], name
    assert not keys & set(TIED_COPIES) and "final_logits_bias" in keys, name
    err = check_seq2seq_reload(name, back, run, TOL)
    assert greedy_generate(back, run.prompt_ids, pad, N_NEW) == run.tokens.tolist(), name
    check_tokenizer(out, spec["prompt"], run.prompt_ids, auto=False)
    return back, err


def make_fixture(name: str, spec: dict, files: dict, out_root: str) -> tuple[dict, object]:
    """Write one fixture folder; return (summary dict, reloaded float32 model)."""
    with tempfile.TemporaryDirectory() as tmp:
        hf = write_tokenizer_files(files, tmp)
        prompt_ids = np.array(hf(spec["prompt"])["input_ids"], dtype=np.int64)
    assert prompt_ids[-1] == EOS_ID and EOS_ID not in prompt_ids[:-1], prompt_ids
    vocab_size = len(files["vocab"])
    assert spec["positions_in_file"] <= (spec["dtype"] == "float32"), name
    run = search(name, spec, prompt_ids, vocab_size)
    out = write_folder(name, spec, files, run, out_root)
    back, err = check_reload(name, spec, out, run)
    text = marian_tokenizer(out).decode(run.tokens.tolist(), skip_special_tokens=True)
    return summary(name, run, out, err, margin=float(margins(run.step_logits, vocab_size - 1)
                                                     .min()), text=text, vocab=vocab_size,
                   dtype=spec["dtype"], positions_in_file=spec["positions_in_file"],
                   pad_raw_top_steps=pad_wins(run.step_logits)), back


# ---------------------------------------------------------------- beam search


BEAM_DEFAULTS = dict(num_beams=4, max_new_tokens=24, length_penalty=1.0, early_stopping=False,
                     no_repeat_ngram_size=0, min_new_tokens=0, num_return_sequences=1,
                     do_sample=False)
"""The generate() kwargs of every beam case: the folder's generation-config defaults (beam
width 4 as opus-mt's) made explicit; a case overrides some."""
BEAM_CASES = [
    ("beam4-defaults", "marian-positions-in-file", {}, None),
    ("beam4-lp2-return3", "marian-positions-in-file",
     dict(length_penalty=2.0, num_return_sequences=3), None),
    ("beam4-lp0.5-norepeat2", "marian-positions-in-file",
     dict(length_penalty=0.5, no_repeat_ngram_size=2), dict(no_repeat_ngram_size=0)),
    ("beam4-extra-eos-early-stop-return4", "marian-no-positions",
     dict(early_stopping=True, num_return_sequences=4, eos_token_id="extra"),
     dict(eos_token_id=EOS_ID)),
    ("beam4-never-lp1.5-min5-extra-eos", "marian-no-positions",
     dict(early_stopping="never", length_penalty=1.5, min_new_tokens=5, eos_token_id="extra"),
     dict(min_new_tokens=0)),
    ("beam4-never-lp0.5-min5-extra-eos-return4", "marian-no-positions",
     dict(early_stopping="never", length_penalty=0.5, min_new_tokens=5, eos_token_id="extra",
          num_return_sequences=4),
     dict(min_new_tokens=0)),
]
"""(name, folder, overrides of BEAM_DEFAULTS, control): eos_token_id "extra" stands for
[0, X] with the folder's extra_eos() X; a control (overrides replaced by it) must give
different sequences or scores (by CONTROL_TOL), so the setting it undoes matters."""
CONTROL_TOL = 1e-5
EXTRA_EOS_STEPS = (2, 10)
"""extra_eos() looks for X among the tokens generated at these (0-based, end excluded) steps."""


def beam_run(model, prompt_ids: np.ndarray, kwargs: dict) -> tuple[list, list]:
    """(sequences, scores) of beam_search(model, prompt_ids, **kwargs)."""
    res = beam_search(model, prompt_ids, **kwargs)
    return res["sequences"], res["scores"]


def extra_eos(model, prompt_ids: np.ndarray) -> int:
    """The X of an "extra" EOS: run beam search (BEAM_DEFAULTS, early stopping, 4 returned
    hypotheses) with the real EOS only; the candidates are the tokens generated at a step in
    EXTRA_EOS_STEPS (hypotheses in returned order, steps in order) that are not EOS and not
    among any hypothesis' first EXTRA_EOS_STEPS[0] tokens; X is the first candidate with which
    (as [0, X]) that search returns both hypotheses ended by X before max_new_tokens and longer
    ones, else the first with which some hypothesis ends by X."""
    kwargs = dict(BEAM_DEFAULTS, early_stopping=True, num_return_sequences=4)
    seqs, _ = beam_run(model, prompt_ids, dict(kwargs, eos_token_id=EOS_ID))
    early = {t for s in seqs for t in s[:EXTRA_EOS_STEPS[0]]}
    candidates = []
    for s in seqs:
        for t in s[EXTRA_EOS_STEPS[0]:EXTRA_EOS_STEPS[1]]:
            if t != EOS_ID and t not in early and t not in candidates:
                candidates.append(t)
    fallback = None
    for x in candidates:
        ended = [len(s) < kwargs["max_new_tokens"] and s[-1] == x
                 for s in beam_run(model, prompt_ids, dict(kwargs, eos_token_id=[EOS_ID, x]))[0]]
        if any(ended) and not all(ended):
            return x
        if any(ended) and fallback is None:
            fallback = x
    if fallback is None:
        raise SystemExit("no token for the extra-EOS beam cases")
    return fallback


def make_beams(models: dict, prompts: dict, out_root: str) -> dict:
    """tests/fixtures/beams-marian.json (see the module docstring). Every case is re-run with
    the model in float64 and must give the same sequences; its control must not. Return the
    printed summaries."""
    import copy

    cases, summaries, extra = [], [], {}
    for name, folder, overrides, control in BEAM_CASES:
        model, prompt_ids = models[folder], prompts[folder]
        kwargs = dict(BEAM_DEFAULTS, **overrides)
        if kwargs.get("eos_token_id") == "extra":
            if folder not in extra:
                extra[folder] = extra_eos(model, prompt_ids)
            kwargs["eos_token_id"] = [EOS_ID, extra[folder]]
        res = beam_search(model, prompt_ids, **kwargs)
        seqs, scores, steps = res["sequences"], res["scores"], res["steps"]
        seqs64, scores64 = beam_run(copy.deepcopy(model).double(), prompt_ids, kwargs)
        if seqs64 != seqs:
            raise SystemExit(f"{name}: float64 beams differ: {seqs} vs {seqs64}")
        if control is not None:
            other, other_scores = beam_run(model, prompt_ids, dict(kwargs, **control))
            if other == seqs and np.abs(np.array(other_scores) - scores).max() < CONTROL_TOL:
                raise SystemExit(f"{name}: {control} gives the same sequences and scores")
        eos_id = kwargs.get("eos_token_id", EOS_ID)
        eos = set(eos_id) if isinstance(eos_id, list) else {eos_id}
        cases.append(dict(name=name, folder=folder, prompt_from="expected.npz prompt_ids",
                          prompt_ids=prompt_ids.tolist(), generate=kwargs, decoder_prompt_len=1,
                          eos_token_id=eos_id, sequences=seqs, scores=scores,
                          eos_ended=[s[-1] in eos for s in seqs], steps=steps))
        summaries.append(dict(
            name=name, folder=folder, lengths=[len(s) for s in seqs], steps=steps,
            eos_ended_early=sum(len(s) < kwargs["max_new_tokens"] and s[-1] in eos
                                for s in seqs),
            last_tokens=[s[-1] for s in seqs], scores=[round(x, 4) for x in scores],
            float64_score_diff=float(np.abs(np.array(scores) - scores64).max())))
    path = os.path.join(out_root, "beams-marian.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")
    return dict(name="beams-marian", cases=summaries, bytes=os.path.getsize(path))


def main(argv=None) -> int:
    files = make_tokenizer_files()
    models = {}

    def make(name, args):
        if name == "beams-marian":
            from transformers import MarianMTModel

            for folder in sorted({c[1] for c in BEAM_CASES} - set(models)):  # made before
                models[folder] = load_reference(MarianMTModel, os.path.join(args.out, folder))
            prompts = {f: np.load(os.path.join(args.out, f, "expected.npz"))["prompt_ids"]
                       for f in models}
            return make_beams(models, prompts, args.out)
        summary, models[name] = make_fixture(name, FIXTURES[name], files, args.out)
        return summary
    return run_cli(__doc__, [*FIXTURES, "beams-marian"], make, argv)


if __name__ == "__main__":
    sys.exit(main())
