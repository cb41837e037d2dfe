"""``addition``: nntrainer's AdditionLayer.

    out = in0 + in1 (+ in2 ...)          rows [0, step) of every batch

Inputs: two or more tensors of equal dims; output: the same dims. No properties.
"""

from causallm.kernels import add
from causallm.runtime.layer import Layer


class AdditionLayer(Layer):
    type = "addition"

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) < 2:
            raise context.error(f"needs at least 2 inputs, got {len(dims)}")
        for d in dims[1:]:
            if d != dims[0]:
                raise context.error(f"input dims differ: {dims[0]} vs {d}")
        context.setOutputDimensions([dims[0]])

    def incremental_forwarding(self, context, from_, to):
        step = min(to - from_, context.outputs[0].shape[1])
        inputs, out = context.inputs, context.outputs[0]
        add(inputs[0], inputs[1], out, step)
        for extra in inputs[2:]:
            add(out, extra, out, step)
