"""The layer registry: type string -> layer class, as nntrainer's ``AppContext`` factory map.

``registerFactory(RMSNormLayer)`` mirrors ``app_context->registerFactory(createLayer<RMSNormLayer>)``.
Registering the same class again is a no-op (``registerCustomLayers`` runs on every
``initialize``); registering a different class under a taken type is an error, as is asking for a
type nobody registered.

The built-in layers (nntrainer's own: input, fully_connected, addition, multiply, activation)
register themselves when their package, ``BUILTIN_LAYER_PACKAGE``, is imported; the registry
imports it by name on the first lookup, so the engine never names a layer class.
"""

from __future__ import annotations

import importlib

from causallm.errors import CausalLMError
from causallm.runtime.layer import Layer

BUILTIN_LAYER_PACKAGE = "causallm.layers"

_factories: dict[str, type[Layer]] = {}
_builtins_loaded = False


def registerFactory(layer_class: type[Layer]) -> None:
    """Register ``layer_class`` under its ``type`` string."""
    if not (isinstance(layer_class, type) and issubclass(layer_class, Layer)):
        raise CausalLMError(f"registerFactory: {layer_class!r} is not a Layer subclass")
    key = layer_class.type
    if not key:
        raise CausalLMError(f"registerFactory: {layer_class.__name__} has no 'type' string")
    current = _factories.get(key)
    if current is layer_class:
        return
    if current is not None:
        raise CausalLMError(f"registerFactory: layer type '{key}' is already registered "
                            f"by {current.__module__}.{current.__name__}")
    _factories[key] = layer_class


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        importlib.import_module(BUILTIN_LAYER_PACKAGE)


def get(key: str) -> type[Layer]:
    """The class registered for ``key``; an unknown key lists the known ones."""
    _load_builtins()
    try:
        return _factories[key]
    except KeyError:
        raise CausalLMError(f"unknown layer type '{key}'; registered types: "
                            f"{', '.join(sorted(_factories))}") from None


def registered() -> list[str]:
    _load_builtins()
    return sorted(_factories)
