"""``permute``: nntrainer's PermuteLayer, a transpose of the channel, height and width axes.

    out[b, a_1, a_2, a_3] = in[b, ...] with output axis k taken from input axis direction[k]

Input ``(B, C, H, W)``; with ``direction`` "d1,d2,d3" (a permutation of 1 = channel,
2 = height, 3 = width; ":" separators are accepted too) the output has dims
``(B, dim[d1], dim[d2], dim[d3])``: "1,3,2" swaps height and width, "2,3,1" moves the channel
last (a convolution's ``(F, OH, OW)`` feature map to one row per position, ``(OH, OW, F)``).
An image layer: each step permutes the whole input.
"""

from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import str_


class PermuteLayer(Layer):
    type = "permute"
    properties = {"direction": str_(required=True)}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        text = self.props["direction"]
        try:
            axes = [int(v) for v in text.replace(":", ",").split(",")]
        except ValueError:
            axes = []
        if sorted(axes) != [1, 2, 3]:
            raise context.error(f"direction must be a permutation of 1,2,3 (channel, height, "
                                f"width), got {text!r}")
        d = dims[0]
        sizes = {1: d.channel, 2: d.height, 3: d.width}
        self.in_dim, self.axes = d, (0, *axes)
        context.setOutputDimensions([TensorDim(d.batch, *(sizes[a] for a in axes))])

    def incremental_forwarding(self, context, from_, to):
        d = self.in_dim
        x = context.inputs[0].reshape(d.batch, d.channel, d.height, d.width)
        out = context.outputs[0]
        out.reshape(out.shape[0], -1)[...] = x.transpose(self.axes).reshape(d.batch, -1)
