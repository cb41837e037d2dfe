"""``conv2d``: nntrainer's Conv2DLayer, a 2-D convolution (cross-correlation, as torch's Conv2d).

    out[b, f, y, x] = bias[f] + sum_{c, i, j} W[f, c, i, j] * in[b, c, r, s]
        r = y*sy + i*dy - pt,  s = x*sx + j*dx - pl

Input ``(B, C, H, W)``; output ``(B, F, OH, OW)`` with ``OH = (H + pt + pb - dy*(KH-1) - 1) // sy
+ 1`` (likewise OW), positions outside the input reading 0. An image layer: each step
convolves the whole input (the step's rows do not apply). Weights, in order: ``filter``
``(F, C, KH, KW)`` (nntrainer's and PyTorch's layout) and, unless ``disable_bias``, ``bias``
``(F,)``. Properties: ``filters`` (F, required), ``kernel_size`` ("KH,KW", required), ``stride``
("1,1"), ``dilation`` ("1,1"), ``padding`` ("valid" = none, "same" = the output keeps H x W at
stride 1, or "p", "ph,pw" or "pt,pb,pl,pr"). SigLIP's patch embedding is the case
kernel_size = stride = patch, padding valid: one matrix product over the patches.
"""

import numpy as np

from causallm.kernels.threads import matmul
from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import list_, str_, uint


def _pair(values, name, context, default=None):
    if not values and default is not None:
        return default
    try:
        ints = [int(v) for v in values]
    except ValueError:
        ints = []
    if len(ints) == 1:
        ints = ints * 2
    if len(ints) != 2 or min(ints) < 1:
        raise context.error(f"{name} must be one or two positive integers, got "
                            f"{','.join(values)!r}")
    return tuple(ints)


class Conv2DLayer(Layer):
    type = "conv2d"
    layer_impl = True
    properties = {"filters": uint(required=True), "kernel_size": list_(required=True),
                  "stride": list_(), "dilation": list_(), "padding": str_("valid")}

    def finalize(self, context):
        dims = context.getInputDimensions()
        if len(dims) != 1:
            raise context.error(f"needs 1 input, got {len(dims)}")
        p = self.props
        d = dims[0]
        self.kernel = _pair(p["kernel_size"], "kernel_size", context)
        self.stride = _pair(p["stride"], "stride", context, (1, 1))
        self.dilation = _pair(p["dilation"], "dilation", context, (1, 1))
        self.pad = self._padding(p["padding"], context)
        F = p["filters"]
        if F < 1:
            raise context.error("filters must be at least 1")
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.stride, self.dilation
        pt, pb, pl, pr = self.pad
        oh = (d.height + pt + pb - dh * (kh - 1) - 1) // sh + 1
        ow = (d.width + pl + pr - dw * (kw - 1) - 1) // sw + 1
        if oh < 1 or ow < 1:
            raise context.error(f"kernel {kh}x{kw} does not fit the {d.height}x{d.width} input")
        self.in_dim, self.out_hw = d, (oh, ow)
        context.requestWeight("filter", (F, d.channel, kh, kw))
        self.has_bias = not p.get("disable_bias", False)
        if self.has_bias:
            context.requestWeight("bias", (F,))
        context.setOutputDimensions([TensorDim(d.batch, F, oh, ow)])

    def _padding(self, text, context):
        text = text.strip().lower()
        if text == "valid":
            return (0, 0, 0, 0)
        if text == "same":
            if self.stride != (1, 1):
                raise context.error("padding=same needs stride 1")
            (kh, kw), (dh, dw) = self.kernel, self.dilation
            th, tw = dh * (kh - 1), dw * (kw - 1)
            return (th // 2, th - th // 2, tw // 2, tw - tw // 2)
        try:
            v = [int(x) for x in text.split(",")]
        except ValueError:
            v = []
        if len(v) == 1:
            v = v * 4
        elif len(v) == 2:
            v = [v[0], v[0], v[1], v[1]]
        if len(v) != 4 or min(v) < 0:
            raise context.error(f"padding must be valid, same, or 1, 2 or 4 non-negative "
                                f"integers, got {text!r}")
        return tuple(v)

    def incremental_forwarding(self, context, from_, to):
        d = self.in_dim
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.stride, self.dilation
        pt, pb, pl, pr = self.pad
        oh, ow = self.out_hw
        x = context.inputs[0].reshape(d.batch, d.channel, d.height, d.width)
        if any(self.pad):
            x = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
        w = context.weights[0]
        F = w.shape[0]
        if (kh, kw) == (sh, sw) and (dh, dw) == (1, 1):  # patches: a reshape, no overlap
            x = x[:, :, :oh * kh, :ow * kw].reshape(d.batch, d.channel, oh, kh, ow, kw)
            cols = x.transpose(0, 2, 4, 1, 3, 5)                    # (B, OH, OW, C, KH, KW)
        else:
            win = np.lib.stride_tricks.sliding_window_view(
                x, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(2, 3))
            win = win[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :oh, :ow]  # (B, C, OH, OW, KH, KW)
            cols = win.transpose(0, 2, 3, 1, 4, 5)
        cols = cols.reshape(d.batch * oh * ow, -1)
        y = np.empty((cols.shape[0], F), np.float32)                # (B * OH * OW, F)
        matmul(cols, w.reshape(F, -1).T, y)
        if self.has_bias:
            y += context.weights[1]
        out = context.outputs[0].reshape(d.batch, F, oh * ow)
        out[...] = y.reshape(d.batch, oh * ow, F).transpose(0, 2, 1)
