"""Running a stage: one step over positions ``[from_, to)`` of one stage's layers.

The step's values sit at rows ``[0, to - from_)`` of every buffer (spec §2.5); attention layers
place them at absolute positions ``[from_, to)``. Each stage remembers the span of its last step
(``StageState``), which is how a later stage's layer knows how many rows of an earlier stage's
tensor hold data (a cross-attention reads the encoder's keys that way). One decode step
allocates nothing inside the layer loop: layers hand whole buffers and a row count to kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from causallm.errors import CausalLMError
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
            for layer, ctx in self.steps:
                layer.incremental_forwarding(ctx, from_, to)
        except BaseException:
            state.from_ = state.to = 0  # half a step: nothing downstream may read it
            raise
        return [out.copy() for out in self._outputs]
