"""Generation, apart from the models: the token sampler (``sampler``: NNTrainer's llm_util with
transformers' semantics) and the generator that drives any model through ``start`` and ``step``
(``generator``)."""
