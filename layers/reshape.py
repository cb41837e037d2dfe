"""``reshape``: nntrainer's ReshapeLayer, the same values under other dimensions.

    out = in viewed as (B, C', H', W')            C' * H' * W' == C * H * W

``target_shape`` is "C:H:W" (or "H:W", "W"; ","-separated too). An image layer: each step
copies the whole input (the step's rows do not apply).
"""

from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import str_


class ReshapeLayer(Layer):
    type = "reshape"
    properties = {"target_shape": str_(required=True)}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        text = self.props["target_shape"]
        try:
            shape = [int(v) for v in text.replace(",", ":").split(":")]
        except ValueError:
            shape = []
        d = dims[0]
        if not 1 <= len(shape) <= 3 or min(shape) < 1:
            raise context.error(f"target_shape must be C:H:W of positive integers, got {text!r}")
        c, h, w = [1] * (3 - len(shape)) + shape
        if c * h * w != d.feature_len:
            raise context.error(f"target_shape {c}:{h}:{w} holds {c * h * w} values; the input "
                                f"{d} holds {d.feature_len}")
        context.setOutputDimensions([TensorDim(d.batch, c, h, w)])

    def incremental_forwarding(self, context, from_, to):
        out = context.outputs[0]
        out.reshape(out.shape[0], -1)[...] = context.inputs[0].reshape(out.shape[0], -1)
