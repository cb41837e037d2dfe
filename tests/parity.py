"""Parity checks shared by the causal-LM family tests (a helper module, not a test file).

Each fixture ``tests/fixtures/<name>/`` is a Hugging Face model folder plus ``expected.npz``
with what transformers computed from it in float32 (keys in tools/make_fixtures.py's docstring):

    prompt_ids (P,)  prefill_logits (V,)  tokens (N,)  step_logits (N, V)  full_logits_last (V,)

step_logits[k] are the logits that chose tokens[k] (step_logits[0] == prefill_logits), and
full_logits_last is a no-cache forward over seq = prompt_ids + tokens[:-1], last position.
Logits (V,) match when max |ours - ref| <= rtol * max(1, max |ref|). Nothing here imports torch
or transformers.
"""

import json
import os

import numpy as np
from cli import run_cli

from causallm.io.config import load_model_configs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
RTOL = 2e-4
FLOAT32_CACHE = {"kv_cache_dtype": "FP32"}
"""What load and load_folder give every model unless told otherwise: transformers computed the
expected logits in float32, caches included (a half checkpoint's default cache is FP16:
check_fp16_cache)."""


def read_safetensors_raw(path):
    """{name: (dtype string, shape, raw bytes)} of one .safetensors file, parsed by hand."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    return {k: (v["dtype"], tuple(v["shape"]), data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}


def read_hf_raw(folder):
    """read_safetensors_raw over a folder's model.safetensors or its index's shards."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index):
        return read_safetensors_raw(os.path.join(folder, "model.safetensors"))
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for name in files:
        out.update(read_safetensors_raw(os.path.join(folder, name)))
    return out


def to_f32(dtype, shape, raw):
    if dtype == "BF16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return np.frombuffer(raw, {"F32": "<f4", "F16": "<f2"}[dtype]).astype(np.float32).reshape(shape)


def read_hf(folder):
    """{name: float32 array} of a Hugging Face folder (a fixture name or a path), widened from
    F32 / F16 / BF16, read without our loader."""
    return {k: to_f32(*v) for k, v in read_hf_raw(os.path.join(FIXTURES, folder)).items()}


def load(cls, name, cfg_changes=None, weights=None, **nntr):
    """cls built from fixture ``name`` (or a folder path), config.json keys replaced by
    cfg_changes, nntr_config keys by nntr (init_seq_len and num_to_generate 64 unless given),
    initialized, weights loaded from ``weights`` (a .bin or folder; default the fixture)."""
    folder = os.path.join(FIXTURES, name)
    cfg, gen, nntr_cfg = load_model_configs(folder)
    cfg.update(cfg_changes or {})
    nntr_cfg.update({"init_seq_len": 64, "num_to_generate": 64, **FLOAT32_CACHE, **nntr})
    model = cls(cfg, gen, nntr_cfg)
    model.initialize()
    model.load_weight(weights or folder)
    return model


def from_folder(name, **nntr):
    """The fixture's model as main.py builds it (nothing pinned, the cache's precision
    included; init_seq_len and num_to_generate 64 unless given), loaded."""
    from causallm.factory import Factory
    model = Factory.Instance().createFromFolder(
        os.path.join(FIXTURES, name), **{"init_seq_len": 64, "num_to_generate": 64, **nntr})
    model.initialize()
    model.load_weight()
    return model


def expected(name):
    """The fixture's expected.npz."""
    return np.load(os.path.join(FIXTURES, name, "expected.npz"))


def full_sequence(ref):
    """prompt_ids + tokens[:-1] (P + N - 1,): the input of full_logits_last."""
    return np.concatenate([ref["prompt_ids"], ref["tokens"][:-1]])


def assert_logits_close(ours, ref, what, rtol=RTOL):
    scale = max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(ours - ref).max())
    assert err <= rtol * scale, f"{what}: max |diff| {err:.3g} (logit scale {scale:.3g})"


def prefill(model, ids):
    """One incremental_inference over ids (L,) at positions [0, L): logits (V,) of the last."""
    ids = np.asarray(ids, dtype=np.float32)[None, :]
    return model.model.incremental_inference(1, [ids], None, ids.shape[1], 0, ids.shape[1])[0][0]


def decode_step(model, token, pos):
    """One cached step feeding ``token`` at position ``pos``: its logits (V,)."""
    step = np.array([[token]], dtype=np.float32)
    return model.model.incremental_inference(1, [step], None, 1, pos, pos + 1)[0][0]


def check_prompt_ids(model, ref):
    """The model's tokenizer encodes the prompt to transformers' ids."""
    assert model.tokenizer.Encode(str(ref["prompt"])) == ref["prompt_ids"].tolist()


def teacher_forced(model, ref):
    """Prefill of the prompt, then one cached step per expected token (tokens[k - 1] at
    position P + k - 1): the logits (N, V) of every step, row k to compare with step_logits[k]."""
    tokens = ref["tokens"]
    P = len(ref["prompt_ids"])
    logits = [prefill(model, ref["prompt_ids"])]
    for k in range(1, len(tokens)):
        logits.append(decode_step(model, tokens[k - 1], P + k - 1))
    return np.stack(logits)


def check_prefill_and_cached_decode(model, ref, rtol=RTOL):
    """teacher_forced: the prefill matches prefill_logits, and every step k matches
    step_logits[k] and picks tokens[k]. Returns the logits (N, V)."""
    logits = teacher_forced(model, ref)
    assert_logits_close(logits[0], ref["prefill_logits"], "prefill", rtol)
    for k, row in enumerate(logits):
        assert_logits_close(row, ref["step_logits"][k], f"decode step {k}", rtol)
        assert int(np.argmax(row)) == ref["tokens"][k], f"greedy token {k}"
    return logits


FP16_CACHE_RTOL = 5e-3
"""How far an FP16 KV cache may move the logits: each cached key and value rounded to 11
significant bits (relative error <= 2^-11 ~ 4.9e-4), through a few layers of tiny random
models whose logits swing more than real ones'."""

INT8_ACTIVATIONS_RTOL = 0.06
"""How far Q8_0 / Q4_0 weights' int8 activations may move the logits: every input of a
quantized projection rounded to 8 bits per block of 32 (relative error up to 1/254 of the
block's largest value), through a few layers of tiny random models (seen: up to 0.035)."""

INT8_ACTIVATIONS_MARGIN = 0.03
"""The gap between transformers' top two logits, relative to the logit scale, beyond which int8
activations keep the greedy token (the gap moved by up to 0.02 on the quantized fixtures)."""


def decided(ref, k, margin):
    """Whether transformers' top two logits at step k are further apart than ``margin`` times
    the logit scale (a closer tie may flip on rounding)."""
    want = ref["step_logits"][k]
    top2 = np.sort(want)[-2:]
    return top2[1] - top2[0] > margin * max(1.0, float(np.abs(want).max()))


def decided_prefix(ref, margin):
    """How many of the greedy tokens are ``decided`` in a row from the first."""
    n = 0
    while n < len(ref["tokens"]) and decided(ref, n, margin):
        n += 1
    return n


def check_close(model, ref, rtol, margin, what):
    """Teacher-forced logits within ``rtol`` of transformers' float32 ones, and the greedy
    token wherever it is ``decided`` by ``margin``. Returns the logits (N, V)."""
    logits = teacher_forced(model, ref)
    for k, row in enumerate(logits):
        assert_logits_close(row, ref["step_logits"][k], f"{what}, step {k}", rtol)
        if decided(ref, k, margin):
            assert int(np.argmax(row)) == ref["tokens"][k], f"{what}, greedy token {k}"
    return logits


QUANTIZED_KL = {"Q8_0": 0.01, "Q4_0": 0.4}
"""The largest KL divergence of a step's next-token distribution from transformers' float32 one
when the weights are quantized at load (weight rounding and int8 activations): this tiny random
model (hidden 96) loses much to Q4_0 (KL 0.22-0.28, cosine 0.78-0.83) and little to Q8_0
(below 0.004); unrelated logits of the same values give KL 1.3."""

QUANTIZED_KL_MEAN = 2e-3
"""The largest mean KL over the steps of Q8_0 weights (seen: up to 1.6e-3)."""


def kl_divergence(want, got):
    """Per row, KL(softmax(want) || softmax(got)) in float64, of logits (N, V)."""
    def log_softmax(x):
        x = np.asarray(x, dtype=np.float64)
        x = x - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    lw, lg = log_softmax(want), log_softmax(got)
    return (np.exp(lw) * (lw - lg)).sum(axis=1)


def check_quantized(model, ref, fmt, what):
    """Teacher-forced steps of weights quantized to ``fmt`` at load: every step's KL divergence
    below QUANTIZED_KL[fmt]; for Q8_0 also a mean below QUANTIZED_KL_MEAN and the greedy token
    wherever transformers' is decided by INT8_ACTIVATIONS_MARGIN (Q4_0 moves decided ones on
    these tiny models). Returns the KL divergences (N,)."""
    logits = teacher_forced(model, ref)
    kl = kl_divergence(ref["step_logits"], logits)
    assert kl.max() < QUANTIZED_KL[fmt], f"{what}: KL {kl.max():.3g} at step {kl.argmax()}"
    if fmt == "Q8_0":
        assert kl.mean() < QUANTIZED_KL_MEAN, f"{what}: mean KL {kl.mean():.3g}"
        for k, row in enumerate(logits):
            if decided(ref, k, INT8_ACTIVATIONS_MARGIN):
                assert int(np.argmax(row)) == ref["tokens"][k], f"{what}, greedy token {k}"
    return kl


def check_fp16_cache(model, ref):
    """The default cache of a half checkpoint: FP16 (uint16 bits), and check_close within
    FP16_CACHE_RTOL."""
    caches = model.model.getKVCaches("self")
    assert caches and all(c.key.dtype == np.uint16 for c in caches)
    return check_close(model, ref, FP16_CACHE_RTOL, 2 * FP16_CACHE_RTOL, "FP16 cache")


def check_greedy(model, ref, what="greedy tokens"):
    """generate_tokens (prefill in chunks of init_seq_len, then cached greedy decode) gives
    transformers' greedy tokens."""
    result = model.generate_tokens([ref["prompt_ids"].tolist()], max_new_tokens=len(ref["tokens"]),
                                   do_sample=False)
    assert result.generated_ids[0] == ref["tokens"].tolist(), what


def check_chunked_prefill(model, ref):
    """check_greedy with a prompt longer than init_seq_len, so it is prefilled in chunks."""
    assert model.INIT_SEQ_LEN < len(ref["prompt_ids"]), "the prompt fits in one chunk"
    check_greedy(model, ref, "greedy tokens after a chunked prefill")


def check_one_shot(model, ref, rtol=RTOL):
    """One prefill over prompt_ids + tokens[:-1] matches transformers' no-cache forward
    (full_logits_last). Returns the logits (V,)."""
    logits = prefill(model, full_sequence(ref))
    assert_logits_close(logits, ref["full_logits_last"], "one-shot forward", rtol)
    return logits


def cli_record(name, n):
    """``main.py tests/fixtures/<name> PROMPT --greedy -n n --json`` (tests/cli.py, in this
    process): the JSON record of its last stdout line."""
    p = run_cli(os.path.join(FIXTURES, name), str(expected(name)["prompt"]), "--greedy", "-n",
                n, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.rstrip("\n").rsplit("\n", 1)[-1])


def check_cli(name, architecture, n):
    """The greedy CLI run (cli_record) names the architecture and gives transformers' prompt ids
    and first n tokens. Returns the record."""
    ref = expected(name)
    record = cli_record(name, n)
    assert record["architecture"] == architecture
    assert record["prompt_ids"] == ref["prompt_ids"].tolist()
    assert record["generated_ids"] == ref["tokens"][:n].tolist()
    return record


# ---------------------------------------------------------------------------- encoder-decoder
# fixtures: tools/fixtures_t5.py, fixtures_bart.py, fixtures_marian.py (keys in their docstrings:
# the causal-LM keys plus encoder_output, decoder_start_token_id and full_step_logits)

def load_folder(name, weights=None, initialize=True, **nntr):
    """The model of fixture ``name`` (a folder under tests/fixtures, or a path) through the
    Factory (init_seq_len 256, num_to_generate 48 unless given). Unless ``initialize`` is
    false: set to greedy decoding with one beam (a Marian generation_config.json asks for 4
    beams), initialized and its weights loaded (default: the folder's)."""
    from causallm.factory import Factory
    model = Factory.Instance().createFromFolder(
        os.path.join(FIXTURES, name), **{"init_seq_len": 256, "num_to_generate": 48,
                                         **FLOAT32_CACHE, **nntr})
    if initialize:
        model.setGenerationOptions(greedy=True)
        model.initialize()
        model.load_weight(weights)
    return model


def decoder_sequence(ref):
    """[decoder_start] + tokens: the decoder's input ids, position k feeding step k."""
    return [int(ref["decoder_start_token_id"])] + ref["tokens"].tolist()


def check_encoder_output(model, ref, rtol=2e-5):
    got = model.encode(ref["prompt_ids"][None])[0]
    scale = float(np.abs(ref["encoder_output"]).max())
    err = float(np.abs(got - ref["encoder_output"]).max())
    assert err <= rtol * scale, f"encoder output: max |diff| {err:.3g} (scale {scale:.3g})"


def check_decoder_steps(model, ref, rtol=RTOL):
    """Encode the prompt, then one cached decoder step per token: every step's raw logits match
    step_logits[k]; the greedy tokens follow where no processor forces a token (the fixture's
    tokens may be forced: BART's first BOS, a last EOS)."""
    model.encode(ref["prompt_ids"][None])
    seq = decoder_sequence(ref)
    tokens = ref["tokens"]
    assert len(tokens) >= 24
    for k in range(len(tokens)):
        logits = model.decode(np.array([[seq[k]]]), k)[0]
        assert_logits_close(logits, ref["step_logits"][k], f"decoder step {k}", rtol)


def check_decoder_no_cache(model, ref, rtol=RTOL):
    """Decoding a whole prefix in one step (nothing from the cache) gives the cached steps'
    logits, and transformers' no-cache forward at the last position."""
    model.encode(ref["prompt_ids"][None])
    seq = decoder_sequence(ref)
    n = len(ref["tokens"])
    assert_logits_close(model.decode(np.array([seq[:n]]), 0)[0], ref["full_logits_last"],
                        "no-cache forward", rtol)
    for k in (0, n // 2, n - 1):
        assert_logits_close(model.decode(np.array([seq[:k + 1]]), 0)[0],
                            ref["full_step_logits"][k], f"no-cache prefix {k}", rtol)

