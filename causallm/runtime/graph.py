"""Model: the graph of named layers, its compiler and its runtime.

Mirrors ``ml::train::Model`` as the CausalLM application uses it:

- ``addLayer`` in insertion order, ``setProperty`` (batch_size, model_tensor_type, ...);
- ``compile()`` realizes implicit wiring (a node with no ``input_layers`` takes the previous
  node; ``activation=X`` on a non-activation layer becomes an ``<name>/activation_realized``
  node), checks names, inputs and cycles, orders the nodes topologically (the smallest insertion
  index first, so a valid insertion order is kept as is, as nntrainer does since 89defc95) and
  finalizes every layer in that order, which infers shapes and fixes the weight order;
- ``initialize()`` allocates weights, KV caches and the activation buffers (one planned pool:
  a buffer is reused once its last reader has run);
- ``load``/``save`` read and write the NNTrainer .bin (every weight in node order, each node's
  weights in request order, a shared weight once at its first owner);
- ``incremental_inference(batch, inputs, labels, init_seq_len, from_, to)`` runs one step:
  the step's tokens sit at rows ``[0, to - from_)`` of every buffer (spec §2.5) and attention
  layers place them at absolute positions ``[from_, to)``.

Lifecycle: declared -> compiled -> initialized. Calling a method out of order is an error.
"""

from __future__ import annotations

import heapq
import sys
from typing import Any, Callable, Iterable

import numpy as np

from causallm.io import nntr_bin
from causallm.errors import CausalLMError
from causallm.runtime.layer import InitLayerContext, RunLayerContext, TensorDim, WeightSpec
from causallm.runtime.node import LAYER_IMPL_PROPERTIES, LayerNode
from causallm.runtime.properties import Prop, bool_, parse_into, split_properties, str_, uint

MODEL_TENSOR_TYPES = (
    "BCQ-FP32", "QINT4-FP16", "QINT4-FP32", "QINT8-FP16", "QINT8-FP32", "FP16-FP16",
    "FP16-FP32", "FP32-FP16", "FP32-FP32", "QINT16-QINT16", "UINT16-UINT16", "QINT8-UINT16",
    "UINT4-UINT8", "UINT4-UINT16", "UINT8-UINT8", "UINT8-UINT16", "Q4_K-FP32", "Q4_0-FP32",
    "Q4_0-FP16")

MODEL_PROPERTIES: dict[str, Prop] = {
    "batch_size": uint(1),
    "epochs": uint(1),
    "model_tensor_type": Prop("str", "FP32-FP32", choices=MODEL_TENSOR_TYPES),
    "fsu": bool_(False),
    "fsu_lookahead": uint(1),
    "memory_optimization": bool_(True),
    "loss": str_(),
    "optimizer": str_(),
}


class ExecutionMode:
    INFERENCE = "inference"
    TRAIN = "train"


class ModelFormat:
    MODEL_FORMAT_BIN = "bin"


class ModelType:
    NEURAL_NET = "neural_net"


_DECLARED, _COMPILED, _INITIALIZED = "declared", "compiled", "initialized"


class Model:
    """A graph of ``LayerNode``s; see the module docstring."""

    def __init__(self) -> None:
        self.props: dict[str, Any] = {k: p.default for k, p in MODEL_PROPERTIES.items()}
        self._nodes: list[LayerNode] = []
        self._state = _DECLARED

    # -- building ---------------------------------------------------------------------------
    def addLayer(self, node: LayerNode) -> None:
        if not isinstance(node, LayerNode):
            raise CausalLMError(f"addLayer: expected a layer made by createLayer, got {node!r}")
        self._require(_DECLARED, "addLayer")
        self._nodes.append(node)

    def setProperty(self, props: Iterable[str]) -> None:
        def unknown(key: str, value: str) -> None:
            raise CausalLMError(f"model: unknown property '{key}' (known: "
                                f"{', '.join(MODEL_PROPERTIES)})")
        self._require(_DECLARED, "model.setProperty()")  # buffers are sized at compile()
        parse_into(MODEL_PROPERTIES, split_properties(props, "model"), self.props, "model", unknown)
        if self.props["batch_size"] < 1:
            raise CausalLMError("model: batch_size must be at least 1")

    def _require(self, state: str, what: str) -> None:
        if self._state != state:
            needed = {_DECLARED: "before compile()", _COMPILED: "after compile() and before "
                      "initialize()", _INITIALIZED: "after initialize()"}[state]
            raise CausalLMError(f"{what} must be called {needed}; the model is {self._state}")

    # -- compile ----------------------------------------------------------------------------
    def compile(self, mode: str = ExecutionMode.INFERENCE) -> None:
        """Realize implicit wiring, validate, sort and finalize every layer (shape inference)."""
        self._require(_DECLARED, "compile()")
        if mode != ExecutionMode.INFERENCE:
            raise CausalLMError("compile: only ExecutionMode.INFERENCE is supported")
        if not self._nodes:
            raise CausalLMError("compile: the model has no layers")
        nodes = self._nodes
        self._name_nodes(nodes)
        self._realize_previous_inputs(nodes)
        nodes = self._realize_activations(nodes)
        by_name = {n.getName(): n for n in nodes}
        for node in nodes:
            for producer, _ in node.getInputConnections():
                if producer not in by_name:
                    raise CausalLMError(f"layer '{node.getName()}': input layer '{producer}' "
                                        f"does not exist")
        self._sorted = self._topological_sort(nodes, by_name)
        self._finalize(by_name)
        self._state = _COMPILED

    @staticmethod
    def _name_nodes(nodes: list[LayerNode]) -> None:
        seen: set[str] = set()
        counters: dict[str, int] = {}
        for node in nodes:
            name = node.getName()
            if not name:
                count = counters.get(node.getType(), 0)
                while f"{node.getType()}{count}" in seen or any(
                        n.getName() == f"{node.getType()}{count}" for n in nodes):
                    count += 1
                counters[node.getType()] = count + 1
                name = f"{node.getType()}{count}"
                node.setName(name)
            if name in seen:
                raise CausalLMError(f"layer '{name}': the name is used by more than one layer")
            seen.add(name)

    @staticmethod
    def _realize_previous_inputs(nodes: list[LayerNode]) -> None:
        for i, node in enumerate(nodes):
            if node.getInputConnections() or node.getType() == "input":
                continue
            if node.getProperty("input_shape"):
                continue
            if i == 0:
                raise CausalLMError(f"layer '{node.getName()}': the first layer has no "
                                    f"input_layers and no input_shape")
            node.setInputConnections([(nodes[i - 1].getName(), 0)])

    @staticmethod
    def _realize_activations(nodes: list[LayerNode]) -> list[LayerNode]:
        out: list[LayerNode] = []
        renamed: dict[str, str] = {}
        for node in nodes:
            act = node.node_props.get("activation")
            out.append(node)
            if node.getType() == "activation" or act in (None, "", "none"):
                continue
            del node.node_props["activation"]
            realized = LayerNode("activation", [f"name={node.getName()}/activation_realized",
                                                f"activation={act}",
                                                f"input_layers={node.getName()}"])
            renamed[node.getName()] = realized.getName()
            out.append(realized)
        if renamed:
            for node in out:
                if node.getType() == "activation" and node.getName().endswith("/activation_realized"):
                    continue
                refs = node.getInputConnections()
                node.setInputConnections([(renamed.get(n, n) if i == 0 else n, i) for n, i in refs])
        return out

    @staticmethod
    def _topological_sort(nodes: list[LayerNode], by_name: dict[str, LayerNode]) -> list[LayerNode]:
        index = {n.getName(): i for i, n in enumerate(nodes)}
        indegree = [0] * len(nodes)
        consumers: list[list[int]] = [[] for _ in nodes]
        for i, node in enumerate(nodes):
            for producer in {p for p, _ in node.getInputConnections()}:
                indegree[i] += 1
                consumers[index[producer]].append(i)
        ready = [i for i, d in enumerate(indegree) if d == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for j in consumers[i]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    heapq.heappush(ready, j)
        if len(order) != len(nodes):
            stuck = [nodes[i].getName() for i, d in enumerate(indegree) if d > 0]
            raise CausalLMError(f"the graph has a cycle among layers: {', '.join(stuck)}")
        return [nodes[i] for i in order]

    def _finalize(self, by_name: dict[str, LayerNode]) -> None:
        batch = self.props["batch_size"]
        w_dtype, a_dtype = self.props["model_tensor_type"].split("-")
        out_dims: dict[str, list[TensorDim]] = {}
        self._contexts: list[InitLayerContext] = []
        weight_owner: dict[str, tuple[str, WeightSpec]] = {}
        for node in self._sorted:
            name = node.getName()
            input_dims = []
            for producer, idx in node.getInputConnections():
                dims = out_dims[producer]
                if idx >= len(dims):
                    raise CausalLMError(f"layer '{name}': input '{producer}({idx})' does not "
                                        f"exist; '{producer}' has {len(dims)} output(s)")
                input_dims.append(dims[idx])
            shared = node.getProperty("shared_from")
            if shared is not None and shared not in by_name:
                raise CausalLMError(f"layer '{name}': shared_from '{shared}' does not exist")
            dtype = node.getProperty("weight_dtype")
            if dtype is None:
                dtype = a_dtype if node.getProperty("packed") is False else w_dtype
            ctx = InitLayerContext(name, node.getType(), input_dims, batch, shared or name,
                                   dtype.upper(), a_dtype)
            ctx.input_shape = node.getProperty("input_shape")
            self._fill_defaults(node)
            node.layer.finalize(ctx)
            if not ctx.output_dims:
                raise CausalLMError(f"layer '{name}' ({node.getType()}): finalize set no output")
            for spec in ctx.weights:
                owner = weight_owner.get(spec.full_name)
                if owner is None:
                    weight_owner[spec.full_name] = (name, spec)
                elif owner[1].shape != spec.shape:
                    raise CausalLMError(
                        f"layer '{name}': shared weight '{spec.full_name}' has shape "
                        f"{spec.shape} here but {owner[1].shape} in '{owner[0]}'")
            out_dims[name] = ctx.output_dims
            self._contexts.append(ctx)
        self._out_dims = out_dims
        # the .bin order: every weight at its first request, in node order
        seen: set[str] = set()
        self._weight_specs: list[WeightSpec] = []
        for ctx in self._contexts:
            for spec in ctx.weights:
                if spec.full_name not in seen:
                    seen.add(spec.full_name)
                    self._weight_specs.append(spec)
        consumed = {p for n in self._sorted for p, _ in n.getInputConnections()}
        self._output_names = [n.getName() for n in self._sorted if n.getName() not in consumed]
        self._input_names = [n.getName() for n in self._sorted if n.getType() == "input"]

    @staticmethod
    def _fill_defaults(node: LayerNode) -> None:
        layer = node.layer
        specs = dict(layer.properties)
        if layer.layer_impl:
            specs = {**LAYER_IMPL_PROPERTIES, **specs}
        for key, spec in specs.items():
            if key not in layer.props:
                if spec.required:
                    raise CausalLMError(f"layer '{node.getName()}' ({layer.type}): property "
                                        f"'{key}' is required")
                layer.props[key] = spec.default

    # -- initialize -------------------------------------------------------------------------
    def initialize(self, mode: str = ExecutionMode.INFERENCE) -> None:
        """Allocate weights (zeros until loaded), tensors (KV caches) and activation buffers."""
        self._require(_COMPILED, "initialize()")
        self._weights: dict[str, np.ndarray] = {
            s.full_name: np.zeros(s.shape, dtype=np.float32) for s in self._weight_specs}
        buffers = self._plan_activations()
        self._run: list[tuple[Any, RunLayerContext]] = []
        batch = self.props["batch_size"]
        for node, ictx in zip(self._sorted, self._contexts):
            rctx = RunLayerContext(node.getName(), batch)
            rctx.inputs = [buffers[p][i] for p, i in node.getInputConnections()]
            rctx.outputs = buffers[node.getName()]
            rctx.tensors = [np.zeros(t.shape, dtype=np.float32) for t in ictx.tensors]
            self._run.append((node.layer, rctx))
        self._buffers = buffers
        self._refresh_weights()
        self._state = _INITIALIZED

    def _plan_activations(self) -> dict[str, list[np.ndarray]]:
        """Give every output a buffer, reusing a buffer once all readers of its tensor have run.

        Graph inputs and outputs keep their own buffers. Buffers are float32 pools viewed in the
        tensor's shape; a layer never gets an output that aliases one of its inputs (inputs are
        released only after the layer that reads them last).
        """
        remaining: dict[tuple[str, int], int] = {}
        for node in self._sorted:
            for ref in node.getInputConnections():
                remaining[ref] = remaining.get(ref, 0) + 1
        keep = set(self._output_names) | set(self._input_names)
        free: list[np.ndarray] = []
        owner: dict[tuple[str, int], np.ndarray] = {}
        buffers: dict[str, list[np.ndarray]] = {}
        for node in self._sorted:
            name = node.getName()
            views = []
            for i, dim in enumerate(self._out_dims[name]):
                size = int(np.prod(dim.shape))
                pool = None
                if name not in keep:
                    fitting = [b for b in free if b.size >= size]
                    if fitting:
                        pool = min(fitting, key=lambda b: b.size)
                        free = [b for b in free if b is not pool]
                if pool is None:
                    pool = np.zeros(size, dtype=np.float32)
                owner[(name, i)] = pool
                views.append(pool[:size].reshape(dim.shape))
            buffers[name] = views
            for ref in node.getInputConnections():
                remaining[ref] -= 1
                if remaining[ref] == 0 and ref[0] not in keep:
                    free.append(owner[ref])
        return buffers

    def _refresh_weights(self) -> None:
        for (layer, rctx), ictx in zip(self._run, self._contexts):
            rctx.weights = [self._weights[s.full_name] for s in ictx.weights]
        self._dirty = False

    # -- weights ----------------------------------------------------------------------------
    def getWeightSpecs(self) -> list[WeightSpec]:
        """Every weight once, in .bin order: (full name ``scope:name``, shape, stored dtype)."""
        self._require_compiled("getWeightSpecs()")
        return list(self._weight_specs)

    def getWeight(self, full_name: str) -> np.ndarray:
        self._require(_INITIALIZED, "getWeight()")
        try:
            return self._weights[full_name]
        except KeyError:
            raise CausalLMError(f"model has no weight '{full_name}'") from None

    def setWeight(self, full_name: str, array: np.ndarray) -> None:
        """Use ``array`` (any float dtype; float32 C- or F-contiguous arrays are kept without a
        copy, e.g. a memory-mapped weight or its transpose) as weight ``full_name``."""
        self._require(_INITIALIZED, "setWeight()")
        current = self._weights.get(full_name)
        if current is None:
            raise CausalLMError(f"model has no weight '{full_name}'")
        if tuple(array.shape) != current.shape:
            raise CausalLMError(f"weight '{full_name}': expected shape {current.shape}, got "
                                f"{tuple(array.shape)}")
        if array.dtype != np.float32 or not (array.flags.c_contiguous or array.flags.f_contiguous):
            array = np.ascontiguousarray(array, dtype=np.float32)
        self._weights[full_name] = array
        self._dirty = True

    def load(self, path: str, format: str = ModelFormat.MODEL_FORMAT_BIN) -> None:
        """Read an NNTrainer .bin: each weight in order, memory-mapped where it is FP32."""
        self._require(_INITIALIZED, "load()")
        if format != ModelFormat.MODEL_FORMAT_BIN:
            raise CausalLMError(f"load: unsupported format {format!r}")
        specs = [(s.full_name, s.shape, s.dtype) for s in self._weight_specs]
        for spec, array in zip(self._weight_specs, nntr_bin.read_bin(path, specs)):
            self._weights[spec.full_name] = array
        self._refresh_weights()

    def save(self, path: str, format: str = ModelFormat.MODEL_FORMAT_BIN,
             dtype: str | None = None, layer_dtype_map: dict[str, str] | None = None) -> None:
        """Write an NNTrainer .bin, each weight in its stored dtype (or the override for its layer)."""
        self._require(_INITIALIZED, "save()")
        if format != ModelFormat.MODEL_FORMAT_BIN:
            raise CausalLMError(f"save: unsupported format {format!r}")
        layer_dtype_map = layer_dtype_map or {}
        dtypes = []
        for spec in self._weight_specs:
            scope = spec.full_name.split(":", 1)[0]
            dtypes.append(layer_dtype_map.get(scope) or dtype or spec.dtype)
        arrays = [self._weights[s.full_name] for s in self._weight_specs]
        nntr_bin.write_bin(path, arrays, dtypes)

    def _require_compiled(self, what: str) -> None:
        if self._state == _DECLARED:
            raise CausalLMError(f"{what} needs compile() first")

    # -- running ----------------------------------------------------------------------------
    def incremental_inference(self, batch: int, inputs: list, labels: list | None = None,
                              init_seq_len: int | None = None, from_: int = 0, to: int = 1,
                              output_hidden_state: bool = False) -> list[np.ndarray]:
        """Run one step over positions ``[from_, to)`` and return each graph output as a new
        ``(batch, feature_len)`` float32 array.

        ``inputs`` holds one array per input layer (graph order); the step's values sit at
        ``[:, :to - from_]`` of each (token ids as floats for a language model).
        ``labels``, ``init_seq_len`` and ``output_hidden_state`` are accepted for the C++
        signature and unused, as in nntrainer.
        """
        self._require(_INITIALIZED, "incremental_inference()")
        if batch != self.props["batch_size"]:
            raise CausalLMError(f"incremental_inference: batch {batch} differs from the model's "
                                f"batch_size {self.props['batch_size']}")
        step = to - from_
        if from_ < 0 or step < 1:
            raise CausalLMError(f"incremental_inference: need 0 <= from_ < to, got from_={from_}, "
                                f"to={to}")
        if len(inputs) != len(self._input_names):
            raise CausalLMError(f"incremental_inference: got {len(inputs)} inputs for "
                                f"{len(self._input_names)} input layers")
        for name, data in zip(self._input_names, inputs):
            buf = self._buffers[name][0].reshape(batch, -1)
            if step > buf.shape[1]:
                raise CausalLMError(f"incremental_inference: a step of {step} tokens exceeds "
                                    f"the {buf.shape[1]} rows of input '{name}' (init_seq_len)")
            data = np.asarray(data, dtype=np.float32)
            if data.size % batch:
                raise CausalLMError(f"incremental_inference: input '{name}' has {data.size} "
                                    f"values, not a multiple of batch {batch}")
            data = data.reshape(batch, -1)
            if not step <= data.shape[1] <= buf.shape[1]:
                raise CausalLMError(f"incremental_inference: input '{name}' takes {step} to "
                                    f"{buf.shape[1]} values per batch; got {data.shape[1]}")
            buf[:, :data.shape[1]] = data
        if self._dirty:
            self._refresh_weights()
        for layer, ctx in self._run:
            layer.incremental_forwarding(ctx, from_, to)
        return [self._buffers[name][0].reshape(batch, -1).copy() for name in self._output_names]

    def warmup(self) -> None:
        """Run a 1-row and a 2-row step of zeros at position 0, so the kernels are compiled or
        loaded from numba's cache before the first real step is timed. It writes KV-cache rows
        0 and 1, which the next prefill (or a loaded cache) overwrites."""
        self._require(_INITIALIZED, "warmup()")
        batch = self.props["batch_size"]
        rows = min(self._buffers[n][0].reshape(batch, -1).shape[1] for n in self._input_names)
        for step in sorted({1, min(2, rows)}):
            zeros = [np.zeros((batch, step), dtype=np.float32) for _ in self._input_names]
            self.incremental_inference(batch, zeros, None, step, 0, step)

    # -- inspection -------------------------------------------------------------------------
    def forEachLayer(self, fn: Callable[[Any, RunLayerContext, Any], None],
                     user_data: Any = None) -> None:
        """Call ``fn(layer, context, user_data)`` for every layer in graph order."""
        self._require(_INITIALIZED, "forEachLayer()")
        for layer, ctx in self._run:
            fn(layer, ctx, user_data)

    def getLayerNames(self) -> list[str]:
        self._require_compiled("getLayerNames()")
        return [n.getName() for n in self._sorted]

    def getOutputNames(self) -> list[str]:
        self._require_compiled("getOutputNames()")
        return list(self._output_names)

    def summarize(self, out=None) -> str:
        """Print (and return) a table: name, type, inputs, output dims, parameters, total."""
        self._require_compiled("summarize()")
        rows = [("name", "type", "input layers", "output", "params")]
        total = 0
        seen: set[str] = set()
        for node, ctx in zip(self._sorted, self._contexts):
            params = 0
            for spec in ctx.weights:
                if spec.full_name not in seen:
                    seen.add(spec.full_name)
                    params += spec.size
            total += params
            inputs = ",".join(n if i == 0 else f"{n}({i})" for n, i in node.getInputConnections())
            outs = " ".join(str(d) for d in ctx.output_dims)
            rows.append((node.getName(), node.getType(), inputs, outs, f"{params:,}"))
        widths = [max(len(r[c]) for r in rows) for c in range(5)]
        lines = []
        for k, row in enumerate(rows):
            cells = [row[c].ljust(widths[c]) if c < 4 else row[c].rjust(widths[c]) for c in range(5)]
            lines.append("  ".join(cells).rstrip())
            if k == 0:
                lines.append("-" * len(lines[0]))
        lines.append("-" * len(lines[0]))
        lines.append(f"total parameters: {total:,}")
        text = "\n".join(lines) + "\n"
        (out or sys.stdout).write(text)
        return text


def createModel(model_type: str = ModelType.NEURAL_NET) -> Model:
    """``ml::train::createModel(ModelType::NEURAL_NET)``."""
    if model_type != ModelType.NEURAL_NET:
        raise CausalLMError(f"createModel: unsupported model type {model_type!r}")
    return Model()
