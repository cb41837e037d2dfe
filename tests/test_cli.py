"""The CLI (main.py) end to end, as a user runs it.

Generated ids are checked against the greedy tokens transformers produced for each committed
fixture (expected.npz); everything else checks the CLI's contract: streamed text equals the
JSON "text", the metrics block goes to stderr, sampling flags behave, and every bad input is
one ``error: ...`` line on stderr with exit status 2. Runs go through tests/cli.py's
``run_cli``: ``main.main(argv)`` in this process (much faster once the numba kernels are
loaded), a child ``python main.py ...`` only where the process is under test (signals, a
closed stdout, limits, NUMBA_CACHE_DIR, an install). Folders are edited only as copies under
``tmp_path``.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from cli import run_cli

from causallm import main
from causallm.io.config import load_model_configs
from causallm.io.safetensors import SafetensorsFile, write_safetensors
from causallm.tokenizer import Tokenizer
from causallm.models.causal_lm import CausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
LLAMA_FIXTURES = ["llama-gqa3", "llama-hd80-bf16-sharded", "llama-f16-yarn-bias"]
DEFAULT_MODEL = os.path.join(ROOT, "res", "tiny-llama")
GQA3 = os.path.join(FIXTURES, "llama-gqa3")
METRICS = [r"^prefill: \d+ tokens, \d+ ms, (?:[\d.]+|inf) TPS$",
           r"^generation: \d+ tokens, \d+ ms, (?:[\d.]+|inf) TPS$",
           r"^peak memory: \d+ KB$"]


def expected(name="llama-gqa3"):
    ref = np.load(os.path.join(FIXTURES, name, "expected.npz"))
    return str(ref["prompt"]), ref["prompt_ids"].tolist(), ref["tokens"].tolist()


def run_main(capsys, *args):
    """``main.main(args)`` in this process and its working directory (tests/cli.py) -> (exit
    status, stdout, stderr)."""
    p = run_cli(*args, cwd=None)
    return p.returncode, p.stdout, p.stderr


def split_json(out):
    """stdout = streamed text + "\\n" + one JSON line + "\\n" -> (streamed text, record)."""
    assert out.endswith("\n")
    body, line = out[:-1].rsplit("\n", 1)
    return body, json.loads(line)


def assert_metrics(err):
    lines = err.splitlines()
    for pattern in METRICS:
        assert any(re.match(pattern, line) for line in lines), f"no line like {pattern}: {err!r}"


def copy_fixture(tmp_path, name="llama-gqa3", as_name="model"):
    dst = tmp_path / as_name
    shutil.copytree(os.path.join(FIXTURES, name), dst)
    os.remove(dst / "expected.npz")
    return dst


def edit_json(path, **changes):
    """Set (value) or delete (value None) keys of a JSON file."""
    data = json.loads(path.read_text()) if path.exists() else {}
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def greedy(capsys, folder, prompt, *args):
    rc, out, err = run_main(capsys, folder, prompt, "--greedy", "--json", *args)
    assert rc == 0, err
    return split_json(out)[1]


# ----------------------------------------------------------------------------------- parity

@pytest.mark.slow
@pytest.mark.parametrize("name", LLAMA_FIXTURES)
def test_greedy_cli_gives_transformers_tokens(name):
    prompt, prompt_ids, tokens = expected(name)
    extra = ["-t", "1"] if name == "llama-hd80-bf16-sharded" else []
    p = run_cli(os.path.join(FIXTURES, name), prompt, "--greedy", "-n", 32, "--json", *extra)
    assert p.returncode == 0, p.stderr
    text, record = split_json(p.stdout)
    assert record["architecture"] == "LlamaForCausalLM"
    assert record["prompt_ids"] == prompt_ids
    assert record["generated_ids"] == tokens[:32]
    assert text == record["text"]  # what streamed is the final text
    assert record["finish_reason"] == "length" and record["do_sample"] is False
    metric_keys = {"tokens", "ms", "tps"}  # present; their values are never asserted on
    for part in ("prefill", "generation"):
        assert set(record[part]) >= metric_keys
    assert record["prefill"]["tokens"] == len(prompt_ids)
    assert record["generation"]["tokens"] == 31  # the first token comes out of the prefill
    assert isinstance(record["peak_memory_kb"], int) and record["peak_memory_kb"] > 0
    assert_metrics(p.stderr)
    assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_no_arguments_runs_the_embedded_model():
    """``python main.py``: res/tiny-llama on its sample_input, greedy with its repetition
    penalty, prints what transformers generates (tools/fixtures_default_model.py)."""
    with open(os.path.join(FIXTURES, "tiny-llama-default.json")) as f:
        ref = json.load(f)
    p = run_cli()
    assert p.returncode == 0, p.stderr
    assert p.stdout == ref["text"] + "\n"
    assert_metrics(p.stderr)


@pytest.mark.slow
def test_a_first_compile_is_announced_and_a_cached_run_is_quiet(tmp_path):
    """An empty numba cache (a fresh machine): stderr says kernels are being compiled, where
    they are kept, then how many and how long; the next run loads them and says nothing."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    runs = [run_cli(GQA3, "hi", "-n", "2", env=env, process=True) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    first = runs[0].stderr.splitlines()
    assert first[0].startswith("[numba] compiling kernels for this CPU (once: they are cached "
                               f"in {tmp_path / 'numba'}"), first
    assert re.fullmatch(r"\[numba\] compiled \d+ kernel\(s\) in \d+\.\d s", first[1]), first
    assert "[numba]" not in runs[1].stderr
    assert any(f.endswith(".nbi") for _, _, fs in os.walk(tmp_path / "numba") for f in fs)


# ------------------------------------------------------------------------- generation options

def test_text_streams_to_stdout_and_metrics_to_stderr(capsys):
    prompt = expected()[0]
    rc, out, err = run_main(capsys, GQA3, prompt, "--greedy", "-n", 6)
    assert rc == 0
    record = greedy(capsys, GQA3, prompt, "-n", 6)
    assert out == record["text"] + "\n"  # without --json stdout is the text alone
    assert "prefill:" not in out
    assert_metrics(err)


def test_n_limits_new_tokens(capsys):
    prompt, _, tokens = expected()
    record = greedy(capsys, GQA3, prompt, "-n", 5)
    assert record["generated_ids"] == tokens[:5]
    assert record["finish_reason"] == "length"


@pytest.mark.slow
def test_sampling_seed_temp0_and_top_k1(capsys):
    prompt, _, tokens = expected()

    def ids(*args):
        rc, out, err = run_main(capsys, GQA3, prompt, "-n", 12, "--json", *args)
        assert rc == 0, err
        return split_json(out)[1]

    sampled = ids("--temp", 1.0, "--seed", 7)
    assert sampled["do_sample"] is True
    assert ids("--temp", 1.0, "--seed", 7)["generated_ids"] == sampled["generated_ids"]
    assert ids("--temp", 1.0, "--seed", 8)["generated_ids"] != sampled["generated_ids"]
    assert ids("--temp", 1.0, "--seed", 7, "--greedy")["generated_ids"] == tokens[:12]
    assert ids("--temp", 0)["generated_ids"] == tokens[:12]
    assert ids("--top-k", 1, "--seed", 3)["generated_ids"] == tokens[:12]
    assert ids("-s", 7, "--temp", 1.0)["generated_ids"] == sampled["generated_ids"]


@pytest.mark.parametrize("as_list", [False, True])
def test_eos_stops_early_and_is_not_printed(capsys, tmp_path, as_list):
    prompt, _, tokens = expected()
    k = next(i for i in range(2, len(tokens)) if tokens[i] not in tokens[:i])
    folder = copy_fixture(tmp_path)
    edit_json(folder / "generation_config.json",
              eos_token_id=[4002, tokens[k]] if as_list else tokens[k])
    rc, out, err = run_main(capsys, folder, prompt, "--greedy", "-n", 32, "--json")
    assert rc == 0, err
    text, record = split_json(out)
    assert record["generated_ids"] == tokens[:k + 1]  # the EOS id is recorded ...
    assert record["finish_reason"] == "eos"
    before_eos = greedy(capsys, GQA3, prompt, "-n", k)["text"]
    assert text == record["text"] == before_eos  # ... but its text is not printed
    eos_text = Tokenizer.FromFile(str(folder / "tokenizer.json")).Decode([tokens[k]])
    assert not text.endswith(eos_text)


def test_nntr_config_settings_and_sample_input(capsys, tmp_path, monkeypatch):
    prompt, prompt_ids, tokens = expected()
    folder = copy_fixture(tmp_path)
    (folder / "tok").mkdir()
    os.rename(folder / "tokenizer.json", folder / "tok" / "tokenizer.json")
    edit_json(folder / "nntr_config.json", init_seq_len=64, num_to_generate=8,
              sample_input=prompt, tokenizer_file="tok/tokenizer.json", bad_word_ids=[tokens[0]])
    monkeypatch.chdir(tmp_path)  # paths resolve against the folder, not the working directory
    rc, out, err = run_main(capsys, folder, "--greedy", "--json")
    assert rc == 0, err
    text, record = split_json(out)
    assert record["prompt"] == prompt and record["prompt_ids"] == prompt_ids
    assert len(record["generated_ids"]) == 8  # num_to_generate
    assert tokens[0] not in record["generated_ids"]  # bad word, though it is the greedy choice
    assert text == record["text"]


def test_prompt_longer_than_init_seq_len_is_prefilled_in_chunks(capsys, tmp_path):
    prompt, prompt_ids, tokens = expected()
    folder = copy_fixture(tmp_path)
    edit_json(folder / "nntr_config.json", init_seq_len=8, num_to_generate=32, max_seq_len=40)
    P = len(prompt_ids)
    assert P > 8
    record = greedy(capsys, folder, prompt)
    # the context (max_seq_len) is 40 positions: the prompt's 19 and 21 more, which give 22 new
    # tokens (the last one is not fed back)
    assert record["generated_ids"] == tokens[:40 - P + 1]
    assert record["finish_reason"] == "cache_full"


def test_nntrainer_bin_weights_from_model_file_name(capsys, tmp_path):
    prompt, _, tokens = expected()
    folder = copy_fixture(tmp_path)
    cfg, gen, nntr = load_model_configs(str(folder))
    model = CausalLM(cfg, gen, nntr)
    model.initialize()
    model.load_weight(str(folder))
    model.save_weight(str(folder / "weights.bin"))
    del model
    os.remove(folder / "model.safetensors")
    edit_json(folder / "nntr_config.json", model_file_name="weights.bin")
    assert greedy(capsys, folder, prompt, "-n", 8)["generated_ids"] == tokens[:8]


@pytest.mark.slow
def test_cache_full_is_said_on_stderr_with_the_setting_to_raise(capsys, tmp_path):
    prompt, prompt_ids, _ = expected()
    folder = copy_fixture(tmp_path)
    edit_json(folder / "nntr_config.json", init_seq_len=8, num_to_generate=32, max_seq_len=40)
    rc, out, err = run_main(capsys, folder, prompt, "--greedy")
    assert rc == 0, err
    n = 40 - len(prompt_ids) + 1  # as in the chunked-prefill test above
    notes = [line for line in err.splitlines() if line.startswith("[cache full]")]
    assert notes == [f"[cache full] stopped after {n} of 32 new tokens: the KV cache is full at "
                     f"40 positions (the context, from max_seq_len in "
                     f"{folder / 'nntr_config.json'}), shared by the prompt and the new tokens; "
                     f"a longer context: -c (ctx_size, max_seq_len)"]
    rc, out, err = run_main(capsys, folder, prompt, "--greedy", "-n", 30, "-c", 32)
    assert "[cache full] stopped after 14 of 30 new tokens: the KV cache is full at 32 " \
        "positions (the context, from -c)" in err
    rc, out, err = run_main(capsys, GQA3, prompt, "--greedy", "-n", 8)
    assert rc == 0 and "[cache full]" not in err  # the prompt fits the context: all 8 come
    gpt2 = os.path.join(FIXTURES, "gpt2-tied")  # GPT-2: its learned positions end first
    rc, out, err = run_main(capsys, gpt2, "hello there " * 20, "--greedy", "-n", 100, "--json")
    record = split_json(out)[1]
    n = len(record["generated_ids"])
    assert record["finish_reason"] == "cache_full" and n == 128 - len(record["prompt_ids"]) + 1
    assert f"[cache full] stopped after {n} of 100 new tokens: the model has n_positions = 128 " \
        f"learned positions ({os.path.join(gpt2, 'config.json')}), prompt and new tokens " \
        f"together" in err.splitlines()


def test_system_prompt_is_prepended(capsys):
    """Without --chat, --system is a line of its own before the prompt: a newline joins them
    unless the text already ends with white space (a head_prompt of nntr_config.json is joined
    as it is, as in the C++)."""
    system, prompt = "You are a careful assistant. ", "The assert statement"
    tokenizer = Tokenizer.FromFile(os.path.join(GQA3, "tokenizer.json"))
    record = greedy(capsys, GQA3, prompt, "-n", 2, "--system", system)
    assert record["prompt_ids"] == tokenizer.Encode(system + prompt)
    assert record["prompt_ids"] != tokenizer.Encode(prompt)
    record = greedy(capsys, GQA3, prompt, "-n", 2, "--system", system.strip())
    assert record["prompt_ids"] == tokenizer.Encode(system.strip() + "\n" + prompt)


@pytest.mark.slow
def test_the_prompt_taken_from_the_folder_is_shown(capsys):
    """No PROMPT: the text the output continues (nntr_config's sample_input) is one stderr line
    before it; stdout stays the generated text alone. A given prompt is not repeated."""
    with open(os.path.join(DEFAULT_MODEL, "nntr_config.json")) as f:
        sample_input = json.load(f)["sample_input"]
    rc, out, err = run_main(capsys, DEFAULT_MODEL, "-n", 2)
    assert rc == 0, err
    shown = f"[prompt: sample_input of {os.path.relpath(DEFAULT_MODEL)}/nntr_config.json] " \
        f"{sample_input}"
    assert err.splitlines()[0] == shown and shown not in out
    rc, out, err = run_main(capsys, DEFAULT_MODEL, sample_input, "-n", 2)
    assert rc == 0 and "[prompt" not in err


def test_version_and_help_mention_what_there_is(capsys):
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    for argv, where in ((["--version"], "out"), (["--help"], "out")):
        with pytest.raises(SystemExit) as e:
            main.main(argv)
        assert e.value.code == 0
        out = capsys.readouterr().out
        if argv == ["--version"]:
            assert out == f"causallm {version}\n"
        else:
            assert "causallm serve MODEL_DIR" in out and "--version" in out


@pytest.mark.slow
def test_threads_above_what_numba_runs_are_one_warning(capsys, tmp_path):
    """-t above NUMBA_NUM_THREADS runs with that many and says so, in main.py and serve."""
    import numba

    most = numba.config.NUMBA_NUM_THREADS
    warning = (f"warning: -t 1000: at most {most} threads here (NUMBA_NUM_THREADS, every core "
               f"by default); using {most}")
    rc, out, err = run_main(capsys, GQA3, "hi", "-n", 1, "-t", 1000)
    assert rc == 0 and err.splitlines()[0] == warning, err
    rc, out, err = run_main(capsys, "serve", tmp_path / "none", "-t", 1000)
    assert rc == 2 and err.splitlines()[0] == warning, err
    assert err.splitlines()[1].startswith("error: ") and len(err.splitlines()) == 2


@pytest.mark.parametrize("argv,message", [
    (["--model-name", ""], "--model-name needs a non-empty name"),
    (["--model-name", "m\udce9"], "--model-name is not valid UTF-8: byte 0xe9 at offset 1"),
    (["--host", "\udcff"], "--host is not valid UTF-8: byte 0xff at offset 0"),
    (["--port", "70000"], "--port must be in [0, 65535]"),
    (["-np", "0"], "--parallel must be at least 1"),
    (["--queue", "-1"], "--queue must be at least 0"),
    (["-t", "0"], "-t must be an integer >= 1, got 0"),
    (["-n", "0"], "-n must be an integer >= 1, got 0"),
    (["--dtype", "Q9"], "argument --dtype: invalid choice: 'Q9'"),
])
def test_serve_refuses_a_bad_option_in_one_line(capsys, tmp_path, argv, message):
    """Refused before anything loads (a folder that is not there is never looked at)."""
    try:
        rc = main.main(["serve", str(tmp_path / "none"), *argv])
    except SystemExit as e:  # argparse's errors
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


@pytest.mark.slow
def test_max_length_of_generation_config_caps_the_new_tokens_as_transformers(capsys, tmp_path):
    """generation_config.json's max_length (prompt and new tokens together) binds when nothing
    sets the new tokens' number, as in transformers: the Marian folder's beam search with
    max_length 25 is transformers' with max_new_tokens 24 (beams-marian.json, its forced EOS
    at the last position); a decoder-only run stops after max_length - P tokens (transformers'
    greedy tokens). -n (max_new_tokens in transformers) overrides it. No warning says it is
    not applied."""
    with open(os.path.join(FIXTURES, "beams-marian.json")) as f:
        case = next(c for c in json.load(f) if c["name"] == "beam4-defaults")
    marian = copy_fixture(tmp_path, case["folder"], "marian")
    edit_json(marian / "generation_config.json", max_length=1 + 24)
    prompt = str(np.load(os.path.join(FIXTURES, case["folder"], "expected.npz"))["prompt"])
    rc, out, err = run_main(capsys, marian, prompt, "--json")
    assert rc == 0 and "max_length" not in err, err
    record = split_json(out)[1]
    assert record["prompt_ids"] == case["prompt_ids"]
    assert record["generated_ids"] == case["sequences"][0]

    prompt, prompt_ids, tokens = expected()
    folder = copy_fixture(tmp_path)
    edit_json(folder / "generation_config.json", max_new_tokens=None,
              max_length=len(prompt_ids) + 5)
    rc, out, err = run_main(capsys, folder, prompt, "--greedy", "--json")
    assert rc == 0 and "max_length" not in err, err
    record = split_json(out)[1]
    assert record["generated_ids"] == tokens[:5] and record["finish_reason"] == "length"
    assert greedy(capsys, folder, prompt, "-n", 8)["generated_ids"] == tokens[:8]
    import causallm  # the Python API's requests (the server's) follow the same rule

    model = causallm.load(str(folder))
    one, = model.complete_many([prompt], greedy=True)
    assert (one.completion_tokens, one.finish_reason) == (5, "length")
    one, = model.complete_many([prompt], greedy=True, max_new_tokens=8)
    assert one.completion_tokens == 8


# ------------------------------------------------------------------------------- bad inputs

def _config(folder, **changes):
    edit_json(folder / "config.json", **changes)


def _rewrite_safetensors(folder, drop=(), add=None, change=None):
    path = str(folder / "model.safetensors")
    f = SafetensorsFile(path)
    tensors = {k: np.array(f.get(k)) for k in f.keys() if k not in drop}
    del f
    tensors.update(add or {})
    tensors.update(change or {})
    write_safetensors(path, tensors)


def _truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


UP1 = "model.layers.1.mlp.up_proj.weight"

# name -> (prepare(folder) or None, argv after the folder, substrings the error line must name)
BAD_INPUTS = {
    "missing folder": (None, ["hi"], ["no-such-folder", "no such directory"]),
    "no config.json": (lambda d: os.remove(d / "config.json"), ["hi"], ["config.json"]),
    "invalid JSON": (lambda d: (d / "config.json").write_text("{bad"), ["hi"],
                     ["config.json", "invalid JSON"]),
    "config not UTF-8": (lambda d: (d / "generation_config.json").write_bytes(b'{"a": "\xe9"}'),
                         ["hi"], ["generation_config.json is not valid UTF-8: byte 0xe9 at "
                                  "offset 7"]),
    "no architectures": (lambda d: _config(d, architectures=None), ["hi"],
                         ["config.json", "architectures"]),
    "unknown architecture": (lambda d: _config(d, architectures=["FooForCausalLM"]), ["hi"],
                             ["config.json", "FooForCausalLM", "LlamaForCausalLM"]),
    "missing hidden_size": (lambda d: _config(d, hidden_size=None), ["hi"],
                            ["config.json", "hidden_size"]),
    "bad value type": (lambda d: _config(d, num_hidden_layers="three"), ["hi"],
                       ["config.json", "num_hidden_layers", "integer"]),
    "prompt longer than the cache": (
        lambda d: edit_json(d / "nntr_config.json", init_seq_len=4, num_to_generate=4,
                            max_seq_len=8),
        [expected()[0]], ["19", "8", "max_seq_len", "-c"]),
    "prompt longer than -c": (None, [expected()[0], "-c", "8", "-n", "4"],
                              ["19", "holds 8", "from -c"]),
    "truncated safetensors": (lambda d: _truncate(d / "model.safetensors", 5000), ["hi"],
                              ["model.safetensors"]),
    "extra and missing tensor": (
        lambda d: _rewrite_safetensors(d, drop=[UP1], add={"model.extra.weight": np.ones(2)}),
        ["hi"], ["model.extra.weight", UP1]),
    "wrong tensor shape": (
        lambda d: _rewrite_safetensors(d, change={UP1: np.ones((160, 50), np.float32)}),
        ["hi"], ["model.safetensors", UP1, "(160, 50)"]),
    "missing tokenizer.json": (lambda d: os.remove(d / "tokenizer.json"), ["hi"],
                               ["tokenizer.json"]),
    "missing model_file_name": (
        lambda d: edit_json(d / "nntr_config.json", model_file_name="nope.bin"), ["hi"],
        ["nntr_config.json", "model_file_name", "nope.bin"]),
    "bin of the wrong size": (
        lambda d: ((d / "w.bin").write_bytes(b"\0" * 1234),
                   edit_json(d / "nntr_config.json", model_file_name="w.bin")),
        ["hi"], ["w.bin", "1234"]),
    "bad nntr_config value": (lambda d: edit_json(d / "nntr_config.json", init_seq_len="64"),
                              ["hi"], ["nntr_config.json", "init_seq_len"]),
    "bad word out of vocabulary": (
        lambda d: edit_json(d / "nntr_config.json", bad_word_ids=[99999]), ["hi"],
        ["bad_word_ids", "99999"]),
    "no prompt and no sample_input": (None, [], ["sample_input"]),
    "-n 0": (None, ["hi", "-n", "0"], ["-n"]),
    "--top-p 2": (None, ["hi", "--top-p", "2"], ["--top-p"]),
    "--temp nan": (None, ["hi", "--temp", "nan"], ["--temp"]),
    "--seed -1": (None, ["hi", "--seed", "-1"], ["--seed"]),
    "not an int": (None, ["hi", "--top-k", "abc"], ["--top-k", "abc"]),
    "unknown option": (None, ["hi", "--bogus"], ["--bogus"]),
    "--num-beams 0": (None, ["hi", "--num-beams", "0"], ["--num-beams"]),
    "more beams than tokens": (None, ["hi", "--num-beams", "1000000"],
                               ["--num-beams must be", "vocabulary", "1000000"]),
    "more sequences than beams": (None, ["hi", "--num-beams", "2", "--num-return-sequences", "3"],
                                  ["--num-return-sequences 3 exceeds --num-beams 2"]),
    "--greedy with beams": (None, ["hi", "--greedy", "--num-beams", "3"], ["--greedy"]),
    "beam sampling": (None, ["hi", "--num-beams", "2", "--temp", "0.7"], ["beam sampling"]),
    "-n beyond the context": (None, ["hi", "-n", "300"],
                              ["-n 300 is more than the context: 256 positions",
                               "max_position_embeddings in config.json", "-c"]),
    "-n beyond -c": (None, ["hi", "-n", "5000000000", "-c", "64"],
                     ["-n 5000000000", "64 positions (-c)"]),
    "-c 0": (None, ["hi", "-c", "0"], ["-c must be an integer >= 1, got 0"]),
    "-c beyond what the cache can index": (None, ["hi", "-c", "5000000000"],
                                           ["-c (max_seq_len)", "5000000000"]),
    "-c beyond the memory": (None, ["hi", "-c", str(2**31)],
                             ["not enough memory", "context of 2147483648 positions (-c)",
                              "GiB", "available"]),
    "architectures a string": (lambda d: _config(d, architectures="LlamaForCausalLM"), ["hi"],
                               ["config.json", "'architectures' must be a list",
                                "'LlamaForCausalLM'"]),
    "bad model_tensor_type": (
        lambda d: edit_json(d / "nntr_config.json", model_tensor_type="FP99-FP32"), ["hi"],
        ["nntr_config.json", "'model_tensor_type' must be one of", "'FP99-FP32'"]),
    "sys_prompt_token_size beyond the cache (first run)": (
        lambda d: edit_json(d / "nntr_config.json", init_seq_len=16, num_to_generate=8,
                            max_seq_len=24, system_prompt={"head_prompt": "Be brief. ", "kvcache": {
                                "pre_computed_cache_path": "sys.cache",
                                "sys_prompt_token_size": 100}}),
        ["hi"], ["nntr_config.json", "system_prompt.kvcache.sys_prompt_token_size",
                 "at most the KV cache's 24 positions", "100"]),
    "system prompt cache path is a folder": (
        lambda d: ((d / "cache").mkdir(),
                   edit_json(d / "nntr_config.json", system_prompt={
                       "head_prompt": "Be brief. ",
                       "kvcache": {"pre_computed_cache_path": "cache"}})),
        ["hi"], ["nntr_config.json", "system_prompt.kvcache.pre_computed_cache_path",
                 "not a folder"]),
    "num_beams in generation_config": (
        lambda d: edit_json(d / "generation_config.json", num_beams=0), ["hi"],
        ["generation_config.json", "num_beams"]),
    "--stop not UTF-8": (None, ["hi", "--stop", "ok\udcff"],  # argv byte 0xff (surrogateescape)
                         ["--stop is not valid UTF-8: byte 0xff at offset 2"]),
    "model.safetensors a folder": (
        lambda d: (os.remove(d / "model.safetensors"), (d / "model.safetensors").mkdir()),
        ["hi"], ["model.safetensors: cannot read (Is a directory)"]),
    "prompt longer than generation_config's max_length": (
        lambda d: edit_json(d / "generation_config.json", max_new_tokens=None, max_length=5),
        [expected()[0]],
        ["the prompt has 19 tokens", "max_length", "is 5"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_error_line(capsys, tmp_path, case):
    prepare, argv, names = BAD_INPUTS[case]
    if case == "missing folder":
        folder = tmp_path / "no-such-folder"
    else:
        folder = copy_fixture(tmp_path)
        if prepare is not None:
            prepare(folder)
    try:
        rc, out, err = run_main(capsys, folder, *argv)
    except SystemExit as e:  # argparse errors leave through sys.exit
        rc, (out, err) = e.code, capsys.readouterr()
    assert rc == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for name in names:
        assert name in lines[0], f"{name!r} not named in {lines[0]!r}"


NO_DAC = ("setpriv", "--inh-caps=-dac_override,-dac_read_search",
          "--bounding-set=-dac_override,-dac_read_search")
"""Runs a command as root without the capabilities that let root ignore file permissions,
so a file or folder without read (or write) permission is refused to it as to any user."""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv (the permission checks of an ordinary user)")
def test_unreadable_files_and_folders_are_named_errors(tmp_path):
    """A weight file, shard, GGUF or model folder the user may not read, and a --graph file in
    a folder they may not write: one line naming the user's path, status 2."""
    def run(*args):
        p = subprocess.run([*NO_DAC, sys.executable, "main.py", *map(str, args)], cwd=ROOT,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        assert p.returncode == 2 and p.stdout == "", p.stderr
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
        return p.stderr

    folder = copy_fixture(tmp_path)
    os.chmod(folder / "model.safetensors", 0)
    assert run(folder, "hi") == \
        f"error: {folder / 'model.safetensors'}: cannot read (Permission denied)\n"
    os.chmod(folder, 0)
    assert run(folder, "hi") == f"error: {folder}: cannot read the folder (Permission denied)\n"
    sharded = copy_fixture(tmp_path, "llama-hd80-bf16-sharded", "sharded")
    shard = sharded / "model-00002-of-00002.safetensors"
    os.chmod(shard, 0)
    assert run(sharded, "hi") == f"error: {shard}: cannot read (Permission denied)\n"
    os.chmod(shard, 0o644)
    os.chmod(sharded / "model.safetensors.index.json", 0)
    assert run(sharded, "hi") == \
        f"error: {sharded / 'model.safetensors.index.json'}: cannot read (Permission denied)\n"
    gguf = tmp_path / "model.gguf"
    shutil.copy(os.path.join(FIXTURES, "gguf-llama-q8_0", "model.gguf"), gguf)
    os.chmod(gguf, 0)
    assert run(gguf, "hi") == f"error: {gguf}: not a readable GGUF file (Permission denied)\n"
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o555)
    assert run(GQA3, "--graph", read_only / "g.dot") == \
        f"error: --graph {read_only / 'g.dot'}: cannot write it (Permission denied)\n"
    assert os.listdir(read_only) == []


def test_graph_onto_a_folder_names_the_path_given(capsys, tmp_path):
    (tmp_path / "g.dot").mkdir()
    rc, out, err = run_main(capsys, GQA3, "--graph", tmp_path / "g.dot")
    assert (rc, out) == (2, "")
    assert err == f"error: --graph {tmp_path / 'g.dot'}: cannot write it (Is a directory)\n"
    assert os.listdir(tmp_path) == ["g.dot"] and os.listdir(tmp_path / "g.dot") == []


@pytest.mark.slow
def test_error_through_subprocess_and_debug_traceback(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    p = run_cli(folder, "hi", process=True)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == f"error: {folder / 'config.json'}: file not found\n"
    p = run_cli(folder, "hi", "--debug", process=True)
    assert p.returncode != 0
    assert "Traceback (most recent call last)" in p.stderr and "config.json" in p.stderr


@pytest.mark.slow
def test_out_of_memory_names_the_flag_that_set_the_context(capsys, monkeypatch):
    from causallm.runtime.graph import Model

    def no_memory(self, mode=None):
        raise MemoryError("Unable to allocate 59.6 GiB")
    monkeypatch.setattr(Model, "initialize", no_memory)
    rc, out, err = run_main(capsys, GQA3, "hi", "-c", 100000)
    assert rc == 2 and out == ""
    assert err.startswith("error: not enough memory for the KV caches and buffers of 1 "
                          "sequence(s), a context of 100000 positions (-c) and a step of "
                          "init_seq_len "), err
    assert len(err.splitlines()) == 1


def _limited_run(*args, limit=3 << 30):
    """main.py under RLIMIT_AS ``limit`` bytes of address space: (CompletedProcess, the
    child's peak RSS in KiB, its VmHWM written last on stderr). Not getrusage's ru_maxrss:
    Linux carries that over exec from the process that spawned the child, so a test worker
    that had compiled many kernels read as the child's peak."""
    code = ("import resource, runpy, sys, os\n"
            f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))\n"
            "sys.argv = ['main.py', *sys.argv[1:]]\n"
            "try:\n"
            "    runpy.run_path('main.py', run_name='__main__')\n"
            "finally:\n"
            "    hwm = next(line.split()[1] for line in open('/proc/self/status')\n"
            "               if line.startswith('VmHWM:'))\n"
            "    sys.stderr.write(f'[rss {hwm}]\\n')\n")
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=ROOT,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    lines = p.stderr.splitlines()
    rss = int(lines[-1][len("[rss "):-1])
    p.stderr = "".join(line + "\n" for line in lines[:-1])
    return p, rss


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["-n", "-c"])
def test_huge_n_or_context_is_refused_before_anything_is_allocated(flag):
    """-n 20000000 used to size the KV caches and RoPE tables (12.6 GB before an error): the
    context (-c, default the model's own at most 4096) sizes them, -n beyond it is refused,
    and a context whose caches exceed the memory (here the address space a ulimit leaves) is
    refused with the bytes, all before the graph is built."""
    p, rss = _limited_run(GQA3, "hi", flag, 20000000)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    line, = p.stderr.splitlines()
    if flag == "-n":
        assert line.startswith("error: -n 20000000 is more than the context: 256 positions")
    else:
        assert line.startswith("error: not enough memory for a context of 20000000 positions "
                               "(-c): ") and "available" in line
    assert rss < 1 << 20, rss  # KiB: well under a GiB (the imports take about 150 MB)


def test_options_may_come_before_between_and_after_the_arguments():
    prompt, _, tokens = expected()
    p = run_cli("--json", GQA3, "--greedy", prompt, "-n", 6)
    assert p.returncode == 0, p.stderr
    assert split_json(p.stdout)[1]["generated_ids"] == tokens[:6]


@pytest.mark.slow
def test_prompt_from_stdin():
    """'-' as PROMPT reads stdin, as does no PROMPT when stdin is a pipe; trailing newlines go,
    as in the shell's $(...). A stdin that is not a pipe or a file (here /dev/null) leaves the
    default, nntr_config's sample_input."""
    prompt, prompt_ids, tokens = expected()
    for args in ([GQA3, "-"], [GQA3]):
        p = run_cli(*args, "--greedy", "-n", 4, "--json", input=prompt + "\n")
        assert p.returncode == 0, p.stderr
        record = split_json(p.stdout)[1]
        assert record["prompt"] == prompt and record["prompt_ids"] == prompt_ids
        assert record["generated_ids"] == tokens[:4]
    with open(os.path.join(DEFAULT_MODEL, "nntr_config.json")) as f:
        sample_input = json.load(f)["sample_input"]
    p = run_cli("-", "-n", 1, "--json", input="Strings are")  # '-' alone: the default model
    assert p.returncode == 0, p.stderr
    assert split_json(p.stdout)[1]["prompt"] == "Strings are"
    p = run_cli("-n", 1, "--json")  # stdin /dev/null
    assert p.returncode == 0, p.stderr
    assert split_json(p.stdout)[1]["prompt"] == sample_input


def test_prompt_that_is_not_utf8_is_one_line_naming_the_byte():
    def run(args, stdin_bytes=None):
        return run_cli(GQA3, *args, input=stdin_bytes, text=False)
    p = run([b"caf\xe9 au lait", "-n", "1"])  # Latin-1 bytes in argv
    assert (p.returncode, p.stdout) == (2, b"")
    assert p.stderr == b"error: PROMPT is not valid UTF-8: byte 0xe9 at offset 3\n"
    p = run(["--system", b"\xff", "hi", "-n", "1"])
    assert p.returncode == 2
    assert p.stderr == b"error: --system is not valid UTF-8: byte 0xff at offset 0\n"
    p = run(["-n", "1"], "naïve".encode() + b" \xc3(")  # a lead byte without its follower
    assert (p.returncode, p.stdout) == (2, b"")
    assert p.stderr == (b"error: the prompt read from stdin is not valid UTF-8: byte 0xc3 at "
                        b"offset 7\n")


@pytest.mark.slow
def test_closed_stdout_exits_141_quietly():
    prompt = expected()[0]
    argv = [sys.executable, "main.py", GQA3, prompt, "-n", 32]
    p = subprocess.Popen(list(map(str, argv)), cwd=ROOT, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the first token (`| head -c0`)
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err and "error" not in err
    p = subprocess.run(list(map(str, argv)), cwd=ROOT, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=300, preexec_fn=lambda: os.close(1))
    assert (p.returncode, p.stderr) == (141, b"")  # started with stdout closed (`>&-`)


# SIGINT the moment a module is first imported: at start-up (the engine, numba, the tokenizer)
# and while loading the weights
INTERRUPT_AT = """import os, runpy, signal, sys
module, sys.argv = sys.argv[1], sys.argv[2:]
class Hook:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, Hook())
runpy.run_path("main.py", run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.parametrize("module", ["causallm", "numba", "tokenizers", "causallm.io.safetensors"])
def test_interrupt_during_start_up_exits_130_quietly(module):
    p = subprocess.run([sys.executable, "-c", INTERRUPT_AT, module, "main.py", GQA3, "hi"],
                       cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 130, p.stderr
    assert p.stderr.strip() == "interrupted" and p.stdout == ""


def test_prompt_without_folder_points_to_the_default_model(capsys):
    rc, out, err = run_main(capsys, "Tell me a story")
    assert rc == 2
    assert err.startswith("error: Tell me a story: not a model folder") and "tiny-llama" in err


@pytest.mark.slow
def test_installed_copy_runs_with_only_the_causallm_name(tmp_path):
    """A regular (non-editable) install: the wheel holds one top-level package, ``causallm``,
    with the application's modules and the embedded model inside it; its console script's
    entry point runs that model from any directory, and no generic name (main, factory,
    models, layers) is importable from it; the prebuilt kernels are in it."""
    target = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", "--no-cache-dir", "--target", str(target), ROOT],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    top = {n for n in os.listdir(target) if not n.endswith(".dist-info") and n != "bin"}
    assert top == {"causallm"}
    for name in ("main.py", "factory.py", "models/causal_lm.py", "layers/rms_norm.py",
                 "res/tiny-llama/config.json", "res/tiny-llama/model.safetensors"):
        assert os.path.isfile(target / "causallm" / name), name
    prebuilt = os.path.join("causallm", "kernels", "prebuilt")
    shipped = {os.path.relpath(os.path.join(d, f), ROOT)
               for d, _, fs in os.walk(os.path.join(ROOT, prebuilt)) for f in fs}
    assert shipped and all(os.path.isfile(target / name) for name in shipped)
    entry = (next(target.glob("causallm-*.dist-info")) / "entry_points.txt").read_text()
    assert "causallm = causallm.main:main" in entry
    env = {**os.environ, "PYTHONPATH": str(target)}
    script = ("import sys, causallm\n"
              f"assert list(causallm.__path__) == [{str(target / 'causallm')!r}]\n"
              "from causallm.main import DEFAULT_MODEL_DIR, main\n"
              "sys.exit(main([DEFAULT_MODEL_DIR, 'Strings are', '-n', '6', '--greedy', "
              "'--json']))\n")
    p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    record = json.loads(p.stdout.splitlines()[-1])
    assert record["model_dir"] == str(target / "causallm" / "res" / "tiny-llama")
    assert record["generated_ids"] == [1082, 308, 256, 1517, 290, 664]



def test_dtype_choices_are_every_weight_format():
    """--dtype's literal choices (no kernel imported to parse the command line) are the formats
    the models hold weights in."""
    from causallm.io.weights import WEIGHT_FORMATS
    assert tuple(main.WEIGHT_FORMATS) == WEIGHT_FORMATS


def test_a_link_to_nothing_is_named_as_such(capsys, tmp_path):
    """A symbolic link whose target is missing, or a loop of links, where a tokenizer or an
    optional config should be: an error saying so, not "not found" alone, and not an optional
    file silently skipped."""
    folder = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL, folder)
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to("loop")
    (folder / "loop").symlink_to("tokenizer.json")
    rc, out, err = run_main(capsys, folder, "hi", "-n", "2")
    assert (rc, out) == (2, "")
    assert err.endswith(f"{folder / 'tokenizer.json'}: tokenizer file not found (a symbolic "
                        f"link to nothing: its target is missing, or the links loop)\n"), err
    shutil.copy(os.path.join(DEFAULT_MODEL, "tokenizer.json"), folder / "real.json")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to("real.json")
    (folder / "generation_config.json").unlink()
    (folder / "generation_config.json").symlink_to("gone.json")
    rc, out, err = run_main(capsys, folder, "hi", "-n", "2")
    assert (rc, out) == (2, "")
    assert err == (f"error: {folder / 'generation_config.json'}: file not found (a symbolic "
                   f"link to nothing: its target is missing, or the links loop)\n")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_onto_a_full_disk_is_one_line():
    """stdout on a full disk: one line saying the output could not be written, status 1."""
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), DEFAULT_MODEL, "hi",
                            "-n", "3"], stdout=full, stderr=subprocess.PIPE, text=True,
                           timeout=300)
    assert p.returncode == 1
    assert p.stderr.splitlines()[-1] == "error: cannot write the output (No space left on device)"
    assert "Traceback" not in p.stderr
