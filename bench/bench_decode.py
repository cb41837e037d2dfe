"""Benchmark end-to-end prefill and decode of our engine against peers measured in the same run.

Run by hand (not a test):

    python bench/bench_decode.py [--models small qwen3-0.6b-shape] [-t N] [--prompt-len 128]
                                 [--decode 64] [--repeat 3] [--cache-dir DIR] [--profile] [--json]

For each model (a random-weight ``LlamaForCausalLM`` folder made once with transformers, float32
safetensors, fixed seed, kept under ``--cache-dir``):

- ours: ``CausalLM.generate_tokens`` greedy over the same prompt ids: prefill of P tokens, then
  D decode steps. Load time and the first (warm-up: numba cache load, page faults) run are
  reported apart; then ``--repeat`` timed runs, the best of which is reported.
- torch: transformers ``LlamaForCausalLM`` in float32, ``inference_mode``, the same thread count;
  prefill = one forward over the prompt with ``use_cache`` (``logits_to_keep=1``, as ours projects
  only the last row), decode = D single-token forwards with ``past_key_values``; greedy argmax.
- roofline: decode tok/s <= bandwidth / bytes read per token, where bandwidth is the best of a
  1-thread numpy ``np.add.reduce`` and a 1- and T-thread numba ``prange`` sum over a 512 MB
  float32 array, probed before and after the engines run (the host's bandwidth varies), and
  bytes = every weight once (the tied embedding once, as the head; the embedding gather is left
  out) + the K and V cache rows attention reads, averaged over the decode steps.

Each engine runs in its own child process, with OMP/OpenBLAS/MKL/numba thread counts set to T
before import, so no thread pool of one spins while the other runs. Ours must produce the same
greedy tokens as torch (a warning is printed otherwise). ``--profile`` times our decode steps
per layer type and per projection, and one prefill per layer type (a timer around each layer's
``incremental_forwarding``, installed by this script only), and prints the top cProfile entries
of the decode steps.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

from children import SEED, busy_cores, new_folder, peak_rss_mb, report, spawn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER_VERSION = "v1"     # bump when the way a model folder is made changes

MODELS = {
    "small": dict(num_hidden_layers=4, hidden_size=512, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=64, intermediate_size=1408,
                  vocab_size=32000, tie_word_embeddings=False, rope_theta=10000.0,
                  max_position_embeddings=4096),
    # Llama architecture with Qwen3-0.6B's shapes (Qwen3's q/k norms are not part of Llama)
    "qwen3-0.6b-shape": dict(num_hidden_layers=28, hidden_size=1024, num_attention_heads=16,
                             num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                             vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
                             max_position_embeddings=40960),
}


# -- shapes -----------------------------------------------------------------------------------
def weight_bytes_per_token(shape: dict) -> int:
    """float32 bytes of every weight decode reads once per token: per layer q, k, v, o, up, gate,
    down and two norms; the final norm; the head (the tied embedding counted once, as the head).
    The input embedding table is not counted: decode gathers one row of it."""
    D, L, I, V = (shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"],
                  shape["vocab_size"])
    q = shape["num_attention_heads"] * shape["head_dim"]
    kv = shape["num_key_value_heads"] * shape["head_dim"]
    per_layer = D * q + 2 * D * kv + q * D + 3 * D * I + 2 * D
    return 4 * (L * per_layer + D + V * D)


def kv_bytes_per_token(shape: dict, prompt_len: int, decode: int) -> float:
    """Mean float32 bytes of K and V cache attention reads per decode step: the step at position
    p reads rows [0, p] of K and V in every layer; p runs over [P, P + D)."""
    row = 2 * 4 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"]
    mean_rows = prompt_len + (decode - 1) / 2 + 1
    return row * mean_rows


def param_count(shape: dict) -> int:
    """Parameters of the Hugging Face model (embedding and an untied head each counted)."""
    tied_extra = 0 if shape["tie_word_embeddings"] else 1
    return (weight_bytes_per_token(shape) // 4
            + tied_extra * shape["vocab_size"] * shape["hidden_size"])


def prompt_ids(vocab_size: int, n: int) -> list[int]:
    """The benchmark's prompt: n token ids drawn uniformly from [0, vocab_size), seeded."""
    rng = random.Random(SEED)
    return [rng.randrange(vocab_size) for _ in range(n)]


# -- children ---------------------------------------------------------------------------------




def child_make(name: str, folder: str) -> None:
    """Write the random-weight model folder ``folder`` (atomically: built aside, then renamed)."""
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = MODELS[name]
    torch.manual_seed(SEED)
    cfg = LlamaConfig(**shape, rms_norm_eps=1e-6, attention_bias=False, mlp_bias=False,
                      hidden_act="silu", bos_token_id=None, eos_token_id=None,
                      pad_token_id=None)
    t0 = time.perf_counter()
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    with new_folder(folder) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        # the engine wants a tokenizer.json in the folder; the benchmark passes ids, never text
        Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")).save(
            os.path.join(tmp, "tokenizer.json"))
    n = sum(p.numel() for p in model.parameters())
    print(f"[make] {name}: {n / 1e6:.1f} M parameters in {time.perf_counter() - t0:.1f} s "
          f"-> {folder}", file=sys.stderr, flush=True)
    report({"params": n})


def child_ours(folder: str, ids: list[int], decode: int, threads: int, repeat: int,
               profile: bool) -> None:
    sys.path.insert(0, ROOT)
    t0 = time.perf_counter()
    from causallm import kernels
    from causallm.io.config import load_model_configs
    from causallm.models.causal_lm import CausalLM

    used = kernels.set_num_threads(threads)
    cfg, gen, nntr = load_model_configs(folder)
    nntr.update(init_seq_len=len(ids), num_to_generate=decode + 1)
    model = CausalLM(cfg, gen, nntr)
    model.initialize()
    model.load_weight(folder)
    load_s = time.perf_counter() - t0

    def run():
        t = time.perf_counter()
        res = model.generate_tokens([ids], max_new_tokens=decode + 1, do_sample=False)
        wall = time.perf_counter() - t
        m = model.performance_metrics
        if m.generation_tokens != decode:
            raise SystemExit(f"ours decoded {m.generation_tokens} tokens, not {decode}")
        return {"prefill_ms": m.prefill_duration_ms, "decode_ms": m.generation_duration_ms,
                "wall_ms": wall * 1e3, "tokens": res.generated_ids[0]}

    first = run()
    runs = [run() for _ in range(repeat)]
    result = {"threads": used, "load_s": load_s, "first": first, "runs": runs,
              "peak_rss_mb": peak_rss_mb()}
    if profile:
        result["profile"] = profile_decode(model, len(ids), decode)
    report(result)


def profile_decode(model, prompt_len: int, decode: int, steps: int = 8) -> dict:
    """Where the time of ``model``'s prefill and decode steps goes, by layer type and projection.

    Every entry of the execution plan (a layer, or a group of projections run together) has
    its ``incremental_forwarding`` wrapped (on the instance, in this process only) with a
    perf_counter timer, and runs on its own (a decode step otherwise runs them as one team
    program, runtime/runner.py ``team_plan``: ``step_ms`` is that step). Decode steps run at the positions the benchmark decoded at, after
    a prefill of the prompt; each figure is the best of 3 (the prefill's, of 3 prefills).
    graph overhead = step time - the sum of the layer times (the graph loop and the input and
    output copies; a layer's own Python is inside its layer's time). ``first_step_ms`` is the
    first decode step right after a prefill (median of 3), against ``step_ms`` in steady state.
    A cProfile of ``steps`` decode steps (no wrappers) gives the top functions by own time.
    """
    import cProfile
    import io
    import pstats

    import numpy as np

    graph = model.model
    ids = (np.arange(prompt_len, dtype=np.float32) % model.NUM_VOCAB)[None, :]
    step_ids = np.ones((1, 1), dtype=np.float32)

    def prefill():
        t = time.perf_counter()
        graph.incremental_inference(1, [ids], None, prompt_len, 0, prompt_len)
        return time.perf_counter() - t

    def steps_at(n):
        """Run n decode steps ending at position prompt_len + decode; seconds per step."""
        pos0 = prompt_len + decode - n
        t = time.perf_counter()
        for s in range(n):
            graph.incremental_inference(1, [step_ids], None, 1, pos0 + s, pos0 + s + 1)
        return (time.perf_counter() - t) / n

    def first_step():
        prefill()
        t = time.perf_counter()
        graph.incremental_inference(1, [step_ids], None, 1, prompt_len, prompt_len + 1)
        return time.perf_counter() - t

    first = statistics.median(first_step() for _ in range(3))
    steps_at(2)
    plain = min(steps_at(steps) for _ in range(3))

    layers: list[tuple[str, str, object]] = []   # what a step runs: layers and linear groups
    weights: dict[str, int] = {}
    for layer, context in graph.executionPlan():
        name = layer.name if context is None else context.getName()
        layers.append((name, layer.getType(), layer))
        weights[name] = (sum(t.nbytes for t in getattr(layer, "tables", ())) if context is None
                         else sum(int(w.nbytes) for w in context.weights))

    times: dict[str, float] = {}

    def timed(key, fn):
        def wrapper(context, from_, to):
            t = time.perf_counter()
            fn(context, from_, to)
            times[key] = times.get(key, 0.0) + time.perf_counter() - t
        return wrapper

    def best_of_3(run, per):
        best = None
        for _ in range(3):
            times.clear()
            total = run()
            if best is None or total < best[0]:
                best = (total, {k: v / per for k, v in times.items()})
        return best

    from causallm.runtime import runner
    team_rows, runner.TEAM_MAX_ROWS = runner.TEAM_MAX_ROWS, 0  # each entry its own calls
    for name, _, layer in layers:
        layer.incremental_forwarding = timed(name, layer.incremental_forwarding)
    prefill_total, prefill_names = best_of_3(prefill, 1)
    wrapped, per_name = best_of_3(lambda: steps_at(steps), steps)
    for name, _, layer in layers:
        del layer.incremental_forwarding  # back to the class method
    runner.TEAM_MAX_ROWS = team_rows

    def by_type(names):
        out: dict[str, float] = {}
        for name, ltype, _ in layers:
            out[ltype] = out.get(ltype, 0.0) + names[name]
        return {k: v * 1e3 for k, v in sorted(out.items(), key=lambda kv: -kv[1])}

    by_role: dict[str, list] = {}
    for name, ltype, _ in layers:
        if ltype in ("fully_connected", "lm_head") or (ltype == "tie_word_embeddings"
                                                       and name != "embedding0"):
            role = "+".join(n.split("_", 1)[1] if n.startswith("layer") else n
                            for n in name.split("+"))   # a linear group: wq+wk+wv
            acc = by_role.setdefault(role, [0.0, 0, 0])
            acc[0] += per_name[name]
            acc[1] += weights[name]
            acc[2] += 1

    pr = cProfile.Profile()
    pr.enable()
    steps_at(steps)
    pr.disable()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(15)
    layer_sum = sum(per_name.values())
    return {
        "steps": steps, "step_ms": plain * 1e3, "first_step_ms": first * 1e3,
        "wrapped_step_ms": wrapped * 1e3, "layer_sum_ms": layer_sum * 1e3,
        "graph_overhead_ms": (wrapped - layer_sum) * 1e3,
        "by_type_ms": by_type(per_name),
        "by_role": {k: {"ms": v[0] * 1e3, "calls": v[2], "MB": v[1] / 1e6,
                        "GB/s": v[1] / v[0] / 1e9 if v[0] else 0.0}
                    for k, v in sorted(by_role.items(), key=lambda kv: -kv[1][0])},
        "prefill_ms": prefill_total * 1e3,
        "prefill_by_type_ms": by_type(prefill_names),
        "cprofile": text.getvalue(),
    }


def child_torch(folder: str, ids: list[int], decode: int, threads: int, repeat: int) -> None:
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    prompt = torch.tensor([ids], dtype=torch.long)

    def run():
        with torch.inference_mode():
            t = time.perf_counter()
            out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            t1 = time.perf_counter()
            tokens = [int(token)]
            past = out.past_key_values
            for _ in range(decode):
                out = model(input_ids=token, past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = out.logits[:, -1].argmax(-1, keepdim=True)
                tokens.append(int(token))
            t2 = time.perf_counter()
        return {"prefill_ms": (t1 - t) * 1e3, "decode_ms": (t2 - t1) * 1e3,
                "wall_ms": (t2 - t) * 1e3, "tokens": tokens}

    first = run()
    runs = [run() for _ in range(repeat)]
    report({"threads": torch.get_num_threads(), "load_s": load_s, "first": first, "runs": runs,
            "peak_rss_mb": peak_rss_mb(),
            "params": sum(p.numel() for p in model.parameters()),
            "torch": torch.__version__, "attn": model.config._attn_implementation})


def child_bandwidth(threads: int, mbytes: int = 512, reps: int = 7, warmup_s: float = 1.0) -> None:
    """Read bandwidth in GB/s: best of ``reps`` sums over a ``mbytes`` MB float32 array, with
    numpy on one thread and a numba prange sum on one and on ``threads`` threads.

    The variants take turns (one sum each per round), after ``warmup_s`` seconds of T-thread
    sums: on a VM the first multi-threaded work after the other vCPUs idled can run at about
    half the bandwidth for a while, and a probe must not catch only that.
    """
    import numba
    import numpy as np
    from numba import njit, prange

    a = np.random.default_rng(0).random(mbytes * 2**20 // 4, dtype=np.float32)

    @njit(parallel=True, fastmath=True, cache=False)
    def psum(x, chunks):
        n = x.shape[0]
        part = np.zeros(chunks, np.float32)
        for c in prange(chunks):
            v = x[c * n // chunks:(c + 1) * n // chunks]  # a view: the loop below vectorizes
            s = np.float32(0.0)
            for i in range(v.shape[0]):
                s += v[i]
            part[c] = s
        return part.sum()

    def numba_sum(t):
        def run():
            numba.set_num_threads(t)
            psum(a, 64)
        return run

    variants = {"numpy_1t": lambda: np.add.reduce(a)}
    for t in sorted({1, threads}):
        variants[f"numba_{t}t"] = numba_sum(t)
    warm = variants[f"numba_{threads}t"]
    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        warm()
    for fn in variants.values():
        fn()
    times = {k: min(_timed(fn) for _ in range(1)) for k, fn in variants.items()}
    for _ in range(reps - 1):
        for k, fn in variants.items():
            times[k] = min(times[k], _timed(fn))
    result = {k: a.nbytes / t / 1e9 for k, t in times.items()}
    result["MB"] = a.nbytes / 2**20
    report(result)


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# -- parent -----------------------------------------------------------------------------------


def model_folder(cache_dir: str, name: str, threads: int) -> str:
    """The folder of model ``name`` under ``cache_dir``, made first if it is not there."""
    folder = os.path.join(cache_dir, f"{name}-seed{SEED}-{FOLDER_VERSION}")
    if not os.path.isdir(folder):
        spawn(__file__, ["make", name, folder], threads)
    return folder


def summarize(runs: list[dict], key: str) -> tuple[float, float]:
    """(best, median) milliseconds of ``key`` over the timed runs."""
    values = [r[key] for r in runs]
    return min(values), statistics.median(values)


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """The first index where the token lists differ (or the shorter length); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def bench_model(name: str, args, log, probe) -> dict:
    """Run ours and torch on model ``name``; ``probe()`` measures bandwidth after each."""
    shape = MODELS[name]
    folder = model_folder(args.cache_dir, name, args.threads)
    common = [name, folder, str(args.prompt_len), str(args.decode), str(args.threads),
              str(args.repeat)]
    log(f"[{name}] ours ...")
    ours = spawn(__file__, ["ours", *common, "1" if args.profile else "0"], args.threads)
    probe()
    log(f"[{name}] torch ...")
    torch_ = spawn(__file__, ["torch", *common], args.threads)
    probe()

    P, D = args.prompt_len, args.decode
    out = {"model": name, "shape": shape, "prompt_len": P, "decode": D}
    for key, res in (("ours", ours), ("torch", torch_)):
        pb, pm = summarize(res["runs"], "prefill_ms")
        db, dm = summarize(res["runs"], "decode_ms")
        out[key] = {
            "threads": res["threads"], "load_s": res["load_s"],
            "first_prefill_ms": res["first"]["prefill_ms"],
            "first_decode_ms": res["first"]["decode_ms"],
            "prefill_ms_best": pb, "prefill_ms_median": pm,
            "decode_ms_best": db, "decode_ms_median": dm,
            "prefill_tok_s": P / pb * 1e3, "decode_tok_s": D / db * 1e3,
            "decode_tok_s_median": D / dm * 1e3,
            "peak_rss_mb": res["peak_rss_mb"],
            "runs_ms": [[r["prefill_ms"], r["decode_ms"]] for r in res["runs"]],
        }
    if "profile" in ours:
        out["ours"]["profile"] = ours["profile"]
    out["torch"]["params"] = torch_["params"]
    out["torch"]["attn_implementation"] = torch_["attn"]
    if torch_["params"] != param_count(shape):
        log(f"WARNING: {name}: transformers has {torch_['params']} parameters, the byte count "
            f"assumes {param_count(shape)}")

    a, b = ours["runs"][-1]["tokens"], torch_["runs"][-1]["tokens"]
    bad = first_mismatch(a, b)
    out["tokens_match"] = bad is None
    if bad is not None:
        out["first_mismatch"] = bad
        log(f"WARNING: {name}: our greedy tokens differ from transformers' from token {bad} "
            f"(ours {a[bad:bad + 4]} vs {b[bad:bad + 4]})")
    return out


def add_roofline(result: dict, gbs: float) -> None:
    """The decode roofline of one model's result at ``gbs`` GB/s of read bandwidth."""
    shape, P, D = result["shape"], result["prompt_len"], result["decode"]
    wbytes = weight_bytes_per_token(shape)
    kvbytes = kv_bytes_per_token(shape, P, D)
    result["roofline"] = {"GB/s": gbs, "weight_MB": wbytes / 1e6, "kv_MB_mean": kvbytes / 1e6,
                          "decode_tok_s": gbs * 1e9 / (wbytes + kvbytes)}
    for engine in ("ours", "torch"):  # the bandwidth each engine's decode achieved
        result[engine]["decode_GB_s"] = result[engine]["decode_tok_s"] * (wbytes + kvbytes) / 1e9


def print_table(doc: dict, out) -> None:
    w = out.write
    busy = doc["busy_cores_before"]
    w(f"threads {doc['threads']}, prompt {doc['prompt_len']} tokens, {doc['decode']} decode "
      f"steps, best of {doc['repeat']} runs after 1 warm-up; float32; "
      f"{'?' if busy is None else f'{busy:.2f}'} of {os.cpu_count()} cores busy before the "
      f"start, load average {doc['loadavg_after'][0]:.2f} at the end\n")
    if busy is not None and busy > 0.25:
        w("NOTE: other processes were using the CPU: spinning thread pools make multi-threaded "
          "numbers unreliable; compare with -t 1\n")
    bw = doc["bandwidth_GB_s"]
    w(f"read bandwidth over {len(bw['probes'])} probes (GB/s, min-max): " + ", ".join(
        f"{k} {lo:.1f}-{hi:.1f}" for k, (lo, hi) in bw["range"].items())
      + f"; the roofline uses {bw['best']:.1f}\n")
    if any(hi > 1.2 * lo for lo, hi in bw["range"].values()):
        w("NOTE: the bandwidth varied by more than 20 % between probes (on a VM the host decides);"
          " the roofline ratios are then only rough\n")
    for r in doc["models"]:
        o, t, rf = r["ours"], r["torch"], r["roofline"]
        w(f"\n## {r['model']}: {t['params'] / 1e6:.1f} M params, {rf['weight_MB']:.0f} MB "
          f"weights + {rf['kv_MB_mean']:.1f} MB KV read per decode token; greedy tokens "
          f"{'match' if r['tokens_match'] else 'DIFFER from ' + str(r['first_mismatch'])}\n")
        w(f"{'engine':<10}{'prefill tok/s':>14}{'decode tok/s':>14}{'decode GB/s':>13}"
          f"{'prefill vs torch':>18}{'decode vs torch':>17}{'decode vs roofline':>20}\n")
        for label, e in (("ours", o), ("torch", t)):
            w(f"{label:<10}{e['prefill_tok_s']:>14.1f}{e['decode_tok_s']:>14.2f}"
              f"{e['decode_GB_s']:>13.1f}{e['prefill_tok_s'] / t['prefill_tok_s']:>18.2f}"
              f"{e['decode_tok_s'] / t['decode_tok_s']:>17.2f}"
              f"{e['decode_tok_s'] / rf['decode_tok_s']:>20.2f}\n")
        w(f"{'roofline':<10}{'-':>14}{rf['decode_tok_s']:>14.2f}{rf['GB/s']:>13.1f}{'-':>18}"
          f"{rf['decode_tok_s'] / t['decode_tok_s']:>17.2f}{1.0:>20.2f}\n")
        for label, e in (("ours", o), ("torch", t)):
            w(f"{label}: load {e['load_s']:.2f} s, first run prefill "
              f"{e['first_prefill_ms']:.0f} ms + decode {e['first_decode_ms']:.0f} ms; "
              f"timed prefill best/median "
              f"{e['prefill_ms_best']:.1f}/{e['prefill_ms_median']:.1f} ms, decode "
              f"{e['decode_ms_best']:.1f}/{e['decode_ms_median']:.1f} ms; peak RSS "
              f"{e['peak_rss_mb']:.0f} MB\n")
        if "profile" in o:
            print_profile(o["profile"], out)


def print_profile(p: dict, out) -> None:
    w = out.write
    w(f"\nprofile of ours, one decode step (best mean of {p['steps']}): {p['step_ms']:.2f} ms "
      f"({p['wrapped_step_ms']:.2f} ms with timers: layers {p['layer_sum_ms']:.2f} ms, graph loop "
      f"+ I/O copies {p['graph_overhead_ms']:.2f} ms); the first step after a prefill "
      f"{p['first_step_ms']:.2f} ms\n")
    total = p["wrapped_step_ms"]
    for k, v in p["by_type_ms"].items():
        w(f"  {k:<22}{v:9.3f} ms {100 * v / total:6.1f} %\n")
    w(f"  {'projection':<22}{'ms':>9} {'calls':>6} {'MB':>8} {'GB/s':>7}\n")
    for k, v in p["by_role"].items():
        w(f"  {k:<22}{v['ms']:9.3f} {v['calls']:6d} {v['MB']:8.1f} {v['GB/s']:7.1f}\n")
    w(f"prefill (best of 3, with timers): {p['prefill_ms']:.1f} ms\n")
    for k, v in p["prefill_by_type_ms"].items():
        w(f"  {k:<22}{v:9.3f} ms {100 * v / p['prefill_ms']:6.1f} %\n")
    w("cProfile of the decode steps, top by own time:\n" + p["cprofile"].strip() + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=["small"])
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1,
                    help="threads of every engine (all cores)")
    ap.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (128)")
    ap.add_argument("--decode", type=int, default=64, help="decode steps (64)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs after the warm-up")
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "causallm-bench"))
    ap.add_argument("--profile", action="store_true",
                    help="also time our decode steps and a prefill per layer type")
    ap.add_argument("--json", action="store_true", help="print the results as JSON only")
    args = ap.parse_args(argv)
    for flag, value in (("-t", args.threads), ("--prompt-len", args.prompt_len),
                        ("--decode", args.decode), ("--repeat", args.repeat)):
        if value < 1:
            ap.error(f"{flag} must be at least 1")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    busy = busy_cores()
    probes = []

    def probe():
        log("[bandwidth] ...")
        probes.append(spawn(__file__, ["bandwidth", str(args.threads)], args.threads))

    probe()
    results = [bench_model(name, args, log, probe) for name in args.models]
    kinds = [k for k in probes[0] if k != "MB"]
    best = max(p[k] for p in probes for k in kinds)
    for result in results:
        add_roofline(result, best)
    doc = {"threads": args.threads, "prompt_len": args.prompt_len, "decode": args.decode,
           "repeat": args.repeat, "busy_cores_before": busy, "loadavg_after": os.getloadavg(),
           "bandwidth_GB_s": {"probes": probes, "best": best,
                              "range": {k: [min(p[k] for p in probes), max(p[k] for p in probes)]
                                        for k in kinds}},
           "models": results}
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print_table(doc, sys.stdout)


def child_main(argv: list[str]) -> None:
    kind, rest = argv[0], argv[1:]
    if kind == "make":
        child_make(rest[0], rest[1])
    elif kind == "bandwidth":
        child_bandwidth(int(rest[0]))
    else:
        name, folder, prompt_len, decode, threads, repeat = rest[:6]
        ids = prompt_ids(MODELS[name]["vocab_size"], int(prompt_len))
        if kind == "ours":
            child_ours(folder, ids, int(decode), int(threads), int(repeat), rest[6] == "1")
        else:
            child_torch(folder, ids, int(decode), int(threads), int(repeat))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        main()
