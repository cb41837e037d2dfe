"""Model: the graph of named layers (``ml::train::Model`` as the CausalLM application uses it).

- ``addLayer`` in insertion order, ``setProperty`` (batch_size, model_tensor_type, ...), and
  ``addStage`` for a model that runs in stages (an encoder once, then a decoder step by step);
- ``compile()`` realizes, checks, orders and finalizes the layers and splits them into stages
  (causallm/runtime/compiler.py); the node order is the .bin weight order;
- ``initialize()`` allocates weights, tensors, KV caches (``getKVCaches``) and the planned
  activation buffers (causallm/runtime/planner.py);
- ``load``/``save`` read and write the NNTrainer .bin (every weight in node order, each node's
  weights in request order, a shared weight once at its first owner); ``setWeight`` gives one
  weight. Weights start as zeros, so a graph with weights runs only once some were given
  (``weightsGiven``): a step before that would compute nothing but zeros;
- ``incremental_inference(batch, inputs, labels, init_seq_len, from_, to, stage=...)`` runs one
  step of one stage (causallm/runtime/runner.py): the step's tokens sit at rows
  ``[0, to - from_)`` of every buffer (docs/nntrainer.md, "The step buffer") and attention
  layers place them at absolute
  positions ``[from_, to)``.

Lifecycle: declared -> compiled -> initialized. Calling a method out of order is an error.
"""

from __future__ import annotations

import mmap
import re
import sys
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np

from causallm.errors import CausalLMError
from causallm.io import nntr_bin
from causallm.kernels import compile_report, threads
from causallm.kernels.packed import PackedMatrix
from causallm.runtime.compiler import StageSpec, compile_graph
from causallm.runtime.kv_cache import CROSS, SELF, KVCache
from causallm.runtime.layer import RunLayerContext, TensorDim, WeightSpec
from causallm.runtime.node import LayerNode
from causallm.runtime.planner import plan_buffers
from causallm.runtime.properties import Prop, bool_, parse_into, split_properties, str_, uint
from causallm.runtime.runner import StageRunner, StageState


def _pages_on_demand(shape, dtype) -> np.ndarray:
    """Zeros in an anonymous mapping of 4 KiB pages, each made resident when first touched: a
    KV cache fills from the front, and numpy's own large arrays are marked for 2 MiB pages,
    which made the first step of each layer commit about 70 % of a 4096-position cache."""
    n = int(np.prod(shape))
    if n == 0:
        return np.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, n * np.dtype(dtype).itemsize)
    return np.frombuffer(buf, dtype=dtype, count=n).reshape(shape)


MODEL_TENSOR_TYPES = (
    "BCQ-FP32", "QINT4-FP16", "QINT4-FP32", "QINT8-FP16", "QINT8-FP32", "FP16-FP16",
    "FP16-FP32", "FP32-FP16", "FP32-FP32", "QINT16-QINT16", "UINT16-UINT16", "QINT8-UINT16",
    "UINT4-UINT8", "UINT4-UINT16", "UINT8-UINT8", "UINT8-UINT16", "Q4_K-FP32", "Q4_0-FP32",
    "Q4_0-FP16", "Q8_0-FP32")
"""nntrainer's ``model_tensor_type`` values (docs/nntrainer.md, "Weight dtypes"), and our
Q8_0-FP32."""

MODEL_PROPERTIES: dict[str, Prop] = {
    "batch_size": uint(1),
    "slots": uint(0),
    "epochs": uint(1),
    "model_tensor_type": Prop("str", "FP32-FP32", choices=MODEL_TENSOR_TYPES),
    "fsu": bool_(False),
    "fsu_lookahead": uint(1),
    "memory_optimization": bool_(True),
    "loss": str_(),
    "optimizer": str_(),
}


class LayerRow(NamedTuple):
    """A compiled layer as ``summarize`` lists it (``Model.getLayerTable``)."""

    name: str
    type: str
    stage: str
    inputs: list[tuple[str, int]]   # (producer layer, its output index), as input_layers says
    output_dims: list[TensorDim]
    params: int


class ExecutionMode:
    INFERENCE = "inference"
    TRAIN = "train"


class ModelFormat:
    MODEL_FORMAT_BIN = "bin"


NEURAL_NET = "neural_net"
"""``ml::train::ModelType::NEURAL_NET``: the one kind of model ``createModel`` makes. (A model
class's own type, the CausalLM app's ``ModelType``, is models/transformer.py's.)"""


_DECLARED, _COMPILED, _INITIALIZED = "declared", "compiled", "initialized"
_BLOCK = re.compile(r"^(\w*?layer)\d+_")  # a block's layers: layer3_wq, encoder_layer0_ffn_up


class Model:
    """A graph of ``LayerNode``s; see the module docstring."""

    def __init__(self) -> None:
        self.props: dict[str, Any] = {k: p.default for k, p in MODEL_PROPERTIES.items()}
        self._nodes: list[LayerNode] = []
        self._stage_specs: list[StageSpec] = []
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

    def addStage(self, name: str, inputs: list[str], outputs: list[str],
                 batch: int | None = None) -> None:
        """Declare a stage (in the order stages run): the input layers it is fed through, the
        layers whose outputs its run returns, and its batch (default: the model's batch_size).
        Every other layer joins the latest stage among its inputs (compiler docstring). A model
        that declares none has one stage, ``"model"``."""
        self._require(_DECLARED, "addStage")
        if any(s.name == name for s in self._stage_specs):
            raise CausalLMError(f"addStage: stage '{name}' is declared twice")
        if not inputs or not outputs:
            raise CausalLMError(f"addStage: stage '{name}' needs input and output layers")
        if batch is not None and batch < 1:
            raise CausalLMError(f"addStage: stage '{name}' needs a batch of at least 1")
        self._stage_specs.append(StageSpec(name, list(inputs), list(outputs), batch))

    # -- compile ----------------------------------------------------------------------------
    def compile(self, mode: str = ExecutionMode.INFERENCE) -> None:
        """Realize implicit wiring, validate, sort and finalize every layer (shape inference),
        and split the layers into stages."""
        self._require(_DECLARED, "compile()")
        if mode != ExecutionMode.INFERENCE:
            raise CausalLMError("compile: only ExecutionMode.INFERENCE is supported")
        self._graph = compile_graph(self._nodes, self._stage_specs, self.props["batch_size"],
                                    self.props["model_tensor_type"], self.props["slots"])
        self._sorted = self._graph.nodes
        self._contexts = self._graph.contexts
        self._weight_specs = self._graph.weight_specs
        self._state = _COMPILED

    # -- initialize -------------------------------------------------------------------------
    def initialize(self, mode: str = ExecutionMode.INFERENCE) -> None:
        """Allocate weights (zeros until loaded), tensors and KV caches, and the activation
        buffers (causallm/runtime/planner.py); bind every stage to them."""
        self._require(_COMPILED, "initialize()")
        graph = self._graph
        self.forgetWeights()
        self._packable = {s.full_name: s.packable for s in self._weight_specs}
        buffers = plan_buffers(graph)
        batch_of = {stage.name: stage.batch for stage in graph.stages}
        states = {stage.name: StageState(stage.name, stage.batch, 1, graph.slots_of[stage.name],
                                         graph.slots_of[stage.name] // stage.batch)
                  for stage in graph.stages}
        contexts = {}
        self._kv_caches: list[KVCache] = []
        for node, ictx in zip(graph.nodes, graph.contexts):
            name = node.getName()
            rctx = RunLayerContext(name, batch_of[graph.stage_of[name]])
            refs = node.getInputConnections()
            rctx.inputs = [buffers[p][i] for p, i in refs]
            rctx.input_stages = [states[graph.stage_of[p]] for p, _ in refs]
            rctx.step = states[graph.stage_of[name]]
            rctx.outputs = buffers[name]
            caches = {i for c in ictx.kv_caches if c.kind == SELF for i in (c.tensor, c.tensor + 1)}
            rctx.tensors = [(_pages_on_demand if i in caches else np.zeros)(t.shape, dtype=t.dtype)
                            for i, t in enumerate(ictx.tensors)]
            contexts[name] = (node.layer, rctx)
            for spec in ictx.kv_caches:
                if spec.kind == SELF:
                    k = spec.tensor
                    self._kv_caches.append(KVCache(name, SELF, graph.stage_of[name],
                                                   rctx.tensors[k], rctx.tensors[k + 1]))
                else:
                    ki, vi = spec.inputs
                    self._kv_caches.append(KVCache(name, CROSS, graph.stage_of[name],
                                                   rctx.inputs[ki], rctx.inputs[vi],
                                                   rctx.input_stages[ki]))
        self._run = [contexts[n.getName()] for n in graph.nodes]
        self._stages = {
            stage.name: StageRunner(stage.name, [contexts[n.getName()] for n in stage.nodes],
                                    stage.inputs, stage.outputs, buffers, stage.batch,
                                    states[stage.name])
            for stage in graph.stages}
        self._buffers = buffers
        self._refresh_weights()
        self._state = _INITIALIZED

    def _refresh_weights(self) -> None:
        for (layer, rctx), ictx in zip(self._run, self._contexts):
            rctx.weights = [self._weights[s.full_name] for s in ictx.weights]
        for runner in self._stages.values():
            runner.replan()
        self._dirty = False

    # -- weights ----------------------------------------------------------------------------
    def forgetWeights(self) -> None:
        """Every weight back to zeros (lazily mapped), as none had been given: what initialize
        starts from, and what a load that failed half-way leaves."""
        self._weights: dict[str, np.ndarray] = {
            s.full_name: np.zeros(s.shape, dtype=np.float32) for s in self._weight_specs}
        self._given = False
        self._dirty = True

    def weightsGiven(self) -> bool:
        """Whether the graph's weights were given (``load``, ``setWeight``), or it has none."""
        return self._given or not self._weight_specs

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

    def setWeight(self, full_name: str, array) -> None:
        """Use ``array`` as weight ``full_name``: any float array (float32 C- or F-contiguous
        arrays are kept without a copy, e.g. a memory-mapped weight or its transpose), or, for
        a packable weight, a ``PackedMatrix`` kept as it is (another weight gets it widened)."""
        self._require(_INITIALIZED, "setWeight()")
        current = self._weights.get(full_name)
        if current is None:
            raise CausalLMError(f"model has no weight '{full_name}'")
        if tuple(array.shape) != tuple(current.shape):
            raise CausalLMError(f"weight '{full_name}': expected shape {tuple(current.shape)}, "
                                f"got {tuple(array.shape)}")
        if isinstance(array, PackedMatrix):
            if not self._packable[full_name]:
                array = np.ascontiguousarray(array.toFloat())
        elif array.dtype != np.float32 or not (array.flags.c_contiguous
                                               or array.flags.f_contiguous):
            array = np.ascontiguousarray(array, dtype=np.float32)
        self._weights[full_name] = array
        self._given = self._dirty = True

    def load(self, path: str, format: str = ModelFormat.MODEL_FORMAT_BIN) -> None:
        """Read an NNTrainer .bin: each weight in order, memory-mapped where it is FP32."""
        self._require(_INITIALIZED, "load()")
        if format != ModelFormat.MODEL_FORMAT_BIN:
            raise CausalLMError(f"load: unsupported format {format!r}")
        specs = [(s.full_name, s.shape, s.dtype, s.packable) for s in self._weight_specs]
        for spec, array in zip(self._weight_specs, nntr_bin.read_bin(path, specs)):
            self._weights[spec.full_name] = array
        self._given = True
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
        nntr_bin.write_bin(path, arrays, dtypes, [s.full_name for s in self._weight_specs])

    def _require_compiled(self, what: str) -> None:
        if self._state == _DECLARED:
            raise CausalLMError(f"{what} needs compile() first")

    # -- running ----------------------------------------------------------------------------
    def getStageNames(self) -> list[str]:
        """The stages in the order they run (``["model"]`` for a model that declares none)."""
        self._require_compiled("getStageNames()")
        return [s.name for s in self._graph.stages]

    def _stage(self, stage: str | None) -> StageRunner:
        if stage is None:
            if len(self._stages) != 1:
                raise CausalLMError(f"incremental_inference: name the stage to run (one of "
                                    f"{', '.join(self._stages)})")
            return next(iter(self._stages.values()))
        try:
            return self._stages[stage]
        except KeyError:
            raise CausalLMError(f"incremental_inference: no stage '{stage}' (stages: "
                                f"{', '.join(self._stages)})") from None

    def incremental_inference(self, batch: int, inputs: list, labels: list | None = None,
                              init_seq_len: int | None = None, from_: int = 0, to: int = 1,
                              output_hidden_state: bool = False,
                              stage: str | None = None, rows=None) -> list[np.ndarray]:
        """Run one step of ``stage`` (the only one when None) over positions ``[from_, to)``
        and return each of its outputs as a new ``(batch, feature_len)`` float32 array.

        ``inputs`` holds one array per input layer of the stage; the step's values sit at
        ``[:, :to - from_]`` of each (token ids as floats for a language model).
        ``labels``, ``init_seq_len`` and ``output_hidden_state`` are accepted for the C++
        signature and unused, as in nntrainer. ``rows`` = (slots, positions, last) makes the
        step one of several sequences (runtime/runner.StageState.set_rows): each row's KV-cache
        slot and position, and the rows whose outputs the heads compute.
        """
        self._require(_INITIALIZED, "incremental_inference()")
        if not self.weightsGiven():
            raise CausalLMError("incremental_inference: the weights were never loaded (the "
                                "model's load_weight() was not called; a graph's load() or "
                                "setWeight() gives them)")
        runner = self._stage(stage)
        if batch != runner.batch:
            raise CausalLMError(f"incremental_inference: batch {batch} differs from the "
                                f"{runner.batch} rows of stage '{runner.name}'")
        if self._dirty:
            self._refresh_weights()
        threads.own()
        return runner.run(inputs, from_, to, rows)

    def warmup(self) -> None:
        """Run a 1-row and a 2-row step of zeros at position 0 in every stage, in order, so
        the kernels are compiled or loaded from numba's cache before the first real step is
        timed (a first compile is announced on stderr). It writes KV-cache rows 0 and 1,
        which the next run overwrites."""
        self._require(_INITIALIZED, "warmup()")
        for name, runner in self._stages.items():
            for step in sorted({1, min(2, runner.input_rows())}):
                zeros = [np.zeros((runner.batch, step), dtype=np.float32)
                         for _ in runner.input_names]
                self.incremental_inference(runner.batch, zeros, None, step, 0, step, stage=name)
        compile_report()

    def getStageBatch(self, stage: str | None = None) -> int:
        """Rows of ``stage`` (the only one when None)."""
        self._require(_INITIALIZED, "getStageBatch()")
        return self._stage(stage).batch

    def getKVCaches(self, kind: str | None = None, stage: str | None = None) -> list[KVCache]:
        """The KV caches (causallm/runtime/kv_cache.py) in graph order, of one ``kind``
        ("self" or "cross") and ``stage`` when given."""
        self._require(_INITIALIZED, "getKVCaches()")
        return [c for c in self._kv_caches
                if (kind is None or c.kind == kind) and (stage is None or c.stage == stage)]

    # -- inspection -------------------------------------------------------------------------
    def forEachLayer(self, fn: Callable[[Any, RunLayerContext, Any], None],
                     user_data: Any = None) -> None:
        """Call ``fn(layer, context, user_data)`` for every layer in graph order."""
        self._require(_INITIALIZED, "forEachLayer()")
        for layer, ctx in self._run:
            fn(layer, ctx, user_data)

    def executionPlan(self, stage: str | None = None) -> list:
        """What a step of ``stage`` (the only one when None) runs, in order: (layer, context)
        pairs, where a ``LinearGroup`` (context None) stands for the layers it multiplies
        together (runtime/runner.py). Each runs by ``incremental_forwarding(context, from_,
        to)``; a profiler may wrap that on the instance."""
        self._require(_INITIALIZED, "executionPlan()")
        if self._dirty:
            self._refresh_weights()
        return list(self._stage(stage).plan)

    def getLayerNames(self, stage: str | None = None) -> list[str]:
        """Every layer in graph order, or only those ``stage`` runs."""
        self._require_compiled("getLayerNames()")
        return [n.getName() for n in self._sorted
                if stage is None or self._graph.stage_of[n.getName()] == stage]

    def getOutputNames(self) -> list[str]:
        self._require_compiled("getOutputNames()")
        return list(self._graph.output_names)

    def getLayerTable(self) -> list[LayerRow]:
        """One ``LayerRow`` per layer in graph order: name, type, stage, input connections
        ``(producer, output index)``, output dims and parameter count (a shared weight counted
        at its first owner). ``summarize`` prints it; ``causallm/runtime/graphviz.py`` draws it."""
        self._require_compiled("getLayerTable()")
        rows, seen = [], set()
        for node, ctx in zip(self._sorted, self._contexts):
            params = 0
            for spec in ctx.weights:
                if spec.full_name not in seen:
                    seen.add(spec.full_name)
                    params += spec.size
            rows.append(LayerRow(node.getName(), node.getType(),
                                 self._graph.stage_of[node.getName()],
                                 list(node.getInputConnections()), list(ctx.output_dims), params))
        return rows

    def summarize(self, out=None) -> str:
        """Print (and return) a table: name, type, inputs, output dims, parameters, total, and
        the total of each stack of blocks (the layers named ``<stack>layer<i>_...``:
        ``layer*``, ``encoder_layer*``, ``decoder_layer*``) and of the rest."""
        rows = [("name", "type", "input layers", "output", "params")]
        total = 0
        stacks: dict[str, int] = {}
        for layer in self.getLayerTable():
            total += layer.params
            block = _BLOCK.match(layer.name)
            key = f"{block.group(1)}*" if block else "other"
            stacks[key] = stacks.get(key, 0) + layer.params
            inputs = ",".join(n if i == 0 else f"{n}({i})" for n, i in layer.inputs)
            outs = " ".join(str(d) for d in layer.output_dims)
            rows.append((layer.name, layer.type, inputs, outs, f"{layer.params:,}"))
        widths = [max(len(r[c]) for r in rows) for c in range(5)]
        lines = []
        for k, row in enumerate(rows):
            cells = [row[c].ljust(widths[c]) if c < 4 else row[c].rjust(widths[c]) for c in range(5)]
            lines.append("  ".join(cells).rstrip())
            if k == 0:
                lines.append("-" * len(lines[0]))
        lines.append("-" * len(lines[0]))
        lines.append(f"total parameters: {total:,}")
        if len(stacks) > 1:
            lines += [f"  {key}: {count:,}" for key, count in stacks.items()]
        text = "\n".join(lines) + "\n"
        (out or sys.stdout).write(text)
        return text


def createModel(model_type: str = NEURAL_NET) -> Model:
    """``ml::train::createModel(ml::train::ModelType::NEURAL_NET)``."""
    if model_type != NEURAL_NET:
        raise CausalLMError(f"createModel: unsupported model type {model_type!r}")
    return Model()
