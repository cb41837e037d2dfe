"""T5 (HF modeling_t5.py): T5ForConditionalGeneration on EncoderDecoder."""
