"""Qwen3Embedding (Applications/CausalLM/models/qwen3/qwen3_embedding.cpp): a Qwen3 decoder read
as a sentence encoder, e.g. Qwen3-Embedding-0.6B (modules.json: Transformer, Pooling with
``pooling_mode_lasttoken``, Normalize).

The graph is Qwen3Transformer's (causal attention, q/k norms, ``output_norm``) followed by the
modules of :class:`SentenceTransformer`; the embedding is the normalised final hidden state of
the last token. Hugging Face saves these models as ``Qwen3Model``, whose tensor names lack the
``model.`` prefix (``layers.0.self_attn.q_proj.weight``); both spellings load.
"""

from __future__ import annotations

from causallm.models.qwen3.qwen3_causallm import Qwen3Transformer
from causallm.models.sentence_transformer import SentenceTransformer


class Qwen3Embedding(SentenceTransformer, Qwen3Transformer):
    """SentenceTransformer over Qwen3Transformer; the cooperative ``super()`` chain
    (Qwen3Embedding -> SentenceTransformer -> Qwen3Transformer -> Transformer) registers both
    parents' layers, as the C++ registerCustomLayers does."""
