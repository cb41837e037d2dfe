"""NNTrainer's CausalLM engine in Python: the graph API, registry, weights and kernels."""

import os as _os

# Two thread pools share the cores: numpy's OpenBLAS (prefill matrix products) and numba's
# OpenMP (every other kernel). By default each spins for a long while after its work, taking the
# cores from the other; short spins measured about twice the prefill speed and removed a slow
# first decode step (bench/README.md). They must be set before numpy and numba load, so this
# module is imported first by main.py; settings already in the environment win.
for _key, _value in (("OPENBLAS_THREAD_TIMEOUT", "4"), ("GOMP_SPINCOUNT", "10000")):
    _os.environ.setdefault(_key, _value)

from causallm.errors import CausalLMError  # noqa: E402

__all__ = ["CausalLMError"]
