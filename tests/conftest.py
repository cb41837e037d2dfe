"""pytest setup: make the repository root importable (causallm, layers, models) when pytest
is run as ``pytest`` rather than ``python -m pytest`` from the root. Nothing else: numba's
on-disk cache lives in causallm/kernels/__pycache__ (or NUMBA_CACHE_DIR if set)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
