"""One file per layer type, each mirroring a layer of nntrainer or of Applications/CausalLM/layers.

Each module docstring states the math, the shapes and the properties with their defaults.
"""
