"""Benchmark structured output's cost (causallm/generation/constraint.py): the grammar engine we
use, llguidance, beside xgrammar, on the real SmolLM2 (49,152 tokens) and Gemma 3 (262,144)
vocabularies.

Run by hand (not a test):

    python bench/bench_grammar.py [--gemma3 FILE] [--xgrammar-python PY] [--repeat 5] [--json]

xgrammar requires torch (and transformers, triton) by its package metadata, which the engine may
not depend on, so it is measured only with ``--xgrammar-python``, an interpreter that has it
(e.g. a virtual environment with ``--system-site-packages`` and ``pip install --no-deps
xgrammar apache-tvm-ffi``, where torch is installed).

Each engine runs in its own child process (one thread) on the vocabulary our GGUFTokenizer
reads from the file (``GGUFTokenizer.token_bytes``; xgrammar gets those bytes as a RAW
vocabulary, special tokens empty):

- build: CPU seconds to prepare the vocabulary (llguidance's ``LLTokenizer`` through
  ``grammar_tokenizer``; xgrammar's ``TokenizerInfo`` and ``GrammarCompiler``), once per
  tokenizer and process;
- compile: CPU seconds to compile each grammar, any JSON object (OpenAI's json_object) and a
  small schema (a person: strings, an integer with bounds, an array of strings, a nested object,
  a boolean, an enum);
- per token, walking the tokens of a pretty-printed JSON answer (our tokenizer's encoding of
  ``json.dumps(value, indent=2)``): ``mask``, the token mask computed and applied to a (V,)
  float32 row (``JsonConstraint.mask``; for xgrammar ``fill_next_token_bitmask`` and the same
  apply kernel), and ``advance`` with the token; the median, mean, 90th percentile and maximum
  over every token of ``--repeat`` walks, in microseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from bench_gguf_tokenizer import files
from children import peak_rss_mb, report, spawn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {"type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
                    "required": ["street", "city"], "additionalProperties": False},
        "active": {"type": "boolean"},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "tags", "address", "active", "role"],
    "additionalProperties": False,
}
ANSWER = {"name": "Ada Lovelace", "age": 36, "tags": ["mathematics", "poetry", "engines"],
          "address": {"street": "12 St James's Square", "city": "London"}, "active": True,
          "role": "admin"}
"""A value valid under SCHEMA (and a JSON object): the walk's text."""


def stats(values: list[float]) -> dict:
    us = sorted(v * 1e6 for v in values)
    return {"median": statistics.median(us), "mean": statistics.fmean(us),
            "p90": us[int(0.9 * (len(us) - 1))], "max": us[-1]}


def child(engine: str, path: str, repeat: int) -> None:
    sys.path.insert(0, ROOT)
    import numpy as np

    from causallm.io.gguf_file import GGUFFile
    from causallm.kernels.token_mask import apply_token_bitmask
    from causallm.tokenizer import Tokenizer

    gguf = GGUFFile(path)
    tokenizer = Tokenizer(gguf.tokenizer(), path)
    text = json.dumps(ANSWER, indent=2)
    ids = tokenizer.Encode(text, add_special_tokens=False)
    V = tokenizer.GetVocabSize()
    result = {"vocab": V, "tokens": len(ids)}
    apply_token_bitmask(np.zeros(V, np.float32), np.zeros((V + 31) // 32, np.int32), V)

    if engine == "llguidance":
        from causallm.generation.constraint import compile_json_schema, grammar_tokenizer

        c = time.process_time()
        grammar_tokenizer(tokenizer)
        result["build_cpu"] = time.process_time() - c

        def compiled(schema):
            return compile_json_schema(tokenizer, schema)

        def walk(grammar, scores, masks, advances):
            constraint = grammar.constraint()
            for t in ids:
                scores.fill(0.0)
                t0 = time.perf_counter()
                constraint.mask(scores)
                t1 = time.perf_counter()
                constraint.advance(t)
                masks.append(t1 - t0)
                advances.append(time.perf_counter() - t1)
                if not scores[t] > -np.inf:
                    raise SystemExit(f"llguidance refused token {t}")
    else:
        import xgrammar as xgr

        c = time.process_time()
        vocab = gguf.tokenizer().token_bytes()
        for t in gguf.tokenizer().special_ids():
            vocab[t] = b""
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=V, stop_token_ids=[])
        compiler = xgr.GrammarCompiler(info, max_threads=1)
        result["build_cpu"] = time.process_time() - c
        bitmask = xgr.allocate_token_bitmask(1, V)
        words = bitmask.numpy()[0]

        def compiled(schema):
            if schema == {"type": "object"}:
                return compiler.compile_json_schema(json.dumps(schema), any_whitespace=True)
            return compiler.compile_json_schema(json.dumps(schema), any_whitespace=True,
                                                strict_mode=True)

        def walk(grammar, scores, masks, advances):
            matcher = xgr.GrammarMatcher(grammar)
            for t in ids:
                scores.fill(0.0)
                t0 = time.perf_counter()
                matcher.fill_next_token_bitmask(bitmask)
                apply_token_bitmask(scores, words, V)
                t1 = time.perf_counter()
                ok = matcher.accept_token(t)
                masks.append(t1 - t0)
                advances.append(time.perf_counter() - t1)
                if not ok or not scores[t] > -np.inf:
                    raise SystemExit(f"xgrammar refused token {t}")

    scores = np.zeros(V, np.float32)
    for name, schema in (("json_object", {"type": "object"}), ("schema", SCHEMA)):
        c = time.process_time()
        grammar = compiled(schema)
        compile_cpu = time.process_time() - c
        masks, advances = [], []
        for _ in range(repeat):
            walk(grammar, scores, masks, advances)
        result[name] = {"compile_cpu": compile_cpu, "mask_us": stats(masks),
                        "advance_us": stats(advances)}
    result["peak_rss_mb"] = peak_rss_mb()
    report(result)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs=3, metavar=("ENGINE", "PATH", "REPEAT"),
                   help=argparse.SUPPRESS)
    p.add_argument("--gemma3", help="the Gemma 3 270M Q4_K_M file (its packages' parts joined)")
    p.add_argument("--xgrammar-python", help="an interpreter with xgrammar installed")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    engines = {"llguidance": None}
    if args.xgrammar_python:
        engines["xgrammar"] = args.xgrammar_python
    rows = {name: {e: spawn(__file__, [e, path, str(args.repeat)], 1, python=py)
                   for e, py in engines.items()}
            for name, path in files(args.gemma3).items()}
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| vocabulary | engine | build CPU s | grammar | compile CPU ms | mask us median / "
          "mean / p90 / max | advance us median / mean |")
    print("|---|---|---|---|---|---|---|")
    for name, by_engine in rows.items():
        for e, r in by_engine.items():
            for g in ("json_object", "schema"):
                m, a = r[g]["mask_us"], r[g]["advance_us"]
                print(f"| {name} ({r['vocab']}) | {e} | {r['build_cpu']:.2f} | {g} | "
                      f"{r[g]['compile_cpu'] * 1e3:.1f} | {m['median']:.0f} / {m['mean']:.0f} / "
                      f"{m['p90']:.0f} / {m['max']:.0f} | {a['median']:.0f} / {a['mean']:.0f} |")


if __name__ == "__main__":
    main()
