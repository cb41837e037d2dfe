"""Writing files a user owns: never half-written.

``atomic_write(path, write)`` calls ``write(f)`` on a fresh temporary file beside ``path``,
flushes it to disk and renames it over ``path``; on any failure the temporary file is removed
and ``path`` is left as it was. ``write_json_atomic`` writes indented JSON that way.

``not_found(path, what)`` is the error for a file that is not there (a symbolic link to nothing
said as such). ``map_file(path)`` maps a weight file read-only; a file that cannot be opened (missing, a
folder, no permission) is a one-line CausalLMError naming it, as ``cannot_read`` words it.

``release_pages(array)`` gives back the memory a memory-mapped weight file's pages take once a
weight read from them has been converted and only the conversion is kept.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any, Callable

import numpy as np
import orjson

from causallm.errors import CausalLMError


def atomic_write(path, write: Callable) -> None:
    """Call write(f) on a fresh temporary file next to ``path``, then rename it over ``path``.
    An OSError about the temporary file (a read-only folder, ``path`` a folder) is raised
    about ``path``, the name the caller knows."""
    path = os.fspath(path)
    folder, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # mode honours the umask
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
    except OSError as e:
        if e.filename != tmp:
            raise
        raise OSError(e.errno, e.strerror, path) from None


def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as indented JSON (and a final newline) to ``path``, atomically."""
    blob = orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n"
    atomic_write(path, lambda f: f.write(blob))


def not_found(path, what: str = "file") -> CausalLMError:
    """The one-line error for a ``what`` ("file", "tokenizer file", ...) that is not there:
    ``PATH: file not found``, or, where PATH is a symbolic link to nothing, what it is."""
    if os.path.lexists(path):
        return CausalLMError(f"{path}: {what} not found (a symbolic link to nothing: its target "
                             f"is missing, or the links loop)")
    return CausalLMError(f"{path}: {what} not found")


def cannot_read(path, e: OSError) -> CausalLMError:
    """The one-line error for a file the loader cannot open or read: ``PATH: cannot read
    (Permission denied)``."""
    return CausalLMError(f"{os.fspath(path)}: cannot read ({e.strerror or type(e).__name__})")


def map_file(path) -> np.memmap | None:
    """The whole file at ``path`` as a read-only ``np.memmap`` of bytes (None when it is
    empty, which numpy cannot map); ``cannot_read`` when it cannot be opened."""
    try:
        return np.memmap(path, dtype=np.uint8, mode="r") if os.path.getsize(path) else None
    except OSError as e:
        raise cannot_read(path, e) from None


def _libc_madvise():
    if not hasattr(mmap, "MADV_DONTNEED"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


_madvise = _libc_madvise()
_byte_bounds = getattr(np.lib, "array_utils", np).byte_bounds  # numpy 2 moved it


def is_file_view(a) -> bool:
    """Whether array ``a`` is a view of a read-only file mapping (an ``np.memmap`` opened
    "r"): its bytes can be read again from the file at any time."""
    base = a
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    return base is not None and base.mode == "r"


def release_pages(*arrays) -> None:
    """Drop from this process's resident memory the pages under each array that a read-only
    file mapping (``is_file_view``) holds, e.g. a BF16 weight once converted to Q4_0.
    The file's pages stay in the OS page cache and a later read maps them again, so the array
    stays valid; an array of other memory is left alone. Whole pages inside the array's bytes
    only (a neighbour sharing an edge page keeps it)."""
    if _madvise is None:
        return
    for a in arrays:
        if not isinstance(a, np.ndarray) or a.size == 0 or not is_file_view(a):
            continue
        lo, hi = _byte_bounds(a)
        page = mmap.PAGESIZE
        start, end = -(-lo // page) * page, hi // page * page
        if end > start:
            _madvise(start, end - start, mmap.MADV_DONTNEED)
