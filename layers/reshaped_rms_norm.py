"""``reshaped_rms_norm``: Applications/CausalLM/layers/reshaped_rms_norm (the per-head q/k norm).

Each row of width W is viewed as ``W / feature_size`` segments (one per head) and every segment
is RMS-normalised on its own, then scaled by the shared gamma:

    y[s] = x[s] / sqrt(mean(x[s]^2) + epsilon) * gamma        s = each feature_size-long segment

Input ``(B, 1, H, W)`` with ``W % feature_size == 0``; output the same.
Weight ``gamma`` ``(feature_size,)``. Properties: ``feature_size`` (required), ``epsilon``
(default 1e-3), ``gamma_initializer`` (unused).
"""

from causallm.kernels import rms_norm
from causallm.kernels.norm import rms_norm_op
from causallm.runtime.layer import Layer
from causallm.runtime.properties import float_, str_, uint


class ReshapedRMSNormLayer(Layer):
    type = "reshaped_rms_norm"
    properties = {"epsilon": float_(1e-3), "feature_size": uint(required=True),
                  "gamma_initializer": str_("ones")}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        fs = self.props["feature_size"]
        if fs < 1 or dims[0].width % fs:
            raise context.error(f"input width {dims[0].width} is not a multiple of "
                                f"feature_size {fs}")
        self.feature_size, self.eps = fs, self.props["epsilon"]
        context.requestWeight("gamma", (fs,))
        context.setOutputDimensions([dims[0]])

    def team_ops(self, context, step):
        """The step as a team op (runtime/runner.py, ``team_plan``)."""
        out = context.outputs[0]
        op = rms_norm_op(context.inputs[0], context.weights[0], out, min(step, out.shape[1]),
                         self.eps, self.feature_size)
        return None if op is None else [op]

    def incremental_forwarding(self, context, from_, to):
        out = context.outputs[0]
        rms_norm(context.inputs[0], context.weights[0], out, min(to - from_, out.shape[1]),
                 self.eps, self.feature_size)
