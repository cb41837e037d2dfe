"""The Factory lists every architecture it registers (main.cpp's registerModel calls)."""

import io

from causallm.factory import Factory

ARCHITECTURES = [
    "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
    "Qwen3SlimMoeForCausalLM", "Qwen3CachedSlimMoeForCausalLM", "Gemma3ForCausalLM",
    "GptOssForCausalLM", "GptOssCachedSlimCausalLM", "GPT2LMHeadModel", "Qwen3Embedding",
    "Qwen2Embedding", "EmbeddingGemma", "BertEmbedding", "T5ForConditionalGeneration",
    "BartForConditionalGeneration", "MarianMTModel", "Gemma3ForConditionalGeneration",
    "T5Gemma2ForConditionalGeneration",
]


def test_print_registered_lists_every_family():
    out = io.StringIO()
    Factory.Instance().printRegistered(out)
    listed = out.getvalue().split()
    assert sorted(listed) == sorted(ARCHITECTURES)
    assert Factory.Instance().create("NoSuchModel", None, None, None) is None
