"""Progress bars on stderr for long work, drawn only where someone is watching.

``progress(total, desc, unit, size)`` is a tqdm bar on stderr when stderr is a terminal and the
work is large: ``size`` (bytes of the weight files a load reads or a .bin it writes) at least
``progress_min_bytes()``, 1 GiB unless the environment variable
``CAUSALLM_PROGRESS_MIN_BYTES`` says otherwise (0: every load). Otherwise (stderr a pipe or a
file, as in tests and logs, or a small load) it is a bar that draws nothing.
A bar is erased when it closes, so the output that follows (the metrics block) stays as it was.

The numba compile notice (causallm/kernels/__init__.py) counts compiled kernels with such a bar
(no size rule: a first compile takes seconds whatever the model).
"""

from __future__ import annotations

import os
import sys

PROGRESS_MIN_BYTES = 1 << 30
"""A load reading fewer bytes of weight files draws no bar: it takes well under a second."""


def progress_min_bytes() -> int:
    """``CAUSALLM_PROGRESS_MIN_BYTES`` (an integer), else ``PROGRESS_MIN_BYTES``."""
    value = os.environ.get("CAUSALLM_PROGRESS_MIN_BYTES", "")
    return int(value) if value.strip().isdigit() else PROGRESS_MIN_BYTES


def stderr_is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


class _Hidden:
    """What ``progress`` gives where nothing is drawn: a bar's ``update``, ``set_postfix_str``
    and ``close``, and a context manager, that do nothing (tqdm, 0.05-0.15 s to import, loads only for a drawn
    bar: a run on the embedded model draws none)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "_Hidden":
        return self

    def __exit__(self, *exc) -> None:
        pass


def progress(total: int | None, desc: str, unit: str, size: int | None = None):
    """A bar of ``total`` steps of ``unit`` (None: a counter, then ``set_postfix_str`` text
    follows it after a comma), drawn on stderr when it is a
    terminal and ``size`` (None: no size rule) >= progress_min_bytes(); else one that draws
    nothing (module docstring)."""
    if not (stderr_is_terminal() and (size is None or size >= progress_min_bytes())):
        return _Hidden()
    from tqdm import tqdm

    counter = f"{{desc}}: {{n_fmt}} {unit} [{{elapsed}}]{{postfix}}" if total is None else None
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                dynamic_ncols=True, bar_format=counter)


def files_size(paths) -> int:
    """Bytes of the distinct files ``paths`` names."""
    return sum(os.path.getsize(p) for p in set(paths) if os.path.isfile(p))
