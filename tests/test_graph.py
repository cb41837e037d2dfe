"""The graph API: property strings, the registry and the compiler's checks and order."""

import io

import numpy as np
import pytest

from causallm.api import UINT_MAX, createLayer, createModel, registerFactory, withKey
from causallm.errors import CausalLMError
from causallm.runtime.layer import Layer, TensorDim
from causallm.runtime.properties import float_, uint
from causallm.layers.rms_norm import RMSNormLayer
from causallm.layers.swiglu import SwiGLULayer

registerFactory(RMSNormLayer)
registerFactory(SwiGLULayer)


def inp(name="input0", width=4):
    return createLayer("input", [withKey("name", name), withKey("input_shape", f"1:1:{width}")])


def fc(name, unit, inputs=None, bias=False):
    props = [withKey("name", name), withKey("unit", unit), withKey("disable_bias", not bias)]
    if inputs:
        props.append(withKey("input_layers", inputs))
    return createLayer("fully_connected", props)


def test_withkey_formats():
    assert withKey("unit", 512) == "unit=512"
    assert withKey("input_layers", ["a", "b", "c"]) == "input_layers=a,b,c"
    assert withKey("disable_bias", True) == "disable_bias=true"
    assert withKey("is_causal", False) == "is_causal=false"
    assert withKey("epsilon", 1e-6) == "epsilon=1e-06"        # not std::to_string's 0.000001
    assert float(withKey("scale", 25.298221281347036).split("=")[1]) == 25.298221281347036
    assert withKey("rope_theta", np.float32(0.1)).split("=")[1] == repr(float(np.float32(0.1)))
    assert withKey("sliding_window", UINT_MAX) == "sliding_window=4294967295"
    assert withKey("name", "x") == "name=x"


def test_property_parsing_rules():
    layer = createLayer("rms_norm", ["NAME = n1 | Epsilon=1e-5", "packed=false"])
    assert layer.getName() == "n1"
    assert layer.layer.props["epsilon"] == 1e-5
    assert layer.getProperty("packed") is False
    # case-insensitive keys; an integral float for an unsigned property (C++ std::to_string)
    attn = createLayer("fully_connected", ["name=f", "UNIT=10000.000000"])
    assert attn.layer.props["unit"] == 10000


@pytest.mark.parametrize("props, needle", [
    (["name=f", "unit=abc"], "property 'unit' expects a non-negative integer"),
    (["name=f", "unit=1.5"], "property 'unit' expects a non-negative integer"),
    (["name=f", "unit=4", "disable_bias=yes"], "property 'disable_bias' expects true or false"),
    (["name=f", "unit=4", "colour=red"], "unknown property 'colour'"),
    (["name=f", "unit"], "not of the form key=value"),
    (["name=f", "unit=4", "weight_dtype=FP8"], "weight_dtype must be one of"),
])
def test_property_errors_name_layer_and_key(props, needle):
    with pytest.raises(CausalLMError) as e:
        createLayer("fully_connected", props)
    assert needle in str(e.value)
    assert "layer 'f' (fully_connected)" in str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_layer_type_lists_known():
    with pytest.raises(CausalLMError, match=r"unknown layer type 'rmsnorm'; registered types: .*rms_norm"):
        createLayer("rmsnorm", ["name=x"])


class Doubler(Layer):
    """A user layer: out = 2 * x + bias_value (a property)."""

    type = "doubler"
    properties = {"bias_value": float_(0.0), "copies": uint(1)}

    def finalize(self, context):
        context.setOutputDimensions(context.getInputDimensions()[:1])

    def incremental_forwarding(self, context, from_, to):
        step = to - from_
        x, y = context.getInput(0), context.getOutput(0)
        y[:, :step] = 2 * x[:, :step] + self.props["bias_value"]


class OtherDoubler(Doubler):
    type = "doubler"


def test_register_user_layer_and_duplicates():
    registerFactory(Doubler)
    registerFactory(Doubler)  # the same class again: fine (registerCustomLayers runs repeatedly)
    with pytest.raises(CausalLMError, match="layer type 'doubler' is already registered"):
        registerFactory(OtherDoubler)
    model = createModel()
    model.addLayer(inp(width=3))
    model.addLayer(createLayer("doubler", ["name=d", "bias_value=0.5"]))
    model.compile()
    model.initialize()
    out = model.incremental_inference(1, [np.array([[1, 2, 3]], np.float32)], None, 3, 0, 3)
    np.testing.assert_array_equal(out[0], [[2.5, 4.5, 6.5]])


def build(layers):
    model = createModel()
    for layer in layers:
        model.addLayer(layer)
    return model


def test_missing_input_layer():
    model = build([inp(), fc("a", 3, "nowhere")])
    with pytest.raises(CausalLMError, match="layer 'a': input layer 'nowhere' does not exist"):
        model.compile()


def test_duplicate_names():
    model = build([inp(), fc("a", 3), fc("a", 3)])
    with pytest.raises(CausalLMError, match="layer 'a': the name is used by more than one layer"):
        model.compile()


def test_cycle():
    model = build([inp(), fc("a", 4, "c"), fc("b", 4, "a"), fc("c", 4, "b"),
                   createLayer("addition", ["name=out", "input_layers=input0,c"])])
    with pytest.raises(CausalLMError, match="cycle among layers: a, b, c"):
        model.compile()


def test_shape_mismatch():
    model = build([inp(width=4), fc("a", 3, "input0"), fc("b", 5, "input0"),
                   createLayer("addition", ["name=sum", "input_layers=a,b"])])
    with pytest.raises(CausalLMError, match=r"layer 'sum' \(addition\): input dims differ: "
                                            r"1:1:1:3 vs 1:1:1:5"):
        model.compile()


@pytest.mark.parametrize("kind,names", [("multiply", "in0 and in1"), ("swiglu", "gate and up")])
def test_row_product_inputs(kind, names):
    """multiply and swiglu (one RowProductLayer) name their inputs in their errors."""
    model = build([inp(width=4), fc("a", 3, "input0"), fc("b", 5, "input0"),
                   createLayer(kind, ["name=p", "input_layers=a,b"])])
    with pytest.raises(CausalLMError, match=rf"layer 'p' \({kind}\): {names} dims differ: "
                                            r"1:1:1:3 vs 1:1:1:5"):
        model.compile()
    model = build([inp(width=4), fc("a", 3, "input0"),
                   createLayer(kind, ["name=p", "input_layers=a"])])
    with pytest.raises(CausalLMError, match=rf"layer 'p' \({kind}\): needs 2 inputs "
                                            rf"\[{names.replace(' and ', ', ')}\], got 1"):
        model.compile()


def test_required_property():
    model = build([inp(), createLayer("fully_connected", ["name=f"])])
    with pytest.raises(CausalLMError, match="layer 'f' .*property 'unit' is required"):
        model.compile()


def test_lifecycle_errors():
    model = build([inp(), fc("a", 3)])
    with pytest.raises(CausalLMError, match="after initialize"):
        model.incremental_inference(1, [np.zeros((1, 4))], None, 1, 0, 1)
    model.compile()
    with pytest.raises(CausalLMError, match="before compile"):
        model.addLayer(fc("b", 3))


def test_topological_order_keeps_valid_insertion_order_and_fixes_invalid():
    # valid insertion order is kept exactly (siblings are not reversed)
    model = build([inp(), fc("q", 4, "input0"), fc("k", 4, "input0"), fc("v", 4, "input0"),
                   createLayer("addition", ["name=s", "input_layers=q,k,v"])])
    model.compile()
    assert model.getLayerNames() == ["input0", "q", "k", "v", "s"]
    # a consumer inserted before its producer moves after it; nothing else moves
    model = build([inp(), fc("late", 4, "early"), fc("early", 4, "input0"), fc("other", 4, "input0")])
    model.compile()
    assert model.getLayerNames() == ["input0", "early", "late", "other"]
    # and the weight (.bin) order follows the sorted order
    assert [s.full_name for s in model.getWeightSpecs()] == ["early:weight", "late:weight",
                                                            "other:weight"]


def test_previous_input_and_activation_realizers():
    model = build([inp(width=3), fc("a", 3, "input0"),
                   createLayer("fully_connected", ["name=b", "unit=3", "disable_bias=true",
                                                   "activation=tanh"]),
                   createLayer("addition", ["name=s", "input_layers=b,a"])])
    model.compile()
    assert model.getLayerNames() == ["input0", "a", "b", "b/activation_realized", "s"]
    model.initialize()
    wa = np.eye(3, dtype=np.float32)
    wb = np.arange(9, dtype=np.float32).reshape(3, 3) / 10
    model.setWeight("a:weight", wa)
    model.setWeight("b:weight", wb)
    x = np.array([[0.5, -1.0, 2.0]], np.float32)
    out = model.incremental_inference(1, [x], None, 3, 0, 3)[0]
    np.testing.assert_allclose(out, x @ wa + np.tanh(x @ wb), rtol=1e-6)


def test_summarize_table():
    model = build([inp(width=4), fc("a", 3, "input0", bias=True)])
    model.compile()
    buf = io.StringIO()
    text = model.summarize(buf)
    assert buf.getvalue() == text
    row = [line.split() for line in text.splitlines() if line.startswith("a ")][0]
    assert row == ["a", "fully_connected", "input0", "1:1:1:3", "15"]
    assert "total parameters: 15" in text


def test_activation_buffers_are_reused():
    # a chain of 8 layers needs only a couple of pooled buffers besides input and output
    layers = [inp(width=16)] + [fc(f"f{i}", 16, "input0" if i == 0 else f"f{i - 1}")
                                for i in range(8)]
    model = build(layers)
    model.compile()
    model.initialize()
    pools = {id(b[0].base if b[0].base is not None else b[0])
             for b in model._buffers.values()}
    assert len(pools) <= 4
    for i in range(8):
        model.setWeight(f"f{i}:weight", np.eye(16, dtype=np.float32) * 2)
    out = model.incremental_inference(1, [np.ones((1, 16))], None, 16, 0, 1)[0]
    np.testing.assert_allclose(out, np.full((1, 16), 256.0))


def test_incremental_inference_checks():
    model = build([inp(width=4), fc("a", 3, "input0")])
    model.compile()
    model.initialize()
    with pytest.raises(CausalLMError, match="the weights were never loaded"):
        model.incremental_inference(1, [np.zeros((1, 4))], None, 1, 0, 1)
    model.setWeight("a:weight", np.ones((4, 3), np.float32))
    with pytest.raises(CausalLMError, match="batch 2 differs from the 1 rows of stage 'model'"):
        model.incremental_inference(2, [np.zeros((2, 4))], None, 1, 0, 1)
    with pytest.raises(CausalLMError, match="a step of 5 tokens exceeds the 4 rows"):
        model.incremental_inference(1, [np.zeros((1, 4))], None, 5, 0, 5)
    with pytest.raises(CausalLMError, match="need 0 <= from_ < to"):
        model.incremental_inference(1, [np.zeros((1, 4))], None, 1, 3, 3)


def test_set_weight_shape_error():
    model = build([inp(width=4), fc("a", 3, "input0")])
    model.compile()
    model.initialize()
    with pytest.raises(CausalLMError, match=r"weight 'a:weight': expected shape \(4, 3\), got \(3, 4\)"):
        model.setWeight("a:weight", np.zeros((3, 4), np.float32))


def test_tensor_dim_str():
    assert str(TensorDim(1, 1, 8, 64)) == "1:1:8:64"
