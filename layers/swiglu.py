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
    input_names = ("gate", "up")
