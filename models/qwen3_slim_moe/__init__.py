"""Qwen3 Slim MoE (Applications/CausalLM/models/qwen3_slim_moe): Qwen3SlimMoECausalLM."""
