"""Benchmark the vision stage (SigLIP tower + Gemma 3's projector) against transformers, in the
same run.

Run by hand (not a test):

    python bench/bench_vision.py [--models siglip-base-shape gemma3-so400m-shape] [-t N]
                                 [--repeat 3] [--cache-dir DIR] [--json]

For each model (a random-weight ``Gemma3ForConditionalGeneration`` folder with a real-shaped
vision tower and a one-layer text model, made once with transformers, float32 safetensors,
fixed seed, kept under ``--cache-dir``), both engines turn the same pixel values (3, S, S) into
the image features (mm_tokens_per_image, text hidden):

- ours: ``runVision`` (the ``vision`` stage: conv2d patches, SigLIP blocks, projector);
- torch: ``model.get_image_features(pixel_values)`` in float32, ``inference_mode``, the same
  thread count.

Best of ``--repeat`` runs after a warm-up, each engine in its own child process with every
thread pool sized to ``-t``; the features must agree (a warning says otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
from children import SEED, new_folder, peak_rss_mb, report, spawn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TEXT = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=1, head_dim=64)
"""A small text model: the benchmark times the vision stage only."""

MODELS = {
    # google/siglip-base-patch16-224's tower: 196 patches, pooled 2 x 2 to 49 tokens
    "siglip-base-shape": dict(vision=dict(hidden_size=768, intermediate_size=3072,
                                          num_hidden_layers=12, num_attention_heads=12,
                                          image_size=224, patch_size=16),
                              mm_tokens_per_image=49),
    # google/gemma-3-4b-it's tower (SigLIP so400m at 896 pixels): 4096 patches -> 256 tokens
    "gemma3-so400m-shape": dict(vision=dict(hidden_size=1152, intermediate_size=4304,
                                            num_hidden_layers=27, num_attention_heads=16,
                                            image_size=896, patch_size=14),
                                mm_tokens_per_image=256),
}






def pixels(name: str) -> np.ndarray:
    S = MODELS[name]["vision"]["image_size"]
    return np.random.default_rng(SEED).standard_normal((3, S, S)).astype(np.float32)


def child_make(name: str, folder: str) -> None:
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(SEED)
    spec = MODELS[name]
    cfg = Gemma3Config(text_config=TEXT, vision_config={**spec["vision"], "vision_use_head": False},
                       mm_tokens_per_image=spec["mm_tokens_per_image"], boi_token_index=1001,
                       eoi_token_index=1002, image_token_index=1003)
    model = Gemma3ForConditionalGeneration(cfg).to(torch.float32).eval()
    with torch.no_grad():  # the projector starts at zero: give it values
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.02)
    with new_folder(folder) as tmp:
        model.save_pretrained(tmp)
        vocab = {f"t{i}": i for i in range(1004)}
        Tokenizer(WordLevel(vocab, unk_token="t0")).save(os.path.join(tmp, "tokenizer.json"))
    report({"folder": folder})


def child_ours(folder: str, name: str, repeat: int, threads: int) -> None:
    sys.path.insert(0, ROOT)
    t0 = time.perf_counter()
    from causallm import kernels
    from causallm.factory import Factory

    used = kernels.set_num_threads(threads)
    model = Factory.Instance().createFromFolder(folder, init_seq_len=16, num_to_generate=1)
    model.initialize()
    model.load_weight()
    load_s = time.perf_counter() - t0
    x = pixels(name)

    def run():
        t = time.perf_counter()
        _, features = model.runVision(x)
        return (time.perf_counter() - t) * 1e3, features

    run()
    runs = [run() for _ in range(repeat)]
    report({"threads": used, "load_s": load_s, "ms": [r[0] for r in runs],
            "features": runs[-1][1].tolist(), "peak_rss_mb": peak_rss_mb()})


def child_torch(folder: str, name: str, repeat: int, threads: int) -> None:
    t0 = time.perf_counter()
    import torch
    from transformers import Gemma3ForConditionalGeneration

    torch.set_num_threads(threads)
    model = Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    x = torch.from_numpy(pixels(name))[None]

    def run():
        with torch.inference_mode():
            t = time.perf_counter()
            out = model.get_image_features(x, return_dict=True).pooler_output
            return (time.perf_counter() - t) * 1e3, out[0].numpy()

    run()
    runs = [run() for _ in range(repeat)]
    report({"threads": torch.get_num_threads(), "load_s": load_s, "ms": [r[0] for r in runs],
            "features": runs[-1][1].tolist(), "peak_rss_mb": peak_rss_mb(),
            "torch": torch.__version__, "attn": model.config._attn_implementation})




def bench_model(name: str, args, log) -> dict:
    folder = os.path.join(args.cache_dir, f"vision-{name}-seed{SEED}")
    if not os.path.isdir(folder):
        os.makedirs(args.cache_dir, exist_ok=True)
        log(f"[make] {name} -> {folder}")
        spawn(__file__, ["make", name, folder], args.threads)
    out = {"model": name, "patches": (MODELS[name]["vision"]["image_size"]
                                      // MODELS[name]["vision"]["patch_size"]) ** 2}
    features = {}
    for engine in ("ours", "torch"):
        log(f"[{name}] {engine} ...")
        r = spawn(__file__, [engine, folder, name, str(args.repeat), str(args.threads)],
                  args.threads)
        features[engine] = np.array(r.pop("features"), dtype=np.float32)
        out[engine] = {"ms": min(r["ms"]), "load_s": r["load_s"],
                       "peak_rss_mb": r["peak_rss_mb"]}
    scale = float(np.abs(features["torch"]).max())
    out["max_rel_diff"] = float(np.abs(features["ours"] - features["torch"]).max()) / scale
    if out["max_rel_diff"] > 1e-4:
        log(f"WARNING: {name}: features differ by {out['max_rel_diff']:.2g} of their scale")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "causallm-bench"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    for flag, value in (("-t", args.threads), ("--repeat", args.repeat)):
        if value < 1:
            ap.error(f"{flag} must be at least 1")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    results = [bench_model(name, args, log) for name in args.models]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"threads {args.threads}, one image, best of {args.repeat} runs after a warm-up; "
          f"float32")
    print(f"{'model':22} {'patches':>8} {'engine':6} {'ms':>9} {'vs torch':>9} "
          f"{'peak RSS MB':>12}")
    for r in results:
        for engine in ("ours", "torch"):
            e = r[engine]
            print(f"{r['model']:22} {r['patches']:8} {engine:6} {e['ms']:9.1f} "
                  f"{r['torch']['ms'] / e['ms']:9.2f} {e['peak_rss_mb']:12.0f}")
        print(f"{'':22} features agree to {r['max_rel_diff']:.1e} of their scale")


def child_main(argv: list[str]) -> None:
    kind, rest = argv[0], argv[1:]
    if kind == "make":
        child_make(rest[0], rest[1])
        return
    folder, name, repeat, threads = rest
    child = child_ours if kind == "ours" else child_torch
    child(folder, name, int(repeat), int(threads))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        main()
