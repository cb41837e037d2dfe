"""KV caches as objects: what an attention layer keeps between steps, listed by the model.

A ``KVCache`` has an ``owner`` (the attention layer), a ``kind`` and the ``stage`` its owner
runs in:

- ``"self"``: the layer's own key and value tensors ``(B, n_kv, max_timestep, head_dim)``
  (each kv head's positions contiguous, so attention streams them), float32 or FP16 bits
  (uint16); a step writes positions ``[from_, to)`` and attends over the ones its mask allows.
  The system-prompt cache saves and loads these (``rows``: NNTrainer's layout, a row per
  position); beam search reorders their batch rows.
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
        """Positions: a cross cache's source step; a self cache's capacity."""
        return self.source.rows if self.source is not None else self.key.shape[2]

    def reorder(self, rows, length: int | None = None) -> None:
        """Row b becomes row ``rows[b]`` (the beams that survive a step), in place; only rows
        that change are copied, and of those only the first ``length`` positions (the ones
        written so far; all when None)."""
        index = np.asarray(rows, dtype=np.int64)
        moved = np.flatnonzero(index != np.arange(index.size))
        if moved.size == 0:
            return
        n = self.length if length is None else length
        source = index[moved]
        # the right side is gathered first
        if self.source is None:
            self.key[moved, :, :n] = self.key[source, :, :n]
            self.value[moved, :, :n] = self.value[source, :, :n]
        else:
            self.key[moved, :n] = self.key[source, :n]
            self.value[moved, :n] = self.value[source, :n]

    def rows(self, to: int) -> tuple[np.ndarray, np.ndarray]:
        """A self cache's positions [0, to) as NNTrainer lays them out: (B, to, n_kv *
        head_dim) key and value, in the cache's dtype (float32 or FP16 bits)."""
        B, n_kv, _, d = self.key.shape
        return tuple(np.ascontiguousarray(c[:, :, :to].transpose(0, 2, 1, 3))
                     .reshape(B, to, n_kv * d) for c in (self.key, self.value))

    def setRows(self, to: int, key: np.ndarray, value: np.ndarray) -> None:
        """The inverse of ``rows``: positions [0, to) from (B, to, n_kv * head_dim) arrays."""
        B, n_kv, _, d = self.key.shape
        for cache, src in ((self.key, key), (self.value, value)):
            cache[:, :, :to] = src.reshape(B, to, n_kv, d).transpose(0, 2, 1, 3)
