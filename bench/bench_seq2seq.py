"""Benchmark an encoder-decoder (T5, Marian) end to end against transformers, measured in the
same run.

Run by hand (not a test):

    python bench/bench_seq2seq.py [--models t5-small-shape ...] [-t N] [--prompt-len 128]
                                  [--decode 64] [--num-beams 1] [--repeat 3] [--cache-dir DIR]
                                  [--json]

For each model (a random-weight ``T5ForConditionalGeneration`` or ``MarianMTModel`` folder made
once with transformers, float32 safetensors, fixed seed, kept under ``--cache-dir``), with no
EOS, so that both engines run exactly D decoder steps:

- ours: ``generate_tokens`` over the same prompt ids: the encoder pass over P tokens, the
  decoder's first step from ``decoder_start_token_id``, then D - 1 one-token steps (greedy, or
  K rows per step with ``--num-beams K``);
- torch, greedy: transformers in float32, ``inference_mode``, the same thread count: the encoder
  over the prompt, then the decoder step by step with an ``EncoderDecoderCache`` (the cross K/V
  computed at its first step, as ``generate`` does), argmax;
- torch, ``--num-beams K``: ``model.generate(num_beams=K, max_new_tokens=D)`` as users call it
  (no processors: no bad words, forced or renormalized tokens in either engine).

Greedy runs report the encoder time and the decoder's tokens per second (its first step
included); beam runs report new tokens per second over the whole call (encoder included).
Best of ``--repeat`` runs after a warm-up; each engine runs in its own child process with every
thread pool sized to ``-t``. Ours must produce torch's tokens (the best hypothesis with beams; a
warning says otherwise).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import tempfile
import time

from children import SEED, new_folder, peak_rss_mb, report, spawn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = {
    # google-t5/t5-small's shapes (relu, tied, 6 + 6 layers)
    "t5-small-shape": dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6,
                           num_heads=8, feed_forward_proj="relu"),
    # google/flan-t5-small's shapes (gated-gelu, untied, 8 + 8 layers, 6 heads)
    "flan-t5-small-shape": dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=1024,
                                num_layers=8, num_heads=6, feed_forward_proj="gated-gelu",
                                tie_word_embeddings=False),
    # Helsinki-NLP/opus-mt-en-de's shapes (58101 ids, swish, post-norm, 6 + 6 layers, 8 heads)
    "opus-mt-shape": dict(vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6,
                          encoder_attention_heads=8, decoder_attention_heads=8,
                          encoder_ffn_dim=2048, decoder_ffn_dim=2048, activation_function="swish",
                          max_position_embeddings=512, scale_embedding=True,
                          pad_token_id=58100, decoder_start_token_id=58100, eos_token_id=0,
                          forced_eos_token_id=0),
}


def prompt_ids(name: str, n: int) -> list[int]:
    """n token ids drawn uniformly from [2, vocab_size - 1) (no pad, no EOS), seeded; the
    family's EOS last."""
    cfg = MODELS[name]
    rng = random.Random(SEED)
    return [rng.randrange(2, cfg["vocab_size"] - 1) for _ in range(n - 1)] + \
        [cfg.get("eos_token_id", 1)]






def child_make(name: str, folder: str) -> None:
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import MarianConfig, MarianMTModel, T5Config, T5ForConditionalGeneration

    torch.manual_seed(SEED)
    if name.startswith("opus-mt"):
        model = MarianMTModel(MarianConfig(**MODELS[name]))
    else:
        model = T5ForConditionalGeneration(T5Config(**MODELS[name], decoder_start_token_id=0,
                                                    pad_token_id=0, eos_token_id=1))
    model = model.to(torch.float32).eval()
    with new_folder(folder) as tmp:
        model.save_pretrained(tmp)
        # the engine wants a tokenizer.json; the benchmark passes ids, never text
        Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")).save(
            os.path.join(tmp, "tokenizer.json"))
    report({"folder": folder})


def child_ours(folder: str, ids: list[int], decode: int, beams: int, threads: int,
               repeat: int) -> None:
    sys.path.insert(0, ROOT)
    t0 = time.perf_counter()
    from causallm import kernels
    from causallm.factory import Factory

    used = kernels.set_num_threads(threads)
    model = Factory.Instance().createFromFolder(folder, init_seq_len=len(ids),
                                                num_to_generate=decode)
    model.setGenerationOptions(num_beams=beams, num_return_sequences=1)
    model.initialize()
    model.load_weight()
    # a fixed number of steps and no processors, as torch's run
    model.setGenerationSettings(dataclasses.replace(
        model.generation, eos_token_id=[], forced_eos_token_id=[], bad_words_ids=[],
        renormalize_logits=False))
    load_s = time.perf_counter() - t0

    def run():
        t = time.perf_counter()
        res = model.generate_tokens([ids], max_new_tokens=decode, do_sample=False)
        total_ms = (time.perf_counter() - t) * 1e3
        m = res.metrics
        return {"encode_ms": m.encode_duration_ms,
                "decode_ms": m.prefill_duration_ms + m.generation_duration_ms,
                "total_ms": total_ms, "tokens": res.generated_ids[0]}

    first = run()
    report({"threads": used, "load_s": load_s, "first": first,
            "runs": [run() for _ in range(repeat)], "peak_rss_mb": peak_rss_mb()})


def child_torch(folder: str, ids: list[int], decode: int, beams: int, threads: int,
                repeat: int) -> None:
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForSeq2SeqLM, DynamicCache, EncoderDecoderCache

    torch.set_num_threads(threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    prompt = torch.tensor([ids], dtype=torch.long)
    start = model.config.decoder_start_token_id

    def run_beams():
        with torch.inference_mode():
            t = time.perf_counter()
            out = model.generate(prompt, num_beams=beams, max_new_tokens=decode,
                                 min_new_tokens=decode, do_sample=False, early_stopping=False,
                                 length_penalty=1.0, bad_words_ids=None,
                                 forced_eos_token_id=None, forced_bos_token_id=None,
                                 renormalize_logits=False, num_return_sequences=1)
            total_ms = (time.perf_counter() - t) * 1e3
        return {"encode_ms": 0.0, "decode_ms": total_ms, "total_ms": total_ms,
                "tokens": out[0, 1:].tolist()}

    def run():
        if beams > 1:
            return run_beams()
        with torch.inference_mode():
            t = time.perf_counter()
            enc = model.get_encoder()(input_ids=prompt)
            t1 = time.perf_counter()
            cache = EncoderDecoderCache(DynamicCache(config=model.get_decoder().config),
                                        DynamicCache(config=model.get_decoder().config))
            token = torch.tensor([[start]])
            tokens = []
            for _ in range(decode):
                out = model(encoder_outputs=enc, decoder_input_ids=token,
                            past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                token = out.logits[:, -1].argmax(-1, keepdim=True)
                tokens.append(int(token))
            t2 = time.perf_counter()
        return {"encode_ms": (t1 - t) * 1e3, "decode_ms": (t2 - t1) * 1e3,
                "total_ms": (t2 - t) * 1e3, "tokens": tokens}

    first = run()
    report({"threads": torch.get_num_threads(), "load_s": load_s, "first": first,
            "runs": [run() for _ in range(repeat)], "peak_rss_mb": peak_rss_mb(),
            "torch": torch.__version__, "attn": model.config._attn_implementation})




def bench_model(name: str, args, log) -> dict:
    folder = os.path.join(args.cache_dir, f"{name}-seed{SEED}")
    if not os.path.isdir(folder):
        os.makedirs(args.cache_dir, exist_ok=True)
        log(f"[make] {name} -> {folder}")
        spawn(__file__, ["make", name, folder], args.threads)
    common = [name, folder, str(args.prompt_len), str(args.decode), str(args.num_beams),
              str(args.threads), str(args.repeat)]
    out = {"model": name}
    for engine in ("ours", "torch"):
        log(f"[{name}] {engine} ...")
        r = spawn(__file__, [engine, *common], args.threads)
        best_enc = min(x["encode_ms"] for x in r["runs"])
        best_dec = min(x["decode_ms"] for x in r["runs"])
        best_total = min(x["total_ms"] for x in r["runs"])
        out[engine] = {"encode_ms": best_enc, "decode_tps": args.decode / best_dec * 1e3,
                       "total_ms": best_total, "tps": args.decode / best_total * 1e3,
                       "load_s": r["load_s"], "peak_rss_mb": r["peak_rss_mb"],
                       "tokens": r["runs"][-1]["tokens"]}
    out["same_tokens"] = out["ours"]["tokens"] == out["torch"]["tokens"]
    if not out["same_tokens"]:
        log(f"WARNING: {name}: ours and torch decoded different tokens")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--num-beams", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "causallm-bench"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    for flag, value in (("-t", args.threads), ("--prompt-len", args.prompt_len),
                        ("--decode", args.decode), ("--num-beams", args.num_beams),
                        ("--repeat", args.repeat)):
        if value < 1:
            ap.error(f"{flag} must be at least 1")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    results = [bench_model(name, args, log) for name in args.models]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    beams = args.num_beams
    print(f"threads {args.threads}, prompt {args.prompt_len} tokens, {args.decode} decoder "
          f"steps, {f'{beams} beams' if beams > 1 else 'greedy'}, best of {args.repeat} runs "
          f"after a warm-up; float32")
    if beams > 1:
        print(f"{'model':22} {'engine':6} {'total ms':>10} {'new tok/s':>13} {'vs torch':>9} "
              f"{'peak RSS MB':>12}")
    else:
        print(f"{'model':22} {'engine':6} {'encode ms':>10} {'decode tok/s':>13} "
              f"{'vs torch':>9} {'peak RSS MB':>12}")
    for r in results:
        for engine in ("ours", "torch"):
            e = r[engine]
            key = "tps" if beams > 1 else "decode_tps"
            ratio = e[key] / r["torch"][key]
            first = e["total_ms"] if beams > 1 else e["encode_ms"]
            print(f"{r['model']:22} {engine:6} {first:10.1f} {e[key]:13.1f} {ratio:9.2f} "
                  f"{e['peak_rss_mb']:12.0f}")
        what = "best hypotheses" if beams > 1 else "greedy tokens"
        print(f"{'':22} {what} {'match' if r['same_tokens'] else 'DIFFER'}")


def child_main(argv: list[str]) -> None:
    kind, rest = argv[0], argv[1:]
    if kind == "make":
        child_make(rest[0], rest[1])
        return
    name, folder, prompt_len, decode, beams, threads, repeat = rest
    ids = prompt_ids(name, int(prompt_len))
    child = child_ours if kind == "ours" else child_torch
    child(folder, ids, int(decode), int(beams), int(threads), int(repeat))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        main()
