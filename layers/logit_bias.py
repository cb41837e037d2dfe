"""``logit_bias``: a learned bias added to the logits (BART's and Marian's ``final_logits_bias``).

    out[b, i] = x[b, i] + bias                  rows [0, step), bias (W,)

Input ``(B, 1, H, W)`` (the LM head's output, H = 1); output the same. Weight ``bias`` (W,),
stored in the activation dtype. No properties.
"""

from causallm.kernels import add_row
from causallm.runtime.layer import Layer


class LogitBiasLayer(Layer):
    type = "logit_bias"

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        context.requestWeight("bias", (dims[0].width,), context.activation_dtype)
        context.setOutputDimensions([dims[0]])

    def incremental_forwarding(self, context, from_, to):
        out = context.outputs[0]
        add_row(context.inputs[0], context.weights[0], out, min(to - from_, out.shape[1]))
