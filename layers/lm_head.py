"""``lm_head``: Applications/CausalLM/layers/lm_head (LmHeadLayer), the untied output head.

    logits[b] = x[b, step - 1] @ W (+ bias)        x (B, 1, H, D) -> (B, 1, 1, unit)

Only the last row of the step is projected. Weights: ``weight`` (D, unit) = [in, out] in the
node's weight dtype (``lmhead_dtype``); ``bias`` (unit,) unless ``disable_bias=true`` (CausalLM
passes true). Properties: ``unit`` (required, the vocabulary size), ``disable_bias``.
"""

from causallm.kernels import linear
from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import uint
from causallm.layers.fully_connected import NO_BIAS


class LmHeadLayer(Layer):
    type = "lm_head"
    layer_impl = True
    properties = {"unit": uint(required=True)}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        unit, x = self.props["unit"], dims[0]
        context.requestWeight("weight", (x.width, unit), packable=True)
        self.has_bias = not self.props["disable_bias"]
        if self.has_bias:
            context.requestWeight("bias", (unit,), context.activation_dtype)
        context.setOutputDimensions([TensorDim(x.batch, 1, 1, unit)])

    def incremental_forwarding(self, context, from_, to):
        x = context.inputs[0]
        w = context.weights
        last = min(to - from_, x.shape[1]) - 1
        linear(x, w[0], w[1] if self.has_bias else NO_BIAS, context.outputs[0], last, 0, 1)
