"""``swiglu``: Applications/CausalLM/layers/swiglu (SwiGLULayer).

    out = silu(gate) * up = gate * sigmoid(gate) * up        rows [0, step)

Inputs ``[gate, up]`` (every model passes ``ffn_gate, ffn_up`` in that order), equal dims;
output: the dims of ``gate``. No properties.
"""

from causallm.kernels.quant import GLU_SWIGLU
from causallm.layers.multiply import RowProductLayer


class SwiGLULayer(RowProductLayer):
    type = "swiglu"
    glu = GLU_SWIGLU

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 2:
            raise context.error(f"needs 2 inputs [gate, up], got {len(dims)}")
        if dims[0] != dims[1]:
            raise context.error(f"gate and up dims differ: {dims[0]} vs {dims[1]}")
        context.setOutputDimensions([dims[0]])
