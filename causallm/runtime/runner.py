"""Running a stage: one step over positions ``[from_, to)`` of one stage's layers.

The step's values sit at rows ``[0, to - from_)`` of every buffer (docs/nntrainer.md, "The step
buffer"); attention layers place them at absolute positions ``[from_, to)``. Each stage remembers
the span of its last step (``StageState``), which is how a later stage's layer knows how many rows
of an earlier stage's tensor hold data (a cross-attention reads the encoder's keys that way). One
decode step allocates nothing inside the layer loop: layers hand whole buffers and a row count to
kernels. A stage runs the execution plan of its layers (``make_plan``), which runs every fully
connected layer with block weights as a ``LinearGroup`` and multiplies those reading the same tensor
together, and lets the norm, swiglu or multiply before such a group round its rows for it (with a
norm's residual addition) in one kernel call. A step of at most TEAM_MAX_ROWS rows (decode, a
short prompt) runs the plan's consecutive entries that can as one team program in one parallel
region (``team_plan``, kernels/team.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from causallm.errors import CausalLMError
from causallm.kernels.packed import PackedMatrix
from causallm.kernels.quant import (
    AMX_MIN_ROWS,
    NO_ACT,
    NO_D,
    NO_Q,
    NO_ROWS,
    NO_U,
    MatrixTable,
    activation_rows,
    activations_generation,
    glu_op,
    norm_op,
    quantize_call,
    quantize_op,
    row_kernels,
)
from causallm.kernels.team import Program
from causallm.kernels.threads import threads
from causallm.layers.multiply import RowProductLayer
from causallm.runtime.layer import RunLayerContext


class StageState:
    """The span ``[from_, to)`` of a stage's last step (``to == 0``: it has not run), and where
    its rows belong: row i of batch b is the token of the sequence in KV-cache slot
    ``slots[b, i]`` at position ``positions[b, i]``; a head projects rows ``last[b, :n_last]``
    of each batch; ``end`` is one past the largest position.

    A step over ``[from_, to)`` (``span``) is one sequence per batch row: slot b, positions
    from_ + i, the head on the last row. A step of several sequences (``set_rows``) puts their
    rows side by side, each at its own position, a decode token of one beside a prompt chunk of
    another: the other layers see rows and never ask whose they are.
    """

    __slots__ = ("name", "from_", "to", "slots", "positions", "last", "n_last", "last_row",
                 "end", "n_slots", "_spans", "generation")

    def __init__(self, name: str, batch: int = 1, rows: int = 1, n_slots: int | None = None,
                 heads: int = 1) -> None:
        self.name, self.from_, self.to = name, 0, 0
        self.n_slots = batch if n_slots is None else n_slots
        self.slots = np.zeros((batch, rows), dtype=np.int64)
        self.positions = np.zeros((batch, rows), dtype=np.int64)
        self.last = np.zeros((batch, heads), dtype=np.int64)
        self.n_last = 1
        self.last_row: int | None = 0  # the one row every batch's head projects, when so
        self.end = 0
        self._spans = False  # whether slots holds the span layout (slot b for batch row b)
        self.generation = 0  # times slots and positions were made anew (``_hold``)

    @property
    def rows(self) -> int:
        return self.to - self.from_

    def _hold(self, n: int) -> None:
        """Room for a step of n rows (the arrays grow to the longest step seen)."""
        if n > self.slots.shape[1]:
            B = self.slots.shape[0]
            self.slots = np.zeros((B, n), dtype=np.int64)
            self.positions = np.zeros((B, n), dtype=np.int64)
            self._spans = False
            self.generation += 1

    def span(self, from_: int, to: int) -> None:
        """Rows [0, to - from_) of batch b: slot b, positions [from_, to)."""
        self._hold(to - from_)
        if not self._spans:
            self.slots[:] = np.arange(self.slots.shape[0], dtype=np.int64)[:, None]
            self._spans = True
        self.positions[:, :to - from_] = np.arange(from_, to, dtype=np.int64)
        self.last[:, 0] = to - from_ - 1
        self.n_last, self.last_row, self.end = 1, to - from_ - 1, to

    def set_rows(self, slots, positions, last, where: str) -> None:
        """A step of several sequences: ``slots`` and ``positions`` (batch, n) for its n rows,
        ``last`` (batch, m) the rows whose logits the head computes (at most ``heads``)."""
        slots = np.asarray(slots, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int64)
        last = np.asarray(last, dtype=np.int64)
        B, n = self.slots.shape[0], self.to - self.from_
        if slots.shape != (B, n) or positions.shape != (B, n):
            raise CausalLMError(f"{where}: slots and positions must be ({B}, {n}) for a step of "
                                f"{n} rows, got {slots.shape} and {positions.shape}")
        if last.ndim != 2 or last.shape[0] != B or not 1 <= last.shape[1] <= self.last.shape[1]:
            raise CausalLMError(f"{where}: the head's rows must be ({B}, 1 to "
                                f"{self.last.shape[1]}), got {last.shape}")
        if slots.min() < 0 or slots.max() >= self.n_slots:
            raise CausalLMError(f"{where}: a slot is outside [0, {self.n_slots})")
        if positions.min() < 0:
            raise CausalLMError(f"{where}: a position is negative")
        if last.min() < 0 or last.max() >= n:
            raise CausalLMError(f"{where}: a head row is outside the step's {n} rows")
        self._hold(n)
        self.slots[:, :n] = slots
        self.positions[:, :n] = positions
        m = last.shape[1]
        self.last[:, :m] = last
        uniform = m == 1 and (last == last[0, 0]).all()  # one row, the same in every batch
        self.n_last, self.end = m, int(positions.max()) + 1
        self.last_row = int(last[0, 0]) if uniform else None
        self._spans = False


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
        self._teams: dict = {}
        self._teams_stamp = None

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
        self._teams = {}

    def execution(self, step: int) -> list:
        """What a step of ``step`` rows runs: the plan, with runs of its entries that can
        run as one team program (``team_plan``) so joined when the step has at most
        TEAM_MAX_ROWS rows in all. Made once for each step length and head row, and again
        when the buffers the programs point to are made anew (the shared activation rows,
        the state's rows) or the thread count changes."""
        if step * self.batch > TEAM_MAX_ROWS:
            return self.plan
        stamp = (activations_generation(), threads(), self.state.generation)
        if stamp != self._teams_stamp:
            self._teams, self._teams_stamp = {}, stamp
        key = (step, self.state.last_row)
        plan = self._teams.get(key)
        if plan is None:
            plan = team_plan(self.plan, step)
            if activations_generation() != stamp[0]:  # an op made the buffers anew (they
                # only grow: made again, the programs point at the new ones)
                self._teams, self._teams_stamp = {}, (activations_generation(),) + stamp[1:]
                plan = team_plan(self.plan, step)
            self._teams[key] = plan
        return plan

    def input_rows(self) -> int:
        """The most values per batch row any input holds (its step buffer)."""
        return min(buf.shape[1] for buf in self._inputs)

    def run(self, inputs: list, from_: int, to: int, rows=None) -> list[np.ndarray]:
        """One step over ``[from_, to)``; ``rows`` = (slots, positions, last) for a step of
        several sequences (``StageState.set_rows``)."""
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
        if rows is None:
            state.span(from_, to)
        else:
            try:
                state.set_rows(*rows, where)
            except CausalLMError:
                state.from_ = state.to = 0
                raise
        try:
            for layer, ctx in self.execution(step):
                layer.incremental_forwarding(ctx, from_, to)
        except BaseException:
            state.from_ = state.to = 0  # half a step: nothing downstream may read it
            raise
        return [out.copy() for out in self._outputs]


# -- the execution plan -----------------------------------------------------------------------

def make_plan(steps: list) -> list:
    """``steps``, the (layer, context) pairs of a stage, as the runner executes them, each by
    ``incremental_forwarding(context, from_, to)``. The layers, except:

    - a layer computing ``x @ W + bias`` (its ``linear_operands``) with W in ggml blocks runs
      as a ``LinearGroup`` (context None), together with the consecutive ones that read the
      same x in the same activation format (a layer's q, k and v projections; its gate and up);
    - an ``rms_norm`` runs as ``NormRows``, taking in the two-input ``addition`` just before it
      when that writes the norm's input (a residual), and rounding its rows for the
      ``LinearGroup`` just after it when that reads its output;
    - a ``swiglu`` or ``multiply`` just before a ``LinearGroup`` reading its output runs as
      ``GluRows``, rounding its rows for it.

    The results are the same: each layer's values are those its own kernel computes, and each
    product is its layer's, on the same rounded activations; only the number of kernel calls
    falls (a decode step's fixed cost: docs/performance.md, "A decode step")."""
    grouped: list = []
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
        grouped.append(steps[i] if group[0] is None else (LinearGroup(group), None))
        i = j
    plan: list = []
    for layer, ctx in grouped:
        prev = plan[-1][0] if plan else None
        if layer.getType() == "rms_norm" and ctx is not None:
            add = None
            if (prev is not None and plan[-1][1] is not None and prev.getType() == "addition"
                    and len(plan[-1][1].inputs) == 2
                    and _same(plan[-1][1].outputs[0], ctx.inputs[0])):
                add = plan.pop()
            plan.append((NormRows(layer, ctx, add), None))
            continue
        if isinstance(layer, LinearGroup) and prev is not None:
            if isinstance(prev, NormRows) and _same(prev.y, layer.x):
                prev.feed(layer)
            elif (isinstance(prev, RowProductLayer) and plan[-1][1] is not None
                  and _same(plan[-1][1].outputs[0], layer.x)):
                plan[-1] = (GluRows(prev, plan[-1][1], layer), None)
        plan.append((layer, ctx))
    return plan


TEAM_MAX_ROWS = AMX_MIN_ROWS - 1
"""Steps of up to this many rows in all (batches times rows: decode steps, a batch's, short
prompts) run consecutive plan entries as one team program (``team_plan``); longer ones call
their kernels, each parallel over rows or tiles of its own (their block products go to AMX
tiles from AMX_MIN_ROWS rows). SmolLM2's 12-token prompt: 18.6 -> 15.6 ms, the same logits."""


def team_plan(plan: list, step: int) -> list:
    """``plan`` for a step of ``step`` rows, each run of consecutive entries that give team ops
    for it (``team_ops(step)`` of LinearGroup, NormRows, GluRows; a layer's
    ``team_ops(context, step)``: mha_core, reshaped_rms_norm, activation, the heads) joined
    into one ``Team``, which runs their kernels' work as one program in one parallel region
    (kernels/team.py), in order, each op's tasks done before the next op starts: the same
    values, without a Python call or a region's start for each kernel (docs/performance.md,
    "A decode step in one region")."""
    out: list = []
    run: list = []
    names: list = []
    labels: list = []
    checks: list = []

    def close() -> None:
        if run:
            out.append((Team(list(run), "+".join(names), list(checks), list(labels)), None))
            for held in (run, names, labels, checks):
                held.clear()

    for entry, ctx in plan:
        if ctx is None:
            ops = entry.team_ops(step)
        else:
            layer_ops = getattr(entry, "team_ops", None)
            ops = None if layer_ops is None else layer_ops(ctx, step)
            if ops is not None and hasattr(entry, "check_step"):
                checks.append((entry.check_step, ctx))
        if ops is None:
            close()
            out.append((entry, ctx))
        else:
            run.extend(ops)
            names.append(entry.name if ctx is None else ctx.name)
            labels.extend([names[-1]] * len(ops))
    close()
    return out


class Team:
    """Plan entries run as one team program (``team_plan``); ``ops`` [(op address, args,
    tasks, *what it keeps alive)]; ``checks`` [(check_step, context)] of its layers, called
    before (a step past a KV cache raises, as the layer itself would); ``labels`` the name of
    the plan entry each op comes from (bench/team_trace.py times the ops by them)."""

    type = "team"

    def __init__(self, ops: list, name: str, checks: list, labels: list) -> None:
        self.name, self.checks, self.labels = name, checks, labels
        # ops of one task each (a norm of one row between float products) need no region
        self.threads = threads() if any(tasks > 1 for _, _, tasks, *_ in ops) else 1
        self.program = Program(ops)

    def getType(self) -> str:
        return self.type

    def incremental_forwarding(self, context, from_: int, to: int) -> None:
        for check, ctx in self.checks:
            check(ctx)
        self.program.run(self.threads)


def _same(a, b) -> bool:
    """Whether two arrays are the same view of the same memory."""
    return a.shape == b.shape and a.ctypes.data == b.ctypes.data


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
    return _same(a[0], b[0]) and a[1].qtype.act == b[1].qtype.act


BOUND_MAX_ROWS = 64
"""Steps of up to this many rows keep their kernel calls (``BoundCalls``): of those, the ones
above TEAM_MAX_ROWS (a large batch's decode step, a short prompt; smaller steps run team
programs); a longer step finds its calls again, a small cost beside its products, and leaves
nothing behind."""


class BoundCalls:
    """A plan entry's kernel calls [(kernel, args)] for a step of ``nrows`` rows: made by
    ``make(nrows)`` once and kept while the shared activation buffers and the thread count stay
    the same (the arguments are the entry's own buffers, views of those rows, and choices made
    from the thread count), so a step of the same length repeats its calls without the Python
    that found them (docs/performance.md, "Attention in one call, kernel calls bound once, nibbles in
    three instructions"). When the buffers are made anew (a longer step than any before) every
    kept call is dropped, with the views that held the old buffers."""

    __slots__ = ("make", "stamp", "calls")

    def __init__(self, make) -> None:
        self.make, self.stamp, self.calls = make, None, {}

    def __call__(self, nrows: int) -> list:
        stamp = (activations_generation(), threads())
        if stamp != self.stamp:
            self.stamp, self.calls = stamp, {}
        calls = self.calls.get(nrows)
        if calls is None:
            calls = self.make(nrows)
            if nrows <= BOUND_MAX_ROWS:
                self.calls[nrows] = calls
        return calls


class LinearGroup:
    """Products of one input by one or more block matrices (``make_plan``): the input quantized
    once (by the group, or by the ``NormRows`` / ``GluRows`` before it: ``quantized``), then
    each block type's matrices in one parallel region (``MatrixTable``). It runs as a layer
    does; ``name`` joins its layers' names."""

    type = "fully_connected"

    def __init__(self, members: list) -> None:
        self.x = members[0][0]
        self.act = members[0][1].qtype.act
        self.rows = members[0][3].shape[1]
        self.names = [m[4] for m in members]
        self.name = "+".join(self.names)
        self.quantized = False
        by_type: dict = {}
        for _, w, bias, y, _ in members:
            by_type.setdefault(w.qtype.name, (w.qtype, []))[1].append((w.blocks, bias, y))
        self.tables = [MatrixTable(qtype, m) for qtype, m in by_type.values()]
        self._calls = BoundCalls(self._make_calls)

    def getType(self) -> str:
        return self.type

    def activations(self, nrows: int):
        """The buffers (q, d, s, u) of the input's rows [0, nrows) in the group's format."""
        return activation_rows(self.x.shape[0] * nrows, self.x.shape[2])

    def _make_calls(self, nrows: int) -> list:
        if self.quantized:
            calls = []
            q, d, s, u = self.activations(nrows)
        else:
            kernel, args = quantize_call(self.act, self.x, 0, nrows)
            calls = [(kernel, args)]
            q, d, s, u = args[4:]
        for table in self.tables:
            calls += table.calls(q, d, s, u, nrows)
        return calls

    def team_ops(self, step: int) -> list | None:
        """The group's work for a step of ``step`` rows as team ops (kernels/team.py), or None
        when a kernel cannot run as one."""
        nrows = min(step, self.rows)
        if self.quantized:
            ops = []
            q, d, s, u = self.activations(nrows)
        else:
            op = quantize_op(self.act, self.x, 0, nrows)
            if op is None:
                return None
            ops = [op]
            q, d, s, u = self.activations(nrows)
        for table in self.tables:
            op = table.op(q, d, s, u, nrows)
            if op is None:
                return None
            ops.append(op)
        return ops

    def incremental_forwarding(self, context, from_: int, to: int) -> None:
        for kernel, args in self._calls(min(to - from_, self.rows)):
            kernel(*args)


class NormRows:
    """An ``rms_norm`` layer run by ``make_plan``: with the residual ``addition`` before it
    (``add``, its (layer, context), or None) in the same kernel call, and rounding its rows for
    the ``LinearGroup`` it ``feed``s. ``name`` joins the layers' names."""

    type = "rms_norm"

    def __init__(self, layer, ctx, add=None) -> None:
        self.layer, self.ctx, self.group = layer, ctx, None
        self.y = ctx.outputs[0]
        if add is None:
            self.a, self.b, self.total = ctx.inputs[0], NO_ROWS, NO_ROWS
        else:
            self.a, self.b = add[1].inputs
            self.total = add[1].outputs[0]
        self.name = ctx.name if add is None else f"{add[1].name}+{ctx.name}"
        self._calls = BoundCalls(self._make_calls)

    def getType(self) -> str:
        return self.type

    def feed(self, group: LinearGroup) -> None:
        self.group, group.quantized = group, True
        self._calls = BoundCalls(self._make_calls)

    def _make_calls(self, nrows: int) -> list:
        if self.group is None:
            act, (q, d, s, u) = NO_ACT, (NO_Q, NO_D, NO_D, NO_U)
        else:
            act, (q, d, s, u) = self.group.act, self.group.activations(nrows)
        kernel = row_kernels(act, self.y.shape[0] * nrows)[0]
        return [(kernel, (self.a, self.b, self.total, self.ctx.weights[0], self.y, nrows,
                          self.layer.eps, q, d, s, u))]

    def team_ops(self, step: int) -> list | None:
        """As ``LinearGroup.team_ops``."""
        nrows = min(step, self.y.shape[1])
        if self.group is None:
            act, (q, d, s, u) = NO_ACT, (NO_Q, NO_D, NO_D, NO_U)
        else:
            act, (q, d, s, u) = self.group.act, self.group.activations(nrows)
        op = norm_op(act, self.a, self.b, self.total, self.ctx.weights[0], self.y, nrows,
                     self.layer.eps, q, d, s, u)
        return None if op is None else [op]

    def incremental_forwarding(self, context, from_: int, to: int) -> None:
        for kernel, args in self._calls(min(to - from_, self.y.shape[1])):
            kernel(*args)


class GluRows:
    """A ``swiglu`` or ``multiply`` layer run by ``make_plan`` with the rounding of its rows for
    the ``LinearGroup`` after it, in one kernel call."""

    def __init__(self, layer, ctx, group: LinearGroup) -> None:
        self.type, self.name = layer.getType(), ctx.name
        self.kind = layer.glu
        self.gate, self.up = ctx.inputs
        self.out = ctx.outputs[0]
        self.group, group.quantized = group, True
        self._calls = BoundCalls(self._make_calls)

    def getType(self) -> str:
        return self.type

    def _make_calls(self, nrows: int) -> list:
        q, d, s, u = self.group.activations(nrows)
        kernel = row_kernels(self.group.act, self.out.shape[0] * nrows)[1]
        return [(kernel, (self.kind, self.gate, self.up, self.out, nrows, q, d, s, u))]

    def team_ops(self, step: int) -> list | None:
        """As ``LinearGroup.team_ops``."""
        nrows = min(step, self.out.shape[1])
        op = glu_op(self.group.act, self.kind, self.gate, self.up, self.out, nrows,
                    *self.group.activations(nrows))
        return None if op is None else [op]

    def incremental_forwarding(self, context, from_: int, to: int) -> None:
        for kernel, args in self._calls(min(to - from_, self.out.shape[1])):
            kernel(*args)
