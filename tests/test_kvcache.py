"""The system-prompt KV cache (CausalLM.run, save_kvcache, load_kvcache; docs/nntrainer.md, "The
system-prompt cache").

With nntr_config ``"system_prompt": {"head_prompt": ..., "kvcache": {"pre_computed_cache_path":
"sys.cache"}}`` the first run prefills Encode(system) at positions [0, n), saves rows [0, n) of
every mha_core's K then V cache as FP16 (NNTrainer's layout, no header in the file: layers * 2 *
n * kv_width * 2 bytes for batch 1) and its header ``sys.cache.header.json`` (size, sha256, token
ids, the model's identity), and goes on; a later run loads the file instead and continues at
position n with Encode(prompt, add_special_tokens=False). Both must equal one plain run over the
concatenated ids, up to the FP16 rounding of the cached rows (the tokens exactly). A file its
header does not vouch for is recomputed with one warning, and a cache that cannot be saved
costs the cache, not the run.
"""

import hashlib
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_cache_file_layout_and_atomic_write(folder, monkeypatch):
    first, _ = run(folder)
    n = first.SYS_PROMP_LEN
    cache = folder / "sys.cache"
    assert os.path.getsize(cache) == LAYERS * 2 * n * KV_WIDTH * 2
    assert sorted(os.listdir(folder)) == sorted(os.listdir(FIXTURE) + [
        "nntr_config.json", "sys.cache", "sys.cache.header.json"])
    header = json.loads((folder / "sys.cache.header.json").read_text())
    assert header == {"format": "causallm system-prompt KV cache 1",
                      "bytes": os.path.getsize(cache),
                      "sha256": hashlib.sha256(cache.read_bytes()).hexdigest(),
                      "token_ids": first.tokenizer.Encode(SYSTEM),
                      "model": first.kvcacheIdentity()}
    st = os.stat(folder / "model.safetensors")
    assert header["model"]["weights"] == [{"file": "model.safetensors", "size": st.st_size,
                                           "mtime_ns": st.st_mtime_ns}]
    assert header["model"]["cache_dtype"] == ["FP32"]
    assert header["model"]["cache_shapes"] == [[1, 2, 16]] * LAYERS
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
        "nntr_config.json", "sys.cache", "sys.cache.header.json"])


@pytest.mark.slow
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


def plain_tokens(folder, system=SYSTEM):
    """The tokens of one run over Encode(system) + Encode(prompt) with no cache file involved."""
    model = make(folder)
    ids = model.tokenizer.Encode(system) + model.tokenizer.Encode(PROMPT, add_special_tokens=False)
    return model.generate_tokens([ids], max_new_tokens=N_NEW, do_sample=False).generated_ids[0]


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, **changes}))


def damage(folder, how):
    """Make the saved cache wrong in one way; the reason the next run should give."""
    cache, header = folder / "sys.cache", folder / "sys.cache.header.json"
    data = cache.read_bytes()
    if how == "zeros":
        cache.write_bytes(bytes(len(data)))
    elif how == "shorter":
        cache.write_bytes(data[:-2])
    elif how == "longer":
        cache.write_bytes(data + b"\0\0")
    elif how == "empty":
        cache.write_bytes(b"")
    elif how == "no header":           # e.g. a file NNTrainer wrote
        os.unlink(header)
    elif how == "header cut short":
        header.write_bytes(header.read_bytes()[:40])
    elif how == "header not ours":
        header.write_text('{"token_ids": [1, 2, 3]}')
    elif how == "token ids":
        ids = json.loads(header.read_text())["token_ids"]
        edit_json(header, token_ids=ids[:3] + [ids[3] + 1] + ids[4:])
    elif how == "weights":             # the weight file was replaced since
        st = os.stat(folder / "model.safetensors")
        os.utime(folder / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    elif how == "config":              # another model in the same folder
        config = json.loads((folder / "config.json").read_text())
        edit_json(folder / "config.json", rope_theta=config.get("rope_theta", 10000.0) * 2)
    elif how == "kv dtype":
        edit_json(folder / "nntr_config.json", kv_cache_dtype="FP16")
    return {"zeros": "its contents do not match its header's size and sha256",
            "no header": f"no header {header}",
            "header cut short": f"unreadable header {header} (JSONDecodeError)",
            "header not ours": f"unreadable header {header} (not a causallm system-prompt KV "
                               f"cache 1)",
            "token ids": "the system prompt changed",
            "weights": "made for another model (weights differ)",
            "config": "made for another model (config_sha256 differ)",
            "kv dtype": "made for another model (cache_dtype differ)",
            }.get(how, "its contents do not match its header's size and sha256")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["zeros", "shorter", "longer", "empty", "no header",
                                 "header cut short", "header not ours", "token ids", "weights",
                                 "config", "kv dtype"])
def test_a_cache_its_header_does_not_vouch_for_is_recomputed(folder, how, capsys):
    first, _ = run(folder)
    n = first.SYS_PROMP_LEN
    capsys.readouterr()
    reason = damage(folder, how)
    cache = folder / "sys.cache"
    second, tokens = run(folder)
    assert capsys.readouterr().err.splitlines() == [
        f"[kv cache] warning: {cache}: {reason}; recomputed, saved {n} system-prompt tokens "
        f"to {cache}"]
    assert second.calls[0][:2] == (0, n)  # the system prompt was prefilled, not loaded
    assert tokens == plain_tokens(folder)
    third, again = run(folder)            # and what was saved instead loads
    assert third.calls[0][0] == n and again == tokens and capsys.readouterr().err == ""


@pytest.mark.slow
@pytest.mark.parametrize("where", ["missing folder", "read-only folder"])
def test_a_cache_that_cannot_be_saved_costs_the_cache_not_the_run(folder, where, capsys):
    target = folder / "cache"
    if where == "read-only folder":
        target.mkdir()
        os.chmod(target, 0o555)
        if os.access(target, os.W_OK):
            pytest.skip("root writes to a read-only folder")
    write_config(folder, pre_computed_cache_path="cache/sys.cache")
    for _ in range(2):                    # nothing saved: both runs compute it
        model, tokens = run(folder)
        err = capsys.readouterr().err
        assert tokens == plain_tokens(folder) and model.calls[0][:2] == (0, model.SYS_PROMP_LEN)
        assert err.splitlines() == [
            f"[kv cache] warning: cannot save the system prompt's cache to {target / 'sys.cache'} "
            f"({'No such file or directory' if where == 'missing folder' else 'Permission denied'}"
            f"); going on without it"]
    assert not os.path.exists(target) or os.listdir(target) == []


@pytest.mark.slow
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


@pytest.mark.slow
def test_changed_system_prompt_recomputes_the_cache(folder):
    run(folder)
    other = "System: you answer in one short sentence.\n"
    second, tokens2 = run(folder, system=other)
    fresh = make(folder)
    ids = fresh.tokenizer.Encode(other) + fresh.tokenizer.Encode(PROMPT, add_special_tokens=False)
    plain = fresh.generate_tokens([ids], max_new_tokens=N_NEW, do_sample=False)
    assert tokens2 == plain.generated_ids[0]
    saved = json.load(open(folder / "sys.cache.header.json"))["token_ids"]
    assert saved == fresh.tokenizer.Encode(other)
    assert os.path.getsize(folder / "sys.cache") == LAYERS * 2 * len(saved) * KV_WIDTH * 2


@pytest.mark.slow
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
        model.setGenerationOptions(repetition_penalty=1.5)
        model.run(PROMPT, do_sample=False, system_prompt=SYSTEM, log_output=False)
    sys_ids = model.tokenizer.Encode(SYSTEM)
    assert seen == [sys_ids, sys_ids]
    monkeypatch.undo()

    # context ids count: penalising the tokens the model would say changes what it says
    model = make(folder)
    prompt = model.tokenizer.Encode(PROMPT)
    said = model.generate_tokens([prompt], max_new_tokens=N_NEW, do_sample=False).generated_ids[0]
    model.setGenerationOptions(repetition_penalty=5.0)
    alone = model.generate_tokens([prompt], max_new_tokens=N_NEW, do_sample=False)
    with_context = model.generate_tokens([prompt], max_new_tokens=N_NEW, do_sample=False,
                                         context_ids=said)
    assert with_context.generated_ids[0] != alone.generated_ids[0]


# --------------------------------------------------------------------- the cache's precision
HALF_FIXTURES = ["llama-hd80-bf16-sharded", "llama-f16-yarn-bias", "qwen2-gqa4", "qwen3-hd80",
                 "gemma3-softcap", "gpt2-untied-scaled", "qwen3moe-e8k2-dense", "gpt-oss-tiny"]


@pytest.mark.slow
@pytest.mark.parametrize("name", HALF_FIXTURES)
def test_a_half_checkpoint_gets_an_fp16_cache_within_its_rounding(name):
    parity.check_fp16_cache(parity.from_folder(name), parity.expected(name))


@pytest.mark.slow
@pytest.mark.parametrize("name,nntr,want", [
    ("llama-gqa3", {}, np.float32),                              # float32 weights: exact
    ("llama-hd80-bf16-sharded", {}, np.uint16),                  # BF16 kept: FP16 cache
    ("llama-hd80-bf16-sharded", {"kv_cache_dtype": "fp32"}, np.float32),
    ("llama-gqa3", {"kv_cache_dtype": "FP16"}, np.uint16),
    ("llama-gqa3", {"fc_layer_dtype": "Q4_0"}, np.uint16),       # held as Q4_0
])
def test_cache_precision_follows_the_weights_unless_set(name, nntr, want):
    model = parity.from_folder(name, **nntr)
    assert {c.key.dtype for c in model.model.getKVCaches("self")} == {np.dtype(want)}


@pytest.mark.slow
def test_weight_format_and_kv_dtype_calls_choose_the_cache():
    from causallm.factory import Factory
    for fmt, kv, want in (("Q8_0", None, np.uint16), ("FP32", None, np.float32),
                          ("Q4_0", "FP32", np.float32)):
        model = Factory.Instance().createFromFolder(FIXTURE, init_seq_len=8, num_to_generate=8)
        model.precision.setWeightFormat(fmt)
        model.precision.setKVCacheDtype(kv)
        model.initialize()
        assert model.model.getKVCaches("self")[0].key.dtype == want


def test_bad_kv_cache_dtype_is_a_one_line_error(tmp_path):
    from causallm.factory import Factory
    path = tmp_path / "llama-gqa3"
    shutil.copytree(FIXTURE, path)
    (path / "nntr_config.json").write_text(json.dumps({"kv_cache_dtype": "Q8_0"}))
    with pytest.raises(CausalLMError) as e:
        Factory.Instance().createFromFolder(str(path))
    assert str(e.value) == (f"{path / 'nntr_config.json'}: 'kv_cache_dtype' must be one of "
                            f"FP32, FP16, got 'Q8_0'")
    with pytest.raises(CausalLMError) as e:  # the same key as a keyword argument: named so
        Factory.Instance().createFromFolder(FIXTURE, kv_cache_dtype="Q8_0")
    assert str(e.value) == "kv_cache_dtype must be one of FP32, FP16, got 'Q8_0'"
    with pytest.raises(CausalLMError, match="KV cache dtype 'BF16' is not one of FP32, FP16"):
        Factory.Instance().createFromFolder(FIXTURE).precision.setKVCacheDtype("BF16")
