"""``pooling2d``: nntrainer's Pooling2DLayer, max or average pooling over 2-D windows.

    average: out[b, c, y, x] = mean_{i < PH, j < PW} in[b, c, y*sy + i, x*sx + j]
    max:     out[b, c, y, x] = max_{i < PH, j < PW} in[b, c, y*sy + i, x*sx + j]

Input ``(B, C, H, W)``; output ``(B, C, OH, OW)``, ``OH = (H - PH) // sy + 1`` (no padding; the
global modes pool the whole plane to 1 x 1). An image layer: each step pools the whole input.
Properties: ``pooling`` (max | average | global_max | global_average, required),
``pool_size`` ("PH,PW", required unless global), ``stride`` ("1,1"), ``padding`` ("valid"
only). Gemma 3's multimodal projector averages the patch grid down to ``mm_tokens_per_image``
tokens (torch's AvgPool2d with kernel = stride).
"""

import numpy as np

from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import list_, str_
from causallm.layers.conv2d import _pair

MODES = ("max", "average", "global_max", "global_average")


class Pooling2DLayer(Layer):
    type = "pooling2d"
    properties = {"pooling": str_(required=True, choices=MODES), "pool_size": list_(),
                  "stride": list_(), "padding": str_("valid")}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        d = dims[0]
        p = self.props
        if p["padding"].strip().lower() != "valid":
            raise context.error(f"padding={p['padding']!r}: only valid is supported")
        self.mode = p["pooling"]
        if self.mode.startswith("global"):
            self.size, self.stride = (d.height, d.width), (1, 1)
        else:
            self.size = _pair(p["pool_size"], "pool_size", context)
            self.stride = _pair(p["stride"], "stride", context, (1, 1))
        (ph, pw), (sh, sw) = self.size, self.stride
        oh, ow = (d.height - ph) // sh + 1, (d.width - pw) // sw + 1
        if ph > d.height or pw > d.width:
            raise context.error(f"pool_size {ph}x{pw} does not fit the {d.height}x{d.width} input")
        self.in_dim, self.out_hw = d, (oh, ow)
        context.setOutputDimensions([TensorDim(d.batch, d.channel, oh, ow)])

    def incremental_forwarding(self, context, from_, to):
        d = self.in_dim
        (ph, pw), (sh, sw) = self.size, self.stride
        oh, ow = self.out_hw
        x = context.inputs[0].reshape(d.batch, d.channel, d.height, d.width)
        if (ph, pw) == (sh, sw):  # non-overlapping windows: a reshape
            win = x[:, :, :oh * ph, :ow * pw].reshape(d.batch, d.channel, oh, ph, ow, pw)
            axes = (3, 5)
        else:
            win = np.lib.stride_tricks.sliding_window_view(x, (ph, pw), axis=(2, 3))
            win = win[:, :, ::sh, ::sw][:, :, :oh, :ow]
            axes = (4, 5)
        pooled = win.max(axis=axes) if self.mode.endswith("max") else win.mean(axis=axes)
        context.outputs[0].reshape(d.batch, d.channel, oh, ow)[...] = pooled
