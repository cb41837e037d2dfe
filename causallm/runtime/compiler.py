"""compile(): from the layers a model file added to an ordered, finalized graph split into stages.

Steps, as nntrainer's realizers and ``NetworkGraph`` do them, plus the stages:

1. Unnamed layers get ``<type><n>`` names; a name used twice is an error.
2. Realizers: a layer without ``input_layers`` reads the previous layer; ``activation=X`` on a
   layer that is not an activation becomes a node ``<name>/activation_realized``.
3. Every input must exist (``name(k)`` picks output k) and the graph must be acyclic.
4. Topological order: Kahn's algorithm taking the smallest insertion index first, so a valid
   insertion order is kept exactly (nntrainer's order since commit 89defc95). This order is the
   .bin weight order.
5. Each layer's ``finalize`` runs in that order: output dims from input dims, weight, tensor and
   KV-cache requests. A weight requested again under the same ``scope:name`` (``shared_from``)
   is the same tensor.
6. Stages. A model with no declared stage has one, ``DEFAULT_STAGE``, holding every layer; its
   outputs are the layers nobody reads. With stages declared (``Model.addStage(name, inputs,
   outputs)``, in the order they run), each input layer belongs to the stage that lists it and
   every other layer to the latest stage among its inputs: a layer that reads only encoder
   tensors (the decoder's cross-attention K and V projections) runs with the encoder, once per
   prompt. A stage runs its layers in graph order, except that layers of one type reading the
   same inputs (the q, k and v projections; gate and up) run one after another, for the runner
   to fuse; a tensor read by a later stage is kept for it (the planner never reuses its
   buffer). A stage may have its own batch: a decoder running B x num_beams rows reads an
   encoder that ran B (each group of beams shares its prompt's encoder rows).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from causallm.errors import CausalLMError
from causallm.runtime.layer import InitLayerContext, TensorDim, WeightSpec
from causallm.runtime.node import LAYER_IMPL_PROPERTIES, LayerNode

DEFAULT_STAGE = "model"
"""The stage of a model that declares none (every decoder-only and embedding model)."""


@dataclass
class StageSpec:
    """A declared stage: its input layers, the layers whose outputs a run returns, and its
    batch (None: the model's batch_size)."""

    name: str
    inputs: list[str]
    outputs: list[str]
    batch: int | None = None


@dataclass
class Stage:
    """A compiled stage: its nodes in graph order, input and output layer names, batch."""

    name: str
    nodes: list[LayerNode] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    batch: int = 1


@dataclass
class CompiledGraph:
    """What compile() hands to initialize(): the sorted nodes with their finalize contexts,
    every output's dims, the weights in .bin order, and the stages."""

    nodes: list[LayerNode]
    contexts: list[InitLayerContext]
    out_dims: dict[str, list[TensorDim]]
    weight_specs: list[WeightSpec]
    stages: list[Stage]
    stage_of: dict[str, str]            # layer name -> its stage
    kept: set[tuple[str, int]]          # tensors read by a later stage
    slots_of: dict[str, int] = field(default_factory=dict)  # stage -> sequences its caches hold

    @property
    def input_names(self) -> list[str]:
        return [name for s in self.stages for name in s.inputs]

    @property
    def output_names(self) -> list[str]:
        return [name for s in self.stages for name in s.outputs]


def compile_graph(nodes: list[LayerNode], stage_specs: list[StageSpec], batch: int,
                  tensor_type: str, slots: int = 0) -> CompiledGraph:
    """Run the steps of the module docstring over ``nodes`` (in insertion order)."""
    if not nodes:
        raise CausalLMError("compile: the model has no layers")
    _name_nodes(nodes)
    _realize_previous_inputs(nodes)
    nodes = _realize_activations(nodes)
    by_name = {n.getName(): n for n in nodes}
    for node in nodes:
        for producer, _ in node.getInputConnections():
            if producer not in by_name:
                raise CausalLMError(f"layer '{node.getName()}': input layer '{producer}' "
                                    f"does not exist")
    order = _topological_sort(nodes)
    stages, stage_of, kept = _split_stages(order, stage_specs, batch)
    for stage in stages:
        stage.nodes = _siblings_together(stage.nodes)
    batch_of = {s.name: s.batch for s in stages}
    slots_of = {s.name: slots or s.batch for s in stages}
    for stage in stages:
        if slots_of[stage.name] % stage.batch:
            raise CausalLMError(f"model: slots {slots} is not a multiple of stage "
                                f"'{stage.name}''s batch {stage.batch}")
    contexts, out_dims, weight_specs = _finalize(order, by_name, tensor_type,
                                                 {n: batch_of[s] for n, s in stage_of.items()},
                                                 {n: slots_of[s] for n, s in stage_of.items()})
    return CompiledGraph(order, contexts, out_dims, weight_specs, stages, stage_of, kept,
                         slots_of)


def _name_nodes(nodes: list[LayerNode]) -> None:
    seen: set[str] = set()
    taken = {n.getName() for n in nodes if n.getName()}
    counters: dict[str, int] = {}
    for node in nodes:
        name = node.getName()
        if not name:
            count = counters.get(node.getType(), 0)
            while f"{node.getType()}{count}" in seen or f"{node.getType()}{count}" in taken:
                count += 1
            counters[node.getType()] = count + 1
            name = f"{node.getType()}{count}"
            node.setName(name)
        if name in seen:
            raise CausalLMError(f"layer '{name}': the name is used by more than one layer")
        seen.add(name)


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


def _topological_sort(nodes: list[LayerNode]) -> list[LayerNode]:
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


def _finalize(order: list[LayerNode], by_name: dict[str, LayerNode], tensor_type: str,
              batch_of: dict[str, int], slots_of: dict[str, int]):
    w_dtype, a_dtype = tensor_type.split("-")
    out_dims: dict[str, list[TensorDim]] = {}
    contexts: list[InitLayerContext] = []
    weight_owner: dict[str, tuple[str, WeightSpec]] = {}
    for node in order:
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
        ctx = InitLayerContext(name, node.getType(), input_dims, batch_of[name], shared or name,
                               dtype.upper(), a_dtype)
        ctx.input_shape = node.getProperty("input_shape")
        ctx.slots = slots_of[name]
        _fill_defaults(node)
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
        contexts.append(ctx)
    # the .bin order: every weight at its first request, in node order
    seen: set[str] = set()
    weight_specs: list[WeightSpec] = []
    for ctx in contexts:
        for spec in ctx.weights:
            if spec.full_name not in seen:
                seen.add(spec.full_name)
                weight_specs.append(spec)
    return contexts, out_dims, weight_specs


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


def _siblings_together(nodes: list[LayerNode]) -> list[LayerNode]:
    """``nodes`` with each layer that has the type and the inputs of an earlier one moved to
    run right after it (Gemma's ``ffn_up`` beside its ``ffn_gate``, ahead of the gate's
    activation), so a runner can fuse them (runtime/runner.py). Still a valid order: the moved
    layer's inputs are those of the layer it joins, and nothing before its old place read it."""
    groups: dict[tuple, list[LayerNode]] = {}
    for node in nodes:
        key = (node.getType(), tuple(node.getInputConnections()))
        groups.setdefault(key, []).append(node)
    return [n for group in groups.values() for n in group]


def _split_stages(order: list[LayerNode], specs: list[StageSpec], batch: int):
    """(stages, stage of every layer, tensors read by a later stage); see the module docstring."""
    names = [n.getName() for n in order]
    consumed = {p for n in order for p, _ in n.getInputConnections()}
    inputs = [n.getName() for n in order if n.getType() == "input"]
    if not specs:
        stage = Stage(DEFAULT_STAGE, list(order), inputs, [n for n in names if n not in consumed],
                      batch)
        return [stage], {n: DEFAULT_STAGE for n in names}, set()

    rank: dict[str, int] = {}
    for k, spec in enumerate(specs):
        for name in spec.inputs:
            if name not in names:
                raise CausalLMError(f"stage '{spec.name}': input layer '{name}' does not exist")
            if name in rank:
                raise CausalLMError(f"stage '{spec.name}': input layer '{name}' already belongs "
                                    f"to stage '{specs[rank[name]].name}'")
            rank[name] = k
    for name in inputs:
        if name not in rank:
            raise CausalLMError(f"input layer '{name}' belongs to no stage (stages: "
                                f"{', '.join(s.name for s in specs)})")
    for node in order:
        name = node.getName()
        if node.getType() == "input":
            continue
        if name in rank:
            raise CausalLMError(f"stage '{specs[rank[name]].name}': '{name}' is not an input layer")
        rank[name] = max(rank[p] for p, _ in node.getInputConnections())
    stages = [Stage(s.name, [n for n in order if rank[n.getName()] == k], list(s.inputs),
                    list(s.outputs), s.batch or batch) for k, s in enumerate(specs)]
    for k, spec in enumerate(specs):
        for name in spec.outputs:
            if name not in rank:
                raise CausalLMError(f"stage '{spec.name}': output layer '{name}' does not exist")
            if rank[name] != k:
                raise CausalLMError(f"stage '{spec.name}': output layer '{name}' is computed in "
                                    f"stage '{specs[rank[name]].name}'")
    kept = {ref for n in order for ref in n.getInputConnections()
            if rank[ref[0]] < rank[n.getName()]}
    stage_of = {name: specs[r].name for name, r in rank.items()}
    return stages, stage_of, kept
