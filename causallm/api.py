"""The graph-building API a ported C++ model file calls, under the C++ names.

    from causallm.api import createLayer, createModel, withKey

    model = createModel()
    model.addLayer(createLayer("input", [withKey("name", "input0"), withKey("input_shape", "1:1:8")]))
    model.addLayer(createLayer("rms_norm", [withKey("name", "norm"), withKey("epsilon", 1e-6)]))

nntrainer's built-in layers (input, fully_connected, addition, multiply, activation) are
registered here; the CausalLM layers are registered by each model's ``registerCustomLayers``.
"""

from __future__ import annotations

from typing import Iterable

from causallm import registry
from causallm.graph import ExecutionMode, Model, ModelFormat, ModelType, createModel
from causallm.node import LayerHandle, LayerNode
from causallm.properties import UINT_MAX, withKey
from causallm.registry import registerFactory

__all__ = ["createLayer", "createModel", "withKey", "registerFactory", "LayerHandle", "Model",
           "ExecutionMode", "ModelFormat", "ModelType", "UINT_MAX"]


def createLayer(layer_type: str, props: Iterable[str] | str = ()) -> LayerNode:
    """``ml::train::createLayer(type, {"key=value", ...})``: an unknown type or property is an error."""
    _register_builtins()
    return LayerNode(layer_type, props)


_builtins_done = False


def _register_builtins() -> None:
    global _builtins_done
    if _builtins_done:
        return
    from layers.activation import ActivationLayer
    from layers.addition import AdditionLayer
    from layers.fully_connected import FullyConnectedLayer
    from layers.input import InputLayer
    from layers.multiply import MultiplyLayer

    for cls in (InputLayer, FullyConnectedLayer, AdditionLayer, MultiplyLayer, ActivationLayer):
        registry.registerFactory(cls)
    _builtins_done = True
