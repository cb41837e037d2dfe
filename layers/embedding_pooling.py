"""``embedding_pooling``: Applications/CausalLM/layers/embedding_pooling_layer (EmbeddingPoolingLayer).

Pools the n token rows of one sequence into a sentence embedding, as sentence-transformers'
``Pooling`` does for an unpadded sequence::

    cls                   x[0]
    max                   max_i x[i]                    (per feature)
    mean                  sum_i x[i] / n
    mean_sqrt_len_tokens  sum_i x[i] / sqrt(n)
    weightedmean          sum_i (i+1) x[i] / sum_i (i+1)
    lasttoken             x[n - 1]

With several modes the results are concatenated, in sentence-transformers' order. Input
``(B, 1, H, W)`` (rows [0, n) of the step, n = to - from_); output ``(B, 1, 1, W * modes)``.

Properties (the keys of a sentence-transformers ``Pooling`` config.json): the legacy booleans
``pooling_mode_cls_token``, ``pooling_mode_max_tokens``, ``pooling_mode_mean_tokens``,
``pooling_mode_mean_sqrt_len_tokens``, ``pooling_mode_weightedmean_tokens``,
``pooling_mode_lasttoken`` (false), or the newer ``pooling_mode`` (a comma list of the mode names
above; it wins over the booleans); ``word_embedding_dimension`` / ``embedding_dimension`` (0 =
unchecked; else must equal W); ``include_prompt`` (true; accepted and unused: no prompt is
excluded).

Fixed against nntrainer: every mode is implemented (nntrainer: lasttoken and mean only, the
others throw), several modes concatenate, no mode set means mean (sentence-transformers'
default; nntrainer writes zeros), and a width mismatch is an error (nntrainer warns). The layer
pools one whole sequence, so it runs only in a step that starts at position 0 (nntrainer's
absolute row indices are right only then: docs/nntrainer.md, "embedding_pooling").
"""

import numpy as np

from causallm.kernels.pooling import POOLING_MODES, embedding_pool
from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import bool_, list_, uint

LEGACY_MODE_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
"""Legacy boolean keys -> mode, in sentence-transformers' concatenation order."""


class EmbeddingPoolingLayer(Layer):
    type = "embedding_pooling"
    layer_impl = True
    properties = {
        "word_embedding_dimension": uint(0),
        "embedding_dimension": uint(0),
        **{key: bool_(False) for key in LEGACY_MODE_KEYS},
        "pooling_mode": list_(),
        "include_prompt": bool_(True),
    }

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        x = dims[0]
        p = self.props
        modes = list(p["pooling_mode"]) or [m for k, m in LEGACY_MODE_KEYS.items() if p[k]]
        modes = modes or ["mean"]
        for mode in modes:
            if mode not in POOLING_MODES:
                raise context.error(f"pooling mode '{mode}' is not one of "
                                    f"{', '.join(POOLING_MODES)}")
        for key in ("word_embedding_dimension", "embedding_dimension"):
            if p[key] and p[key] != x.width:
                raise context.error(f"{key} {p[key]} does not match the input width {x.width}")
        self.modes = modes
        self.codes = np.array([POOLING_MODES[m] for m in modes], dtype=np.int64)
        context.setOutputDimensions([TensorDim(x.batch, 1, 1, x.width * len(modes))])

    def incremental_forwarding(self, context, from_, to):
        if from_ != 0:
            raise context.error(f"pools a whole sequence, so it runs in one step from position "
                                f"0; got a step from position {from_}")
        embedding_pool(context.inputs[0], context.outputs[0], to - from_, self.codes)
