"""The layer registry: type string -> layer class, as nntrainer's ``AppContext`` factory map.

``registerFactory(RMSNormLayer)`` mirrors ``app_context->registerFactory(createLayer<RMSNormLayer>)``.
Registering the same class again is a no-op (``registerCustomLayers`` runs on every
``initialize``); registering a different class under a taken type is an error, as is asking for a
type nobody registered.
"""

from __future__ import annotations

from causallm.errors import CausalLMError
from causallm.layer import Layer

_factories: dict[str, type[Layer]] = {}


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


def get(key: str) -> type[Layer]:
    """The class registered for ``key``; an unknown key lists the known ones."""
    try:
        return _factories[key]
    except KeyError:
        raise CausalLMError(f"unknown layer type '{key}'; registered types: "
                            f"{', '.join(sorted(_factories))}") from None


def registered() -> list[str]:
    return sorted(_factories)
