"""``swiglu``: Applications/CausalLM/layers/swiglu (SwiGLULayer).

    out = silu(gate) * up = gate * sigmoid(gate) * up        rows [0, step)

Inputs ``[gate, up]`` (every model passes ``ffn_gate, ffn_up`` in that order), equal dims;
output: the dims of ``gate``. No properties.
"""

from causallm.kernels.quant import GLU_SWIGLU, NO_ACT, NO_D, NO_Q, NO_U, glu_op, row_kernels
from causallm.runtime.layer import Layer


class SwiGLULayer(Layer):
    type = "swiglu"

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 2:
            raise context.error(f"needs 2 inputs [gate, up], got {len(dims)}")
        if dims[0] != dims[1]:
            raise context.error(f"gate and up dims differ: {dims[0]} vs {dims[1]}")
        context.setOutputDimensions([dims[0]])

    def team_ops(self, context, step):
        """The step as a team op (runtime/runner.py, ``team_plan``)."""
        out = context.outputs[0]
        op = glu_op(NO_ACT, GLU_SWIGLU, context.inputs[0], context.inputs[1], out,
                    min(step, out.shape[1]), NO_Q, NO_D, NO_D, NO_U)
        return None if op is None else [op]

    def incremental_forwarding(self, context, from_, to):
        step = min(to - from_, context.outputs[0].shape[1])
        glu_rows = row_kernels()[1]
        glu_rows(GLU_SWIGLU, context.inputs[0], context.inputs[1], context.outputs[0], step,
                 NO_Q, NO_D, NO_D, NO_U)
