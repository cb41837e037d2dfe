"""EmbeddingGemma (Applications/CausalLM/models/gemma3/embedding_gemma.cpp): a bidirectional
Gemma 3 encoder read as a sentence encoder, e.g. embeddinggemma-300m (modules.json:
Transformer, Pooling mean, Dense 768->3072, Dense 3072->768, Normalize).

The graph is Gemma3Transformer's followed by the modules of :class:`SentenceTransformer`. With
``use_bidirectional_attention`` (config.json) every layer attends both ways: a full-attention
layer to every token, a sliding layer to the tokens at distance < W' where, as transformers'
Gemma3TextConfig does, W' = sliding_window // 2 + 1 (so ``|q - kv| <= sliding_window // 2``);
mha_core's non-causal window is that two-sided ``|q - kv| < window`` (the C++ passes the raw
window to a one-sided "last W keys" mask: docs/nntrainer.md, "Sliding-window mask"). Tensor
names load with or without the ``model.`` prefix (an HF ``Gemma3TextModel`` saves them bare).
"""

from __future__ import annotations

from causallm.io.config import JsonConfig
from causallm.runtime.properties import UINT_MAX
from causallm.models.gemma3.gemma3_causallm import Gemma3Transformer
from causallm.models.sentence_transformer import SentenceTransformer


class EmbeddingGemma(SentenceTransformer, Gemma3Transformer):
    """SentenceTransformer over Gemma3Transformer (cooperative ``super()`` diamond)."""

    def setupParameters(self, cfg: JsonConfig, generation_cfg: JsonConfig,
                        nntr_cfg: JsonConfig) -> None:
        super().setupParameters(cfg, generation_cfg, nntr_cfg)
        if not self.IS_CAUSAL and self.SLIDING_WINDOW != UINT_MAX:
            self.SLIDING_WINDOW = self.SLIDING_WINDOW // 2 + 1  # Gemma3TextConfig.__post_init__
