"""The graph-building API a ported C++ model file calls, under the C++ names.

    from causallm.api import createLayer, createModel, withKey

    model = createModel()
    model.addLayer(createLayer("input", [withKey("name", "input0"), withKey("input_shape", "1:1:8")]))
    model.addLayer(createLayer("rms_norm", [withKey("name", "norm"), withKey("epsilon", 1e-6)]))

nntrainer's built-in layers (input, fully_connected, addition, multiply, activation) register
themselves when the ``layers`` package loads (the registry loads it on first use, as nntrainer's
AppContext registers its built-ins at start-up); the CausalLM layers are registered by each
model's ``registerCustomLayers``.
"""

from __future__ import annotations

from typing import Iterable

from causallm.runtime.graph import NEURAL_NET, ExecutionMode, Model, ModelFormat, createModel
from causallm.runtime.node import LayerHandle, LayerNode
from causallm.runtime.properties import UINT_MAX, withKey
from causallm.runtime.registry import registerFactory

__all__ = ["createLayer", "createModel", "withKey", "registerFactory", "LayerHandle", "Model",
           "ExecutionMode", "ModelFormat", "NEURAL_NET", "UINT_MAX"]


def createLayer(layer_type: str, props: Iterable[str] | str = ()) -> LayerNode:
    """``ml::train::createLayer(type, {"key=value", ...})``: an unknown type or property is an error."""
    return LayerNode(layer_type, props)
