"""SigLIP: the vision tower and Gemma 3's multimodal projector as registry layers."""
