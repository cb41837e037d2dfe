"""Files: the three JSON configs, safetensors checkpoints, the NNTrainer .bin, weights read on
demand, MXFP4 tensors, the Hugging Face weight tables, and atomic writes."""
