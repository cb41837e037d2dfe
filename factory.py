"""Factory: architecture string -> model creator (Applications/CausalLM/factory.h), with the
model registrations and the architecture resolution main.cpp does.

    Factory.Instance().registerModel("LlamaForCausalLM", lambda cfg, gen, nntr: CausalLM(cfg, gen, nntr))
    model = Factory.Instance().create("LlamaForCausalLM", cfg, gen, nntr)   # None if unknown

    model = Factory.Instance().createFromFolder("path/to/model")   # the Python API's way in

``Factory.Instance()`` registers every built-in architecture once (``registerModels``, main.cpp's
``registerModel`` calls), so the Python API sees them without going through main.py.

Model classes from outside this repository register through the same ``registerModel``:

- a plugin file (``main.py --plugin FILE.py``, or ``loadPlugin(path)``): imported as a module,
  it calls ``Factory.Instance().registerModel("MyArchitecture", MyModelClass)`` at import;
- an installed package's entry point in the group ``causallm.models``: a module (importing it
  registers, as a plugin file does) or a function called with the Factory
  (``register(factory)``). ``Factory.Instance()`` loads every such entry point once, after the
  built-in architectures; one that fails is a warning on stderr naming it and its
  distribution, and the others still load.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
import types
from typing import Callable

from causallm.errors import CausalLMError


class Factory:
    _instance: "Factory | None" = None

    def __init__(self) -> None:
        self._creators: dict[str, Callable] = {}

    @classmethod
    def Instance(cls) -> "Factory":
        if cls._instance is None:
            cls._instance = cls()
            registerModels(cls._instance)
            loadEntryPoints(cls._instance)
        return cls._instance

    def registerModel(self, key: str, creator: Callable) -> None:
        self._creators[key] = creator

    def create(self, key: str, cfg, generation_cfg, nntr_cfg):
        creator = self._creators.get(key)
        return None if creator is None else creator(cfg, generation_cfg, nntr_cfg)

    def createFromFolder(self, model_dir: str, flags: dict[str, str] | None = None,
                         **nntr_overrides):
        """The model of a folder, as main.py builds it: its three configs (``nntr_overrides``
        replace nntr_config keys, e.g. ``num_to_generate=64``; an error about one names it as
        the keyword, or as the command-line flag ``flags`` gives for it), ``architectures[0]``
        resolved by ``resolve_architecture``, then ``create``. The model is not initialized
        yet; its ``architecture`` attribute is the key it was created under."""
        from causallm.io.config import load_model_configs

        cfg, gen, nntr = load_model_configs(model_dir)
        nntr.update(nntr_overrides)
        nntr.flags = {**{key: key for key in nntr_overrides}, **(flags or {})}
        architecture = resolve_architecture(cfg, nntr)
        model = self.create(architecture, cfg, gen, nntr)
        if model is None:
            raise CausalLMError(f"{cfg.path}: unknown architecture '{architecture}' "
                                f"(architectures[0]); registered: "
                                f"{', '.join(self.getRegistered())}")
        model.architecture = architecture
        return model

    def getRegistered(self) -> list[str]:
        return sorted(self._creators)

    def printRegistered(self, out=None) -> None:
        out = out or sys.stdout
        for key in self.getRegistered():
            out.write(f"  {key}\n")


def registerModels(factory: Factory) -> None:
    """main.cpp's ``Factory::Instance().registerModel(...)`` calls. Each family's module is
    imported when a model of it is created, so a run loads only its own family."""
    for key, (module, cls) in _BUILT_IN.items():
        factory.registerModel(key, _creator(module, cls))


ENTRY_POINT_GROUP = "causallm.models"
"""The entry-point group an installed package registers its model classes under."""


def loadEntryPoints(factory: Factory, out=None) -> None:
    """Load every ``causallm.models`` entry point (module docstring): a module registers as it
    is imported, a function is called with ``factory``. A failing one is one warning line on
    ``out`` (stderr) naming the entry point and its distribution; the rest still load."""
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = ep.load()
            if not isinstance(loaded, types.ModuleType):
                loaded(factory)
        except Exception as e:
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown"
            (out or sys.stderr).write(
                f"warning: entry point '{ep.name} = {ep.value}' ({ENTRY_POINT_GROUP}) of "
                f"distribution '{dist}' failed, skipped: {_one_line(e)}\n")


def _one_line(e: Exception) -> str:
    """``Type: message``, the message's first line only."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def loadPlugin(path: str) -> types.ModuleType:
    """Import the Python file ``path`` as the module ``causallm_plugin_<stem>``; it registers
    its model classes with ``Factory.Instance().registerModel`` as it runs. A missing file, or
    one that raises on import, is a one-line CausalLMError naming it."""
    if not os.path.isfile(path):
        what = "a folder, not a Python file" if os.path.isdir(path) else "no such file"
        raise CausalLMError(f"--plugin {path}: {what}")
    stem = os.path.splitext(os.path.basename(path))[0]
    name = "causallm_plugin_" + "".join(c if c.isalnum() else "_" for c in stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CausalLMError(f"--plugin {path}: not a Python file (expected FILE.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise CausalLMError(f"--plugin {path}: import failed: {_one_line(e)}") from e
    return module


def _creator(module: str, cls: str) -> Callable:
    def create(cfg, gen, nntr):
        return getattr(importlib.import_module(f"causallm.{module}"), cls)(cfg, gen, nntr)
    return create


_BUILT_IN = {
    "LlamaForCausalLM": ("models.causal_lm", "CausalLM"),
    "Qwen3MoeForCausalLM": ("models.qwen3_moe.qwen3_moe_causallm", "Qwen3MoECausalLM"),
    "Qwen3SlimMoeForCausalLM": ("models.qwen3_slim_moe.qwen3_slim_moe_causallm",
                                "Qwen3SlimMoECausalLM"),
    "Qwen3CachedSlimMoeForCausalLM": ("models.qwen3_cached_slim_moe."
                                      "qwen3_cached_slim_moe_causallm",
                                      "Qwen3CachedSlimMoECausalLM"),
    "Gemma3ForCausalLM": ("models.gemma3.gemma3_causallm", "Gemma3CausalLM"),
    "Gemma3ForConditionalGeneration": ("models.gemma3.gemma3_vision",
                                       "Gemma3ForConditionalGeneration"),
    "GptOssForCausalLM": ("models.gpt_oss.gptoss_causallm", "GptOssForCausalLM"),
    "GptOssCachedSlimCausalLM": ("models.gpt_oss_cached_slim.gptoss_cached_slim_causallm",
                                 "GptOssCachedSlimCausalLM"),
    "GPT2LMHeadModel": ("models.gpt2.gpt2_causallm", "GPT2CausalLM"),
    "Qwen2ForCausalLM": ("models.qwen2.qwen2_causallm", "Qwen2CausalLM"),
    "Qwen3ForCausalLM": ("models.qwen3.qwen3_causallm", "Qwen3CausalLM"),
    "Qwen3Embedding": ("models.qwen3.qwen3_embedding", "Qwen3Embedding"),
    "Qwen2Embedding": ("models.qwen2.qwen2_embedding", "Qwen2Embedding"),
    "EmbeddingGemma": ("models.gemma3.embedding_gemma", "EmbeddingGemma"),
    "BertEmbedding": ("models.bert.bert_model", "BertEmbedding"),
    "T5ForConditionalGeneration": ("models.t5.t5", "T5ForConditionalGeneration"),
    "BartForConditionalGeneration": ("models.bart.bart", "BartForConditionalGeneration"),
    "MarianMTModel": ("models.marian.marian", "MarianMTModel"),
    "T5Gemma2ForConditionalGeneration": ("models.t5gemma2.t5gemma2",
                                         "T5Gemma2ForConditionalGeneration"),
}
"""Architecture key -> (module under ``causallm``, class) of every built-in model."""


EMBEDDING_ARCHITECTURES = {
    "Qwen3ForCausalLM": "Qwen3Embedding", "Qwen3Model": "Qwen3Embedding",
    "Gemma3ForCausalLM": "EmbeddingGemma", "Gemma3TextModel": "EmbeddingGemma",
    "Qwen2Model": "Qwen2Embedding", "Qwen2ForCausalLM": "Qwen2Embedding",
    "BertModel": "BertEmbedding",
}
"""main.cpp ``resolve_architecture`` for embedding models, plus Qwen3Model, Qwen2ForCausalLM and
BertModel."""


def resolve_architecture(cfg, nntr_cfg=None) -> str:
    """``config.json`` ``architectures[0]``, resolved as main.cpp does: with nntr_config
    ``model_type`` "embedding" it names the embedding class (an architecture without one is an
    error). Beyond main.cpp, a sentence-transformers folder (a ``modules.json`` beside
    config.json, or nntr_config's ``module_config_path``, and no ``model_type``) resolves the
    same way, and BertModel (an encoder) always does."""
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise cfg.error("architectures", 'a list naming the model class, e.g. '
                                         '["LlamaForCausalLM"]')
    architecture = archs[0]
    model_type = nntr_cfg.get_str("model_type").lower() \
        if nntr_cfg is not None and nntr_cfg.contains("model_type") else None
    if model_type == "embedding":
        if architecture not in EMBEDDING_ARCHITECTURES:
            raise CausalLMError(f"{cfg.path}: unsupported architecture for embedding model: "
                                f"{architecture} (supported: "
                                f"{', '.join(EMBEDDING_ARCHITECTURES)})")
        return EMBEDDING_ARCHITECTURES[architecture]
    modules = os.path.join(cfg.directory, "modules.json")
    if nntr_cfg is not None and nntr_cfg.contains("module_config_path"):
        modules = nntr_cfg.resolve_path(nntr_cfg.get_str("module_config_path"))
    if architecture in EMBEDDING_ARCHITECTURES and (
            architecture == "BertModel" or (model_type is None and os.path.isfile(modules))):
        return EMBEDDING_ARCHITECTURES[architecture]
    return architecture
