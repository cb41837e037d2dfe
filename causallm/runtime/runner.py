"""Running a stage: one step over positions ``[from_, to)`` of one stage's layers.

The step's values sit at rows ``[0, to - from_)`` of every buffer (spec §2.5); attention layers
place them at absolute positions ``[from_, to)``. Each stage remembers the span of its last step
(``StageState``), which is how a later stage's layer knows how many rows of an earlier stage's
tensor hold data (a cross-attention reads the encoder's keys that way). One decode step
allocates nothing inside the layer loop: layers hand whole buffers and a row count to kernels.
A stage runs the execution plan of its layers (``make_plan``), which runs every fully connected
layer with block weights as a ``LinearGroup`` and multiplies those reading the same tensor
together.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from causallm.errors import CausalLMError
from causallm.kernels.packed import PackedMatrix
from causallm.kernels.quant import MatrixTable, quantize_activations
from causallm.runtime.layer import RunLayerContext


class StageState:
    """The span ``[from_, to)`` of a stage's last step (``to == 0``: it has not run)."""

    __slots__ = ("name", "from_", "to")

    def __init__(self, name: str) -> None:
        self.name, self.from_, self.to = name, 0, 0

    @property
    def rows(self) -> int:
        return self.to - self.from_


class StageRunner:
    """A compiled stage bound to its buffers: ``run(batch, inputs, from_, to)``."""

    def __init__(self, name: str, steps: list[tuple[Any, RunLayerContext]], inputs: list[str],
                 outputs: list[str], buffers: dict[str, list[np.ndarray]], batch: int,
                 state: StageState) -> None:
        self.name = name
        self.steps = steps
        self.input_names = inputs
        self.output_names = outputs
        self.batch = batch
        self.state = state
        self._inputs = [buffers[n][0].reshape(batch, -1) for n in inputs]
        self._outputs = [buffers[n][0].reshape(batch, -1) for n in outputs]
        self._plan: list | None = None

    @property
    def plan(self) -> list:
        """The execution plan (``make_plan``), made at the first run after the weights were
        set."""
        if self._plan is None:
            self._plan = make_plan(self.steps)
        return self._plan

    def replan(self) -> None:
        """Forget the execution plan (the weights changed); the next run makes it again."""
        self._plan = None

    def input_rows(self) -> int:
        """The most values per batch row any input holds (its step buffer)."""
        return min(buf.shape[1] for buf in self._inputs)

    def run(self, inputs: list, from_: int, to: int) -> list[np.ndarray]:
        batch, step = self.batch, to - from_
        where = f"incremental_inference (stage '{self.name}')"
        if from_ < 0 or step < 1:
            raise CausalLMError(f"{where}: need 0 <= from_ < to, got from_={from_}, to={to}")
        if len(inputs) != len(self._inputs):
            raise CausalLMError(f"{where}: got {len(inputs)} inputs for {len(self._inputs)} "
                                f"input layers ({', '.join(self.input_names)})")
        for name, buf, data in zip(self.input_names, self._inputs, inputs):
            if step > buf.shape[1]:
                raise CausalLMError(f"{where}: a step of {step} tokens exceeds the "
                                    f"{buf.shape[1]} rows of input '{name}' (init_seq_len)")
            data = np.asarray(data, dtype=np.float32)
            if data.size % batch:
                raise CausalLMError(f"{where}: input '{name}' has {data.size} values, not a "
                                    f"multiple of batch {batch}")
            data = data.reshape(batch, -1)
            if not step <= data.shape[1] <= buf.shape[1]:
                raise CausalLMError(f"{where}: input '{name}' takes {step} to {buf.shape[1]} "
                                    f"values per batch; got {data.shape[1]}")
            buf[:, :data.shape[1]] = data
        state = self.state
        state.from_, state.to = from_, to
        try:
            for layer, ctx in self.plan:
                layer.incremental_forwarding(ctx, from_, to)
        except BaseException:
            state.from_ = state.to = 0  # half a step: nothing downstream may read it
            raise
        return [out.copy() for out in self._outputs]


# -- the execution plan -----------------------------------------------------------------------

def make_plan(steps: list) -> list:
    """``steps``, the (layer, context) pairs of a stage, as the runner executes them, each by
    ``incremental_forwarding(context, from_, to)``: the layers, except that a layer computing
    ``x @ W + bias`` (its ``linear_operands``) with W in ggml blocks runs as a ``LinearGroup``
    (context None), together with the consecutive ones that read the same x in the same
    activation format (a layer's q, k and v projections; its gate and up). The results are the
    same: each product is the one its layer computes, on the same rounded activations."""
    out: list = []
    i = 0
    while i < len(steps):
        group = [_linear(*steps[i])]
        j = i + 1
        while group[0] is not None and j < len(steps):
            nxt = _linear(*steps[j])
            if nxt is None or not _same_input(nxt, group[0]):
                break
            group.append(nxt)
            j += 1
        out.append(steps[i] if group[0] is None else (LinearGroup(group), None))
        i = j
    return out


def _linear(layer, ctx):
    """A layer's (x, packed W, bias, y, name) when its W is in ggml blocks, else None."""
    operands = getattr(layer, "linear_operands", None)
    if operands is None:
        return None
    x, w, bias, y = operands(ctx)
    if not isinstance(w, PackedMatrix) or w.qtype is None or not w.transposed:
        return None
    return x, w, bias, y, ctx.name


def _same_input(a, b) -> bool:
    xa, xb = a[0], b[0]
    return (xa.shape == xb.shape and xa.ctypes.data == xb.ctypes.data
            and a[1].qtype.act == b[1].qtype.act)


class LinearGroup:
    """Products of one input by one or more block matrices (``make_plan``): the input quantized
    once, then each block type's matrices in one parallel region (``MatrixTable``). It runs as
    a layer does; ``name`` joins its layers' names."""

    type = "fully_connected"

    def __init__(self, members: list) -> None:
        self.x = members[0][0]
        self.act = members[0][1].qtype.act
        self.rows = members[0][3].shape[1]
        self.names = [m[4] for m in members]
        self.name = "+".join(self.names)
        by_type: dict = {}
        for _, w, bias, y, _ in members:
            by_type.setdefault(w.qtype.name, (w.qtype, []))[1].append((w.data, bias, y))
        self.tables = [MatrixTable(qtype, m) for qtype, m in by_type.values()]

    def getType(self) -> str:
        return self.type

    def incremental_forwarding(self, context, from_: int, to: int) -> None:
        nrows = min(to - from_, self.rows)
        q, d, s, u = quantize_activations(self.act, self.x, 0, nrows)
        for table in self.tables:
            table.run(q, d, s, u, nrows)
