"""KV caches as objects: what an attention layer keeps between steps, listed by the model.

A ``KVCache`` has an ``owner`` (the attention layer), a ``kind`` and the ``stage`` its owner
runs in:

- ``"self"``: the layer's own key and value tensors ``(B, max_timestep, n_kv * head_dim)``; a
  step writes rows ``[from_, to)`` and attends over the rows its mask allows. The system-prompt
  cache saves and loads these; beam search reorders their batch rows.
- ``"cross"``: the keys and values of another stage's sequence (the encoder's), projected once
  by that stage and read by every decoder step: views of those projections' output buffers,
  ``(B, rows, n_kv * head_dim)``, of which the first ``length`` rows are valid.

``Model.getKVCaches(kind, stage)`` lists them in graph order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SELF, CROSS = "self", "cross"


@dataclass
class KVCache:
    owner: str
    kind: str
    stage: str
    key: np.ndarray
    value: np.ndarray
    source: object = None  # for a cross cache: the StageState of the stage that projected it

    @property
    def length(self) -> int:
        """Rows holding positions: a cross cache's source step; a self cache's capacity."""
        return self.source.rows if self.source is not None else self.key.shape[1]

    def reorder(self, rows, length: int | None = None) -> None:
        """Row b becomes row ``rows[b]`` (the beams that survive a step), in place; only rows
        that change are copied, and of those only the first ``length`` positions (the ones
        written so far; all when None)."""
        index = np.asarray(rows, dtype=np.int64)
        moved = np.flatnonzero(index != np.arange(index.size))
        if moved.size == 0:
            return
        n = self.key.shape[1] if length is None else length
        source = index[moved]
        self.key[moved, :n] = self.key[source, :n]  # the right side is gathered first
        self.value[moved, :n] = self.value[source, :n]
