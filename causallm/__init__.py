"""NNTrainer's CausalLM engine in Python: the graph API, registry, weights and kernels."""

from causallm.errors import CausalLMError

__all__ = ["CausalLMError"]
