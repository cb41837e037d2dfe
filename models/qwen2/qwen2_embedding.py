"""Qwen2Embedding (Applications/CausalLM/models/qwen2/qwen2_embedding.cpp): a Qwen2 decoder read
as a sentence encoder (e.g. gte-Qwen2 models; modules.json: Transformer, Pooling, Normalize).

The graph is Qwen2Transformer's followed by the modules of :class:`SentenceTransformer`.
``config.json`` decides the attention direction (``is_causal``, else
``use_bidirectional_attention``; docs/nntrainer.md, "Attention direction from config.json").
Tensor names load with or without the ``model.`` prefix (an HF ``Qwen2Model`` saves them bare).
"""

from __future__ import annotations

from causallm.models.qwen2.qwen2_causallm import Qwen2Transformer
from causallm.models.sentence_transformer import SentenceTransformer


class Qwen2Embedding(SentenceTransformer, Qwen2Transformer):
    """SentenceTransformer over Qwen2Transformer (cooperative ``super()`` diamond)."""
