"""Writing files a user owns: never half-written.

``atomic_write(path, write)`` calls ``write(f)`` on a fresh temporary file beside ``path``,
flushes it to disk and renames it over ``path``; on any failure the temporary file is removed
and ``path`` is left as it was. ``write_json_atomic`` writes indented JSON that way.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import orjson


def atomic_write(path, write: Callable) -> None:
    """Call write(f) on a fresh temporary file next to ``path``, then rename it over ``path``."""
    path = os.fspath(path)
    folder, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
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


def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as indented JSON (and a final newline) to ``path``, atomically."""
    blob = orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n"
    atomic_write(path, lambda f: f.write(blob))
