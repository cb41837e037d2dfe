"""Train the embedded default model res/tiny-llama/ (a small Llama 3 style LlamaForCausalLM).

Data: the pydoc topics text (see tools/train_tokenizer.py), each topic encoded as
``ids + [EOS]`` and concatenated into one stream of T tokens. The stream is cut into 20 equal
parts; part 10 is the validation set, the rest (joined) the training set.

Model (about 5.4 M parameters, ~10.8 MB in BF16): vocab 4003, hidden 256, 6 layers, 8 query
heads and 4 KV heads of size 32 (GQA 2), SwiGLU intermediate 688, RMSNorm eps 1e-5, RoPE theta
1e4, max_position_embeddings 512, tied input/output embeddings.

Training: windows of SEQ_LEN tokens, ``x = [BOS] + s[o : o + SEQ_LEN - 1]`` and
``y = s[o : o + SEQ_LEN]`` at uniform random offsets o, so position 0 always holds BOS, as in
a prompt. Loss = mean next-token cross-entropy. AdamW (betas 0.9/0.95, weight decay 0.1 on
matrices), learning rate ``lr * min(1, step / warmup)`` then cosine down to lr/10, where the
cosine's progress is ``max(step / steps, elapsed / budget)``: the run ends at ``--steps`` or
after ``--minutes``, whichever comes first, with the schedule finished. Dropout p on the
embedding output and on each attention/MLP output before the residual add (training only;
transformers' Llama has none, so it is added with forward hooks). Validation loss over
non-overlapping windows every ``--eval-every`` steps; the best model so far is written to
OUT in BF16 with save_pretrained, plus a torch checkpoint for ``--resume``.

Usage (about 40 minutes on 2 CPU cores):
    nohup python tools/train_default_model.py > /tmp/train_tiny_llama.log 2>&1 &
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_tokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ_LEN = 256

MODEL = dict(vocab_size=train_tokenizer.VOCAB_SIZE, hidden_size=256, intermediate_size=688,
             num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
             hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-5,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
             tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
             bos_token_id=train_tokenizer.VOCAB_SIZE - 2, eos_token_id=train_tokenizer.VOCAB_SIZE - 1)

SAMPLE_INPUT = "Strings are immutable sequences of"
SAMPLE_PROMPTS = [SAMPLE_INPUT, "The for statement is used to", "A class definition defines",
                  "When an exception is raised,"]
# HF repetition_penalty for generation_config.json: plain greedy loops on "the exception is executed".
REPETITION_PENALTY = 1.2

NNTR_CONFIG = {
    "model_type": "CausalLM",
    "model_tensor_type": "FP32-FP32",
    "model_file_name": "model.safetensors",
    "tokenizer_file": "tokenizer.json",
    "init_seq_len": 256,
    "max_seq_len": 512,
    "num_to_generate": 96,
    "batch_size": 1,
    "bad_word_ids": [],
    "embedding_dtype": "FP32",
    "fc_layer_dtype": "FP32",
    "sample_input": SAMPLE_INPUT,
}


def token_streams(tokenizer_path: str):
    """Return (train_ids, val_ids) int64 arrays cut from the pydoc topics token stream."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    eos = tok.token_to_id(train_tokenizer.EOS)
    import pydoc_data.topics as topics
    parts = [tok.encode(topics.topics[k], add_special_tokens=False).ids + [eos] for k in sorted(topics.topics)]
    stream = np.array([t for p in parts for t in p], dtype=np.int64)
    a, b = len(stream) * 10 // 20, len(stream) * 11 // 20
    return np.concatenate([stream[:a], stream[b:]]), stream[a:b]


def batch(ids: np.ndarray, offsets: np.ndarray, bos: int):
    """x (B, SEQ_LEN) = BOS + ids[o : o+SEQ_LEN-1]; y (B, SEQ_LEN) = ids[o : o+SEQ_LEN]."""
    import torch
    y = np.stack([ids[o:o + SEQ_LEN] for o in offsets])
    x = np.concatenate([np.full((len(offsets), 1), bos), y[:, :-1]], axis=1)
    return torch.from_numpy(x), torch.from_numpy(y)


def add_dropout(model, p: float):
    """Dropout(p) on embeddings and on each o_proj / down_proj output (active in train mode)."""
    import torch.nn.functional as F

    def hook(module, args, output):
        return F.dropout(output, p, module.training)

    model.model.embed_tokens.register_forward_hook(hook)
    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(hook)
        layer.mlp.down_proj.register_forward_hook(hook)


def loss_on(model, x, y):
    import torch.nn.functional as F
    logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def evaluate(model, val: np.ndarray, bos: int, batch_size: int = 16) -> float:
    """Mean cross-entropy over non-overlapping SEQ_LEN windows of val."""
    import torch
    offsets = np.arange(0, len(val) - SEQ_LEN + 1, SEQ_LEN)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(offsets), batch_size):
            x, y = batch(val, offsets[i:i + batch_size], bos)
            total += float(loss_on(model, x, y)) * y.numel()
            count += y.numel()
    model.train()
    return total / count


def export(model, out_dir: str, tokenizer_dir: str) -> None:
    """Write the HF folder: BF16 model.safetensors, clean config.json, generation/nntr configs, tokenizer."""
    import torch
    from transformers import GenerationConfig

    tmp = out_dir.rstrip("/") + ".tmp"
    if os.path.isdir(tmp):
        shutil.rmtree(tmp)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(tmp)
    with open(os.path.join(tmp, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["attention_dropout"] = 0.0
    cfg.pop("pad_token_id", None)
    _write_json(os.path.join(tmp, "config.json"), dict(sorted(cfg.items())))
    GenerationConfig(bos_token_id=MODEL["bos_token_id"], eos_token_id=MODEL["eos_token_id"], do_sample=False,
                     repetition_penalty=REPETITION_PENALTY).save_pretrained(tmp)
    _write_json(os.path.join(tmp, "nntr_config.json"), NNTR_CONFIG)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), tmp)
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(tmp):
        os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
    os.rmdir(tmp)


def report(out_dir: str, tokenizer_dir: str, n_new: int = 64) -> None:
    """Print the saved folder's val loss (BF16 weights widened to float32) and greedy samples."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out_dir)
    _, val = token_streams(os.path.join(tokenizer_dir, "tokenizer.json"))
    print(f"{out_dir}: val loss {evaluate(model, val, MODEL['bos_token_id']):.4f}", flush=True)
    model.eval()
    gen = model.generation_config
    for prompt in SAMPLE_PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        for penalty in (1.0, gen.repetition_penalty or 1.0) if gen.repetition_penalty else (1.0,):
            out = model.generate(ids, max_new_tokens=n_new, do_sample=False, repetition_penalty=penalty)
            text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=False)
            print(f"--- greedy, repetition_penalty {penalty}: {prompt!r}\n{prompt}{text}\n", flush=True)


def _write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "res", "tiny-llama"))
    ap.add_argument("--tokenizer-dir", default=os.path.join(ROOT, "res", "tiny-llama"),
                    help="folder with tokenizer.json/tokenizer_config.json from train_tokenizer.py")
    ap.add_argument("--work", default="/tmp/tiny-llama-train", help="checkpoint folder")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=40.0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--report", action="store_true", help="only print OUT's val loss and greedy samples")
    ap.add_argument("--reexport", action="store_true", help="only rewrite OUT from its own weights (new configs)")
    args = ap.parse_args(argv)

    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    if args.report:
        report(args.out, args.tokenizer_dir)
        return 0
    if args.reexport:
        from transformers import AutoModelForCausalLM
        export(AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32), args.out, args.tokenizer_dir)
        return 0
    train, val = token_streams(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    bos = MODEL["bos_token_id"]
    print(f"tokens: train {len(train)}, val {len(val)}", flush=True)

    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(LlamaConfig(**MODEL)).to(torch.float32)
    model.config._attn_implementation = "sdpa"
    add_dropout(model, args.dropout)
    print(f"parameters: {sum(p.numel() for p in model.parameters())}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.work, exist_ok=True)
    ckpt = os.path.join(args.work, "ckpt.pt")
    step, best, spent = 0, float("inf"), 0.0
    if args.resume and os.path.exists(ckpt):
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, best, spent = state["step"], state["best"], state["spent"]
        rng.bit_generator.state = state["rng"]
        print(f"resumed at step {step}, best val {best:.4f}", flush=True)

    budget = args.minutes * 60.0
    start = time.time() - spent
    model.train()
    run_loss, run_n = 0.0, 0
    while True:
        progress = max(step / args.steps, (time.time() - start) / budget)
        if progress >= 1.0:
            break
        lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        lr = min(lr, args.lr * (step + 1) / args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch(train, rng.integers(0, len(train) - SEQ_LEN, args.batch), bos)
        loss = loss_on(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        run_loss, run_n = run_loss + float(loss.detach()), run_n + 1
        if step % args.eval_every == 0:
            v = evaluate(model, val, bos)
            note = ""
            if v < best:
                best = v
                export(model, args.out, args.tokenizer_dir)
                note = " (saved)"
            elapsed = time.time() - start
            print(f"step {step} lr {lr:.2e} train {run_loss / run_n:.4f} val {v:.4f}{note} "
                  f"[{elapsed / 60:.1f} min]", flush=True)
            run_loss, run_n = 0.0, 0
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "best": best,
                        "spent": elapsed, "rng": rng.bit_generator.state}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
    v = evaluate(model, val, bos)
    if v < best:
        best = v
        export(model, args.out, args.tokenizer_dir)
    print(f"done at step {step}: final val {v:.4f}, best val {best:.4f} -> {args.out}", flush=True)
    report(args.out, args.tokenizer_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
