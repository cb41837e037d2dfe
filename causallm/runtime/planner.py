"""The activation buffers: one float32 pool per tensor, reused once its last reader has run.

Every layer output gets a buffer of its full dims (``INIT_SEQ_LEN`` rows for a step buffer).
Walking the stages in order and each stage's layers in graph order, an output takes the
smallest free buffer that fits; a buffer becomes free once every reader of its tensor has run.
Graph inputs, stage outputs and tensors read by a later stage keep their own buffers for the
model's lifetime, so a 28-layer model needs a handful of activation buffers, not hundreds. A
layer never gets an output that aliases one of its inputs (inputs are released only after the
layer that reads them last).
"""

from __future__ import annotations

import numpy as np

from causallm.runtime.compiler import CompiledGraph


def plan_buffers(graph: CompiledGraph) -> dict[str, list[np.ndarray]]:
    """{layer name: a buffer view per output, shaped as its dims}."""
    nodes = [node for stage in graph.stages for node in stage.nodes]
    remaining: dict[tuple[str, int], int] = {}
    for node in nodes:
        for ref in node.getInputConnections():
            remaining[ref] = remaining.get(ref, 0) + 1
    keep = set(graph.output_names) | set(graph.input_names)
    free: list[np.ndarray] = []
    owner: dict[tuple[str, int], np.ndarray] = {}
    buffers: dict[str, list[np.ndarray]] = {}
    for node in nodes:
        name = node.getName()
        views = []
        for i, dim in enumerate(graph.out_dims[name]):
            size = int(np.prod(dim.shape))
            pool = None
            if name not in keep and (name, i) not in graph.kept:
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
            if remaining[ref] == 0 and ref[0] not in keep and ref not in graph.kept:
                free.append(owner[ref])
    return buffers
