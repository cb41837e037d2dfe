"""Tiny graphs through the public API, shared by the layer tests (a helper module, not a test
file): an input layer of feature rows, and a list of layers compiled and initialized."""

from causallm.api import createLayer, createModel, withKey


def feature_input(name, rows, width):
    """An input layer holding ``rows`` rows of ``width`` features: buffer (B, rows, width)."""
    return createLayer("input", [withKey("name", name), withKey("input_shape", f"1:{rows}:{width}")])


def build(layers, batch=1):
    """A model of ``layers`` in order (batch_size ``batch``), compiled and initialized."""
    model = createModel()
    if batch != 1:
        model.setProperty([withKey("batch_size", batch)])
    for layer in layers:
        model.addLayer(layer)
    model.compile()
    model.initialize()
    return model
