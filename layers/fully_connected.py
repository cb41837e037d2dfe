"""``fully_connected``: nntrainer's FullyConnectedLayer.

    y = x @ W + b                 x (B, 1, H, K) rows [0, step) -> y (B, 1, H, unit)

Weights, in order: ``weight`` (K, unit) = [in, out], the PyTorch weight transposed, as NNTrainer
stores it; ``bias`` (unit,) in the activation dtype unless ``disable_bias=true``.
A weight loaded from a Hugging Face checkpoint is the transposed view of the memory-mapped
[out, in] tensor, so no copy is made; the kernel picks the loop order for either layout.
Properties: ``unit`` (required), ``disable_bias`` (false), ``lora_rank``/``lora_alpha``
(LoRA adapters are not supported here: a non-zero rank is an error).
"""

import numpy as np

from causallm.kernels import linear
from causallm.kernels.linear import linear_ops
from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import uint

NO_BIAS = np.zeros(0, dtype=np.float32)


class FullyConnectedLayer(Layer):
    type = "fully_connected"
    layer_impl = True
    properties = {"unit": uint(required=True), "lora_rank": uint(0), "lora_alpha": uint(0)}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        if self.props["lora_rank"]:
            raise context.error("lora_rank > 0: LoRA adapters are not supported")
        unit, x = self.props["unit"], dims[0]
        if unit < 1:
            raise context.error("unit must be at least 1")
        context.requestWeight("weight", (x.width, unit), packable=True)
        self.has_bias = not self.props["disable_bias"]
        if self.has_bias:
            context.requestWeight("bias", (unit,), context.activation_dtype)
        context.setOutputDimensions([TensorDim(x.batch, x.channel, x.height, unit)])

    def linear_operands(self, context):
        """(x, W, bias, y) of ``y = x @ W + bias``: a runner may compute the products of
        several layers that read the same x together (runtime/runner.py)."""
        w = context.weights
        return context.inputs[0], w[0], w[1] if self.has_bias else NO_BIAS, context.outputs[0]

    def team_ops(self, context, step):
        """The step as team ops (runtime/runner.py, ``team_plan``): a float W's product (a W in
        ggml blocks runs in the runner's LinearGroup)."""
        x, w, bias, y = self.linear_operands(context)
        return linear_ops(x, w, bias, y, 0, 0, min(step, y.shape[1]))

    def incremental_forwarding(self, context, from_, to):
        x, w, bias, y = self.linear_operands(context)
        linear(x, w, bias, y, 0, 0, min(to - from_, y.shape[1]))
