"""GPT-OSS cached slim (Applications/CausalLM/models/gpt_oss_cached_slim)."""
