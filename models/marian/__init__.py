"""Marian (HF modeling_marian.py): MarianMTModel, BART with sinusoidal positions."""
