"""Hugging Face weight tables: one declarative table per family, our weight names <-> HF names.

In the manner of gguf-py's ``tensor_mapping.py``, a family lists its tensors once::

    LLAMA_WEIGHTS = WeightTable([
        Tensor("embedding0:Embedding", "model.embed_tokens.weight", aliases=("lm_head.weight",)),
        Tensor("layer{i}_wq:weight", "model.layers.{i}.self_attn.q_proj.weight", transpose=True),
        ...
    ], ignore=["model.layers.{i}.self_attn.rotary_emb.inv_freq"])

- ``ours`` is a weight of the compiled graph (``scope:name``) and ``hf`` a checkpoint tensor,
  both patterns whose ``{i}``, ``{e}`` (digits) and other ``{word}`` fields match each other. The
  table is expanded against the graph's weights (``weightMap``): a row that matches no weight
  (a bias the model was built without, an untied head of a tied model) simply does not appear,
  and a weight no row matches is an error. Nothing spells a weight name twice.
- ``transpose``: PyTorch Linear stores [out, in], NNTrainer [in, out]; read as a view.
- ``offset``: added on the way in (Gemma's norms store w for 1 + w; NNTrainer stores 1 + w).
- ``part``: one HF tensor feeding several weights. A numpy basic index applied to the tensor:
  ints, the names of pattern fields (``"e"``: expert e's block), slices, ``...``, and
  ``Split(k, n)`` (the k-th of n equal blocks of that axis: GPT-2's fused ``c_attn`` is
  ``(..., Split(0, 3))`` for q) or ``Every(k, n)`` (every n-th element from k: gpt-oss's
  interleaved gate/up columns).
- ``aliases``: other HF names holding the same tensor (tied copies: T5's ``shared`` is also
  ``encoder.embed_tokens``, ``decoder.embed_tokens`` and a tied ``lm_head``). A checkpoint may
  hold any of them; the primary is read when present, else an alias. A name another row maps
  as its own tensor (an untied head) is that row's, not an alias.
- ``ignore``: buffers that are not weights (patterns; ``*`` matches anything).
- ``prefixes``: prefixes a checkpoint's names may carry or lack (``transformer.`` for GPT-2's
  Hub files, ``model.`` / ``bert.`` for sentence-transformers folders).

Loading (``load``), the .bin -> HF export (``export``, tools/bin_to_hf.py) and the coverage
check (every weight covered, every checkpoint tensor used) all read the same table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple

import numpy as np

from causallm.errors import CausalLMError
from causallm.kernels.packed import PackedMatrix
from causallm.progress import files_size, progress


@dataclass(frozen=True)
class Split:
    """Index item: the k-th of n equal contiguous blocks of an axis."""
    k: int
    n: int


@dataclass(frozen=True)
class Every:
    """Index item: every n-th element of an axis, from k (``k::n``)."""
    k: int
    n: int


@dataclass(frozen=True)
class Tensor:
    """A row of a weight table: see the module docstring."""
    ours: str
    hf: str
    transpose: bool = False
    offset: float = 0.0
    part: tuple = ()
    aliases: tuple[str, ...] = ()


class HFWeight(NamedTuple):
    """A row expanded for one weight: its target ``scope:name``, and how the checkpoint tensor
    becomes it (``transpose``, ``offset``, ``index``: the part, pattern fields filled in)."""

    target: str
    transpose: bool = False
    offset: float = 0.0
    index: tuple | None = None

    def resolve(self, shape: tuple) -> tuple | None:
        """The index as a plain numpy index for a tensor of ``shape`` (Split/Every and ``...``
        made into slices)."""
        if self.index is None:
            return None
        items, out = list(self.index), []
        if Ellipsis in items:
            k = items.index(Ellipsis)
            items[k:k + 1] = [slice(None)] * (len(shape) - len(items) + 1)
        for axis, item in enumerate(items):
            if isinstance(item, Split):
                size, rest = divmod(shape[axis], item.n)
                if rest:
                    raise CausalLMError(f"axis {axis} of length {shape[axis]} does not split "
                                        f"into {item.n} equal parts")
                item = slice(item.k * size, (item.k + 1) * size)
            elif isinstance(item, Every):
                item = slice(item.k, None, item.n)
            out.append(item)
        return tuple(out)

    def to_weight(self, array):
        """The checkpoint tensor as the layer weight (a view unless an offset is added)."""
        index = self.resolve(array.shape)
        if index is not None:
            array = array[index]
        array = array.T if self.transpose else array
        return array + np.float32(self.offset) if self.offset else array

    def from_weight(self, array):
        """The layer weight back as (its part of) the checkpoint tensor, C-contiguous float32."""
        array = array - np.float32(self.offset) if self.offset else array
        return np.ascontiguousarray(array.T if self.transpose else array, dtype=np.float32)


_FIELD = re.compile(r"\{(\w+)\}")
_DIGIT_FIELDS = ("i", "e", "j")


def _regex(pattern: str) -> re.Pattern:
    """A row pattern as a regex: ``{i}``/``{e}``/``{j}`` digits, another ``{word}`` letters,
    ``*`` anything (ignore patterns), the rest literal."""
    out, pos = [], 0
    for m in _FIELD.finditer(pattern):
        out.append(re.escape(pattern[pos:m.start()]).replace(r"\*", ".*"))
        name = m.group(1)
        out.append(f"(?P<{name}>\\d+)" if name in _DIGIT_FIELDS else f"(?P<{name}>[a-z]+)")
        pos = m.end()
    out.append(re.escape(pattern[pos:]).replace(r"\*", ".*"))
    return re.compile("".join(out) + r"\Z")


class WeightTable:
    """A family's HF weight table (module docstring). Immutable; ``extend`` makes a new one."""

    def __init__(self, tensors: Iterable[Tensor], ignore: Iterable[str] = (),
                 prefixes: Iterable[str] = ()) -> None:
        self.tensors = tuple(tensors)
        self.ignore = tuple(ignore)
        self.prefixes = tuple(prefixes)
        self._rows = [(_regex(t.ours), t) for t in self.tensors]
        self._ignored = [_regex(p) for p in self.ignore]

    def extend(self, tensors: Iterable[Tensor] = (), ignore: Iterable[str] = (),
               prefixes: Iterable[str] = ()) -> "WeightTable":
        """This table plus more rows (checked first, so they take precedence), ignored buffers
        and prefixes."""
        return WeightTable((*tensors, *self.tensors), (*self.ignore, *ignore),
                           (*self.prefixes, *prefixes))

    # -- expansion --------------------------------------------------------------------------
    def weightMap(self, weight_names: Iterable[str], owner: str = "model"
                  ) -> dict[str, tuple[HFWeight, ...]]:
        """{HF name: the HFWeights it feeds}, for the graph's ``weight_names`` in their order;
        a weight that no row maps is an error naming it."""
        out: dict[str, list[HFWeight]] = {}
        uncovered = []
        for name in weight_names:
            found = self._row_for(name)
            if found is None:
                uncovered.append(name)
                continue
            row, fields = found
            index = None
            if row.part:
                index = tuple(int(fields[item]) if isinstance(item, str) else item
                              for item in row.part)
            out.setdefault(row.hf.format(**fields), []).append(
                HFWeight(name, row.transpose, row.offset, index))
        if uncovered:
            raise CausalLMError(f"{owner}'s weight table maps no checkpoint tensor to: "
                                f"{_some(uncovered)}")
        return {hf: tuple(parts) for hf, parts in out.items()}

    def _row_for(self, name: str):
        for regex, row in self._rows:
            m = regex.match(name)
            if m:
                return row, m.groupdict()
        return None

    def aliasMap(self, weight_map: dict) -> dict[str, str]:
        """{alias HF name: its primary} for the rows ``weight_map`` uses (names that are
        another row's own tensor excluded)."""
        aliases = {}
        for hf, parts in weight_map.items():
            found = self._row_for(parts[0].target)
            if found is None:
                continue
            row, fields = found
            for alias in row.aliases:
                name = alias.format(**fields)
                if name not in weight_map:
                    aliases[name] = hf
        return aliases

    def isIgnored(self, name: str) -> bool:
        return any(r.match(name) for r in self._ignored)

    def _canonical(self, name: str, known) -> str:
        """``name`` as the table spells it: with or without one of the prefixes."""
        if name in known or self.isIgnored(name):
            return name
        for prefix in self.prefixes:
            variant = name[len(prefix):] if name.startswith(prefix) else prefix + name
            if variant in known or self.isIgnored(variant):
                return variant
        return name

    # -- loading ----------------------------------------------------------------------------
    def load(self, ckpt, weight_map: dict, set_weight: Callable, owner: str = "model",
             packable: dict | None = None) -> None:
        """Give every weight of ``weight_map`` its checkpoint tensor (``set_weight(target,
        array)``). A tensor read whole (no part, no offset) into weights that ``packable`` maps
        to how their packed rows lie (True: the logical matrix transposed, as a Linear's
        [out, in]; False: as it is, as an embedding table), the table reading it that way,
        comes as the checkpoint's ``raw`` gives it: a ``PackedMatrix`` when stored packed (BF16,
        F16, a GGUF's Q8_0 / Q4_0), kept so; any other as float32.
        A tensor feeding a weight of ``packable`` is read with ``zeros=True``: all zeros is an
        error (causallm/io/weight_check.py), as in a .bin.
        Every checkpoint tensor must be used (or ignored, or an alias) and every mapped tensor
        found; the error names the ones that are not. A large load shows a progress bar on a
        terminal (causallm/progress.py)."""
        aliases = self.aliasMap(weight_map)
        found: dict[str, str] = {}       # our HF name -> the checkpoint's name for it
        spare: dict[str, str] = {}       # primary -> a checkpoint alias of it
        unused = []
        for name in ckpt.keys():
            canonical = self._canonical(name, weight_map.keys() | aliases.keys())
            if canonical in weight_map:
                found[canonical] = name
            elif canonical in aliases:
                spare.setdefault(aliases[canonical], name)
            elif not self.isIgnored(canonical):
                unused.append(name)
        missing = []
        for hf in weight_map:
            if hf not in found:
                if hf in spare:
                    found[hf] = spare[hf]
                else:
                    missing.append(hf)
        problems = ([f"{len(unused)} checkpoint tensor(s) match no weight of {owner}: "
                     f"{_some(unused)}"] if unused else []) + \
            ([f"{len(missing)} tensor(s) missing from the checkpoint: {_some(missing)}"]
             if missing else [])
        if problems:
            raise CausalLMError(f"{getattr(ckpt, 'folder', 'checkpoint')}: {'; '.join(problems)}")
        file_of = getattr(ckpt, "file_of", None)  # a checkpoint not on disk: no size, no bar
        size = files_size(file_of(name) for name in found.values()) if file_of else 0
        with progress(len(weight_map), f"loading weights ({size / 1e9:.1f} GB)", "tensor",
                      size) as bar:
            for hf, parts in weight_map.items():
                self._loadTensor(ckpt, found[hf], parts, set_weight, packable or {})
                bar.update()

    @staticmethod
    def _loadTensor(ckpt, name: str, parts, set_weight: Callable, packable: dict) -> None:
        """Checkpoint tensor ``name`` into the weights ``parts`` says (``load``)."""
        whole = all(packable.get(p.target) is p.transpose and p.index is None
                    and not p.offset for p in parts)
        zeros = any(p.target in packable for p in parts)  # a matrix: never all zero
        array = ckpt.raw(name, zeros) if whole and hasattr(ckpt, "raw") else ckpt.get(name, zeros)
        for part in parts:
            try:
                value = (array.oriented(part.transpose)
                         if isinstance(array, PackedMatrix) else part.to_weight(array))
                set_weight(part.target, value)
            except (CausalLMError, IndexError) as e:
                raise CausalLMError(f"{ckpt.file_of(name)}: tensor '{name}' of shape "
                                    f"{tuple(array.shape)}"
                                    f"{' (read transposed)' * part.transpose}: {e}") from None

    # -- export -----------------------------------------------------------------------------
    @staticmethod
    def export(weight_map: dict, get_weight: Callable) -> dict[str, np.ndarray]:
        """{HF name: C-contiguous float32 tensor} from the model's weights (``get_weight(target)``),
        the inverse of ``load``: transposed weights go back to [out, in], parts are put back in
        place."""
        tensors = {}
        for hf, parts in weight_map.items():
            arrays = [p.from_weight(_float(get_weight(p.target))) for p in parts]
            if len(parts) == 1 and parts[0].index is None:
                tensors[hf] = arrays[0]
            else:
                tensors[hf] = _assemble(hf, parts, arrays)
        return tensors


def _assemble(hf: str, parts, arrays) -> np.ndarray:
    """The tensor whose parts ``parts`` (indexes) are ``arrays``: each axis as long as its
    parts reach, and every element written by exactly one part."""
    def extent(index, a):
        items, dims, k = list(index), [], 0
        if Ellipsis in items:
            at = items.index(Ellipsis)
            ints = sum(isinstance(i, int) for i in items)
            items[at:at + 1] = [slice(None)] * (a.ndim + ints - len(items) + 1)
        for item in items:
            if isinstance(item, int):
                dims.append(item + 1)
                continue
            size = a.shape[k]
            if isinstance(item, (Split, Every)):
                dims.append(size * item.n)
            elif isinstance(item, slice) and item.stop is not None:
                dims.append(item.stop)
            else:
                dims.append((item.start or 0) + size)
            k += 1
        return dims + list(a.shape[k:])

    shapes = [extent(p.index or (), a) for p, a in zip(parts, arrays)]
    full = np.zeros([max(d) for d in zip(*shapes)], dtype=np.float32)
    count = np.zeros(full.shape, dtype=np.int8)
    for p, a in zip(parts, arrays):
        index = p.resolve(full.shape) if p.index is not None else ...
        full[index] = a
        count[index] += 1
    if not (count == 1).all():
        raise CausalLMError(f"{hf}: the weights of its parts do not tile the tensor")
    return full


def _float(weight):
    """A weight as float32 (a packed one widened to its logical shape)."""
    return weight.toFloat() if isinstance(weight, PackedMatrix) else weight


def _some(names: list[str], n: int = 8) -> str:
    return ", ".join(names[:n]) + (f" ... ({len(names) - n} more)" if len(names) > n else "")
