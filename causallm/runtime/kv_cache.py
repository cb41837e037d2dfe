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

The system-prompt cache file (``save_system_cache`` / ``read_system_cache`` /
``load_system_cache``; CausalLM's save_kvcache / load_kvcache): positions [0, to) of every self
cache's K then V, in graph order, as FP16 rows (B, to, n_kv * d), NNTrainer's layout with no
header in the file, so NNTrainer reads it; beside it ``<path>.header.json`` records its size,
sha256, the token ids and the model's identity, and a file is used only when all of them match.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import orjson

from causallm.errors import CausalLMError
from causallm.io.files import atomic_write, write_json_atomic

SELF, CROSS = "self", "cross"

CACHE_DTYPES = {"FP32": "float32", "FP16": "uint16"}
"""What a self cache holds (mha_core ``cache_dtype``, nntr_config ``kv_cache_dtype``,
``--kv-dtype``) -> its numpy dtype: float32, or IEEE half bits."""


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


SYSTEM_CACHE_FORMAT = "causallm system-prompt KV cache 1"
"""The header's ``format``."""


def save_system_cache(path: str, caches: list[KVCache], to: int,
                      token_ids: list[int] | None = None, identity: dict | None = None) -> None:
    """Write positions [0, to) of ``caches`` (self caches, graph order) to ``path``, atomically
    (module docstring); with ``token_ids`` also the header (atomic too), holding ``identity``
    (what else the values depend on: ``system_cache_identity``)."""
    digest, size = hashlib.sha256(), 0

    def write(f):
        nonlocal size
        for cache in caches:
            for rows in cache.rows(to):
                blob = (rows.view(np.float16) if rows.dtype == np.uint16
                        else rows.astype(np.float16)).tobytes()
                digest.update(blob)
                size += len(blob)
                f.write(blob)
    atomic_write(path, write)
    if token_ids is not None:
        write_json_atomic(f"{path}.header.json", {
            "format": SYSTEM_CACHE_FORMAT, "bytes": size, "sha256": digest.hexdigest(),
            "token_ids": [int(t) for t in token_ids], "model": identity})


def system_cache_identity(owner: str, config: dict, weight_path: str | None,
                          weight_formats: list[str | None], caches: list[KVCache]) -> dict:
    """The header's ``model``: what a model's cached keys and values depend on besides the
    tokens. The class ``owner``, a sha256 of ``config``'s values (JSON, sorted keys), the weight
    files ``weight_path`` names (a .bin, a .gguf, or a folder's safetensors files and index:
    name, size, mtime), the formats the packable weights are held in (``weight_formats``, None
    for the file's own: "as stored"), and the ``caches``' dtype and (batch, kv heads,
    head_dim)."""
    files = []
    if weight_path:
        if os.path.isdir(weight_path):
            folder = weight_path
            names = sorted(f for f in os.listdir(folder)
                           if f.endswith((".safetensors", ".safetensors.index.json")))
        else:
            folder, name = os.path.split(weight_path)
            names = [name]
        for name in names:
            st = os.stat(os.path.join(folder, name))
            files.append({"file": name, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return {
        "class": owner,
        "config_sha256": hashlib.sha256(orjson.dumps(
            config, option=orjson.OPT_SORT_KEYS, default=str)).hexdigest(),
        "weights": files,
        "weight_formats": sorted({fmt or "as stored" for fmt in weight_formats}),
        "cache_dtype": sorted({"FP16" if c.key.dtype == np.uint16 else "FP32" for c in caches}),
        "cache_shapes": [[c.key.shape[0], c.key.shape[1], c.key.shape[3]] for c in caches]}


def read_system_cache(path: str, token_ids: list[int],
                      identity: Callable[[], dict]) -> tuple[bytes | None, str]:
    """The bytes of the cache file at ``path`` when its header vouches for them: its format,
    these ``token_ids``, the model's ``identity()``, and the file's size and sha256. Else None
    and why not ("" when there is no file)."""
    if not os.path.exists(path):
        return None, ""
    header_path = f"{path}.header.json"
    try:
        with open(header_path, "rb") as f:
            header = orjson.loads(f.read())
    except FileNotFoundError:
        return None, f"no header {header_path}"
    except (OSError, ValueError) as e:
        return None, f"unreadable header {header_path} ({type(e).__name__})"
    if not isinstance(header, dict) or header.get("format") != SYSTEM_CACHE_FORMAT:
        return None, f"unreadable header {header_path} (not a {SYSTEM_CACHE_FORMAT})"
    if header.get("token_ids") != list(token_ids):
        return None, "the system prompt changed"
    expected, made_for = identity(), header.get("model")
    if made_for != expected:
        differ = [k for k in expected
                  if not isinstance(made_for, dict) or made_for.get(k) != expected[k]]
        return None, f"made for another model ({', '.join(differ or ['identity'])} differ)"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return None, f"unreadable ({e.strerror or e})"
    if len(data) != header.get("bytes") or \
            hashlib.sha256(data).hexdigest() != header.get("sha256"):
        return None, "its contents do not match its header's size and sha256"
    return data, ""


def load_system_cache(path: str, caches: list[KVCache], to: int, data: bytes,
                      rows: int) -> None:
    """Put ``data`` (the bytes of the file at ``path`` that ``read_system_cache`` vouched for)
    into positions [0, to) of ``caches``, which hold ``rows`` positions."""
    expected = sum(2 * c.key[:, :, :to].size for c in caches) * 2
    if to > rows or len(data) != expected:
        raise CausalLMError(f"{path}: expected {expected} bytes for a {to}-token system "
                            f"prompt cache in {rows} rows, found {len(data)}")
    data = np.frombuffer(data, dtype=np.float16)
    if not np.isfinite(data).all():
        raise CausalLMError(f"{path}: the system prompt cache holds non-finite values")
    offset = 0
    for cache in caches:
        B, n_kv, _, d = cache.key.shape
        n = B * to * n_kv * d
        k, v = (data[o:o + n].reshape(B, to, n_kv * d) for o in (offset, offset + n))
        if cache.key.dtype == np.uint16:
            k, v = k.view(np.uint16), v.view(np.uint16)
        cache.setRows(to, k, v)
        offset += 2 * n
