"""The layer contract: what a layer class declares and the two contexts it works with.

Mirrors nntrainer's ``Layer`` / ``InitLayerContext`` / ``RunLayerContext``:

- ``finalize(context)`` reads the input dimensions, sets the output dimensions and requests
  weights (saved and loaded, in request order), tensors (scratch) and KV caches.
- ``incremental_forwarding(context, from_, to)`` computes rows ``[0, to - from_)`` of its outputs
  from rows ``[0, to - from_)`` of its inputs (the step buffer convention). Only
  position-aware layers look further: row i of batch b belongs to the sequence in KV-cache
  slot ``context.step.slots[b, i]``, at position ``context.step.positions[b, i]`` (by default
  slot b, position from_ + i; a step of several sequences, each at its own position, sets them
  otherwise, see runtime/runner.py), and a head projects the rows ``context.step.last``. An
  input made by an earlier stage (the encoder output a cross-attention reads) holds that
  stage's last step: ``context.input_stages[i]`` says which rows.

Activations are float32 arrays of shape ``(batch, channel * height, width)``; their NNTrainer
dimension ``batch:channel:height:width`` is a :class:`TensorDim`. Weights are float32 arrays of
the shape they were requested with, whatever dtype the .bin stores them in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from causallm.errors import CausalLMError
from causallm.runtime.properties import Prop

DTYPES = ("FP32", "FP16", "Q4_0", "Q6_K", "Q4_K", "BCQ", "QINT4", "QINT8", "QINT16",
          "UINT4", "UINT8", "UINT16", "Q8_0", "BF16", "Q4_1", "Q5_0", "Q5_1", "Q5_K")
"""nntrainer's weight dtypes, and our extensions: BF16 and ggml's Q8_0, Q4_1, Q5_0, Q5_1, Q5_K
(the block types a weight can be quantized to, kernels/quantize.py)."""


@dataclass(frozen=True)
class TensorDim:
    """An NNTrainer tensor dimension ``batch:channel:height:width``."""

    batch: int
    channel: int
    height: int
    width: int

    @property
    def feature_len(self) -> int:
        return self.channel * self.height * self.width

    @property
    def shape(self) -> tuple[int, int, int]:
        """The numpy shape of the activation buffer."""
        return (self.batch, self.channel * self.height, self.width)

    def __str__(self) -> str:
        return f"{self.batch}:{self.channel}:{self.height}:{self.width}"


class Layer:
    """Base of every layer type. Subclasses set ``type`` and ``properties`` and implement
    ``finalize`` and ``incremental_forwarding``.

    ``layer_impl = True`` marks a layer built on nntrainer's ``LayerImpl``: it also accepts the
    weight-related keys every such layer takes (``disable_bias``, ``weight_initializer``, ...).
    """

    type: str = ""
    properties: dict[str, Prop] = {}
    layer_impl: bool = False

    def __init__(self) -> None:
        self.props: dict[str, Any] = {}

    def finalize(self, context: "InitLayerContext") -> None:
        raise NotImplementedError

    def incremental_forwarding(self, context: "RunLayerContext", from_: int, to: int) -> None:
        raise NotImplementedError

    def getType(self) -> str:
        return self.type


@dataclass
class WeightSpec:
    """A requested weight: its full name (``scope:name``), numpy shape and stored dtype;
    ``packable``: the layer also takes it as a ``PackedMatrix`` (BF16, F16, Q8_0, Q4_0 kept in
    memory as they are, causallm/kernels/packed.py), else it is always float32."""

    full_name: str
    shape: tuple[int, ...]
    dtype: str
    packable: bool = False

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class KVCacheSpec:
    """A requested KV cache: ``kind`` "self" (the runtime allocates key and value tensors of
    ``shape``, appended to the layer's tensors) or "cross" (the key and value are the layer's
    inputs ``inputs``, projected by an earlier stage and read as they are)."""

    kind: str
    shape: tuple[int, ...] | None = None
    inputs: tuple[int, int] | None = None
    tensor: int | None = None  # "self": the key's tensor index (the value's is the next)


@dataclass
class TensorSpec:
    """A requested non-weight tensor (KV cache, scratch): lives as long as the model."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"   # numpy dtype name: float32, or uint16 (an FP16 KV cache's bits)


class InitLayerContext:
    """What ``finalize`` sees: input dims, node properties, and where to request weights."""

    def __init__(self, name: str, layer_type: str, input_dims: list[TensorDim], batch: int,
                 weight_scope: str, weight_dtype: str, activation_dtype: str) -> None:
        self.name = name
        self.layer_type = layer_type
        self.input_dims = input_dims
        self.batch = batch
        self.slots = batch  # sequences the KV caches hold (the model's ``slots``; default batch)
        self.weight_scope = weight_scope
        self.weight_dtype = weight_dtype
        self.activation_dtype = activation_dtype
        self.input_shape: str | None = None  # the node's input_shape ("C:H:W"), if given
        self.output_dims: list[TensorDim] | None = None
        self.weights: list[WeightSpec] = []
        self.tensors: list[TensorSpec] = []
        self.kv_caches: list[KVCacheSpec] = []

    def getName(self) -> str:
        return self.name

    def getInputDimensions(self) -> list[TensorDim]:
        return self.input_dims

    def getNumInputs(self) -> int:
        return len(self.input_dims)

    def setOutputDimensions(self, dims: list[TensorDim]) -> None:
        self.output_dims = list(dims)

    def requestWeight(self, name: str, shape: tuple[int, ...], dtype: str | None = None,
                      packable: bool = False) -> int:
        """Request a weight of numpy ``shape``; ``dtype`` defaults to the node's weight dtype;
        ``packable``: the layer's kernels also take it packed (WeightSpec). Returns its index
        for ``RunLayerContext.getWeight``."""
        shape = tuple(int(s) for s in shape)
        self.weights.append(WeightSpec(f"{self.weight_scope}:{name}", shape,
                                       dtype or self.weight_dtype, packable))
        return len(self.weights) - 1

    def requestTensor(self, name: str, shape: tuple[int, ...], dtype: str = "float32") -> int:
        """Request a tensor kept for the model's lifetime (zeroed at initialize): float32, or
        ``dtype`` (uint16 for FP16 bits)."""
        self.tensors.append(TensorSpec(name, tuple(int(s) for s in shape), dtype))
        return len(self.tensors) - 1

    def requestKVCache(self, kind: str, shape: tuple[int, ...] | None = None,
                       inputs: tuple[int, int] | None = None,
                       dtype: str = "float32") -> int | None:
        """Declare a KV cache of the layer (at most one of each kind), listed by
        ``Model.getKVCaches``.

        ``"self"``: key and value tensors of ``shape`` (zeroed; (B, n_kv, T, head_dim): each
        kv head's positions contiguous) and ``dtype`` (float32, or uint16 FP16 bits), appended
        to the layer's tensors; returns the key's tensor index (the value's is the next).
        ``"cross"``: the cache is the layer's inputs ``inputs = (key, value)`` as an earlier
        stage left them; returns None.
        """
        if any(spec.kind == kind for spec in self.kv_caches):
            raise self.error(f"requests a second {kind!r} KV cache")
        if kind == "self" and shape is not None:
            key = self.requestTensor("cache_key", shape, dtype)
            self.requestTensor("cache_value", shape, dtype)
            self.kv_caches.append(KVCacheSpec(kind, tuple(int(s) for s in shape), tensor=key))
            return key
        if kind == "cross" and inputs is not None:
            self.kv_caches.append(KVCacheSpec(kind, inputs=tuple(inputs)))
            return None
        raise self.error(f"bad KV cache request ({kind!r}: 'self' needs a shape, 'cross' the "
                         f"key and value inputs)")

    def error(self, message: str) -> CausalLMError:
        return CausalLMError(f"layer '{self.name}' ({self.layer_type}): {message}")


class RunLayerContext:
    """What ``incremental_forwarding`` sees: the layer's buffers, by index.

    The lists are plain attributes so the per-token path does no lookups beyond an index.
    """

    __slots__ = ("name", "inputs", "outputs", "weights", "tensors", "batch", "input_stages",
                 "step")

    def __init__(self, name: str, batch: int) -> None:
        self.name = name
        self.batch = batch
        self.step = None  # the StageState of the layer's own stage: its rows' slots, positions
        self.input_stages: list = []  # the StageState that wrote each input (rows of its step)
        self.inputs: list[np.ndarray] = []
        self.outputs: list[np.ndarray] = []
        self.weights: list[np.ndarray] = []
        self.tensors: list[np.ndarray] = []

    def getName(self) -> str:
        return self.name

    def getInput(self, i: int) -> np.ndarray:
        return self.inputs[i]

    def getOutput(self, i: int) -> np.ndarray:
        return self.outputs[i]

    def getWeight(self, i: int) -> np.ndarray:
        return self.weights[i]

    def getTensor(self, i: int) -> np.ndarray:
        return self.tensors[i]

    def getNumInputs(self) -> int:
        return len(self.inputs)

    def error(self, message: str) -> CausalLMError:
        return CausalLMError(f"layer '{self.name}': {message}")
