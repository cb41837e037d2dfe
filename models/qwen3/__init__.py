"""Qwen3 (Applications/CausalLM/models/qwen3): Qwen3Transformer and Qwen3CausalLM."""
