"""The image layers of the vision towers (conv2d, pooling2d, permute, reshape) and the layers
that put image features and special vectors into a text embedding, each against its formula
written with plain loops."""

import numpy as np
import pytest
from graphs import build, feature_input

from causallm.api import createLayer, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.layers.embedding_merge import EmbeddingMergeLayer
from causallm.layers.special_token_embedding import SpecialTokenEmbeddingLayer

for _cls in (EmbeddingMergeLayer, SpecialTokenEmbeddingLayer):
    registerFactory(_cls)

F32 = np.float32


def rand(*shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(F32)


def image_input(c, h, w):
    return createLayer("input", [withKey("name", "image"), withKey("input_shape", f"{c}:{h}:{w}")])


def run(model, x, rows=1):
    batch = x.shape[0]
    return model.incremental_inference(batch, [x.reshape(batch, -1)], None, None, 0, rows)[0]


def conv_loops(x, w, b, stride, pad, dil):
    """out[f, y, x] = b[f] + sum W[f, c, i, j] * in[c, y*sy + i*dy - pt, x*sx + j*dx - pl]."""
    C, H, W = x.shape
    F, _, KH, KW = w.shape
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = stride, pad, dil
    OH = (H + pt + pb - dh * (KH - 1) - 1) // sh + 1
    OW = (W + pl + pr - dw * (KW - 1) - 1) // sw + 1
    out = np.zeros((F, OH, OW))
    for f in range(F):
        for y in range(OH):
            for xx in range(OW):
                acc = b[f]
                for c in range(C):
                    for i in range(KH):
                        for j in range(KW):
                            r, q = y * sh + i * dh - pt, xx * sw + j * dw - pl
                            if 0 <= r < H and 0 <= q < W:
                                acc += w[f, c, i, j] * x[c, r, q]
                out[f, y, xx] = acc
    return out


CONV_CASES = {
    # name: (C, H, W, F, kernel, stride, padding text, (pt, pb, pl, pr), dilation)
    "patches": (3, 8, 12, 5, (4, 4), (4, 4), "valid", (0, 0, 0, 0), (1, 1)),
    "patches_ragged": (3, 9, 10, 4, (4, 4), (4, 4), "valid", (0, 0, 0, 0), (1, 1)),
    "stride1_same": (2, 6, 7, 3, (3, 3), (1, 1), "same", (1, 1, 1, 1), (1, 1)),
    "stride2_pad": (2, 7, 9, 3, (3, 2), (2, 3), "1,0,2,1", (1, 0, 2, 1), (1, 1)),
    "dilated": (1, 9, 9, 2, (2, 3), (1, 2), "valid", (0, 0, 0, 0), (2, 2)),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv2d(case):
    C, H, W, F, k, s, ptext, pad, dil = CONV_CASES[case]
    model = build([image_input(C, H, W), createLayer("conv2d", [
        withKey("name", "conv"), withKey("filters", F), withKey("kernel_size", f"{k[0]},{k[1]}"),
        withKey("stride", f"{s[0]},{s[1]}"), withKey("dilation", f"{dil[0]},{dil[1]}"),
        withKey("padding", ptext)])], batch=2)
    w, b = rand(F, C, *k, seed=1), rand(F, seed=2)
    model.setWeight("conv:filter", w)
    model.setWeight("conv:bias", b)
    x = rand(2, C, H, W, seed=3)
    got = run(model, x)
    for n in range(2):
        want = conv_loops(x[n], w, b, s, pad, dil)
        np.testing.assert_allclose(got[n].reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_conv2d_without_bias_and_bad_kernel():
    model = build([image_input(1, 4, 4), createLayer("conv2d", [
        withKey("name", "conv"), withKey("filters", 2), withKey("kernel_size", "2,2"),
        withKey("stride", "2,2"), withKey("disable_bias", "true")])])
    assert [s.full_name for s in model.getWeightSpecs()] == ["conv:filter"]
    with pytest.raises(CausalLMError, match="kernel 5x5 does not fit the 4x4 input"):
        build([image_input(1, 4, 4), createLayer("conv2d", [
            withKey("name", "conv"), withKey("filters", 2), withKey("kernel_size", "5")])])


@pytest.mark.parametrize("mode,size,stride", [("average", (2, 2), (2, 2)),
                                              ("max", (3, 2), (1, 2)),
                                              ("global_average", None, None)])
def test_pooling2d(mode, size, stride):
    C, H, W = 3, 6, 8
    props = [withKey("name", "pool"), withKey("pooling", mode)]
    if size:
        props += [withKey("pool_size", f"{size[0]},{size[1]}"),
                  withKey("stride", f"{stride[0]},{stride[1]}")]
    model = build([image_input(C, H, W), createLayer("pooling2d", props)])
    x = rand(1, C, H, W, seed=4)
    got = run(model, x)[0]
    (ph, pw), (sh, sw) = (size, stride) if size else ((H, W), (1, 1))
    OH, OW = (H - ph) // sh + 1, (W - pw) // sw + 1
    want = np.zeros((C, OH, OW))
    for c in range(C):
        for y in range(OH):
            for xx in range(OW):
                win = x[0, c, y * sh:y * sh + ph, xx * sw:xx * sw + pw]
                want[c, y, xx] = win.max() if mode == "max" else win.mean()
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("direction", ["1,3,2", "2,3,1", "3:1:2", "2,1,3"])
def test_permute(direction):
    C, H, W = 2, 3, 4
    model = build([image_input(C, H, W), createLayer("permute", [
        withKey("name", "perm"), withKey("direction", direction)])])
    x = rand(1, C, H, W, seed=5)
    axes = [int(a) for a in direction.replace(":", ",").split(",")]
    want = x[0].transpose([a - 1 for a in axes])
    np.testing.assert_array_equal(run(model, x)[0].reshape(want.shape), want)


def test_permute_and_reshape_errors():
    with pytest.raises(CausalLMError, match="permutation of 1,2,3"):
        build([image_input(1, 2, 3), createLayer("permute", [withKey("name", "p"),
                                                             withKey("direction", "1,1,2")])])
    with pytest.raises(CausalLMError, match="holds 7 values; the input 1:1:2:3 holds 6"):
        build([image_input(1, 2, 3), createLayer("reshape", [withKey("name", "r"),
                                                             withKey("target_shape", "7:1:1")])])


def test_reshape_keeps_the_values():
    model = build([image_input(2, 3, 4), createLayer("reshape", [
        withKey("name", "r"), withKey("target_shape", "1:6:4")])])
    x = rand(1, 2, 3, 4, seed=6)
    np.testing.assert_array_equal(run(model, x)[0], x.reshape(-1))


def ids_input(n):
    return createLayer("input", [withKey("name", "ids"), withKey("input_shape", f"1:1:{n}")])


def test_embedding_merge_takes_the_source_rows_at_the_token():
    L, W, token = 6, 5, 9
    model = build([ids_input(L), feature_input("x", L, W), feature_input("src", L, W),
                   createLayer("embedding_merge", [withKey("name", "m"), withKey("token_id", token),
                                                   withKey("input_layers", "ids,x,src")])], batch=2)
    ids = np.array([[1, 9, 9, 4, 9, 2], [9, 3, 3, 3, 3, 3]], F32)
    x, src = rand(2, L, W, seed=7), rand(2, L, W, seed=8)
    out = model.incremental_inference(2, [ids, x.reshape(2, -1), src.reshape(2, -1)], None,
                                      None, 0, 5)[0].reshape(2, L, W)[:, :5]
    want = np.where((ids[:, :5] == token)[..., None], src[:, :5], x[:, :5])
    np.testing.assert_array_equal(out, want)


def test_special_token_embedding_swaps_in_its_vector():
    L, W, token = 4, 3, 2
    model = build([ids_input(L), feature_input("x", L, W), createLayer(
        "special_token_embedding", [withKey("name", "eoi"), withKey("token_id", token),
                                    withKey("input_layers", "ids,x")])])
    vec = rand(W, seed=9)
    model.setWeight("eoi:embedding", vec)
    ids = np.array([[2, 0, 2, 1]], F32)
    x = rand(1, L, W, seed=10)
    out = model.incremental_inference(1, [ids, x.reshape(1, -1)], None, None, 0, 4)[0]
    want = np.where((ids == token)[..., None], vec, x)
    np.testing.assert_array_equal(out.reshape(1, L, W), want)
