"""numba kernels: @njit(cache=True) functions over float32 C-contiguous arrays.

Conventions: activations are 3-D (B, H, W) = (batch, rows of this step, features); a call
processes rows [0, nrows) of every batch (or the explicit row offsets it is given). Outputs
and scratch are passed in, never allocated on the per-token path. Kernels know nothing of
layers or configs; each has a plain-numpy twin in tests/reference.py.

Modules: linear (fully connected), norm (rms_norm), layer_norm, rope (tables), attention (KV
cache write and attention), elementwise (swiglu, activations, add, multiply, softmax), softcap,
embedding, embedding_sum (learned positions and token types), pooling (sentence embeddings),
moe and gpt_oss_moe (routing and experts). The families' own kernels are imported from their
modules; this package re-exports the common ones.
"""

import numba

from causallm.kernels.attention import attention, kv_cache_write
from causallm.kernels.elementwise import (
    ACT_GELU,
    ACT_NONE,
    ACT_RELU,
    ACT_SIGMOID,
    ACT_SILU,
    ACT_TANH,
    ACT_TANH_GELU,
    ACTIVATIONS,
    activation,
    add,
    add_row,
    multiply,
    softmax_rows,
    swiglu,
)
from causallm.kernels.embedding import embedding
from causallm.kernels.linear import BLAS_MIN_ROWS, linear, linear_io, linear_oi
from causallm.kernels.norm import rms_norm
from causallm.kernels.rope import rope_inv_freq, rope_tables


def set_num_threads(n):
    """Use n threads in the parallel kernels, clamped to [1, NUMBA_NUM_THREADS]; returns it."""
    n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(n)
    return n


def get_num_threads():
    """Number of threads the parallel kernels use now."""
    return numba.get_num_threads()


__all__ = [
    "ACT_GELU", "ACT_NONE", "ACT_RELU", "ACT_SIGMOID", "ACT_SILU", "ACT_TANH", "ACT_TANH_GELU",
    "ACTIVATIONS", "BLAS_MIN_ROWS", "activation", "add", "add_row", "attention", "embedding",
    "get_num_threads", "kv_cache_write", "linear", "linear_io", "linear_oi", "multiply",
    "rms_norm", "rope_inv_freq", "rope_tables", "set_num_threads", "softmax_rows", "swiglu",
]
