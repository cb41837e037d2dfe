"""Model classes, mirroring Applications/CausalLM/models: Transformer, CausalLM and the families."""
