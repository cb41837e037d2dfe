"""``rms_norm``: Applications/CausalLM/layers/rms_norm (RMSNormLayer).

    y = x / sqrt(mean(x^2) + epsilon) * gamma        over the width W, rows [0, step)

Input ``(B, 1, H, W)``; output the same. Weight ``gamma`` ``(W,)``; models pass ``packed=false``
so it is stored in the activation dtype (FP32). Gemma's ``(1 + w)`` norms store ``1 + w`` as
gamma (the converter adds the 1); the layer always multiplies by the stored gamma.
Properties: ``epsilon`` (float, default 1e-3 as in nntrainer), ``gamma_initializer`` (unused).
"""

from causallm.kernels.quant import NO_D, NO_Q, NO_ROWS, NO_U, row_kernels
from causallm.runtime.layer import Layer
from causallm.runtime.properties import float_, str_


class RMSNormLayer(Layer):
    type = "rms_norm"
    properties = {"epsilon": float_(1e-3), "gamma_initializer": str_("ones")}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        self.width = dims[0].width
        self.eps = self.props["epsilon"]
        context.requestWeight("gamma", (self.width,))
        context.setOutputDimensions([dims[0]])

    def incremental_forwarding(self, context, from_, to):
        out = context.outputs[0]
        # the kernel also adds the residual before and rounds the rows for the product after
        # when the execution plan runs them together (runtime/runner.py, NormRows)
        norm_rows = row_kernels()[0]
        norm_rows(context.inputs[0], NO_ROWS, NO_ROWS, context.weights[0], out,
                  min(to - from_, out.shape[1]), self.eps, NO_Q, NO_D, NO_D, NO_U)
