"""One file per layer type, each mirroring a layer of nntrainer or of Applications/CausalLM/layers.

Each module docstring states the math, the shapes and the properties with their defaults.
Importing this package registers nntrainer's built-in layers (the registry does it on its first
lookup); the CausalLM layers are registered by the models' ``registerCustomLayers``.
"""

from causallm.runtime.registry import registerFactory
from causallm.layers.activation import ActivationLayer
from causallm.layers.addition import AdditionLayer
from causallm.layers.conv2d import Conv2DLayer
from causallm.layers.fully_connected import FullyConnectedLayer
from causallm.layers.input import InputLayer
from causallm.layers.multiply import MultiplyLayer
from causallm.layers.permute import PermuteLayer
from causallm.layers.pooling2d import Pooling2DLayer
from causallm.layers.reshape import ReshapeLayer

BUILTIN_LAYERS = (InputLayer, FullyConnectedLayer, AdditionLayer, MultiplyLayer, ActivationLayer,
                  Conv2DLayer, Pooling2DLayer, PermuteLayer, ReshapeLayer)
"""nntrainer's own layer types that the CausalLM models use."""

for _layer_class in BUILTIN_LAYERS:
    registerFactory(_layer_class)
