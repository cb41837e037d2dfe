"""``input``: nntrainer's InputLayer.

The graph's entry: the model copies the caller's data into this layer's buffer before each
step. For a language model the buffer holds token ids as float32 at ``[b, 0, 0:step]``.

Shape: ``input_shape`` is ``C:H:W`` (or ``H:W``, ``W``); the output is ``(B, C, H, W)``.
Properties: ``input_shape`` (node key), ``normalization`` and ``standardization`` (false; the
training-time transforms are not supported here).
"""

from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import bool_


class InputLayer(Layer):
    type = "input"
    properties = {"normalization": bool_(False), "standardization": bool_(False)}

    def finalize(self, context):
        if context.getNumInputs():
            raise context.error("an input layer takes no input_layers")
        if not context.input_shape:
            raise context.error("input_shape is required (C:H:W)")
        if self.props.get("normalization") or self.props.get("standardization"):
            raise context.error("normalization/standardization are not supported for inference")
        try:
            dims = [int(d) for d in context.input_shape.split(":")]
        except ValueError:
            dims = []
        if not 1 <= len(dims) <= 3 or min(dims) < 1:
            raise context.error(f"input_shape must be C:H:W of positive integers, got "
                                f"{context.input_shape!r}")
        c, h, w = [1] * (3 - len(dims)) + dims
        context.setOutputDimensions([TensorDim(context.batch, c, h, w)])

    def incremental_forwarding(self, context, from_, to):
        pass  # the model fills the buffer
