"""LayerNode: a layer instance plus the node-level properties nntrainer's ``LayerNode`` consumes.

``createLayer(type, props)`` returns one of these (``LayerHandle``). The node takes the keys every
layer has (``name``, ``input_layers``, ``input_shape``, ``shared_from``, ``weight_dtype``,
``packed``, ``activation``, ...); the rest are the layer's own and are converted by the layer's
declared specs. An unknown key is an error naming the layer and the key.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from causallm.errors import CausalLMError
from causallm.runtime import registry
from causallm.runtime.layer import DTYPES, Layer
from causallm.runtime.properties import Prop, bool_, float_, parse_into, split_properties, str_

NODE_PROPERTIES: dict[str, Prop] = {
    "name": str_(),
    "input_layers": Prop("list"),
    "input_shape": str_(),
    "shared_from": str_(),
    "weight_dtype": str_(),
    "packed": bool_(True),
    "activation": str_(),
    "trainable": bool_(False),
    "distribute": bool_(False),
    "flatten": bool_(False),
    "compute_engine": str_("cpu"),
    "loss_scale": float_(1.0),
    "clip_grad_by_global_norm": float_(0.0),
}

LAYER_IMPL_PROPERTIES: dict[str, Prop] = {
    "disable_bias": bool_(False),
    "weight_initializer": str_("xavier_uniform"),
    "bias_initializer": str_("zeros"),
    "weight_regularizer": str_("none"),
    "weight_regularizer_constant": float_(1.0),
    "weight_decay": float_(0.0),
    "bias_decay": float_(0.0),
    "print": str_(),
}

_INPUT_REF = re.compile(r"^(?P<name>[^()]+)(\((?P<idx>\d+)\))?$")


class LayerNode:
    """One node of the graph (nntrainer ``LayerNode``); ``createLayer`` returns it."""

    def __init__(self, layer_type: str, props: Iterable[str] = ()) -> None:
        layer_class = registry.get(layer_type)
        self.layer: Layer = layer_class()
        self.node_props: dict[str, Any] = {}
        self.setProperty(props)

    # -- properties -------------------------------------------------------------------------
    def setProperty(self, props: Iterable[str]) -> None:
        layer = self.layer
        props = [props] if isinstance(props, str) else list(props)
        # the name first, so every message can name the layer
        for prop in props:
            for part in str(prop).split("|"):
                key, _, value = "".join(part.split()).partition("=")
                if key.lower() == "name" and value:
                    self.node_props["name"] = value
        where = f"layer '{self.node_props.get('name') or '?'}' ({layer.type})"
        pairs = split_properties(props, where)
        where = f"layer '{self.node_props.get('name') or '?'}' ({layer.type})"

        layer_specs = dict(layer.properties)
        if layer.layer_impl:
            layer_specs = {**LAYER_IMPL_PROPERTIES, **layer_specs}
        node_specs = dict(NODE_PROPERTIES)
        if "activation" in {k.lower() for k in layer_specs}:
            node_specs.pop("activation")  # the activation layer's own key

        def unknown(key: str, value: str) -> None:
            raise CausalLMError(f"{where}: unknown property '{key}' (known: "
                                f"{', '.join(sorted(set(node_specs) | set(layer_specs)))})")

        def to_layer(key: str, value: str) -> None:
            parse_into(layer_specs, [(key, value)], layer.props, where, unknown)

        parse_into(node_specs, pairs, self.node_props, where, to_layer)
        dtype = self.node_props.get("weight_dtype")
        if dtype is not None and dtype.upper() not in DTYPES:
            raise CausalLMError(f"{where}: weight_dtype must be one of {', '.join(DTYPES)}; "
                                f"got {dtype!r}")

    def getProperty(self, key: str, default: Any = None) -> Any:
        if key in self.node_props:
            return self.node_props[key]
        return self.layer.props.get(key, default)

    def layerProperty(self, key: str) -> Any:
        """The layer's own property, with its declared default."""
        if key in self.layer.props:
            return self.layer.props[key]
        specs = self.layer.properties
        if self.layer.layer_impl and key not in specs:
            specs = LAYER_IMPL_PROPERTIES
        return specs[key].default

    # -- identity and wiring ----------------------------------------------------------------
    def getName(self) -> str:
        return self.node_props.get("name") or ""

    def setName(self, name: str) -> None:
        self.node_props["name"] = name

    def getType(self) -> str:
        return self.layer.type

    def getInputConnections(self) -> list[tuple[str, int]]:
        """``input_layers`` as (producer name, output index) pairs; ``name(1)`` picks output 1."""
        refs = []
        for entry in self.node_props.get("input_layers") or []:
            match = _INPUT_REF.match(entry)
            if not match:
                raise CausalLMError(f"layer '{self.getName()}': bad input_layers entry {entry!r}")
            refs.append((match["name"], int(match["idx"] or 0)))
        return refs

    def setInputConnections(self, refs: list[tuple[str, int]]) -> None:
        self.node_props["input_layers"] = [n if i == 0 else f"{n}({i})" for n, i in refs]

    def __repr__(self) -> str:
        return f"LayerNode({self.getType()!r}, name={self.getName()!r})"


LayerHandle = LayerNode
