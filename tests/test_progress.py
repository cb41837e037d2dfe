"""Progress on stderr (causallm/progress.py): drawn on a terminal, never into a pipe.

The CLI runs in a subprocess whose stderr is a pseudo-terminal (100 columns) or a pipe. A
weight load draws its bar from ``CAUSALLM_PROGRESS_MIN_BYTES`` bytes (0 here, so the small
fixture counts as large); a first numba compile (an empty ``NUMBA_CACHE_DIR``) counts its
kernels on the terminal.
"""

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import numpy as np
import pytest

from causallm.io import nntr_bin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GQA3 = os.path.join(ROOT, "tests", "fixtures", "llama-gqa3")


def run_on_terminal(args, env):
    """``python main.py *args`` with stderr on a pseudo-terminal -> (status, stdout, stderr)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    with subprocess.Popen([sys.executable, "main.py", *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=slave) as p:
        os.close(slave)
        err = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal's last writer is gone
                break
            if not chunk:
                break
            err.append(chunk)
        os.close(master)
        out = p.stdout.read()
        p.wait(timeout=300)
    return p.returncode, out.decode(), b"".join(err).decode()


@pytest.mark.slow
def test_a_terminal_sees_the_load_and_the_first_compile(tmp_path):
    env = {**os.environ, "CAUSALLM_PROGRESS_MIN_BYTES": "0",
           "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    rc, out, err = run_on_terminal([GQA3, "hi", "-n", "2"], env)
    assert rc == 0, err
    # the load: 30 tensors (3 blocks of 9, the embedding, the final norm, the untied head)
    assert re.search(r"\rloading weights \(0\.0 GB\):\s+0%\|\s*\| 0/30 ", err), err
    # the compile: the one line, then the counter (beside the load's bar while the load's
    # checks compile), erased before the summary line
    assert err.count("[numba] compiling kernels") == 1
    after = err[err.index("[numba] compiling kernels"):]
    counts = [int(n) for n in re.findall(r"\r\[numba\] compiling: (\d+) kernel\(s\) \[", after)]
    assert len(counts) >= 2 and counts == sorted(counts), after
    summary = re.search(r"\r +(?:\x1b\[A|\r)\[numba\] compiled (\d+) kernel\(s\) in \d+\.\d s\r\n",
                        after)
    assert summary and int(summary.group(1)) >= counts[-1], after
    assert "prefill:" in err


@pytest.mark.slow
def test_a_small_load_on_a_terminal_draws_nothing(tmp_path):
    rc, _, err = run_on_terminal([GQA3, "hi", "-n", "2"], dict(os.environ))
    assert rc == 0, err
    assert "loading weights" not in err and "\r" not in err.replace("\r\n", "")


@pytest.mark.slow
def test_a_pipe_gets_no_bars():
    env = {**os.environ, "CAUSALLM_PROGRESS_MIN_BYTES": "0"}
    p = subprocess.run([sys.executable, "main.py", GQA3, "hi", "-n", "2", "--dtype", "Q8_0"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "loading weights" not in p.stderr and "\r" not in p.stderr


def test_writing_a_bin_draws_on_a_terminal_only(tmp_path, monkeypatch, capsys):
    """nntr_bin.write_bin's bar, in process: stderr a terminal or not."""
    monkeypatch.setenv("CAUSALLM_PROGRESS_MIN_BYTES", "0")
    arrays = [np.ones((32, 8), np.float32), np.ones((4,), np.float32)]
    nntr_bin.write_bin(tmp_path / "a.bin", arrays, ["FP32", "FP16"])
    assert capsys.readouterr().err == ""

    class Terminal:
        def __init__(self):
            self.text = ""

        def write(self, s):
            self.text += s

        def flush(self):
            pass

        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    nntr_bin.write_bin(tmp_path / "b.bin", arrays, ["FP32", "FP16"])
    assert re.match(r"\rwriting b.bin \(0.0 GB\): +0%\|.*\| 0/2 \[", terminal.text), terminal.text
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()
