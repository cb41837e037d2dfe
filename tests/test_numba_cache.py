"""Where numba caches the kernels (causallm/kernels/jit_cache.py), and a damaged cache.

A read-only install run without a home (a service user, a container) must still generate:
the kernels are cached in the first writable folder of NUMBA_CACHE_DIR, the sources'
__pycache__, the user's cache folder and a private temporary folder, or not at all. A cache
file cut short (a crash, a full disk) is compiled again, not an UnpicklingError.

The runs go through the CLI in a subprocess on one copy of the package made read-only, without
its prebuilt kernels; each first run compiles the embedded model's kernels (seconds), so the
tree and its runs are shared.

A kernel computes the same bits whether it was just compiled or read from the cache: the
embedded model generates in a process that compiles every kernel (an empty cache) and in one
that loads them all, and the logits of every step must be equal to the bit. Those processes
name this CPU as numba's target (``COMPILE_HERE``), which compiles for it instead of reading the
prebuilt kernels; a first run that does read them compiles nothing and generates the same.
"""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from causallm.kernels import jit_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "The for statement"
NOBODY = 65534


def _compile_here() -> dict:
    import llvmlite.binding as llvm
    return {"NUMBA_CPU_NAME": llvm.get_host_cpu_name(),
            "NUMBA_CPU_FEATURES": llvm.get_host_cpu_features().flatten()}


COMPILE_HERE = _compile_here()
"""Environment naming this CPU as numba's target: numba's own key for it (so the same cache
entries as a process that names none), and no prebuilt kernels (kernels/jit_cache.py)."""

NO_TARGET = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
"""This environment without a target named to numba: the prebuilt kernels serve."""


def copy_install(base, *skip):
    """The package (causallm, layers, models, factory.py, main.py, res/tiny-llama) copied to
    ``base``, without numba's caches and the names ``skip``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", *skip)
    for name in ("causallm", "layers", "models"):
        shutil.copytree(os.path.join(ROOT, name), os.path.join(base, name), ignore=ignore)
    for name in ("factory.py", "main.py"):
        shutil.copy(os.path.join(ROOT, name), base)
    shutil.copytree(os.path.join(ROOT, "res", "tiny-llama"), os.path.join(base, "res", "tiny-llama"))


@pytest.fixture(scope="module")
def tree():
    """The package (causallm, layers, models, factory.py, main.py, res/tiny-llama) copied to a
    fresh folder others can read (for the unprivileged run), without caches, then chmod -R a-w;
    ``tmp`` beside it is the runs' TMPDIR, writable by anyone."""
    top = tempfile.mkdtemp(prefix="causallm-ro-")
    os.chmod(top, 0o755)
    base = os.path.join(top, "install")
    copy_install(base, "prebuilt")
    tmp = os.path.join(top, "tmp")
    os.mkdir(tmp)
    os.chmod(tmp, 0o1777)
    for folder, dirs, files in os.walk(base):
        for name in files + dirs:
            path = os.path.join(folder, name)
            os.chmod(path, os.stat(path).st_mode & ~0o222)
    os.chmod(base, 0o555)
    yield base
    for folder, dirs, _ in os.walk(top):
        os.chmod(folder, 0o755)
    shutil.rmtree(top)


def run(base, *prefix):
    """The CLI of the copy, greedy, 4 tokens, --json, with no HOME, XDG_CACHE_HOME or
    NUMBA_CACHE_DIR; ``prefix`` runs it as another user."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HOME", "XDG_CACHE_HOME", "NUMBA_CACHE_DIR")}
    env["TMPDIR"] = os.path.join(os.path.dirname(base), "tmp")
    p = subprocess.run([*prefix, sys.executable, os.path.join(base, "main.py"),
                        os.path.join(base, "res", "tiny-llama"), PROMPT, "--greedy", "-n", "4",
                        "--json"], cwd=env["TMPDIR"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1]), p.stderr


def cache_folder(stderr):
    """The folder the compile notice names."""
    m = re.search(r"\[numba\] compiling kernels for this CPU \(once: they are cached in (.+)\)",
                  stderr)
    assert m, stderr
    return m.group(1)


@pytest.fixture(scope="module")
def first_run(tree):
    record, stderr = run(tree)
    return record, stderr, cache_folder(stderr)


@pytest.mark.slow
def test_read_only_install_without_home_generates(tree, first_run):
    record, stderr, folder = first_run
    assert len(record["generated_ids"]) == 4 and record["text"].strip(), record
    # as root the "read-only" tree is writable and numba's default stays; as anyone else the
    # kernels go to the private temporary folder and stderr says so
    if os.access(os.path.join(tree, "causallm", "kernels"), os.W_OK):
        assert folder.startswith(os.path.join(tree, "causallm", "kernels", "__pycache__"))
    else:
        temp = os.path.join(os.path.dirname(tree), "tmp", f"causallm-numba-{os.getuid()}")
        assert folder.startswith(temp)
        assert f"kernels are cached in {temp} (NUMBA_CACHE_DIR moves them)" in stderr


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to run as an unprivileged user")
def test_read_only_install_as_an_unprivileged_user(tree, first_run):
    """As nobody (its home /nonexistent, none in the environment) nothing of the install is
    writable: the kernels are cached in the private temporary folder, said once, and the next
    run loads them from there."""
    as_nobody = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    temp = os.path.join(os.path.dirname(tree), "tmp", f"causallm-numba-{NOBODY}")
    note = (f"[numba] {tree}/causallm/kernels is not writable: kernels are cached in {temp} "
            f"(NUMBA_CACHE_DIR moves them)")
    (first, err1), (second, err2) = run(tree, *as_nobody), run(tree, *as_nobody)
    assert first["generated_ids"] == second["generated_ids"] == first_run[0]["generated_ids"]
    assert err1.splitlines()[0] == note and err1.count("[numba]") == 3  # the note, compiling
    assert err2.splitlines()[0] == note and err2.count("[numba]") == 1  # the note alone
    assert cache_folder(err1).startswith(temp)
    st = os.stat(temp)
    assert st.st_uid == NOBODY and stat.S_IMODE(st.st_mode) == 0o700


@pytest.mark.slow
def test_a_truncated_cache_file_is_compiled_again(tree, first_run):
    record, _, folder = first_run
    # a data file, the last entry of its kernel (a second signature if there is one), and the
    # index of another kernel, of kernels every run reads (one only called by other kernels
    # is compiled into them: its own files are written but never read)
    read = ("attention._ops.locals.attend", "attention._ops.locals.write", "team._run_parallel",
            "team._run_serial")
    data = [f for f in os.listdir(folder) if f.endswith(".nbc") and f.split("-")[0] in read]
    bad_data = max(data, key=lambda f: (int(f.rsplit(".", 2)[1]), f))
    kernel = bad_data.split(".py")[0]
    bad_index = min(f for f in os.listdir(folder)
                    if f.endswith(".nbi") and f.split(".py")[0] != kernel
                    and f.split("-")[0] in read)
    for name in (bad_index, bad_data):
        path = os.path.join(folder, name)
        os.chmod(path, 0o644)
        os.truncate(path, os.path.getsize(path) // 2)
    again, stderr = run(tree)
    assert again["generated_ids"] == record["generated_ids"]
    assert f"[numba] cache index {os.path.join(folder, bad_index)} is unreadable" in stderr
    assert re.search(rf"\[numba\] cache of \S+ in {re.escape(folder)} is unreadable "
                     rf"\((UnpicklingError|EOFError)\); compiling it again", stderr), stderr
    assert re.search(r"\[numba\] compiled \d+ kernel\(s\)", stderr), stderr
    third, stderr = run(tree)  # the rebuilt entries load (the index may name new data files)
    assert third["generated_ids"] == record["generated_ids"] and "[numba]" not in stderr


# --------------------------------------------------------------------------- the choice itself

def test_the_first_writable_folder_is_chosen(tmp_path, monkeypatch):
    """NUMBA_CACHE_DIR, the sources' __pycache__, $XDG_CACHE_HOME or ~/.cache, a private temp
    folder, none; a folder below a regular file stands for one that cannot be written (root
    writes anywhere else)."""
    (tmp_path / "file").write_text("")
    bad = str(tmp_path / "file" / "x")
    tree, given, xdg, home = (str(tmp_path / n) for n in ("tree", "given", "xdg", "home"))
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    private = os.path.join(str(temp), f"causallm-numba-{os.getuid()}")

    def choose(**env):
        return jit_cache.choose(env, env.pop("in_tree", tree))

    assert choose(NUMBA_CACHE_DIR=given) == (given, "")
    assert choose() == ("", "")
    assert choose(NUMBA_CACHE_DIR=bad) == (
        "", f"[numba] NUMBA_CACHE_DIR {bad} is not writable: kernels are cached in {tree}")
    assert choose(in_tree=bad, XDG_CACHE_HOME=xdg, HOME=home) == (
        os.path.join(xdg, "causallm", "numba"),
        f"[numba] {tmp_path}/file is not writable: kernels are cached in "
        f"{xdg}/causallm/numba (NUMBA_CACHE_DIR moves them)")
    assert choose(in_tree=bad, HOME=home)[0] == os.path.join(home, ".cache", "causallm", "numba")
    assert choose(in_tree=bad, HOME=bad)[0] == private
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
    os.chmod(private, 0o777)  # a temporary folder others may write to is not used
    folder, note = choose(in_tree=bad, HOME=bad, NUMBA_CACHE_DIR=bad)
    assert folder is None and note == (
        f"[numba] NUMBA_CACHE_DIR {bad} is not writable; {tmp_path}/file is not writable, nor "
        f"is a user or temporary cache folder: kernels are compiled on every run (set "
        f"NUMBA_CACHE_DIR to a writable folder)")


@pytest.mark.slow
def test_without_a_cache_folder_kernels_compile_uncached(monkeypatch):
    from numba import njit
    from numba.core.caching import NullCache

    monkeypatch.setattr(jit_cache, "CACHED", False)

    @njit(cache=True)
    def twice(x):
        return 2 * x

    assert isinstance(twice._cache, NullCache) and twice(21) == 42
    monkeypatch.setattr(jit_cache, "CACHED", True)

    @njit(cache=True)
    def thrice(x):
        return 3 * x

    assert type(thrice._cache).__name__ == "CheckedCache"


# --------------------------------------------------------------------------- compiled or cached

LONG_PROMPT = ("Strings are immutable sequences of Unicode code points. A tuple is an immutable "
               "sequence, a list a mutable one; the for statement iterates over the items of any "
               "sequence, in the order that they appear in the sequence, and a dictionary maps "
               "keys to values.")
"""55 tokens: the prefill's attention runs on the thread pool, over rows of 32 keys and more."""

RECORD = """
import hashlib, json, sys
import numpy as np
import causallm

loaded = causallm.load(sys.argv[1], threads=2)
model, logits = loaded.model, []
start, step = model.start, model.step

def recorded_start(*args, **kwargs):
    first = start(*args, **kwargs)
    logits.append(np.array(first.logits, dtype=np.float32))
    return first

def recorded_step(*args, **kwargs):
    row = step(*args, **kwargs)
    logits.append(np.array(row, dtype=np.float32))
    return row

model.start, model.step = recorded_start, recorded_step
done = loaded.complete(sys.argv[2], max_new_tokens=int(sys.argv[3]), greedy=True)
print(json.dumps({"ids": [int(t) for t in done.result.generated_ids[0]], "steps": len(logits),
                  "sha256": hashlib.sha256(b"".join(x.tobytes() for x in logits)).hexdigest()}))
"""
"""Greedy generation through the Python API, every step's logits kept: the ids, the number of
logit rows and the SHA-256 of their float32 bytes, as one JSON line."""


def generate_recorded(cache, model=os.path.join(ROOT, "res", "tiny-llama"), n=8):
    """RECORD in a subprocess of this tree with NUMBA_CACHE_DIR=cache, compiling for this CPU:
    (its record, stderr)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=ROOT, **COMPILE_HERE)
    p = subprocess.run([sys.executable, "-c", RECORD, model, LONG_PROMPT, str(n)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1]), p.stderr


@pytest.mark.slow
def test_compiled_and_cached_kernels_compute_the_same_logits(tmp_path):
    """The first process compiles every kernel (numba links a copy of each kernel a kernel calls
    into the caller); the second reads them all from the cache. Their logits are equal to the
    bit (before jit_cache made linked copies internal, the compiling process's parallel
    attention ran the separately compiled _attend and its prefill logits differed by 4e-6)."""
    cache = str(tmp_path / "numba")
    cold, err_cold = generate_recorded(cache)
    warm, err_warm = generate_recorded(cache)
    assert "[numba] compiling kernels" in err_cold and "[numba]" not in err_warm, err_warm
    assert cold["steps"] == len(cold["ids"]) > 0
    assert warm["ids"] == cold["ids"]
    assert warm["sha256"] == cold["sha256"], "the same tokens from different logits"



HASHING = """
import sys
sys.path.insert(0, sys.argv[1])
import causallm.kernels  # noqa: F401  (jit_cache.install: the cache and how a hit binds)
from numba import njit

@njit(cache=True)
def hashed(n):
    return hash(str(n) + "x")

print(hashed(1234) == hash(str(1234) + "x"))
"""
"""A cached kernel that hashes a string it makes: its code reads the hash secret, a symbol
numba gives LLVM only when numba.cpython.hashing loads."""


@pytest.mark.slow
def test_a_cached_kernel_naming_a_registry_symbol_loads(tmp_path):
    """A cache hit binds the kernel without loading numba's registries (jit_cache): a kernel
    whose code names a symbol one of them defines still loads and runs in a second process
    (were the symbol unknown to LLVM, linking the cached code would abort the process)."""
    (tmp_path / "hashing_kernel.py").write_text(HASHING)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=ROOT)
    runs = [subprocess.run([sys.executable, str(tmp_path / "hashing_kernel.py"), ROOT],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for p in runs:
        assert p.returncode == 0 and p.stdout.strip() == "True", p.stderr
    assert "[numba] compiling" in runs[0].stderr and "[numba]" not in runs[1].stderr


@pytest.mark.slow
def test_warmup_compiles_what_the_first_run_needs(tmp_path):
    """``python -m causallm.warmup`` on an empty cache compiles the embedded model's kernels
    (and says so); the run after it, the default model and prompt, compiles nothing. Both
    compile for this CPU, without the prebuilt kernels."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), **COMPILE_HERE)
    warm = subprocess.run([sys.executable, "-m", "causallm.warmup"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert warm.returncode == 0, warm.stderr
    assert "[numba] compiling kernels" in warm.stderr
    assert re.search(r"\[warmup\] \S+tiny-llama: kernels ready in \d+\.\d s", warm.stderr)
    run = subprocess.run([sys.executable, "main.py", "-n", "4"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip(), run.stderr
    assert "[numba]" not in run.stderr, run.stderr


HELPER = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from causallm.kernels.quant import NO_D, NO_Q, NO_ROWS, NO_U, row_kernels

x = np.full((1, 1, 8), 3.0, np.float32)
y = np.zeros_like(x)
row_kernels()[0](x, NO_ROWS, NO_ROWS, np.ones(8, np.float32), y, 1, 1e-6, NO_Q, NO_D, NO_D, NO_U)
print(float(y[0, 0, 0]))
"""


@pytest.mark.slow
def test_a_changed_helper_compiles_its_callers_again(tmp_path):
    """numba keys a cached kernel by its own code and its own file's time stamp: a kernel in
    quant.py read back after a helper it calls (norm.rms_segment) changed ran the old helper.
    The cache key carries a digest of every kernel module (jit_cache.kernel_sources), so the
    caller computes with the new helper."""
    copy = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "causallm"), copy / "causallm",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "prebuilt"))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))

    def norm_of_threes():
        p = subprocess.run([sys.executable, "-c", HELPER, str(copy)], env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        return float(p.stdout.split()[-1])

    assert norm_of_threes() == pytest.approx(1.0)
    norm = copy / "causallm" / "kernels" / "norm.py"
    text = norm.read_text()
    assert text.count("ys[j] = xs[j] * inv * gamma[j]") == 1
    norm.write_text(text.replace("ys[j] = xs[j] * inv * gamma[j]",
                                 "ys[j] = 2 * xs[j] * inv * gamma[j]"))
    assert norm_of_threes() == pytest.approx(2.0)


# --------------------------------------------------------------------------- prebuilt kernels

def _prebuilt_here() -> list[str]:
    """The prebuilt folders that serve this CPU, Python and numba."""
    import numba
    from numba.core.registry import cpu_target
    folders = []
    for folder, _ in jit_cache.prebuilt_targets(cpu_target.target_context.codegen()):
        with open(os.path.join(folder, "target.json")) as f:
            target = json.load(f)
        if (target["numba"] == numba.__version__
                and target["python"] == "%d.%d" % sys.version_info[:2]):
            folders.append(folder)
    return folders


@pytest.mark.slow
def test_a_first_run_of_the_embedded_model_compiles_nothing(tmp_path):
    """The embedded model's kernels ship compiled for CPU levels (causallm/kernels/prebuilt,
    tools/prebuild_kernels.py): the README's first run, on an empty cache, reads them back,
    compiles nothing and generates what a run that compiles them for this CPU generates. It
    fails after a change to causallm/kernels/ until the tool makes them again; it is skipped
    where no prebuilt folder serves this CPU, Python and numba."""
    if not _prebuilt_here():
        pytest.skip("no prebuilt kernels for this CPU, Python and numba")

    def generate(cache, **more):
        p = subprocess.run([sys.executable, "main.py", "-n", "8", "--json"], cwd=ROOT,
                           env=dict(NO_TARGET, NUMBA_CACHE_DIR=str(tmp_path / cache), **more),
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.splitlines()[-1])["generated_ids"], p.stderr

    (prebuilt, err), (compiled, err_compiled) = generate("a"), generate("b", **COMPILE_HERE)
    assert "[numba]" not in err, ("the prebuilt kernels are stale: run "
                                  "tools/prebuild_kernels.py\n" + err)
    assert not any(f.endswith(".nbi") for _, _, fs in os.walk(tmp_path / "a") for f in fs)
    assert "[numba] compiling kernels" in err_compiled
    assert prebuilt == compiled and len(prebuilt) == 8


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2_gguf", "gemma3_gguf"])
def test_a_first_run_of_a_real_gguf_file_compiles_nothing(name, request, tmp_path):
    """The prebuilt folders also hold the kernels of the real GGUF files the tests use (their
    vocabulary's and their block types'): a first run of each, on an empty cache, compiles
    nothing (stale after a change to causallm/kernels/ until tools/prebuild_kernels.py runs
    again with their packages installed). Skipped without the file or a folder for this CPU."""
    if not _prebuilt_here():
        pytest.skip("no prebuilt kernels for this CPU, Python and numba")
    path = request.getfixturevalue(name)
    p = subprocess.run([sys.executable, "main.py", path, "What is a tuple?", "-n", "4"],
                       cwd=ROOT, env=dict(NO_TARGET, NUMBA_CACHE_DIR=str(tmp_path / "numba")),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "[numba]" not in p.stderr, ("the prebuilt kernels are stale: run "
                                       "tools/prebuild_kernels.py\n" + p.stderr)


@pytest.mark.slow
def test_a_damaged_prebuilt_file_is_compiled_instead(tmp_path):
    """A prebuilt data file cut short (a broken install) is a miss: one stderr line names the
    kernel, which is compiled (and cached) instead, and the run generates what an intact
    install does."""
    if not _prebuilt_here():
        pytest.skip("no prebuilt kernels for this CPU, Python and numba")
    copy = tmp_path / "install"
    copy_install(copy)
    folder = os.path.relpath(_prebuilt_here()[0], ROOT)
    damaged = sorted((copy / folder).glob("quant._row_kernels.locals.norm_team-*.1.nbc"))
    assert len(damaged) == 1
    os.truncate(damaged[0], os.path.getsize(damaged[0]) // 2)

    def generate(base, cache):
        p = subprocess.run([sys.executable, str(base / "main.py"), "-n", "6", "--json"],
                           cwd=tmp_path, env=dict(NO_TARGET, NUMBA_CACHE_DIR=str(tmp_path / cache)),
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.splitlines()[-1])["generated_ids"], p.stderr

    (ids, err), (intact, _) = generate(copy, "a"), generate(Path(ROOT), "b")
    assert re.search(r"\[numba\] prebuilt _row_kernels\.<locals>\.norm_team in \S+ is unreadable "
                     r"\(\w+\); compiling it", err), err
    assert "[numba] compiled" in err and ids == intact
