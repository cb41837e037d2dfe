"""GPT-2 (Hugging Face GPT2LMHeadModel): GPT2Transformer and GPT2CausalLM."""
