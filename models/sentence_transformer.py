"""SentenceTransformer: a Transformer read as a sentence encoder (Applications/CausalLM/models/sentence_transformer.cpp).

A sentence-transformers folder lists its pipeline in ``modules.json`` ([{idx, name, path,
type}], in order); each module's ``<path>/config.json`` holds its settings. ``constructModel``
walks the list as the C++ does:

    ...models.Transformer -> the Transformer's graph (input0 ... output_norm)
    ...models.Pooling     -> embedding_pooling    (config keys as properties)
    ...models.Dense       -> fully_connected      (out_features -> unit, bias: false ->
                                                   disable_bias=true, activation_function ->
                                                   activation: Tanh -> tanh, Identity -> none)
    ...models.Normalize   -> embedding_normalize

Module layers are unnamed (auto-named at compile) and chain to the previous layer, as in the
C++. ``encode(prompt)`` tokenizes ``system + prompt + tail`` with the tokenizer's special tokens
(a BERT [CLS] ... [SEP], as the C++ does), runs the whole sequence in one step from position 0
and returns the output, one embedding row per batch: ``(B, D)``. ``run`` prints it.

Tokenization follows sentence-transformers: the padding a ``tokenizer.json`` may carry is
switched off and sequences are truncated (special tokens kept) to ``max_seq_length`` of
``sentence_bert_config.json``, else to ``max_seq_len``. Without an nntr_config value,
``init_seq_len`` is that length (at most 2048) and ``num_to_generate`` is 0: nothing is generated.

Weights: a Hugging Face folder loads the transformer from its safetensors (tensor names with or
without the ``model.`` prefix: an HF ``Qwen3Model`` / ``Gemma3TextModel`` saves them bare; a
``bert.`` prefix is dropped likewise) and each Dense module from ``<path>/model.safetensors``
(``linear.weight`` [out, in], ``linear.bias``), named ``<path>/linear.weight`` in the map.

Fixed against the C++ (docs/nntrainer.md, "modules.json errors swallowed", "Dense activation class
names"): ``modules.json`` is found beside the model (its ``module_config_path`` in nntr_config is
relative to the model folder, not the working directory), every problem with it is a one-line error
instead of a swallowed message, Dense activations are mapped from their torch class names (a missing
one is Tanh, sentence-transformers' default), an unsupported module type is an error rather than
silently skipped (the embedding would be wrong), and a prompt longer than the step buffer is an
error rather than an overflow (docs/nntrainer.md, "Prompts longer than the step buffer").
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np
import orjson

from causallm.api import createLayer, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.generation.generator import PerformanceMetrics, peak_memory_kb
from causallm.io.config import NNTR_DEFAULTS, JsonConfig, load_json
from causallm.io.files import cannot_read
from causallm.io.safetensors import Checkpoint
from causallm.io.weight_table import Tensor, WeightTable
from causallm.layers.embedding_normalize import EmbeddingNormalizeLayer
from causallm.layers.embedding_pooling import EmbeddingPoolingLayer
from causallm.models.transformer import ModelType, Transformer

DENSE_ACTIVATIONS = {"Tanh": "tanh", "Identity": "none", "ReLU": "relu", "Sigmoid": "sigmoid",
                     "GELU": "gelu", "SiLU": "swish"}
"""torch.nn activation class (last component of ``activation_function``) -> NNTrainer activation."""

HF_NAME_PREFIXES = ("model.", "bert.")
"""Prefixes a checkpoint may have (or lack) relative to the family's weight table."""


class SentenceTransformer(Transformer):
    """A Transformer plus the sentence-transformers modules of ``modules.json`` (module doc)."""

    MODEL_TYPE = ModelType.EMBEDDING

    layer_map = {"Pooling": "embedding_pooling", "Normalize": "embedding_normalize",
                 "Dense": "fully_connected"}
    """modules.json ``type`` (last component) -> the layer type that computes it."""

    def __init__(self, cfg: JsonConfig, generation_cfg: JsonConfig, nntr_cfg: JsonConfig) -> None:
        super().__init__(cfg, generation_cfg, nntr_cfg)
        self.configureTokenizer()

    # -- parameters -------------------------------------------------------------------------
    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        self.readModules(nntr_cfg)
        if not nntr_cfg.contains("num_to_generate"):
            self.NUM_TO_GENERATE = 0
        if not nntr_cfg.contains("init_seq_len") and self.MAX_SEQ_LENGTH:
            self.INIT_SEQ_LEN = min(self.MAX_SEQ_LENGTH, NNTR_DEFAULTS["init_seq_len"])
        self.performance_metrics = PerformanceMetrics()
        self.prompt_ids: list[int] = []

    def setupContext(self, nntr_cfg: JsonConfig) -> None:
        """A text is embedded in one step: the context is nntr_config's ``max_seq_len``, else
        the step's INIT_SEQ_LEN rows (plus num_to_generate when nntr_config sets it)."""
        self.context = self.readContext(nntr_cfg, self.INIT_SEQ_LEN + self.NUM_TO_GENERATE)
        self.MAX_SEQ_LEN = self.context.length

    def readModules(self, nntr_cfg: JsonConfig) -> None:
        """Load ``modules.json`` and each module's ``config.json`` (module_configs by idx), and
        the Transformer module's ``sentence_bert_config.json`` (``MAX_SEQ_LENGTH``)."""
        path = nntr_cfg.resolve_path(nntr_cfg.get_str("module_config_path", "modules.json"))
        self.modules_path = path
        base_dir = os.path.dirname(path)
        if not os.path.isfile(path):
            if nntr_cfg.contains("module_config_path"):
                raise CausalLMError(f"{nntr_cfg.where('module_config_path')}: {path}: file not "
                                    f"found")
            raise CausalLMError(f"{path}: file not found (a sentence-transformers model lists its "
                                f"modules there; set 'module_config_path' in nntr_config.json)")
        try:
            with open(path, "rb") as f:
                modules = orjson.loads(f.read())
        except orjson.JSONDecodeError as e:
            raise CausalLMError(f"{path}: invalid JSON ({e})") from None
        except OSError as e:
            raise cannot_read(path, e) from None
        if not isinstance(modules, list) or not modules:
            raise CausalLMError(f"{path}: expected a non-empty JSON list of modules")
        self.modules, self.module_configs, self.module_dirs = [], {}, {}
        for k, module in enumerate(modules):
            if (not isinstance(module, dict) or not isinstance(module.get("type"), str)
                    or not isinstance(module.get("path", ""), str)
                    or not isinstance(module.get("idx", k), int)):
                raise CausalLMError(f"{path}: module {k} must be an object with a string 'type', "
                                    f"an integer 'idx' and a string 'path'")
            idx, component = module.get("idx", k), self.getLastComponent(module["type"])
            if component != "Transformer" and component not in self.layer_map:
                raise CausalLMError(f"{path}: module {idx} has type '{module['type']}', which is "
                                    f"not supported (supported: Transformer, "
                                    f"{', '.join(self.layer_map)})")
            if idx in self.module_dirs:
                raise CausalLMError(f"{path}: idx {idx} is used by more than one module")
            module_dir = os.path.join(base_dir, module.get("path", ""))
            self.module_dirs[idx] = module_dir
            config_path = os.path.join(module_dir, "config.json")
            if module.get("path") and os.path.isfile(config_path):
                self.module_configs[idx] = load_json(config_path)
            self.modules.append({**module, "idx": idx})
        components = [self.getLastComponent(m["type"]) for m in self.modules]
        if components[0] != "Transformer" or components.count("Transformer") != 1:
            raise CausalLMError(f"{path}: the first module, and only it, must be a "
                                f"sentence_transformers.models.Transformer")
        if "Pooling" not in components:
            raise CausalLMError(f"{path}: no Pooling module (a sentence embedding needs one)")
        st_config = os.path.join(self.module_dirs[self.modules[0]["idx"]],
                                 "sentence_bert_config.json")
        self.MAX_SEQ_LENGTH = None
        if os.path.isfile(st_config):
            st = load_json(st_config)
            if st.contains("max_seq_length"):
                self.MAX_SEQ_LENGTH = st.get_int("max_seq_length", minimum=1)

    def configureTokenizer(self) -> None:
        """As sentence-transformers calls its tokenizer: truncation (special tokens kept) at
        ``max_seq_length``, else ``MAX_SEQ_LEN`` (padding is always off, see Tokenizer)."""
        self.tokenizer.EnableTruncation(self.MAX_SEQ_LENGTH or self.MAX_SEQ_LEN)

    @staticmethod
    def getLastComponent(type_name: str) -> str:
        """``"sentence_transformers.models.Pooling"`` -> ``"Pooling"``."""
        return type_name.rsplit(".", 1)[-1]

    # -- graph ------------------------------------------------------------------------------
    def constructModel(self) -> None:
        self.module_layers = {}
        for module in self.modules:
            if self.getLastComponent(module["type"]) == "Transformer":
                super().constructModel()
            else:
                self.addModule(module["type"], module["idx"])

    def addModule(self, type_name: str, idx: int) -> None:
        """Add the layer of module ``idx``, its config.json items as properties (module doc)."""
        config = self.module_configs.get(idx, JsonConfig({}, os.path.join(
            self.module_dirs[idx], "config.json"), exists=False))
        component = self.getLastComponent(type_name)
        layer_type = self.layer_map[component]
        props = []
        for key, value in config.items():
            if isinstance(value, str):
                text = value
            elif isinstance(value, list):  # pooling_mode: ["cls", "mean"] -> cls,mean
                text = ",".join(str(v) for v in value)
            else:  # numbers, and booleans as true / false
                text = orjson.dumps(value).decode()
            if key == "out_features":
                props.append(withKey("unit", text))
            elif key == "bias":
                if value is False:
                    props.append(withKey("disable_bias", "true"))
            elif key == "activation_function":
                props.append(withKey("activation", self.denseActivation(config, value)))
            elif key == "in_features":
                pass  # inferred from the input, as nntrainer does
            elif key in ("module_input_name", "module_output_name"):
                if value not in (None, "sentence_embedding"):
                    raise config.error(key, "'sentence_embedding' (other feature names are not "
                                            "supported)")
            elif key == "use_residual":
                if value is not False:
                    raise config.error(key, "false (residual Dense modules are not supported)")
            else:
                props.append(withKey(key, text))
        if component == "Dense" and "activation_function" not in config:
            props.append(withKey("activation", "tanh"))  # sentence-transformers' default
        if layer_type == "fully_connected":  # held as the model's projections are
            props.append(withKey("weight_dtype", self.FC_LAYER_DTYPE))
        try:
            layer = createLayer(layer_type, props)
        except CausalLMError as e:
            raise CausalLMError(f"{config.path}: {e}") from None
        self.module_layers[idx] = layer
        self.model.addLayer(layer)

    @staticmethod
    def denseActivation(config: JsonConfig, value) -> str:
        """A Dense ``activation_function`` (a torch.nn class path) as an NNTrainer activation."""
        name = value.rsplit(".", 1)[-1] if isinstance(value, str) else None
        if name not in DENSE_ACTIVATIONS:
            raise config.error("activation_function", "a torch.nn activation class among "
                               f"{', '.join(DENSE_ACTIVATIONS)}")
        return DENSE_ACTIVATIONS[name]

    def registerCustomLayers(self) -> None:
        super().registerCustomLayers()
        registerFactory(EmbeddingPoolingLayer)
        registerFactory(EmbeddingNormalizeLayer)

    # -- weights ----------------------------------------------------------------------------
    def denseModules(self) -> list[tuple[dict, str]]:
        """(module, its compiled layer name) of every Dense module, in order."""
        found = []
        for module in self.modules:
            if self.getLastComponent(module["type"]) == "Dense":
                name = self.module_layers[module["idx"]].getName()
                if not name:
                    raise CausalLMError("SentenceTransformer: Dense layer names are known after "
                                        "initialize()")
                found.append((module, name))
        return found

    def getHFWeightTable(self) -> WeightTable:
        """The transformer's table plus ``<Dense path>/linear.weight`` (read transposed) and
        ``<Dense path>/linear.bias`` of every Dense module; names with or without the
        ``model.`` / ``bert.`` prefix; an LM head a checkpoint carries is not read."""
        dense = []
        for module, name in self.denseModules():
            dense += [Tensor(f"{name}:weight", f"{module['path']}/linear.weight", transpose=True),
                      Tensor(f"{name}:bias", f"{module['path']}/linear.bias")]
        return super().getHFWeightTable().extend(dense, ignore=["lm_head.weight"],
                                                 prefixes=HF_NAME_PREFIXES)

    def openHFCheckpoint(self, folder: str) -> "ModuleCheckpoint":
        return ModuleCheckpoint(super().openHFCheckpoint(folder),
                                {module["path"]: self.module_dirs[module["idx"]]
                                 for module, _ in self.denseModules()})

    # -- running ----------------------------------------------------------------------------
    def encode(self, prompt: str, system_prompt: str = "", tail_prompt: str = "") -> np.ndarray:
        """The embedding of ``system_prompt + prompt + tail_prompt``: ``(B, D)`` float32, the
        same text in every batch row (docs/nntrainer.md, "SentenceTransformer::encode"). The
        ids used are kept in ``prompt_ids``."""
        self.requireWeights("encode")
        ids = self.tokenizer.Encode(system_prompt + prompt + tail_prompt, add_special_tokens=True)
        n = len(ids)
        if n == 0:
            raise CausalLMError("encode: the text encodes to no tokens")
        if n > self.INIT_SEQ_LEN:
            raise CausalLMError(f"the text has {n} tokens but init_seq_len is {self.INIT_SEQ_LEN}"
                                f" (an embedding is computed in one step); raise init_seq_len "
                                f"in nntr_config.json")
        B = self.BATCH_SIZE
        metrics = PerformanceMetrics()
        with metrics.phase("encode", n):
            out = self.model.incremental_inference(B, [np.asarray([ids] * B, dtype=np.float32)],
                                                   None, n, 0, n)[0]
        metrics.total_duration_ms = metrics.encode_duration_ms
        metrics.peak_memory_kb = peak_memory_kb()
        self.prompt_ids = list(ids)
        self.performance_metrics = metrics
        return out

    def run(self, prompt: str, do_sample: bool = False, system_prompt: str = "",
            tail_prompt: str = "", log_output: bool = True, out=None) -> "EmbeddingResult":
        """``encode`` and, with ``log_output``, print each row's first 10 values and its size
        (the C++ format) and the encode time to stderr. ``do_sample`` is unused."""
        embedding = self.encode(prompt, system_prompt, tail_prompt)
        m = self.performance_metrics
        if log_output:
            out = out or sys.stdout
            B, D = embedding.shape
            out.write(f"Embedding Result ({B} batch(es)):\n")
            for b in range(B):
                head = ", ".join(f"{v:g}" for v in embedding[b, :10])
                out.write(f"Batch {b}: [{head}{', ...' if D > 10 else ''}] (Total DIM: {D})\n")
            out.flush()
            sys.stderr.write(f"encode: {m.encode_tokens} tokens, {m.encode_duration_ms:.0f} ms\n"
                             f"peak memory: {m.peak_memory_kb} KB\n")
        return EmbeddingResult(list(self.prompt_ids), embedding, m)


@dataclass
class EmbeddingResult:
    """What ``SentenceTransformer.run`` produced: the prompt ids, the ``(B, D)`` embedding and
    the metrics (the encode phase)."""

    prompt_ids: list
    embedding: np.ndarray
    metrics: PerformanceMetrics

    def record(self) -> dict:
        """The CLI's --json fields: row 0's embedding, its size, the encode time."""
        return {"prompt_ids": self.prompt_ids,
                "embedding": [float(v) for v in self.embedding[0]],
                "dim": int(self.embedding.shape[1]),
                "encode_ms": round(self.metrics.encode_duration_ms, 3),
                "peak_memory_kb": self.metrics.peak_memory_kb}


class ModuleCheckpoint:
    """A sentence-transformers folder's weights as one Checkpoint-like mapping: the transformer's
    safetensors plus each Dense module's tensors as ``<module path>/<name>``."""

    def __init__(self, base: Checkpoint, dense_dirs: dict[str, str]) -> None:
        self.folder = base.folder
        self._where: dict[str, tuple[object, str]] = {key: (base, key) for key in base.keys()}
        for module_path, module_dir in dense_dirs.items():
            ckpt = Checkpoint(module_dir)
            for key in ckpt.keys():
                self._where[f"{module_path}/{key}"] = (ckpt, key)

    def _find(self, name: str):
        try:
            return self._where[name]
        except KeyError:
            raise CausalLMError(f"checkpoint has no tensor named '{name}'") from None

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def __len__(self) -> int:
        return len(self._where)

    def get(self, name: str, zeros: bool = False) -> np.ndarray:
        ckpt, key = self._find(name)
        return ckpt.get(key, zeros)

    def shape(self, name: str):
        ckpt, key = self._find(name)
        return ckpt.shape(key)

    def dtype(self, name: str):
        ckpt, key = self._find(name)
        return ckpt.dtype(key)

    def file_of(self, name: str) -> str:
        ckpt, key = self._find(name)
        return ckpt.file_of(key)
