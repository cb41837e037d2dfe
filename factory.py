"""Factory: architecture string -> model creator (Applications/CausalLM/factory.h), with the
model registrations and the architecture resolution main.cpp does.

    Factory.Instance().registerModel("LlamaForCausalLM", lambda cfg, gen, nntr: CausalLM(cfg, gen, nntr))
    model = Factory.Instance().create("LlamaForCausalLM", cfg, gen, nntr)   # None if unknown

    model = Factory.Instance().createFromFolder("path/to/model")   # the Python API's way in

``Factory.Instance()`` registers every built-in architecture once (``registerModels``, main.cpp's
``registerModel`` calls), so the Python API sees them without going through main.py.
"""

from __future__ import annotations

import os
import sys
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
        return cls._instance

    def registerModel(self, key: str, creator: Callable) -> None:
        self._creators[key] = creator

    def create(self, key: str, cfg, generation_cfg, nntr_cfg):
        creator = self._creators.get(key)
        return None if creator is None else creator(cfg, generation_cfg, nntr_cfg)

    def createFromFolder(self, model_dir: str, **nntr_overrides):
        """The model of a folder, as main.py builds it: its three configs (``nntr_overrides``
        replace nntr_config keys, e.g. ``num_to_generate=64``), ``architectures[0]`` resolved
        by ``resolve_architecture``, then ``create``. The model is not initialized yet; its
        ``architecture`` attribute is the key it was created under."""
        from causallm.io.config import load_model_configs

        cfg, gen, nntr = load_model_configs(model_dir)
        nntr.update(nntr_overrides)
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
    """main.cpp's ``Factory::Instance().registerModel(...)`` calls."""
    from models.bart.bart import BartForConditionalGeneration
    from models.bert.bert_model import BertEmbedding
    from models.causal_lm import CausalLM
    from models.gemma3.embedding_gemma import EmbeddingGemma
    from models.gemma3.gemma3_causallm import Gemma3CausalLM
    from models.gemma3.gemma3_vision import Gemma3ForConditionalGeneration
    from models.gpt2.gpt2_causallm import GPT2CausalLM
    from models.gpt_oss.gptoss_causallm import GptOssForCausalLM
    from models.gpt_oss_cached_slim.gptoss_cached_slim_causallm import GptOssCachedSlimCausalLM
    from models.marian.marian import MarianMTModel
    from models.qwen2.qwen2_causallm import Qwen2CausalLM
    from models.qwen2.qwen2_embedding import Qwen2Embedding
    from models.qwen3.qwen3_causallm import Qwen3CausalLM
    from models.qwen3.qwen3_embedding import Qwen3Embedding
    from models.qwen3_cached_slim_moe.qwen3_cached_slim_moe_causallm import (
        Qwen3CachedSlimMoECausalLM,
    )
    from models.qwen3_moe.qwen3_moe_causallm import Qwen3MoECausalLM
    from models.qwen3_slim_moe.qwen3_slim_moe_causallm import Qwen3SlimMoECausalLM
    from models.t5.t5 import T5ForConditionalGeneration
    from models.t5gemma2.t5gemma2 import T5Gemma2ForConditionalGeneration

    factory.registerModel("LlamaForCausalLM", lambda cfg, gen, nntr: CausalLM(cfg, gen, nntr))
    factory.registerModel("Qwen3MoeForCausalLM",
                          lambda cfg, gen, nntr: Qwen3MoECausalLM(cfg, gen, nntr))
    factory.registerModel("Qwen3SlimMoeForCausalLM",
                          lambda cfg, gen, nntr: Qwen3SlimMoECausalLM(cfg, gen, nntr))
    factory.registerModel("Qwen3CachedSlimMoeForCausalLM",
                          lambda cfg, gen, nntr: Qwen3CachedSlimMoECausalLM(cfg, gen, nntr))
    factory.registerModel("Gemma3ForCausalLM",
                          lambda cfg, gen, nntr: Gemma3CausalLM(cfg, gen, nntr))
    factory.registerModel("Gemma3ForConditionalGeneration",
                          lambda cfg, gen, nntr: Gemma3ForConditionalGeneration(cfg, gen, nntr))
    factory.registerModel("GptOssForCausalLM",
                          lambda cfg, gen, nntr: GptOssForCausalLM(cfg, gen, nntr))
    factory.registerModel("GptOssCachedSlimCausalLM",
                          lambda cfg, gen, nntr: GptOssCachedSlimCausalLM(cfg, gen, nntr))
    factory.registerModel("GPT2LMHeadModel", lambda cfg, gen, nntr: GPT2CausalLM(cfg, gen, nntr))
    factory.registerModel("Qwen2ForCausalLM", lambda cfg, gen, nntr: Qwen2CausalLM(cfg, gen, nntr))
    factory.registerModel("Qwen3ForCausalLM", lambda cfg, gen, nntr: Qwen3CausalLM(cfg, gen, nntr))
    factory.registerModel("Qwen3Embedding", lambda cfg, gen, nntr: Qwen3Embedding(cfg, gen, nntr))
    factory.registerModel("Qwen2Embedding", lambda cfg, gen, nntr: Qwen2Embedding(cfg, gen, nntr))
    factory.registerModel("EmbeddingGemma", lambda cfg, gen, nntr: EmbeddingGemma(cfg, gen, nntr))
    factory.registerModel("BertEmbedding", lambda cfg, gen, nntr: BertEmbedding(cfg, gen, nntr))
    factory.registerModel("T5ForConditionalGeneration",
                          lambda cfg, gen, nntr: T5ForConditionalGeneration(cfg, gen, nntr))
    factory.registerModel("BartForConditionalGeneration",
                          lambda cfg, gen, nntr: BartForConditionalGeneration(cfg, gen, nntr))
    factory.registerModel("MarianMTModel", lambda cfg, gen, nntr: MarianMTModel(cfg, gen, nntr))
    factory.registerModel("T5Gemma2ForConditionalGeneration",
                          lambda cfg, gen, nntr: T5Gemma2ForConditionalGeneration(cfg, gen, nntr))


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
        raise CausalLMError(f"{cfg.path}: missing key 'architectures' (a list naming the model "
                            f"class, e.g. [\"LlamaForCausalLM\"])")
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
