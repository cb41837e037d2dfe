"""Qwen2 (Applications/CausalLM/models/qwen2): Qwen2Transformer and Qwen2CausalLM."""
