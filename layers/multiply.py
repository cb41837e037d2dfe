"""``multiply``: nntrainer's MultiplyLayer (a BinaryOperationLayer).

    out = in0 * in1                      elementwise, rows [0, step) of every batch

Inputs: two tensors of equal dims; output: the same dims. No properties. (NNTrainer refuses a
multi-token step that does not start at position 0; the step buffer makes that needless:
docs/nntrainer.md, "Multi-token steps after position 0".)
"""

from causallm.kernels.quant import GLU_MULTIPLY, NO_ACT, NO_D, NO_Q, NO_U, glu_op, row_kernels
from causallm.runtime.layer import Layer


class RowProductLayer(Layer):
    """A layer whose step is quant's ``glu_rows`` of its two inputs, of kind ``glu``
    (``multiply``: in0 * in1; ``swiglu``: silu(in0) * in1), rows [0, step) of every batch;
    its inputs, named ``input_names`` in its errors, have equal dims, which its output takes."""

    glu = GLU_MULTIPLY
    input_names = ("in0", "in1")

    def finalize(self, context):
        dims, (a, b) = context.getInputDimensions(), self.input_names
        if len(dims) != 2:
            raise context.error(f"needs 2 inputs [{a}, {b}], got {len(dims)}")
        if dims[0] != dims[1]:
            raise context.error(f"{a} and {b} dims differ: {dims[0]} vs {dims[1]}")
        context.setOutputDimensions([dims[0]])

    def team_ops(self, context, step):
        """The step as a team op (runtime/runner.py, ``team_plan``)."""
        out = context.outputs[0]
        op = glu_op(NO_ACT, self.glu, context.inputs[0], context.inputs[1], out,
                    min(step, out.shape[1]), NO_Q, NO_D, NO_D, NO_U)
        return None if op is None else [op]

    def incremental_forwarding(self, context, from_, to):
        step = min(to - from_, context.outputs[0].shape[1])
        glu_rows = row_kernels()[1]
        glu_rows(self.glu, context.inputs[0], context.inputs[1], context.outputs[0], step,
                 NO_Q, NO_D, NO_D, NO_U)


class MultiplyLayer(RowProductLayer):
    type = "multiply"
