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
import parity
import pytest

from causallm.errors import CausalLMError
from causallm.io.config import load_model_configs
from causallm.models.causal_lm import CausalLM

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
    for cache in rounded.model.getKVCaches("self"):
        for c in (cache.key, cache.value):
            c[:, :, :n] = c[:, :, :n].astype(np.float16).astype(np.float32)
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
    for i, kv in enumerate(first.model.getKVCaches("self")):
        assert kv.owner == f"layer{i}_attention"
        k, v = kv.rows(n)              # (B, n, n_kv * head_dim): position t's heads side by side
        np.testing.assert_array_equal(data[i, 0], k[0].astype(np.float16))
        np.testing.assert_array_equal(data[i, 1], v[0].astype(np.float16))
        np.testing.assert_array_equal(k[0, 5, 16:32], kv.key[0, 1, 5])  # kv head 1

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


def test_an_fp16_cache_is_saved_and_loaded_bit_for_bit(folder):
    """With FP16 caches (kv_cache_dtype) the file holds the cache's own bits: a run from the
    file is the run that wrote it, logits and all."""
    config = json.loads((folder / "nntr_config.json").read_text())
    (folder / "nntr_config.json").write_text(json.dumps({**config, "kv_cache_dtype": "FP16"}))
    first, tokens1 = run(folder)
    assert all(c.key.dtype == np.uint16 for c in first.model.getKVCaches("self"))
    second, tokens2 = run(folder)
    n = first.SYS_PROMP_LEN
    assert tokens1 == tokens2
    np.testing.assert_array_equal(logits(second, n), logits(first, n))
    for a, b in zip(first.model.getKVCaches("self"), second.model.getKVCaches("self")):
        np.testing.assert_array_equal(a.key[:, :, :n], b.key[:, :, :n])


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
    from causallm import main
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


# --------------------------------------------------------------------- the cache's precision
HALF_FIXTURES = ["llama-hd80-bf16-sharded", "llama-f16-yarn-bias", "qwen2-gqa4", "qwen3-hd80",
                 "gemma3-softcap", "gpt2-untied-scaled", "qwen3moe-e8k2-dense", "gpt-oss-tiny"]


def from_folder(name, **nntr):
    """The fixture's model as main.py builds it (no cache precision pinned), loaded."""
    from causallm.factory import Factory
    model = Factory.Instance().createFromFolder(os.path.join(parity.FIXTURES, name),
                                                init_seq_len=64, num_to_generate=64, **nntr)
    model.initialize()
    model.load_weight()
    return model


@pytest.mark.parametrize("name", HALF_FIXTURES)
def test_a_half_checkpoint_gets_an_fp16_cache_within_its_rounding(name):
    parity.check_fp16_cache(from_folder(name), parity.expected(name))


@pytest.mark.parametrize("name,nntr,want", [
    ("llama-gqa3", {}, np.float32),                              # float32 weights: exact
    ("llama-hd80-bf16-sharded", {}, np.uint16),                  # BF16 kept: FP16 cache
    ("llama-hd80-bf16-sharded", {"kv_cache_dtype": "fp32"}, np.float32),
    ("llama-gqa3", {"kv_cache_dtype": "FP16"}, np.uint16),
    ("llama-gqa3", {"fc_layer_dtype": "Q4_0"}, np.uint16),       # held as Q4_0
])
def test_cache_precision_follows_the_weights_unless_set(name, nntr, want):
    model = from_folder(name, **nntr)
    assert {c.key.dtype for c in model.model.getKVCaches("self")} == {np.dtype(want)}


def test_weight_format_and_kv_dtype_calls_choose_the_cache():
    from causallm.factory import Factory
    for fmt, kv, want in (("Q8_0", None, np.uint16), ("FP32", None, np.float32),
                          ("Q4_0", "FP32", np.float32)):
        model = Factory.Instance().createFromFolder(FIXTURE, init_seq_len=8, num_to_generate=8)
        model.setWeightFormat(fmt)
        model.setKVCacheDtype(kv)
        model.initialize()
        assert model.model.getKVCaches("self")[0].key.dtype == want


def test_bad_kv_cache_dtype_is_a_one_line_error(tmp_path):
    from causallm.factory import Factory
    path = tmp_path / "llama-gqa3"
    shutil.copytree(FIXTURE, path)
    (path / "nntr_config.json").write_text(json.dumps({"kv_cache_dtype": "Q8_0"}))
    with pytest.raises(CausalLMError) as e:
        Factory.Instance().createFromFolder(str(path))
    assert str(e.value) == (f"{path / 'nntr_config.json'}: kv_cache_dtype 'Q8_0' is not one "
                            f"of FP32, FP16")
    with pytest.raises(CausalLMError, match="KV cache dtype 'BF16' is not one of FP32, FP16"):
        Factory.Instance().createFromFolder(FIXTURE).setKVCacheDtype("BF16")
