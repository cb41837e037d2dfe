"""GGUF files (llama.cpp's single-file format) read as a model folder: config, tokenizer, weights.

A GGUF holds typed metadata (``{arch}.block_count``, ``tokenizer.ggml.tokens``, ...) and named
tensors (``blk.{i}.attn_q.weight``) in ggml types. ``GGUFFile(path)`` parses it with our own
reader (causallm/io/gguf_reader.py: one read-only map, arrays read in bulk; under 0.1 s of
CPU for Gemma 3's 262,144-token vocabulary); its ``metadata`` holds Python values (a
numeric array as a list), its ``tensors`` the reader's records (``data`` the raw bytes, mapped).
gguf-py supplies the constants and the tensor name maps, not the reading:

- ``GGUFFile.config()`` is the Hugging Face ``config.json`` the metadata stands for (what
  ``Factory`` and the families read), ``generation()`` its ``generation_config.json``;
- ``GGUFFile.tokenizer()`` is the vocabulary's tokenizer (``GGUFTokenizer``,
  causallm/io/gguf_tokenizer.py: a byte-level BPE, ``tokenizer.ggml.model`` "gpt2", or a
  SentencePiece BPE, "llama", built on arrays in tens of milliseconds). It gives llama.cpp's
  token ids (tests/test_gguf.py checks both real files against them), which are transformers'
  GGUF tokenizer's but where llama.cpp splits digits apart first;
- ``GGUFCheckpoint`` presents the tensors under the Hugging Face names a weight table asks for
  (gguf's ``TensorNameMap``), undoing what llama.cpp's converter did to them: Llama's q/k rows
  are un-permuted (the converter interleaves the two halves of each head for its RoPE), Gemma's
  norm weights lose the 1 the converter added.

Weights keep their precision and stay views of the mapped file: F32 as float32; F16, BF16 and
every ggml block type with a kernel (Q4_0 ... Q8_0, the K-quants, IQ4_NL, IQ4_XS:
causallm/kernels/quant.py) as packed matrices of the file's bytes. Llama's q and k rows are
copied into Hugging Face's order. A type without a kernel (the IQ2 / IQ3 / TQ types, ...) is
dequantized exactly and then, by default, held as Q8_0; ``--dtype`` chooses otherwise.

Supported ``general.architecture``: llama, qwen2, qwen3, gemma3 (text).
"""

from __future__ import annotations

import os

import numpy as np

from causallm.errors import CausalLMError
from causallm.io.config import gguf_in_folder, is_gguf  # noqa: F401  (found there, read here)
from causallm.io.files import release_pages
from causallm.io.gguf_reader import GGUFContents
from causallm.io.gguf_tokenizer import GGUFTokenizer
from causallm.io.weight_check import check_weight
from causallm.kernels.packed import PackedMatrix
from causallm.kernels.quant import QTYPES

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}
"""GGUF ``general.architecture`` -> the Hugging Face architecture it is run as."""

CONFIG_TENSORS = ("rope_freqs.weight",)
"""Tensors that hold configuration, read into config() rather than into a weight."""

def _python(value):
    """A metadata value with its numpy arrays as lists (the Python types the configs read;
    ``value()`` returns these, ``metadata`` holds the reader's arrays)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list) and value and not isinstance(value[0], str):
        return [_python(v) for v in value]
    return value


def _gguf():
    try:
        import gguf
    except ImportError:  # pragma: no cover - a declared dependency
        raise CausalLMError("reading a GGUF file needs the gguf package (pip install gguf)") \
            from None
    return gguf


class GGUFFile:
    """One .gguf file: its metadata and tensors (memory-mapped, read-only)."""

    def __init__(self, path: str) -> None:
        self.path = os.fspath(path)
        self.contents = GGUFContents(self.path)
        self.metadata = self.contents.metadata
        self.tensors = self.contents.tensors
        self.architecture = self.metadata.get("general.architecture")
        if self.architecture not in ARCHITECTURES:
            raise CausalLMError(f"{self.path}: general.architecture {self.architecture!r} is not "
                                f"supported (supported: {', '.join(ARCHITECTURES)})")

    # -- metadata ---------------------------------------------------------------------------
    def value(self, key: str, default=None, required: bool = False):
        """Metadata ``key`` ("{arch}." prefixed when it starts with a dot)."""
        full = self.architecture + key if key.startswith(".") else key
        if full not in self.metadata:
            if required:
                raise CausalLMError(f"{self.path}: missing metadata key '{full}'")
            return default
        return _python(self.metadata[full])

    def _int(self, key: str, default=None, required: bool = False) -> int | None:
        v = self.value(key, default, required)
        if isinstance(v, list):  # per-layer values: one model-wide value is all that is run
            if len(set(v)) != 1:
                raise CausalLMError(f"{self.path}: '{self.architecture + key}' differs between "
                                    f"layers ({v}); only one value for all layers is supported")
            v = v[0]
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise CausalLMError(f"{self.path}: '{self.architecture + key}' must be a number, "
                                f"got {v!r}")
        return None if v is None else int(v)

    def config(self) -> dict:
        """The Hugging Face config.json of the model the metadata describes."""
        arch = self.architecture
        hidden = self._int(".embedding_length", required=True)
        heads = self._int(".attention.head_count", required=True)
        layers = self._int(".block_count", required=True)
        kv_heads = self._int(".attention.head_count_kv", heads)
        head_dim = self._int(".attention.key_length", None) or \
            self._int(".rope.dimension_count", None) or hidden // heads
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        vocab = self._int(".vocab_size", None) or (len(tokens) if tokens else None)
        if vocab is None and "token_embd.weight" in self.tensors:
            vocab = int(self.tensors["token_embd.weight"].shape[-1])
        if vocab is None:
            raise CausalLMError(f"{self.path}: no vocabulary size ('{arch}.vocab_size', "
                                f"tokenizer.ggml.tokens or token_embd.weight)")
        cfg = {
            "architectures": [ARCHITECTURES[arch]],
            "model_type": arch,
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": self._int(".feed_forward_length", required=True),
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "rms_norm_eps": float(self.value(".attention.layer_norm_rms_epsilon", 1e-6)),
            "max_position_embeddings": self._int(".context_length", 4096),
            "rope_theta": float(self.value(".rope.freq_base", 10000.0)),
            "rope_scaling": self._rope_scaling(),
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "torch_dtype": "float32",
        }
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            token = self.metadata.get(f"tokenizer.ggml.{key}")
            if token is not None:
                cfg[key] = int(token)
        if arch == "llama":
            cfg["attention_bias"] = "blk.0.attn_q.bias" in self.tensors
            cfg["mlp_bias"] = "blk.0.ffn_up.bias" in self.tensors
            if CONFIG_TENSORS[0] in self.tensors:
                cfg["rope_scaling"] = self._llama3_scaling(head_dim, cfg["rope_theta"])
        if arch == "gemma3":
            cfg["model_type"] = "gemma3_text"
            # llama.cpp's Gemma 3: sliding-window layers 5 of every 6, their RoPE base 10000,
            # queries scaled by head_dim^-1/2 (hidden / heads for the 62-layer 27B)
            cfg["sliding_window"] = self._int(".attention.sliding_window", 4096)
            cfg["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                  for i in range(layers)]
            cfg["rope_local_base_freq"] = 10000.0
            cfg["query_pre_attn_scalar"] = hidden // heads if layers == 62 else head_dim
            cfg["hidden_activation"] = "gelu_pytorch_tanh"
            for key in ("final_logit_softcapping", "attn_logit_softcapping"):
                value = self.value(f".{key}", None)
                cfg[key] = None if value is None else float(value)
        return cfg

    def _rope_scaling(self) -> dict | None:
        kind = self.value(".rope.scaling.type", None)
        if kind in (None, "none"):
            return None
        factor = float(self.value(".rope.scaling.factor", 1.0))
        if kind == "linear":
            return {"rope_type": "linear", "factor": factor}
        if kind == "yarn":
            return {"rope_type": "yarn", "factor": factor,
                    "original_max_position_embeddings":
                        self._int(".rope.scaling.original_context_length", required=True)}
        raise CausalLMError(f"{self.path}: '{self.architecture}.rope.scaling.type' {kind!r} is "
                            f"not supported (none, linear, yarn)")

    def _llama3_scaling(self, head_dim: int, theta: float) -> dict:
        """Llama 3's rope_scaling from ``rope_freqs.weight``, the factors f[j] that llama.cpp
        divides inverse frequency j by (its converter writes them instead of the parameters):
        f = 1 where wavelen < L / high_freq_factor, ``factor`` where wavelen > L /
        low_freq_factor, else 1 / ((1 - s) / factor + s), s = (L / wavelen - low_freq_factor) /
        (high_freq_factor - low_freq_factor). Llama 3.x's own values (1, 4, L = 8192) are tried
        first, else the line s(L / wavelen) fitted through the blended factors (only the ratios
        of L and the two factors matter); either must give the file's factors back."""
        t = self.tensors[CONFIG_TENSORS[0]]
        if t.tensor_type.name not in ("F32", "F16"):
            raise CausalLMError(f"{self.path}: '{CONFIG_TENSORS[0]}' is {t.tensor_type.name}; "
                                f"expected F32 factors")
        f = np.asarray(t.values(), dtype=np.float64).reshape(-1)
        if 2 * f.size != head_dim or not (np.isfinite(f).all() and (f > 0).all()):
            raise CausalLMError(f"{self.path}: '{CONFIG_TENSORS[0]}' holds {f.size} factors; "
                                f"expected {head_dim // 2} positive ones (head_dim / 2)")
        inv = theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        wavelen = 2 * np.pi / inv
        factor = float(f.max())
        L = float(self._int(".rope.scaling.original_context_length", 8192))

        def factors(low, high):
            s = np.clip((L / wavelen - low) / (high - low), 0.0, 1.0)
            return 1 / ((1 - s) / factor + s)

        candidates = [(1.0, 4.0)]
        blended = (f > 1 + 1e-6) & (f < factor * (1 - 1e-6))
        if factor > 1 and blended.sum() >= 2:
            s = (1 / f[blended] - 1 / factor) / (1 - 1 / factor)
            slope, intercept = np.polyfit(L / wavelen[blended], s, 1)
            if slope > 0:
                candidates.append((-intercept / slope, -intercept / slope + 1 / slope))
        for low, high in candidates:
            if high > low and np.allclose(factors(low, high), f, rtol=1e-5, atol=0):
                return {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(low),
                        "high_freq_factor": float(high),
                        "original_max_position_embeddings": int(L)}
        raise CausalLMError(f"{self.path}: '{CONFIG_TENSORS[0]}' does not follow Llama 3's RoPE "
                            f"scaling (factors between 1 and {factor:g} blended by wavelength)")

    def generation(self) -> dict:
        """generation_config.json: BOS, and every end-of-generation token as EOS (llama.cpp
        stops at EOS, EOT and EOM)."""
        eos = [int(self.metadata[f"tokenizer.ggml.{k}_token_id"]) for k in ("eos", "eot", "eom")
               if f"tokenizer.ggml.{k}_token_id" in self.metadata]
        gen = {"eos_token_id": list(dict.fromkeys(eos))}
        if "tokenizer.ggml.bos_token_id" in self.metadata:
            gen["bos_token_id"] = int(self.metadata["tokenizer.ggml.bos_token_id"])
        return gen

    @property
    def chat_template(self) -> str | None:
        return self.metadata.get("tokenizer.chat_template")

    def weightPrecision(self) -> str:
        """"FP32" when float32 tensors hold most of the weights, else "quantized" (16 bits or
        fewer a weight)."""
        count: dict[str, int] = {}
        for t in self.tensors.values():
            kind = t.tensor_type.name
            count[kind] = count.get(kind, 0) + int(t.n_elements)
        main = max(count, key=count.get) if count else "F32"
        return "FP32" if main == "F32" else "quantized"

    # -- tokenizer --------------------------------------------------------------------------
    def tokenizer(self) -> GGUFTokenizer:
        """The tokenizer the vocabulary metadata describes (causallm/io/gguf_tokenizer.py)."""
        return GGUFTokenizer.from_gguf(self)


class GGUFCheckpoint:
    """A GGUF file's tensors under the Hugging Face names of ``hf_names`` (a weight table's),
    with the checkpoint methods WeightTable.load reads (keys, shape, dtype, get, raw, file_of).

    ``get`` gives float32 (dequantized); ``raw`` gives a packable matrix as held: F32 as
    float32, F16 / BF16 / a type with a kernel as a PackedMatrix of the file's rows, another
    quantized type dequantized and packed as ``requantize`` (Q8_0 by default; None keeps the
    float32). A tensor no name maps to keeps its GGUF name (and the weight table reports it as
    unused)."""

    def __init__(self, file: GGUFFile, hf_names, requantize: str | None = "Q8_0") -> None:
        gguf = _gguf()
        self.file, self.folder, self.requantize = file, file.path, requantize
        arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[file.architecture]
        blocks = file._int(".block_count", required=True)
        names = gguf.get_tensor_name_map(arch, blocks)
        self._gguf_of: dict[str, str] = {}
        taken = set()
        for hf in hf_names:
            name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
            if name in file.tensors and name not in taken:
                self._gguf_of[hf] = name
                taken.add(name)
        self._names = list(self._gguf_of) + [n for n in file.tensors
                                             if n not in taken and n not in CONFIG_TENSORS]
        cfg = file.config()
        self._heads = {"attn_q": cfg["num_attention_heads"],
                       "attn_k": cfg["num_key_value_heads"]} if file.architecture == "llama" \
            else {}
        self._norm_shift = file.architecture.startswith("gemma")
        self.requantized: dict[str, int] = {}  # ggml type -> tensors raw() held as requantize

    def keys(self) -> list[str]:
        return list(self._names)

    def __contains__(self, name: str) -> bool:
        return name in self._gguf_of or name in self.file.tensors

    def __len__(self) -> int:
        return len(self._names)

    def _tensor(self, name: str):
        gname = self._gguf_of.get(name, name)
        if gname not in self.file.tensors:
            raise CausalLMError(f"{self.folder}: no tensor for '{name}'")
        return self.file.tensors[gname]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(n) for n in reversed(self._tensor(name).shape))

    def dtype(self, name: str) -> str:
        return self._tensor(name).tensor_type.name

    def file_of(self, name: str) -> str:
        return self.file.path

    def _rows(self, name: str):
        """The permutation that takes the file's rows to Hugging Face's, or None: Llama's q and k
        heads, whose two rotary halves llama.cpp's converter interleaved."""
        t = self._tensor(name)
        kind = t.name.split(".")[-2] if t.name.startswith("blk.") else ""
        heads = self._heads.get(kind)
        if heads is None:
            return None
        rows = self.shape(name)[0]
        hd = rows // heads
        idx = np.arange(rows).reshape(heads, hd // 2, 2)  # file row of (head, j, half)
        return idx.transpose(0, 2, 1).reshape(rows)       # HF row (head, half, j) reads it

    def _shifted(self, name: str, a: np.ndarray) -> np.ndarray:
        if self._norm_shift and self._tensor(name).name.endswith("norm.weight"):
            return a - np.float32(1.0)
        return a

    def get(self, name: str, zeros: bool = False) -> np.ndarray:
        """The tensor as float32 of its Hugging Face shape (dequantized exactly), checked for
        NaN and infinities, and with ``zeros`` for all zeros (``check_weight``)."""
        return check_weight(self._get(name), f"{self.folder}: tensor '{self._tensor(name).name}'",
                            zeros)

    def raw(self, name: str, zeros: bool = False):
        """A 2-D tensor as held (class docstring); others as ``get``; checked likewise (a
        quantized tensor's scales)."""
        return check_weight(self._raw(name), f"{self.folder}: tensor '{self._tensor(name).name}'",
                            zeros)

    def _get(self, name: str) -> np.ndarray:
        gguf = _gguf()
        t = self._tensor(name)
        kind = t.tensor_type.name
        try:
            if kind == "F32":
                a = np.asarray(t.values(), dtype=np.float32)
            elif kind == "F16":
                a = np.asarray(t.values()).astype(np.float32)
            else:
                a = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        except NotImplementedError:
            raise CausalLMError(f"{self.folder}: tensor '{t.name}' is {kind}, which cannot be "
                                f"read") from None
        a = a.reshape(self.shape(name))
        perm = self._rows(name)
        if perm is not None:
            a = a[perm]
        a = self._shifted(name, a)
        a.flags.writeable = False
        return a

    def _raw(self, name: str):
        t = self._tensor(name)
        kind = t.tensor_type.name
        shape = self.shape(name)
        if len(shape) != 2:
            return self._get(name)
        R, C = shape
        if kind in ("F16", "BF16") or kind in QTYPES:
            raw = np.asarray(t.data).view(np.uint8).reshape(R, -1)
            packed = PackedMatrix(kind, raw.view(np.uint16) if kind in ("F16", "BF16") else raw,
                                  transposed=False)
            perm = self._rows(name)
            if perm is None:
                return packed  # the file's bytes, mapped
            release_pages(raw)  # the rows in Hugging Face's order are a copy
            return packed.takeRows(perm)
        if kind != "F32" and self.requantize is not None and C % 32 == 0:
            self.requantized[kind] = self.requantized.get(kind, 0) + 1
            return PackedMatrix.fromFloat(self.requantize, self._get(name), transposed=False)
        return self._get(name)
