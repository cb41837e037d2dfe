"""T5Gemma2 (HF modeling_t5gemma2.py): T5Gemma2ForConditionalGeneration on EncoderDecoder, with
the SigLIP vision tower."""
