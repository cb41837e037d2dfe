"""``activation``: nntrainer's ActivationLayer, elementwise.

    silu/swish(x) = x * sigmoid(x)
    gelu(x)       = 0.5 x (1 + erf(x / sqrt 2))
    tanh_gelu(x)  = 0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3)))   (HF gelu_pytorch_tanh)
    relu, tanh, sigmoid, none

Applied to rows [0, step) only (NNTrainer runs it over the whole buffer: docs/nntrainer.md,
"Activations over the whole buffer").
Property: ``activation`` (required). Also created by compile() for ``activation=X`` on
another layer, as ``<layer>/activation_realized``.
"""

from causallm.kernels import ACTIVATIONS, activation
from causallm.kernels.elementwise import activation_op
from causallm.runtime.layer import Layer
from causallm.runtime.properties import str_


class ActivationLayer(Layer):
    type = "activation"
    properties = {"activation": str_(required=True, choices=tuple(ACTIVATIONS))}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        self.kind = ACTIVATIONS[self.props["activation"]]
        context.setOutputDimensions([dims[0]])

    def team_ops(self, context, step):
        """The step as a team op (runtime/runner.py, ``team_plan``)."""
        out = context.outputs[0]
        op = activation_op(context.inputs[0], out, min(step, out.shape[1]), self.kind)
        return None if op is None else [op]

    def incremental_forwarding(self, context, from_, to):
        step = min(to - from_, context.outputs[0].shape[1])
        activation(context.inputs[0], context.outputs[0], step, self.kind)
