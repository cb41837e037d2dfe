"""``lm_head``: Applications/CausalLM/layers/lm_head (LmHeadLayer), the untied output head.

    logits[b, j] = x[b, r_j] @ W (+ bias)        x (B, 1, H, D) -> (B, 1, L, unit)

Only the rows r_j a head needs are projected (``project_last``): the step's last, or with a
step of several sequences (``context.step``) the last row of each sequence whose next token is
wanted; L = the model's slots / batch (1 unless the model holds more sequences than batch
rows). Weights: ``weight`` (D, unit) = [in, out] in the
node's weight dtype (``lmhead_dtype``); ``bias`` (unit,) unless ``disable_bias=true`` (CausalLM
passes true). Properties: ``unit`` (required, the vocabulary size), ``disable_bias``.
"""

from causallm.kernels import linear
from causallm.kernels.linear import linear_ops
from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import uint
from causallm.layers.fully_connected import NO_BIAS


class LmHeadLayer(Layer):
    type = "lm_head"
    layer_impl = True
    properties = {"unit": uint(required=True)}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        unit, x = self.props["unit"], dims[0]
        context.requestWeight("weight", (x.width, unit), packable=True)
        self.has_bias = not self.props["disable_bias"]
        if self.has_bias:
            context.requestWeight("bias", (unit,), context.activation_dtype)
        context.setOutputDimensions([head_dims(self, context, x, unit)])

    def team_ops(self, context, step):
        w = context.weights
        return project_last_ops(context, w[0], w[1] if self.has_bias else NO_BIAS)

    def incremental_forwarding(self, context, from_, to):
        w = context.weights
        project_last(self, context, w[0], w[1] if self.has_bias else NO_BIAS)


def head_dims(layer, context, x, unit) -> TensorDim:
    """A head's output dims (B, 1, L, unit), L = slots / batch: the logits of as many
    sequences as a batch row may carry; with L > 1 the layer keeps a (B, L, D) tensor to
    gather their rows in."""
    heads = context.slots // context.batch
    layer.gather = context.requestTensor("rows", (x.batch, heads, x.width)) if heads > 1 else None
    return TensorDim(x.batch, 1, heads, unit)


def project_last(layer, context, w, bias) -> None:
    """out[b, j] = x[b, step.last[b, j]] @ w + bias for j < step.n_last (every batch's last row
    alone when the step is one sequence per batch row: no gather)."""
    x, out, step = context.inputs[0], context.outputs[0], context.step
    if step.last_row is not None:
        linear(x, w, bias, out, min(step.last_row, x.shape[1] - 1), 0, 1)
        return
    rows, n = context.tensors[layer.gather], step.n_last
    for b in range(x.shape[0]):
        rows[b, :n] = x[b, step.last[b, :n]]
    linear(rows, w, bias, out, 0, 0, n)


def project_last_ops(context, w, bias):
    """``project_last`` as team ops (runtime/runner.py, ``team_plan``; ``linear_ops``): every
    batch's row ``step.last_row`` times w; None for a step whose rows need gathering."""
    x, out, rows = context.inputs[0], context.outputs[0], context.step
    if rows.last_row is None:
        return None
    return linear_ops(x, w, bias, out, min(rows.last_row, x.shape[1] - 1), 0, 1)
