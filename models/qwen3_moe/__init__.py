"""Qwen3-MoE (Applications/CausalLM/models/qwen3_moe): Qwen3MoECausalLM and the qwen_moe layer."""
