"""Qwen3 Cached Slim MoE (Applications/CausalLM/models/qwen3_cached_slim_moe):
Qwen3CachedSlimMoECausalLM."""
