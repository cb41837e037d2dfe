"""BERT encoders (no C++ twin in nntrainer's CausalLM): BertTransformer and BertEmbedding."""
