"""BART (HF modeling_bart.py): BartForConditionalGeneration on EncoderDecoder."""
