"""Convert a Hugging Face model folder into a GGUF file that llama.cpp and main.py run (no torch).

    python tools/hf_to_gguf.py MODEL_DIR [-o OUT.gguf] [--type Q8_0] [--embd-type Q8_0]
                               [--tensor-type PATTERN=TYPE ...]

Families: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM (text). The
file is what llama.cpp's own converter writes for them:

- metadata ``{arch}.*`` from config.json (block_count, embedding_length, feed_forward_length,
  head counts, key_length, rms epsilon, RoPE base and linear / yarn scaling, Gemma 3's sliding
  window and softcaps), ``general.*``; Llama 3's RoPE scaling as llama.cpp writes it, the
  ``rope_freqs.weight`` tensor of per-frequency factors;
- the tokenizer from tokenizer.json: a byte-level BPE as ``tokenizer.ggml.model = "gpt2"``
  (tokens, token types, merges, ``pre`` named after the pre-tokenizer's split: llama-bpe,
  qwen2 or gpt-2), a SentencePiece-style BPE (Metaspace + byte fallback) as "llama" with scores
  that rank the merges; special added tokens as control tokens, others as user-defined; BOS /
  EOS ids and whether the post-processor adds them; tokenizer_config.json's chat template;
- tensors under llama.cpp's names (gguf's TensorNameMap); Llama's q/k rows permuted as
  llama.cpp's converter does (each head's two rotary halves interleaved), Gemma's norm weights
  stored plus 1.

Types: 2-D weight matrices as ``--type`` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4;
default Q8_0), the token embedding as ``--embd-type`` (default: ``--type``), a matrix whose
rows are not whole blocks as F16 (F32 for --type F32); norms and biases F32. ``--tensor-type
REGEX=TYPE`` (repeatable, first match wins) sets the type of the GGUF tensors whose name the
regex finds, e.g. ``ffn_.*=Q4_0``. Quantization is gguf-py's (ggml's reference quantizers).
The file is written atomically.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from causallm.errors import CausalLMError  # noqa: E402
from causallm.io.config import load_json  # noqa: E402
from causallm.io.gguf_file import ARCHITECTURES  # noqa: E402
from causallm.io.gguf_tokenizer import PRE_TOKENIZER_SPLITS, bytes_to_unicode  # noqa: E402
from causallm.io.safetensors import Checkpoint  # noqa: E402

ARCH_OF = {hf: arch for arch, hf in ARCHITECTURES.items()}
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4")
FILE_TYPES = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "Q8_0": "MOSTLY_Q8_0",
              "Q4_0": "MOSTLY_Q4_0", "Q4_1": "MOSTLY_Q4_1", "Q5_0": "MOSTLY_Q5_0",
              "Q5_1": "MOSTLY_Q5_1", "MXFP4": "MOSTLY_MXFP4_MOE"}
PRE_NAMES = {PRE_TOKENIZER_SPLITS["llama-bpe"]: "llama-bpe", PRE_TOKENIZER_SPLITS["qwen2"]: "qwen2"}
"""The split regex of a tokenizer.json -> the ``tokenizer.ggml.pre`` llama.cpp knows it by."""

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


def convert(model_dir: str, out: str, type_: str = "Q8_0", embd_type: str | None = None,
            tensor_types: list[tuple[str, str]] = ()) -> str:
    import gguf

    cfg = load_json(os.path.join(model_dir, "config.json"))
    gen = load_json(os.path.join(model_dir, "generation_config.json"), required=False)
    hf_arch = (cfg.get("architectures") or [None])[0]
    if hf_arch not in ARCH_OF:
        raise CausalLMError(f"{cfg.path}: architectures[0] {hf_arch!r} cannot be written as GGUF "
                            f"(supported: {', '.join(ARCH_OF)})")
    arch = ARCH_OF[hf_arch]
    for t in (type_, embd_type or type_, *(t for _, t in tensor_types)):
        if t not in TYPES:
            raise CausalLMError(f"type {t!r} is not one of {', '.join(TYPES)}")
    tmp = out + ".tmp"
    writer = gguf.GGUFWriter(tmp, arch)
    try:
        _metadata(writer, gguf, cfg, gen, arch, model_dir, type_)
        _tensors(writer, gguf, cfg, arch, model_dir, type_, embd_type or type_, tensor_types)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return out


def _metadata(w, gguf, cfg, gen, arch, model_dir, type_) -> None:
    hidden, heads = cfg.get_int("hidden_size"), cfg.get_int("num_attention_heads")
    head_dim = cfg.get_int("head_dim", hidden // heads)
    w.add_name(os.path.basename(os.path.abspath(model_dir)))
    w.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES[type_]))
    w.add_context_length(cfg.get_int("max_position_embeddings", 4096))
    w.add_embedding_length(hidden)
    w.add_block_count(cfg.get_int("num_hidden_layers"))
    w.add_feed_forward_length(cfg.get_int("intermediate_size"))
    w.add_head_count(heads)
    w.add_head_count_kv(cfg.get_int("num_key_value_heads", heads))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(cfg.get_float("rms_norm_eps", 1e-6))
    w.add_vocab_size(cfg.get_int("vocab_size"))
    rope = cfg.get("rope_parameters") or {}
    local = rope.get("sliding_attention", {})
    rope = rope.get("full_attention", rope)  # Gemma 3: the global layers' (scaled) RoPE
    scaling = _rope_scaling(cfg)
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    w.add_rope_freq_base(float(theta))
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in (None, "default", "llama3"):  # llama3: the rope_freqs.weight tensor instead
        if kind not in ("linear", "yarn"):
            raise CausalLMError(f"{cfg.path}: RoPE scaling {kind!r} has no GGUF form here "
                                f"(linear, yarn, llama3)")
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR if kind == "linear"
                                else gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(scaling["factor"]))
        if kind == "yarn":
            w.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
    if arch == "gemma3":
        layers = cfg.get_int("num_hidden_layers")
        pattern = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                   for i in range(layers)]
        if cfg.get("layer_types", pattern) != pattern:
            raise CausalLMError(f"{cfg.path}: GGUF Gemma 3 has a full-attention layer every 6th "
                                f"layer; this config's layer_types differ")
        if float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10000.0))) != 10000.0:
            raise CausalLMError(f"{cfg.path}: GGUF Gemma 3's local RoPE base is 10000")
        expected = hidden // heads if layers == 62 else head_dim
        if cfg.get_int("query_pre_attn_scalar", expected) != expected:
            raise CausalLMError(f"{cfg.path}: GGUF Gemma 3 scales queries by {expected}^-1/2; "
                                f"query_pre_attn_scalar differs")
        w.add_sliding_window(cfg.get_int("sliding_window"))
        if cfg.get("final_logit_softcapping") is not None:
            w.add_final_logit_softcapping(float(cfg["final_logit_softcapping"]))
        if cfg.get("attn_logit_softcapping") is not None:
            w.add_attn_logit_softcapping(float(cfg["attn_logit_softcapping"]))
    _tokenizer(w, cfg, gen, model_dir)


def _tokenizer(w, cfg, gen, model_dir) -> None:
    tok = load_json(os.path.join(model_dir, "tokenizer.json"))
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise CausalLMError(f"{tok.path}: only BPE tokenizers are written (got "
                            f"{model.get('type')!r})")
    vocab = dict(model["vocab"])
    added = {a["id"]: a for a in tok.get("added_tokens") or []}
    for i, a in added.items():
        vocab[a["content"]] = i
    n = max(cfg.get_int("vocab_size"), max(vocab.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [USER_DEFINED] * n
    for t, i in vocab.items():
        tokens[i], types[i] = t, NORMAL
    for i, a in added.items():
        types[i] = CONTROL if a.get("special") else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    pre = tok.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre])
    byte_level = any(s.get("type") == "ByteLevel" for s in steps)
    if byte_level:
        w.add_tokenizer_model("gpt2")
        split = next((s["pattern"].get("Regex") for s in steps if s.get("type") == "Split"), None)
        if split is None:
            name = "gpt-2"
        elif split in PRE_NAMES:
            name = PRE_NAMES[split]
        else:
            raise CausalLMError(f"{tok.path}: its pre-tokenizer split matches no llama.cpp "
                                f"pre-tokenizer type (llama-bpe, qwen2, gpt-2)")
        w.add_tokenizer_pre(name)
        w.add_token_merges(merges)
        alphabet = set(bytes_to_unicode().values())
        for i, t in enumerate(tokens):  # a special token outside the byte alphabet stays as is
            if types[i] == NORMAL and not set(t) <= alphabet:
                raise CausalLMError(f"{tok.path}: token {t!r} is not byte-level")
    elif model.get("byte_fallback") and any(s.get("type") == "Metaspace" for s in steps):
        w.add_tokenizer_model("llama")
        # SentencePiece merges by score: a merged token scores minus its merge's rank
        scores = [0.0] * n
        for rank, m in enumerate(merges):
            merged = m.replace(" ", "", 1)
            if merged in vocab and scores[vocab[merged]] == 0.0:
                scores[vocab[merged]] = -float(rank + 1)
        for i, t in enumerate(tokens):
            if re.fullmatch(r"<0x[0-9A-F]{2}>", t):
                types[i] = BYTE
        if model.get("unk_token") in vocab:
            types[vocab[model["unk_token"]]] = UNKNOWN
        w.add_token_scores(scores)
        meta = next(s for s in steps if s.get("type") == "Metaspace")
        w.add_add_space_prefix(meta.get("prepend_scheme", "always") != "never")
    else:
        raise CausalLMError(f"{tok.path}: neither a byte-level BPE nor a SentencePiece-style BPE")
    w.add_token_list(tokens)
    w.add_token_types(types)
    post = tok.get("post_processor") or {}
    single = (post.get("single") or []) if post.get("type") == "TemplateProcessing" else []
    first = single[0].get("SpecialToken") if single else None
    last = single[-1].get("SpecialToken") if single else None
    bos = gen.get("bos_token_id", cfg.get("bos_token_id"))
    eos = gen.get("eos_token_id", cfg.get("eos_token_id"))
    eos = eos[0] if isinstance(eos, list) else eos
    if bos is not None:
        w.add_bos_token_id(int(bos))
    if eos is not None:
        w.add_eos_token_id(int(eos))
    w.add_add_bos_token(first is not None)
    w.add_add_eos_token(last is not None and len(single) > 1)
    config = load_json(os.path.join(model_dir, "tokenizer_config.json"), required=False)
    if isinstance(config.get("chat_template"), str):
        w.add_chat_template(config["chat_template"])


def _rope_scaling(cfg) -> dict:
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    if cfg.get("rope_scaling"):
        return cfg["rope_scaling"]
    return rope if rope.get("rope_type", "default") != "default" else {}


def llama3_rope_factors(cfg, head_dim: int) -> np.ndarray:
    """llama.cpp's ``rope_freqs.weight`` for Llama 3's RoPE scaling: per inverse frequency
    1 / theta^(2j / d), with wavelen = 2 pi / it, L = original_max_position_embeddings: 1 where
    wavelen < L / high_freq_factor, ``factor`` where wavelen > L / low_freq_factor, else
    1 / ((1 - s) / factor + s), s = (L / wavelen - low_freq_factor) / (high - low)."""
    s = _rope_scaling(cfg)
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    factor, low, high = float(s["factor"]), float(s.get("low_freq_factor", 1.0)), \
        float(s.get("high_freq_factor", 4.0))
    L = float(s["original_max_position_embeddings"])
    out = []
    for j in range(0, head_dim, 2):
        wavelen = 2 * np.pi * theta ** (j / head_dim)
        if wavelen < L / high:
            out.append(1.0)
        elif wavelen > L / low:
            out.append(factor)
        else:
            smooth = (L / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _tensors(w, gguf, cfg, arch, model_dir, type_, embd_type, tensor_types) -> None:
    ckpt = Checkpoint(model_dir)
    scaling = _rope_scaling(cfg)
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        heads = cfg.get_int("num_attention_heads")
        w.add_tensor("rope_freqs.weight",
                     llama3_rope_factors(cfg, cfg.get_int("head_dim",
                                                          cfg.get_int("hidden_size") // heads)))
    layers = cfg.get_int("num_hidden_layers")
    names = gguf.get_tensor_name_map({v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch],
                                     layers)
    heads = cfg.get_int("num_attention_heads")
    kv_heads = cfg.get_int("num_key_value_heads", heads)
    tied = cfg.get_bool("tie_word_embeddings", arch == "gemma3")
    for hf in ckpt.keys():
        if hf.endswith("rotary_emb.inv_freq") or (tied and hf == "lm_head.weight"):
            continue
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise CausalLMError(f"{ckpt.file_of(hf)}: tensor '{hf}' has no GGUF name for {arch}")
        a = np.ascontiguousarray(ckpt.get(hf), dtype=np.float32)
        if arch == "llama" and re.search(r"\.attn_[qk]\.", name):
            n = heads if ".attn_q." in name else kv_heads
            a = a.reshape(n, 2, a.shape[0] // n // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
        if arch == "gemma3" and name.endswith("norm.weight"):
            a = a + np.float32(1.0)
        kind = "F32"
        if a.ndim == 2:
            kind = next((t for p, t in tensor_types if re.search(p, name)),
                        embd_type if name == "token_embd.weight" else type_)
            block = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, kind)][0]
            if a.shape[1] % block:
                kind = "F32" if type_ == "F32" else "F16"
        qtype = getattr(gguf.GGMLQuantizationType, kind)
        if kind == "F32":
            w.add_tensor(name, a)
        elif kind == "F16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("-o", "--out", help="output file (default: MODEL_DIR/<folder>-<type>.gguf)")
    p.add_argument("--type", default="Q8_0", type=str.upper, choices=TYPES)
    p.add_argument("--embd-type", type=str.upper, choices=TYPES)
    p.add_argument("--tensor-type", action="append", default=[], metavar="REGEX=TYPE")
    args = p.parse_args(argv)
    pairs = []
    for item in args.tensor_type:
        pattern, _, kind = item.rpartition("=")
        if not pattern:
            p.error(f"--tensor-type {item!r}: expected REGEX=TYPE")
        pairs.append((pattern, kind.upper()))
    folder = os.path.basename(os.path.abspath(args.model_dir))
    out = args.out or os.path.join(args.model_dir, f"{folder}-{args.type}.gguf")
    try:
        convert(args.model_dir, out, args.type, args.embd_type, pairs)
    except CausalLMError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{out}: {os.path.getsize(out) / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
