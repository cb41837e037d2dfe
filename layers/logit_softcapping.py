"""``logit_softcapping``: tanh soft-capping of a tensor (no NNTrainer twin; Gemma's
``final_logit_softcapping``, which the C++ Gemma3CausalLM does not apply: docs/nntrainer.md,
"Gemma 3 final logit softcapping").

    y = tanh(x / softcapping) * softcapping          element-wise, rows [0, step)

Input ``(B, 1, H, W)`` (the LM head's logits ``(B, 1, 1, vocab)``); output the same dims.
No weights, so a .bin is unchanged by it. Property: ``softcapping`` (float, required, > 0).
"""

from causallm.kernels.softcap import softcap
from causallm.runtime.layer import Layer
from causallm.runtime.properties import float_


class LogitSoftcappingLayer(Layer):
    type = "logit_softcapping"
    properties = {"softcapping": float_(required=True)}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        self.cap = self.props["softcapping"]
        if not self.cap > 0:
            raise context.error(f"softcapping must be positive, got {self.cap}")
        context.setOutputDimensions([dims[0]])

    def incremental_forwarding(self, context, from_, to):
        out = context.outputs[0]
        softcap(context.inputs[0], out, min(to - from_, out.shape[1]), self.cap)
