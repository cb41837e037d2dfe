"""``run_cli``: the CLI (main.py) as the tests run it, in this process unless the process itself
is under test.

In this process, ``main.main(argv)`` runs with its own stdin, stdout and stderr, as
``python main.py ARGS`` would get them in a child: stdin is /dev/null, or a pipe fed with
``input``; stdout and stderr are UTF-8 text streams over bytes that are handed back as
``subprocess.run(..., capture_output=True, text=text)`` hands back a child's (text: decoded,
``\\r\\n`` and ``\\r`` read as ``\\n``). The exit status is ``main``'s return value, the code of
a ``SystemExit`` (argparse's errors, --help), or 1 with the traceback on stderr for an
exception that escapes (``--debug``), as the interpreter would give. The kernels' thread count
(``-t``) is set back afterwards. What stays a child's own (``process=True``): signals, a closed
stdout, a terminal, variables read at import (``NUMBA_*``, thread counts, ``PYTHONPATH``),
limits set on the process, the Factory a plugin registers into, the server.
"""

import io
import os
import subprocess
import sys
import threading
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = os.path.join(ROOT, "main.py")


def run_cli(*args, input=None, env=None, cwd=ROOT, text=True, process=False,
            timeout=300) -> subprocess.CompletedProcess:
    """``python main.py *args`` -> CompletedProcess(args, returncode, stdout, stderr).

    ``args`` are str() of each (bytes stay bytes: in this process they are decoded as the
    interpreter decodes argv, os.fsdecode). ``input`` (str or bytes) is stdin through a pipe,
    else stdin is /dev/null (neither a terminal nor a pipe, as under cron). ``cwd``: the
    working directory of the run, the repository's root by default (None: this process's, as
    a test has set it). ``process=True`` runs a child
    ``python main.py`` (``env``, when given, is its whole environment; ``timeout`` bounds it)."""
    argv = [a if isinstance(a, (str, bytes)) else str(a) for a in args]
    if process:
        data = input.encode("utf-8") if isinstance(input, str) else input
        p = subprocess.run([sys.executable, MAIN, *argv], cwd=cwd, env=env, input=data,
                           stdin=subprocess.DEVNULL if data is None else None,
                           capture_output=True, timeout=timeout)
        if text:
            p.stdout, p.stderr = _text(p.stdout), _text(p.stderr)
        return p
    if env is not None:
        raise ValueError("env is a child's environment: run_cli(..., process=True)")
    out, err = io.BytesIO(), io.BytesIO()
    code = _in_process([os.fsdecode(a) for a in argv], input, cwd, out, err)
    stdout, stderr = out.getvalue(), err.getvalue()
    if text:
        stdout, stderr = _text(stdout), _text(stderr)
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


def _text(data: bytes) -> str:
    """Bytes a child wrote, as ``subprocess.run(text=True, encoding="utf-8")`` reads them."""
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def _in_process(argv, input, cwd, out, err) -> int:
    """main.main(argv) with stdin from ``input`` (or /dev/null) and stdout, stderr written to
    the byte buffers ``out``, ``err``: its exit status."""
    from causallm import main
    from causallm.kernels import threads

    count, here = threads.threads(), os.getcwd()
    saved = sys.stdin, sys.stdout, sys.stderr
    stdin, feeder = _stdin(input)
    sys.stdin = stdin
    sys.stdout = io.TextIOWrapper(out, encoding="utf-8")
    sys.stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)
    try:
        if cwd is not None and cwd != here:
            os.chdir(cwd)
        try:
            code = main.main(argv)
        except SystemExit as e:
            code = e.code
            if code is not None and not isinstance(code, int):
                sys.stderr.write(f"{code}\n")
                code = 1
        except Exception:  # --debug: what the interpreter prints of an uncaught exception
            traceback.print_exc()
            code = 1
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
            stream.detach()  # the buffers stay open for the caller
        return 0 if code is None else code
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
        stdin.close()
        if feeder is not None:
            feeder.join()
        os.chdir(here)
        if threads.threads() != count:
            threads.set_threads(count)


def _stdin(input):
    """(stdin, the thread feeding it or None): /dev/null, or a pipe a thread writes ``input``
    into and then closes (so a read sees the end of input)."""
    if input is None:
        return open(os.devnull, encoding="utf-8"), None
    data = input.encode("utf-8") if isinstance(input, str) else input
    read_end, write_end = os.pipe()

    def feed():
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(write_end, view):]
        except BrokenPipeError:  # the run ended without reading it all
            pass
        finally:
            os.close(write_end)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    return io.TextIOWrapper(open(read_end, "rb"), encoding="utf-8"), feeder
