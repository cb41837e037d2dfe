"""``layer_normalization``: nntrainer's LayerNormalizationLayer (nntrainer/layers/layer_normalization_layer).

    mu = mean(x),  var = mean((x - mu)^2)                over the width W (axis 3)
    y  = (x - mu) / sqrt(var + epsilon) * gamma + beta   rows [0, step)

the biased-variance layer norm of torch.nn.LayerNorm (GPT-2's pre-norms, BERT's post-norms).
Input ``(B, 1, H, W)``; output the same. Weights, in order: ``gamma`` (W,), ``beta`` (W,).
Properties: ``axis`` (required; only 3, the width, is supported here), ``epsilon`` (float,
default 1e-3 as nntrainer's ``props::Epsilon``; models pass the config's value),
``gamma_initializer`` / ``beta_initializer`` / ``weight_decay`` / ``bias_decay`` (unused:
weights are loaded). A plain nntrainer Layer: any other key is an error.
"""

from causallm.kernels.layer_norm import layer_norm
from causallm.runtime.layer import Layer
from causallm.runtime.properties import float_, list_, str_


class LayerNormalizationLayer(Layer):
    type = "layer_normalization"
    properties = {
        "axis": list_(required=True),
        "epsilon": float_(1e-3),
        "gamma_initializer": str_("ones"),
        "beta_initializer": str_("zeros"),
        "weight_decay": float_(0.0),
        "bias_decay": float_(0.0),
    }

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        if sorted(set(self.props["axis"])) != ["3"]:
            raise context.error(f"axis={','.join(self.props['axis'])}: only axis=3 (the width) "
                                f"is supported")
        if not self.props["epsilon"] > 0:
            raise context.error(f"epsilon must be positive, got {self.props['epsilon']}")
        self.eps = self.props["epsilon"]
        width = dims[0].width
        context.requestWeight("gamma", (width,))
        context.requestWeight("beta", (width,))
        context.setOutputDimensions([dims[0]])

    def incremental_forwarding(self, context, from_, to):
        out = context.outputs[0]
        layer_norm(context.inputs[0], context.weights[0], context.weights[1], out,
                   min(to - from_, out.shape[1]), self.eps)
