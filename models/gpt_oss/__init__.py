"""GPT-OSS (Applications/CausalLM/models/gpt_oss): GptOssForCausalLM."""
