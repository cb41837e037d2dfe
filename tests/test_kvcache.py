"""The system-prompt KV cache (CausalLM.run, save_kvcache, load_kvcache; porting spec 6.5).

With nntr_config ``"system_prompt": {"head_prompt": ..., "kvcache": {"pre_computed_cache_path":
"sys.cache"}}`` the first run prefills Encode(system) at positions [0, n), saves rows [0, n) of
every mha_core's K then V cache as FP16 (no header: layers * 2 * n * kv_width * 2 bytes for
batch 1), and goes on; a later run loads the file instead and continues at position n with
Encode(prompt, add_special_tokens=False). Both must equal one plain run over the concatenated
ids, up to the FP16 rounding of the cached rows (the tokens exactly).
"""

import json
import os
import shutil

import numpy as np
import pytest

from causallm.errors import CausalLMError
from causallm.io.config import load_model_configs
from models.causal_lm import CausalLM

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "llama-gqa3")
SYSTEM = "System: you explain the Python language reference.\n"
PROMPT = "The assert statement is a convenient way to insert debugging assertions into a program."
N_NEW = 16
LAYERS, KV_WIDTH = 3, 2 * 16  # llama-gqa3: 3 layers, 2 KV heads of head_dim 16


def write_config(folder, **kvcache):
    config = {"init_seq_len": 64, "num_to_generate": N_NEW,
              "system_prompt": {"head_prompt": SYSTEM,
                                "kvcache": {"pre_computed_cache_path": "sys.cache", **kvcache}}}
    with open(os.path.join(folder, "nntr_config.json"), "w") as f:
        json.dump(config, f)


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "llama-gqa3"
    shutil.copytree(FIXTURE, path)
    write_config(path)
    return path


def make(folder):
    """A fresh model (a new process, as far as the cache is concerned) that records the logits
    of every incremental_inference call as (from_, to, logits of batch 0)."""
    cfg, gen, nntr = load_model_configs(str(folder))
    model = CausalLM(cfg, gen, nntr)
    model.initialize()
    model.load_weight(str(folder))
    model.calls = []
    run = model.model.incremental_inference

    def recording(batch, inputs, labels=None, init_seq_len=None, from_=0, to=1, **kw):
        out = run(batch, inputs, labels, init_seq_len, from_, to, **kw)
        model.calls.append((from_, to, out[0][0].copy()))
        return out
    model.model.incremental_inference = recording
    return model


def run(folder, system=SYSTEM):
    model = make(folder)
    result = model.run(PROMPT, do_sample=False, system_prompt=system, log_output=False)
    return model, result.generated_ids[0]


def logits(model, start):
    """The logits of the calls from position ``start`` on, one row per generated token."""
    return np.array([x for f, _, x in model.calls if f >= start])


def assert_close(ours, ref, rtol, what):
    scale = max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(ours - ref).max())
    assert err <= rtol * scale, f"{what}: max |diff| {err:.3g} (logit scale {scale:.3g})"
    return err


def test_saved_then_loaded_cache_continues_like_one_plain_run(folder):
    cache = folder / "sys.cache"
    first, tokens1 = run(folder)
    n = first.SYS_PROMP_LEN
    sys_ids = first.tokenizer.Encode(SYSTEM)
    prompt_ids = first.tokenizer.Encode(PROMPT, add_special_tokens=False)
    assert n == len(sys_ids) == 14 and cache.exists()
    # run 1: the system prompt alone at [0, n), then the prompt at [n, n + P): positions go on
    assert [(f, t) for f, t, _ in first.calls[:3]] == [(0, n), (n, n + len(prompt_ids)),
                                                       (n + len(prompt_ids),
                                                        n + len(prompt_ids) + 1)]

    second, tokens2 = run(folder)
    assert [(f, t) for f, t, _ in second.calls[:1]] == [(n, n + len(prompt_ids))]  # no [0, n)
    assert tokens1 == tokens2 and len(tokens1) == N_NEW

    plain = make(folder)  # no cache file involved: one prompt, positions [0, n + P)
    result = plain.generate_tokens([sys_ids + prompt_ids], do_sample=False)
    assert result.generated_ids[0] == tokens1
    ref = logits(plain, 0)
    assert_close(logits(first, n), ref, 2e-5, "run 1 (float32 cache) vs plain")
    deviation = assert_close(logits(second, n), ref, 2e-3, "run 2 (FP16 cache) vs plain")
    top2 = np.sort(ref, axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 4 * deviation  # the tokens are not a near tie

    # run 2's difference is the FP16 rounding of the cached rows and nothing else
    rounded = make(folder)
    rounded.prefill_only(sys_ids)
    for _, k, v in rounded._caches():
        for c in (k, v):
            c[:, :n] = c[:, :n].astype(np.float16).astype(np.float32)
    rounded.calls.clear()
    assert rounded.generate_tokens([prompt_ids], do_sample=False,
                                   start_pos=n).generated_ids[0] == tokens1
    assert_close(logits(rounded, n), logits(second, n), 1e-6, "FP16-rounded cache vs run 2")


def test_cache_file_layout_and_atomic_write(folder, monkeypatch):
    first, _ = run(folder)
    n = first.SYS_PROMP_LEN
    cache = folder / "sys.cache"
    assert os.path.getsize(cache) == LAYERS * 2 * n * KV_WIDTH * 2
    assert sorted(os.listdir(folder)) == sorted(os.listdir(FIXTURE) + [
        "nntr_config.json", "sys.cache", "sys.cache.ids.json"])
    # the layout: per mha_core in graph order, K rows [0, n) then V rows [0, n), FP16
    data = np.fromfile(cache, dtype=np.float16).reshape(LAYERS, 2, n, KV_WIDTH)
    for i, (name, k, v) in enumerate(first._caches()):
        assert name == f"layer{i}_attention"
        np.testing.assert_array_equal(data[i, 0], k[0, :n].astype(np.float16))
        np.testing.assert_array_equal(data[i, 1], v[0, :n].astype(np.float16))

    # a write that fails before the rename leaves the old file whole and no temporary file
    cache.write_bytes(b"old")

    def fail(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        first.save_kvcache(str(cache), n)
    monkeypatch.undo()
    assert cache.read_bytes() == b"old"
    assert sorted(os.listdir(folder)) == sorted(os.listdir(FIXTURE) + [
        "nntr_config.json", "sys.cache", "sys.cache.ids.json"])


@pytest.mark.parametrize("delta", [-2, 2, None])
def test_wrong_size_cache_file_is_a_one_line_error(folder, delta):
    first, _ = run(folder)
    n = first.SYS_PROMP_LEN
    cache = folder / "sys.cache"
    size = os.path.getsize(cache)
    if delta is None:
        cache.write_bytes(b"")
        found = 0
    else:
        data = cache.read_bytes()
        cache.write_bytes(data[:size + delta] if delta < 0 else data + b"\0" * delta)
        found = size + delta
    with pytest.raises(CausalLMError) as e:
        run(folder)
    message = str(e.value)
    assert "\n" not in message and str(cache) in message
    assert f"expected {size} bytes for a {n}-token system prompt cache, found {found}" in message


def test_sys_prompt_token_size_is_honoured(folder):
    first, tokens1 = run(folder)
    n = first.SYS_PROMP_LEN
    # a cache file made elsewhere (NNTrainer writes no token sidecar): the configured size
    # decides how much is loaded and where the prompt starts, whatever the system text says
    os.unlink(folder / "sys.cache.ids.json")
    write_config(folder, sys_prompt_token_size=n)
    second, tokens2 = run(folder, system="another system prompt")
    assert second.SYS_PROMP_LEN == n and second.calls[0][:2] == (n, n + len(
        second.tokenizer.Encode(PROMPT, add_special_tokens=False)))
    assert tokens2 == tokens1
    # a size that does not fit the file is a one-line error naming both sizes
    write_config(folder, sys_prompt_token_size=n - 1)
    with pytest.raises(CausalLMError, match=rf"expected {LAYERS * 2 * (n - 1) * KV_WIDTH * 2} "
                                            rf"bytes for a {n - 1}-token .* found "
                                            rf"{LAYERS * 2 * n * KV_WIDTH * 2}"):
        run(folder)


def test_cli_uses_head_prompt_and_the_cache(folder, capsys):
    import main

    outputs = []
    for _ in range(2):
        assert main.main([str(folder), PROMPT, "--greedy", "--json"]) == 0
        captured = capsys.readouterr()
        outputs.append(json.loads(captured.out.strip().splitlines()[-1]))
        if len(outputs) == 1:
            assert "[kv cache] saved 14 system-prompt tokens" in captured.err
    assert (folder / "sys.cache").exists()
    first, second = outputs
    assert first["generated_ids"] == second["generated_ids"]
    assert len(first["generated_ids"]) == N_NEW
    prompt_ids = make(folder).tokenizer.Encode(PROMPT, add_special_tokens=False)
    assert first["prompt_ids"] == second["prompt_ids"] == prompt_ids  # the prompt alone, no BOS


def test_changed_system_prompt_recomputes_the_cache(folder):
    run(folder)
    other = "System: you answer in one short sentence.\n"
    second, tokens2 = run(folder, system=other)
    fresh = make(folder)
    ids = fresh.tokenizer.Encode(other) + fresh.tokenizer.Encode(PROMPT, add_special_tokens=False)
    plain = fresh.generate_tokens([ids], max_new_tokens=N_NEW, do_sample=False)
    assert tokens2 == plain.generated_ids[0]
    saved = json.load(open(folder / "sys.cache.ids.json"))["token_ids"]
    assert saved == fresh.tokenizer.Encode(other)
    assert os.path.getsize(folder / "sys.cache") == LAYERS * 2 * len(saved) * KV_WIDTH * 2


def test_repetition_penalty_counts_the_cached_system_prompt(folder, monkeypatch):
    """The penalty sees every token of the context, the cached system prompt included (HF
    penalises all input ids): run() hands the cached ids to generate_tokens as context, and
    context ids are penalised like prompt ids."""
    seen = []
    original = CausalLM.generate_tokens

    def spy(self, *args, **kwargs):
        seen.append(list(kwargs.get("context_ids", ())))
        return original(self, *args, **kwargs)
    monkeypatch.setattr(CausalLM, "generate_tokens", spy)
    for _ in range(2):  # computes and saves the cache, then loads it
        model = make(folder)
        model.REPETITION_PENALTY = 1.5
        model.run(PROMPT, do_sample=False, system_prompt=SYSTEM, log_output=False)
    sys_ids = model.tokenizer.Encode(SYSTEM)
    assert seen == [sys_ids, sys_ids]
    monkeypatch.undo()

    # context ids count: penalising the tokens the model would say changes what it says
    model = make(folder)
    prompt = model.tokenizer.Encode(PROMPT)
    said = model.generate_tokens([prompt], max_new_tokens=N_NEW, do_sample=False).generated_ids[0]
    model.REPETITION_PENALTY = 5.0
    alone = model.generate_tokens([prompt], max_new_tokens=N_NEW, do_sample=False)
    with_context = model.generate_tokens([prompt], max_new_tokens=N_NEW, do_sample=False,
                                         context_ids=said)
    assert with_context.generated_ids[0] != alone.generated_ids[0]
