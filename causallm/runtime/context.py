"""The context: the positions one sequence holds, the prompt and the new tokens together.

Its length is the C++'s ``MAX_SEQ_LEN``, the rows of every self-attention KV cache and RoPE
table. A model makes one ``Context`` from its numbers (``Transformer.setupContext``) and sets
``MAX_SEQ_LEN`` from it; the context then decides, before anything is allocated:

    length       nntr_config ``max_seq_len`` (``-c`` / ``ctx_size`` replace it), else the
                 model's own context (config.json's ``max_position_embeddings`` or what the
                 family reads) at most CONTEXT_CAP; never past a learned position table, never
                 past mha_core's UINT_MAX; never sized by the new tokens
    new tokens   ``fitNewTokens``: more than the length is an error when the caller asked for
                 them (``-n``, ``num_to_generate=``), else cut to the length
    memory       ``checkMemory``: sequences x length x bytes a position of the KV caches, plus
                 the RoPE tables (cos, sin and the float64 values they are rounded from: about
                 16 x head_dim bytes a position), at most the memory available

``source()`` says where the length came from, for every message that names it.
"""

from __future__ import annotations

import os

from causallm.errors import CausalLMError
from causallm.io.config import JsonConfig
from causallm.runtime.properties import UINT_MAX

CONTEXT_CAP = 4096
"""The longest context a model gets by default (llama.cpp's default n_ctx): a model trained
for more positions gets this many unless ``-c`` / ``ctx_size`` / nntr_config ``max_seq_len``
ask for more (SmolLM2-135M's FP16 KV caches take 23 KiB a position, 90 MiB for 4096;
Qwen3-0.6B's 112 KiB, 448 MiB)."""


def available_memory() -> int | None:
    """Bytes a new allocation may take: /proc/meminfo's MemAvailable, or less when a limit on
    the address space (``ulimit -v``, RLIMIT_AS) leaves less room; None where neither is
    known."""
    room = None
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        room = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            room = max(0, limit - used) if room is None else min(room, max(0, limit - used))
    except (ImportError, OSError, ValueError):
        pass
    return room


def _gb(n: int) -> str:
    """Bytes as GiB (or MiB below one GiB), for messages."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def cache_rows(batch: int, beams: int = 1, slots: int = 0) -> int:
    """Sequences every self-attention KV cache holds: its ``slots``, else a row per prompt of
    the batch and beam."""
    return slots or batch * beams


class Context:
    """The context of one model (module docstring). ``own`` is the model's own context and
    ``own_source`` what says so; ``limit`` the positions past which the model has none (a
    learned position table's rows, in ``config_path``), or None; ``default`` replaces the
    length nntr_config's ``max_seq_len`` does not give (a model that sizes it otherwise)."""

    def __init__(self, nntr_cfg: JsonConfig, own: int, own_source: str,
                 limit: int | None = None, config_path: str = "",
                 default: int | None = None) -> None:
        self.nntr_cfg = nntr_cfg
        self.own, self.own_source = own, own_source
        self.limit, self.config_path = limit, config_path
        if default is None:
            default = min(own, CONTEXT_CAP, limit or UINT_MAX)
        self.length = self.read(default)

    def read(self, default: int) -> int:
        """nntr_config ``max_seq_len`` (the C++'s MAX_SEQ_LEN), at most ``limit`` and UINT_MAX
        (mha_core's max_timestep); ``default`` without it."""
        nntr_cfg, limit = self.nntr_cfg, self.limit
        if not nntr_cfg.contains("max_seq_len"):
            return default
        context = nntr_cfg.get_int("max_seq_len", minimum=1)
        if limit is not None and context > limit:
            raise nntr_cfg.error("max_seq_len", f"at most {limit}: the model has {limit} "
                                 f"learned positions ({self.config_path})")
        if context > UINT_MAX:
            raise nntr_cfg.error("max_seq_len", f"at most {UINT_MAX}")
        return context

    def source(self) -> str:
        """Where the length comes from, for messages: the flag or keyword, nntr_config, or the
        model's own context (capped)."""
        nntr_cfg = self.nntr_cfg
        if "max_seq_len" in nntr_cfg.flags:
            return nntr_cfg.flags["max_seq_len"]
        if nntr_cfg.contains("max_seq_len"):
            return f"max_seq_len in {nntr_cfg.path}"
        capped = f", capped at {self.length}" if self.own > self.length else ""
        return f"the model's {self.own}, {self.own_source}{capped}"

    def cacheSize(self) -> str:
        """What sets the KV caches' length, for messages: the context and where it was set."""
        return f"the context, from {self.source()}"

    def fitNewTokens(self, n: int) -> int:
        """``n`` new tokens (NUM_TO_GENERATE) within the context: more than it holds is an
        error when the caller asked for them (``-n``, ``num_to_generate=``), and cut to the
        length when they are the configs' default (nntr_config.json, generation_config.json): a
        run stops at the context's end either way (finish reason ``length``)."""
        context, flags = self.length, self.nntr_cfg.flags
        if n <= context:
            return n
        if "num_to_generate" in flags:
            raise CausalLMError(
                f"{flags['num_to_generate']} {n} is more than the context: {context} positions "
                f"({self.source()}), shared by the prompt and the new tokens; ask for fewer new "
                f"tokens or a longer context (-c, ctx_size)")
        return context

    def checkMemory(self, bytes_per_position: int, head_dim: int, batch: int, beams: int = 1,
                    slots: int = 0, available: int | None = None) -> None:
        """Refuse, before anything is allocated, a context whose KV caches (``cache_rows``
        sequences x length positions x ``bytes_per_position``, every layer's key and value) and
        RoPE tables need more than the memory available (``available`` bytes;
        available_memory() when None; no check where that is unknown). The weights and step
        buffers are not counted: the caches are what a user's -c, --parallel, beams or batch
        multiply."""
        if available is None:
            available = available_memory()
            if available is None:
                return
        rows, context = cache_rows(batch, beams, slots), self.length
        need = rows * context * bytes_per_position + context * head_dim * 16
        if need <= available:
            return
        sources = [self.source()]
        if slots > 1:
            sources.append(f"{slots} slots (--parallel, slots)")
        if beams > 1:
            sources.append(f"{beams} beams (--num-beams)")
        if batch > 1:
            sources.append(f"batch_size {batch}")
        raise CausalLMError(
            f"not enough memory for a context of {context} positions ({'; '.join(sources)}): "
            f"the KV caches of {rows} sequence(s) x {context} positions x {bytes_per_position} "
            f"bytes and the RoPE tables need {_gb(need)}, {_gb(available)} is available; ask for "
            f"a shorter context (-c, ctx_size) or fewer sequences")

    def outOfMemory(self, error: MemoryError, init_seq_len: int, batch: int, beams: int = 1,
                    slots: int = 0) -> CausalLMError:
        """The error of an allocation that failed anyway (the buffers, or memory that went
        elsewhere after checkMemory), naming what sized it."""
        return CausalLMError(
            f"not enough memory for the KV caches and buffers of {cache_rows(batch, beams, slots)} "
            f"sequence(s), a context of {self.length} positions ({self.source()}) and a step of "
            f"init_seq_len {init_seq_len} rows ({error})")
