"""What the fixture makers (tools/make_fixtures.py, tools/fixtures_*.py) share.

A causal-LM fixture ``tests/fixtures/<name>/`` is a Hugging Face folder (config.json,
generation_config.json, safetensors weights, tokenizer.json, tokenizer_config.json) of a tiny
randomly initialised model, plus ``expected.npz`` (keys in tools/make_fixtures.py's docstring)
with what transformers computes from it in float32 with eager attention. A maker builds it in
four steps, each a function here:

    search(name, spec, build, ...)    the first seed from spec["seed"] whose model (build(spec,
                                      seed)) decodes spec["n_new"] greedy tokens of spec["prompt"],
                                      each winning by >= MIN_MARGIN, no EOS, enough distinct ids
                                      -> Run (seed, model, prompt_ids, tokens, step_logits, full_last)
    write_folder(name, spec, run, ..) the folder: weights rounded to spec["dtype"], generation
                                      config, tokenizer files, expected.npz
    check_reload(name, out, run, tol) transformers reloads the folder and reproduces the prefill
                                      and full-sequence logits to tol
    summary(name, run, out, err, ..)  the dict the maker prints

An encoder-decoder fixture (tools/fixtures_t5.py, fixtures_bart.py, fixtures_marian.py, and
T5Gemma 2 in fixtures_vision.py) takes the same steps with the seq2seq twins: seq2seq_search
(the encoder output once, then a cached greedy decoder run from the decoder start token ->
Seq2SeqRun, which adds start, enc and the no-cache logits of every step), the folder from the
pieces below (the family writes its own config.json and tokenizer files) with
seq2seq_arrays as expected.npz, and check_seq2seq_reload.

Pieces every maker uses: first_seed (the seed loop), fresh_folder, save_weights /
state_tensors + save_tensors (model.safetensors as save_pretrained writes it, or by hand),
write_expected (expected.npz with transformers_version), load_reference (from_pretrained in
float32, eager attention), check_safetensors, check_tokenizer, generate / beam_search
(model.generate as the fixtures record it) and run_cli (the ``--out`` / ``--only`` command line).

Random weights (random_model): parameter p ~ mean + std * N(0, 1) with (mean, std) = init(name)
(standard_init: RMSNorm gains 1 + N(0, 0.1^2), biases N(0, 0.1^2), the rest N(0, 0.12^2)) so
that logits are far from flat, then rounded to the fixture's dtype and widened back to float32.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES_DIR = os.path.join(ROOT, "tests", "fixtures")
TOKENIZER_JSON = os.path.join(FIXTURES_DIR, "llama-gqa3", "tokenizer.json")  # the project's

MIN_MARGIN = 5e-3
WEIGHT_STD = 0.12
BIAS_STD = 0.1
NORM_STD = 0.1
BOS, EOS, VOCAB = 4001, 4002, 4003
COMMON = dict(hidden_act="silu", initializer_range=0.02, attention_dropout=0.0, use_cache=True,
              bos_token_id=BOS, eos_token_id=EOS, vocab_size=VOCAB)
"""Config keys shared by the Llama-like (silu) families."""
SAFETENSORS_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def torch_dtype(name: str):
    import torch
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def standard_init(name: str) -> tuple[float, float]:
    """(mean, std) of parameter ``name``: RMSNorm gains 1 + N(0, 0.1^2), biases N(0, 0.1^2),
    everything else N(0, 0.12^2)."""
    if name.endswith("norm.weight"):
        return 1.0, NORM_STD
    if name.endswith(".bias"):
        return 0.0, BIAS_STD
    return 0.0, WEIGHT_STD


def random_model(config_cls, model_cls, spec: dict, seed: int, init=standard_init,
                 generator=None, **common):
    """model_cls(config_cls(**common, **spec["config"])) in float32, eval mode, eager attention,
    every parameter drawn as mean + std * N(0, 1) with (mean, std) = init(name) (None: the
    parameter keeps the model's own values) from ``generator`` (default: a new one) seeded with
    ``seed`` (torch's global seed too), then rounded to spec["dtype"]."""
    import torch

    cfg = config_cls(**common, **copy.deepcopy(spec["config"]))
    torch.manual_seed(seed)
    model = model_cls(cfg).to(torch.float32).eval()
    gen = (generator or torch.Generator()).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            drawn = init(name)
            if drawn is None:
                continue
            mean, std = drawn
            p.copy_(mean + std * torch.randn(p.shape, generator=gen))
            p.copy_(p.to(torch_dtype(spec["dtype"])).to(torch.float32))
    model.config._attn_implementation = "eager"
    return model


def first_seed(name: str, spec: dict, attempt, tries: int, why: str):
    """(seed, result) for the first seed in [spec["seed"], spec["seed"] + tries) whose
    attempt(seed) returns a result other than None; SystemExit "<name>: no seed gave <why>"
    when none does."""
    for seed in range(spec["seed"], spec["seed"] + tries):
        result = attempt(seed)
        if result is not None:
            return seed, result
    raise SystemExit(f"{name}: no seed gave {why}")


def greedy(model, prompt_ids: np.ndarray, n_new: int):
    """Greedy decode n_new tokens with the KV cache; return (tokens (N,), step_logits (N, V))."""
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(prompt_ids)[None], use_cache=True)
        logits, cache = out.logits[0, -1], out.past_key_values
        tokens, steps = [], []
        for _ in range(n_new):
            tok = int(torch.argmax(logits))
            tokens.append(tok)
            steps.append(logits.numpy().astype(np.float32))
            out = model(torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
            logits, cache = out.logits[0, -1], out.past_key_values
    return np.array(tokens, dtype=np.int64), np.stack(steps)


def last_logits(model, ids: np.ndarray) -> np.ndarray:
    """No-cache forward over ids (L,); return float32 logits (V,) of the last position."""
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(ids)[None], use_cache=False).logits[0, -1].numpy().astype(np.float32)


def min_margin(step_logits: np.ndarray) -> float:
    """Smallest (top1 - top2) logit gap over the greedy steps."""
    top2 = np.sort(step_logits, axis=1)[:, -2:]
    return float((top2[:, 1] - top2[:, 0]).min())


def rel_err(a, b: np.ndarray) -> float:
    """max |a - b| / max |b|."""
    return float(np.abs(np.asarray(a) - b).max() / np.abs(b).max())


def write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def encode(tokenizer_json: str, text: str) -> np.ndarray:
    """The ids (int64) the tokenizer.json gives text, special tokens (BOS) included."""
    from tokenizers import Tokenizer
    return np.array(Tokenizer.from_file(tokenizer_json).encode(text).ids, dtype=np.int64)


@dataclass
class Run:
    """A seed's model and what transformers computed from it: prompt_ids (P,), greedy tokens
    (N,), step_logits (N, V) (step_logits[0] is the prefill), full_last (V,) = no-cache logits
    of the last position of seq = prompt_ids + tokens[:-1]."""
    seed: int
    model: object
    prompt_ids: np.ndarray
    tokens: np.ndarray
    step_logits: np.ndarray
    full_last: np.ndarray

    @property
    def seq(self) -> np.ndarray:
        return np.concatenate([self.prompt_ids, self.tokens[:-1]])


def search(name: str, spec: dict, build, tokenizer_json: str = TOKENIZER_JSON,
           min_distinct: int = 0, accept=None, tries: int = 200) -> Run:
    """The first seed in [spec["seed"], spec["seed"] + tries) whose model build(spec, seed)
    decodes spec["n_new"] greedy tokens of spec["prompt"] (encoded by tokenizer_json), each step
    winning by >= MIN_MARGIN, without EOS, with >= min_distinct different ids and, if given,
    accept(model, prompt_ids, tokens) true. The prefill and no-cache logits must agree with the
    cached ones (1e-5 and 1e-4)."""
    prompt_ids = encode(tokenizer_json, spec["prompt"])

    def attempt(seed: int):
        model = build(spec, seed)
        tokens, step_logits = greedy(model, prompt_ids, spec["n_new"])
        if (min_margin(step_logits) >= MIN_MARGIN and EOS not in tokens
                and len(set(tokens.tolist())) >= min_distinct
                and (accept is None or accept(model, prompt_ids, tokens))):
            return model, tokens, step_logits
        return None

    seed, (model, tokens, step_logits) = first_seed(
        name, spec, attempt, tries, f"a greedy margin >= {MIN_MARGIN} without EOS, "
        f"{min_distinct} distinct tokens{' and the extra rule' if accept else ''}")
    prefill = last_logits(model, prompt_ids)
    full_last = last_logits(model, np.concatenate([prompt_ids, tokens[:-1]]))
    assert np.allclose(prefill, step_logits[0], atol=1e-5), name
    assert np.allclose(full_last, step_logits[-1], atol=1e-4), name
    return Run(seed, model, prompt_ids, tokens, step_logits, full_last)


# ---------------------------------------------------------------------------- the folder

def fresh_folder(out_root: str, name: str) -> str:
    """out_root/name, emptied (made if missing)."""
    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    return out


def save_weights(model, out: str, dtype: str) -> dict:
    """out/model.safetensors as save_pretrained writes it for a copy of the model in dtype (the
    model stays float32); returns the config.json save_pretrained wrote beside it (not kept)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy.deepcopy(model).to(torch_dtype(dtype)).save_pretrained(tmp)
        assert sorted(os.listdir(tmp)) == ["config.json", "generation_config.json",
                                           "model.safetensors"], os.listdir(tmp)
        with open(os.path.join(tmp, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        shutil.copy(os.path.join(tmp, "model.safetensors"), out)
    return config


def state_tensors(model, dtype: str, drop=()) -> dict:
    """Every state_dict tensor of model not named in drop, in dtype (contiguous copies)."""
    return {k: v.detach().to(torch_dtype(dtype)).contiguous().clone()
            for k, v in model.state_dict().items() if k not in drop}


def save_tensors(tensors: dict, out: str) -> None:
    """out/model.safetensors of tensors, sorted by name, metadata {"format": "pt"} (as
    save_pretrained writes it)."""
    from safetensors.torch import save_file
    save_file(dict(sorted(tensors.items())), os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})


def write_expected(out: str, arrays: dict, sort: bool = False) -> None:
    """out/expected.npz: arrays in order (sort: by key), transformers_version (0-d str) last
    (sort: in its place)."""
    import transformers
    data = dict(arrays, transformers_version=np.array(transformers.__version__))
    np.savez_compressed(os.path.join(out, "expected.npz"),
                        **(dict(sorted(data.items())) if sort else data))


def write_folder(name: str, spec: dict, run: Run, out_root: str,
                 tokenizer_json: str = TOKENIZER_JSON, **save_kwargs) -> str:
    """Write out_root/name afresh: the model saved in spec["dtype"] (save_pretrained with
    save_kwargs; the model is float32 again afterwards), a greedy generation_config.json,
    tokenizer.json (re-saved compact) with the tokenizer_config.json beside tokenizer_json, and
    expected.npz. Return the folder."""
    import torch
    from tokenizers import Tokenizer
    from transformers import GenerationConfig

    out = fresh_folder(out_root, name)
    run.model.to(torch_dtype(spec["dtype"])).save_pretrained(out, **save_kwargs)
    run.model.to(torch.float32)
    GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, do_sample=False,
                     max_new_tokens=spec["n_new"]).save_pretrained(out)
    Tokenizer.from_file(tokenizer_json).save(os.path.join(out, "tokenizer.json"), pretty=False)
    shutil.copy(os.path.join(os.path.dirname(tokenizer_json), "tokenizer_config.json"), out)
    write_expected(out, dict(
        prompt=np.array(spec["prompt"]), prompt_ids=run.prompt_ids,
        prefill_logits=run.step_logits[0], tokens=run.tokens, step_logits=run.step_logits,
        full_logits_last=run.full_last))
    return out


# ---------------------------------------------------------------------------- reload checks

def load_reference(model_cls, folder: str, **kwargs):
    """model_cls.from_pretrained(folder, **kwargs) in float32 with eager attention, eval
    mode."""
    import torch
    return model_cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                     **kwargs).eval()


def check_reload(name: str, out: str, run: Run, tol: float = 1e-5, back=None):
    """Reload the written folder with transformers (float32, eager attention), unless the
    reloaded model back is given, and check it reproduces the prefill and the full-sequence
    logits to tol; return (model, max error)."""
    from transformers import AutoModelForCausalLM

    back = load_reference(AutoModelForCausalLM, out) if back is None else back
    err = max(float(np.abs(last_logits(back, run.prompt_ids) - run.step_logits[0]).max()),
              float(np.abs(last_logits(back, run.seq) - run.full_last).max()))
    assert err < tol, f"{name}: reloaded folder differs by {err}"
    return back, err


def check_safetensors(out: str, dtype: str) -> list[str]:
    """out/model.safetensors has save_pretrained's metadata and every tensor in dtype; returns
    its tensor names."""
    from safetensors import safe_open
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}, f.metadata()
        keys = list(f.keys())
        assert {f.get_slice(k).get_dtype() for k in keys} == {SAFETENSORS_DTYPE[dtype]}, out
    return keys


def check_tokenizer(out: str, prompt: str, prompt_ids: np.ndarray, auto: bool = True) -> None:
    """out/tokenizer.json (tokenizers) and, if auto, transformers' AutoTokenizer of the folder
    encode prompt as prompt_ids."""
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(os.path.join(out, "tokenizer.json")).encode(prompt).ids
    assert ids == prompt_ids.tolist(), (out, ids)
    if auto:
        from transformers import AutoTokenizer
        assert AutoTokenizer.from_pretrained(out)(prompt)["input_ids"] == ids, out


def folder_bytes(out: str) -> int:
    return sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))


def summary(name: str, run: Run, out: str, err: float, margin: float | None = None,
            distinct_of: np.ndarray | None = None, text: str | None = None, **extra) -> dict:
    """What a maker prints for one fixture: margin (default min_margin of the steps), distinct
    tokens (of distinct_of, default all), and with text the logit scale and the decoded text."""
    res = dict(name=name, seed=run.seed, prompt_len=len(run.prompt_ids), n_new=len(run.tokens),
               **extra, margin=round(min_margin(run.step_logits) if margin is None else margin, 4),
               distinct=len(set((run.tokens if distinct_of is None else distinct_of).tolist())))
    if text is not None:
        res.update(logit_scale=round(float(np.abs(run.step_logits).max()), 2), text=text)
    return dict(res, reload_err=err, bytes=folder_bytes(out))


# ---------------------------------------------------------------------------- command line

def arg_parser(doc: str, names, tokenizer: str | None = None) -> argparse.ArgumentParser:
    """[--tokenizer PATH (when a default is given)] [--out tests/fixtures] [--only NAME ...]"""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    if tokenizer is not None:
        ap.add_argument("--tokenizer", default=tokenizer)
    ap.add_argument("--out", default=FIXTURES_DIR)
    ap.add_argument("--only", nargs="*", choices=list(names),
                    help="fixture names to make (default: all)")
    return ap


def quiet_torch() -> None:
    """One torch thread (as the committed fixtures were made), no transformers warnings or
    progress bars."""
    import torch
    import transformers
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def run_cli(doc: str, names, make, argv=None, tokenizer: str | None = None) -> int:
    """Parse arg_parser's options, then print json.dumps(make(name, args)) for each name asked
    for (all by default)."""
    args = arg_parser(doc, names, tokenizer).parse_args(argv)
    quiet_torch()
    for name in args.only or list(names):
        print(json.dumps(make(name, args)), flush=True)
    return 0


# ---------------------------------------------------------------------------- encoder-decoder
# (tools/fixtures_t5.py, fixtures_bart.py, fixtures_marian.py, fixtures_vision.py)

@dataclass
class Seq2SeqRun(Run):
    """A Run of an encoder-decoder: decoding starts from [start]; enc (P, d_model) is the
    encoder output of prompt_ids, full (N, V) the no-cache decoder logits over [start] +
    tokens[:-1] (full_last = full[-1])."""
    start: int
    enc: np.ndarray
    full: np.ndarray


def encoder_output(model, prompt_ids: np.ndarray):
    """The encoder's last hidden state (1, P, d_model) as a torch tensor."""
    import torch
    with torch.no_grad():
        return model.get_encoder()(input_ids=torch.from_numpy(prompt_ids)[None]).last_hidden_state


def decoder_greedy(model, enc, start: int, n_new: int, choose=None):
    """Decode n_new tokens from [start] with transformers' KV cache, given the encoder output
    enc: step k's token is ``choose(k, raw)`` (default: the argmax of the raw logits), raw its
    float32 logits (V,). Returns (tokens (N,), raw step logits (N, V))."""
    import torch
    from transformers.cache_utils import EncoderDecoderCache

    tokens, steps = [], []
    with torch.no_grad():
        out = model(encoder_outputs=(enc,), decoder_input_ids=torch.tensor([[start]]),
                    use_cache=True)
        assert isinstance(out.past_key_values, EncoderDecoderCache), type(out.past_key_values)
        for k in range(n_new):
            raw = out.logits[0, -1].numpy().astype(np.float32)
            tok = int(np.argmax(raw)) if choose is None else choose(k, raw)
            tokens.append(tok)
            steps.append(raw)
            out = model(encoder_outputs=(enc,), decoder_input_ids=torch.tensor([[tok]]),
                        past_key_values=out.past_key_values, use_cache=True)
    return np.array(tokens, dtype=np.int64), np.stack(steps)


def decoder_logits(model, enc, tokens: np.ndarray, start: int) -> np.ndarray:
    """No-cache decoder forward over [start] + tokens[:-1]; float32 logits (N, V) of every
    position."""
    import torch
    dec = torch.from_numpy(np.concatenate([[start], tokens[:-1]]).astype(np.int64))[None]
    with torch.no_grad():
        out = model(encoder_outputs=(enc,), decoder_input_ids=dec, use_cache=False)
    return out.logits[0].numpy().astype(np.float32)


def seq2seq_search(name: str, spec: dict, build, prompt_ids: np.ndarray, start: int, good,
                   why: str, choose=None, tries: int = 200, abs_tol: float | None = None
                   ) -> Seq2SeqRun:
    """The first seed from spec["seed"] whose model build(spec, seed) decodes spec["n_new"]
    tokens from [start] (decoder_greedy with choose) that good(model, tokens, step_logits)
    accepts; the no-cache decoder logits must equal the cached steps to 1e-5 of their scale
    (and to abs_tol if given)."""
    def attempt(seed: int):
        model = build(spec, seed)
        enc = encoder_output(model, prompt_ids)
        tokens, steps = decoder_greedy(model, enc, start, spec["n_new"], choose)
        return (model, enc, tokens, steps) if good(model, tokens, steps) else None

    seed, (model, enc, tokens, steps) = first_seed(name, spec, attempt, tries, why)
    full = decoder_logits(model, enc, tokens, start)
    err = rel_err(full, steps)
    assert err < 1e-5 and (abs_tol is None or np.abs(full - steps).max() < abs_tol), (name, err)
    return Seq2SeqRun(seed, model, prompt_ids, tokens, steps, full[-1], start,
                      enc[0].numpy().astype(np.float32), full)


def seq2seq_arrays(prompt: str, run: Seq2SeqRun, **extra) -> dict:
    """expected.npz of an encoder-decoder fixture (keys in tools/fixtures_t5.py's docstring),
    then extra (write_expected adds transformers_version)."""
    return dict(prompt=np.array(prompt), prompt_ids=run.prompt_ids, encoder_output=run.enc,
                decoder_start_token_id=np.array(run.start, dtype=np.int64), tokens=run.tokens,
                step_logits=run.step_logits, prefill_logits=run.step_logits[0],
                full_step_logits=run.full, full_logits_last=run.full_last, **extra)


def check_seq2seq_reload(name: str, back, run: Seq2SeqRun, tol: float) -> float:
    """The reloaded model reproduces the encoder output, the prefill and the last
    full-sequence logits to tol (max |difference| / max |expected|); returns the largest."""
    enc = encoder_output(back, run.prompt_ids)
    prefill = decoder_logits(back, enc, run.tokens[:1], run.start)[0]
    full = decoder_logits(back, enc, run.tokens, run.start)
    err = max(rel_err(enc[0].numpy(), run.enc), rel_err(prefill, run.step_logits[0]),
              rel_err(full[-1], run.full_last))
    assert err < tol, f"{name}: reloaded folder differs by {err}"
    return err


def generate(model, ids, **kwargs):
    """model.generate on the prompt ids (P,) under no_grad with kwargs. A T5 model also gets
    past_key_values: generate() sizes its cache from config.num_layers, the ENCODER depth
    (transformers 5.23), and fails with an IndexError when num_decoder_layers is larger, so it
    is handed a cache built from the decoder's config."""
    import torch
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    if model.config.model_type == "t5":
        kwargs["past_key_values"] = EncoderDecoderCache(
            DynamicCache(config=model.decoder.config), DynamicCache(config=model.decoder.config))
    with torch.no_grad():
        return model.generate(torch.from_numpy(np.asarray(ids, dtype=np.int64))[None], **kwargs)


def greedy_generate(model, ids, start: int, n_new: int, **kwargs) -> list[int]:
    """The new tokens of greedy generate(..., max_new_tokens=n_new, **kwargs) of an
    encoder-decoder, which must start the decoder from start."""
    out = generate(model, ids, do_sample=False, num_beams=1, max_new_tokens=n_new, **kwargs)
    assert int(out[0, 0]) == start, out
    return out[0, 1:].tolist()


def beam_search(model, ids, **kwargs) -> dict:
    """generate(model, ids, **kwargs, return_dict_in_generate, output_scores) as the beam
    fixtures record it: sequences (the new tokens of each returned hypothesis, cut at its own
    length = its count of beam_indices >= 0, so without pad filler), scores (sequences_scores),
    steps (decoding steps run), decoder_prompt_len (1 for an encoder-decoder, else len(ids))."""
    out = generate(model, ids, return_dict_in_generate=True, output_scores=True, **kwargs)
    start = 1 if model.config.is_encoder_decoder else len(ids)
    lengths = (out.beam_indices >= 0).sum(dim=1).tolist()
    return dict(decoder_prompt_len=start,
                sequences=[out.sequences[i, start:start + n].tolist()
                           for i, n in enumerate(lengths)],
                scores=[float(x) for x in out.sequences_scores], steps=len(out.scores))
