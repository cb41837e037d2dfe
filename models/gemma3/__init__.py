"""Gemma 3 (Applications/CausalLM/models/gemma3): Gemma3Transformer, Gemma3CausalLM and the
FunctionGemma chat template."""
