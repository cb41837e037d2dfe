"""Many users at once: our OpenAI server beside llama-server, on the same GGUF file.

Run by hand (not a test):

    python bench/bench_serve.py [-t N] [--clients 1 4 8] [--requests 3] [--max-tokens 64]
                                [--turns 10] [--parallel 4] [--file smollm2|gemma3]
                                [--no-llama] [--json] [--from-json FILE] [--cache-dir DIR]

One server at a time, each on a free loopback port, each given the same file and ``-t``
threads: ours (``python main.py serve FILE --port P -t T``, plus ``--parallel N`` when its
``--help`` lists that option), then llama-server built from the same llama.cpp source as
bench_gguf.py's tools (``llama-server -m FILE -t T -np N -c 8192 --host 127.0.0.1 --port P``).
Each server gets one warm-up request, then:

1. load: for each count C of ``--clients``, C client threads start together and each sends
   ``--requests`` streamed requests back to back (temperature 0, ``max_tokens`` 64, the
   usage asked for in the last chunk). Every request's prompt is its own: a system message
   that starts with the request's number and a topic no other request has, so no request
   finds another's prefix cached. Per C: aggregate tokens/s (the completion tokens of all C x
   R requests over the wall time from the clients' start to the last one's end), the p95 of
   request latency (send to last byte) and of the time to first token (send to the first
   chunk carrying text), by nearest rank;
2. a conversation of ``--turns`` turns resent in full each turn (each turn appends the last
   answer and a new question): the prompt tokens the server evaluated over all turns against
   the conversation's final length (its last prompt and answer). llama-server says what it
   evaluated (``timings.prompt_n``); ours is read from ``usage.prompt_tokens_details.
   cached_tokens`` (prompt tokens minus those) when it gives that field, else every prompt
   token counts as evaluated.

Before the servers, our CLI's decode speed on the same file and threads: ``main.py FILE PROMPT
-n 64 --greedy --json -t T`` (its ``generation.tps``, the best of two runs). Targets: one
client's decode speed (a request's tokens after its first over the time after its first, the
median request: as the CLI's figure, the prefill left out) >= 0.9x that, and evaluated prompt
tokens <= 1.2x the conversation's final length. Completion tokens come from the servers' ``usage`` (else the text chunks counted).
A file with a chat template is served through ``/v1/chat/completions``; one without (the
Gemma 3 GGUF has none) through ``/v1/completions``, the turns written out in the family's
format here. Both servers are stopped (their process groups killed) however the run ends.
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from bench_gguf import CACHE_DIR, FILES, LLAMA_CPP_TARGETS, Skip, llama_cpp_tools, locate, log
from children import (SEED, ChildFailed, busy_cores, last_line, machine_load, output_options,
                      print_results, thread_env)

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
START_TIMEOUT = 900
"""Seconds a server may take to answer /health: a cold numba cache compiles for minutes."""
REQUEST_TIMEOUT = 600
CLI_RUNS = 2
TARGETS = """\
targets: one client's decode tok/s >= 0.9x our CLI's decode tok/s on the file; prompt tokens
evaluated over the conversation <= 1.2x its final length"""

SUBJECTS = ("the history of lighthouses", "how bees make honey", "the water cycle",
            "the first voyage around the world", "how a bicycle stays upright",
            "volcanoes and how they form", "the invention of printing", "life in a coral reef",
            "how bread rises", "the phases of the moon", "the Silk Road", "how trains brake",
            "migrating birds", "the making of glass", "glaciers", "the first telescopes",
            "how paper is recycled", "desert plants", "the rules of chess", "thunderstorms")
ANGLES = ("Write a long, detailed essay about {}.", "Explain {} to a curious child, at length.",
          "Tell a long story that teaches {}.")
CONVERSATION = (
    "I want to grow tomatoes on my balcony. Where do I start?",
    "What kind of pot and soil should I buy?",
    "How often should I water them?",
    "The leaves are turning yellow at the bottom. Why?",
    "Should I remove the small shoots between the stem and the branches?",
    "How do I keep aphids away without chemicals?",
    "When will the first fruits be ripe?",
    "Some fruits have cracks. What causes that?",
    "Can I save seeds from my tomatoes for next year?",
    "Thank you. Can you summarize the most important advice?",
    "What other vegetables grow well on a balcony?",
    "How do I prepare the pots for winter?",
)
RAW_TURNS = {"gemma3": ("<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n",
                        "<end_of_turn>\n")}
"""For a file without a chat template: a user turn with the model's turn opened after it, and
what ends a model turn (the family's format; a system message goes before the first user
message, as Gemma 3's template puts it)."""


def request_messages(n: int) -> list[dict]:
    """Request ``n``'s messages: its number first, then a subject and angle of its own."""
    subject = SUBJECTS[n % len(SUBJECTS)]
    angle = ANGLES[(n // len(SUBJECTS)) % len(ANGLES)]
    return [{"role": "system", "content": f"Request {n}. You are a helpful assistant who "
                                          f"answers at length."},
            {"role": "user", "content": angle.format(subject)}]


def raw_prompt(messages: list[dict], turns: tuple[str, str]) -> str:
    """The messages written out as ``turns`` says: system text before the first user
    message, each user message a turn, each assistant message its text and the turn's end."""
    user, end = turns
    out, system = [], ""
    for m in messages:
        if m["role"] == "system":
            system = m["content"] + "\n\n"
        elif m["role"] == "user":
            out.append(user.format(system + m["content"]))
            system = ""
        else:
            out.append(m["content"] + end)
    return "".join(out)


def has_chat_template(path: str) -> bool:
    from gguf import GGUFReader

    return GGUFReader(path).fields.get("tokenizer.chat_template") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def p95(values: list[float]) -> float | None:
    """The 95th percentile by nearest rank: the ceil(0.95 n)-th smallest value."""
    v = sorted(values)
    return v[max(0, math.ceil(0.95 * len(v)) - 1)] if v else None


# -- servers ----------------------------------------------------------------------------------

_RUNNING: list[subprocess.Popen] = []


def stop(proc: subprocess.Popen) -> None:
    """Stop ``proc``'s process group: SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
    if proc in _RUNNING:
        _RUNNING.remove(proc)


def stop_all() -> None:
    for proc in list(_RUNNING):
        stop(proc)


class Server:
    """A server process in its own process group, its output in ``log_path``; a context
    manager that waits for its /health and stops it when the block ends."""

    def __init__(self, name: str, cmd: list[str], port: int, threads: int, log_path: str,
                 cwd: str | None = None):
        self.name, self.cmd, self.log_path = name, cmd, log_path
        self.base = f"http://127.0.0.1:{port}"
        self.env, self.cwd = thread_env(threads), cwd
        self.proc = None

    def __enter__(self) -> "Server":
        import httpx

        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, env=self.env,
                                         stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        _RUNNING.append(self.proc)
        t0 = time.perf_counter()
        try:
            while True:
                if self.proc.poll() is not None:
                    raise ChildFailed(f"{self.name} exited ({self.proc.returncode}) before "
                                      f"answering: {self.last_log_line()}")
                if time.perf_counter() - t0 > START_TIMEOUT:
                    raise ChildFailed(f"{self.name} did not answer /health in "
                                      f"{START_TIMEOUT} s")
                try:
                    if httpx.get(self.base + "/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        except BaseException:
            stop(self.proc)
            raise
        self.start_s = time.perf_counter() - t0
        return self

    def __exit__(self, *exc) -> None:
        stop(self.proc)

    def last_log_line(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return last_line(f.read())


# -- clients ----------------------------------------------------------------------------------

def request_body(messages: list[dict], chat: bool, raw: tuple[str, str] | None,
                 max_tokens: int) -> tuple[str, dict]:
    body = {"model": "bench", "max_tokens": max_tokens, "temperature": 0, "seed": SEED,
            "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        return "/v1/chat/completions", {**body, "messages": messages}
    return "/v1/completions", {**body, "prompt": raw_prompt(messages, raw)}


def stream_request(http, base: str, path: str, body: dict) -> dict:
    """One streamed request: its latency, time to first text, text, and the usage and
    timings its last chunks carry."""
    chat = path.endswith("chat/completions")
    text, chunks, first, usage, timings = [], 0, None, None, None
    t0 = time.perf_counter()
    with http.stream("POST", base + path, json=body) as r:
        if r.status_code != 200:
            raise ChildFailed(f"{path}: HTTP {r.status_code}: "
                              f"{r.read().decode(errors='replace')[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            event = json.loads(line[6:])
            if "error" in event:
                raise ChildFailed(f"{path}: {event['error']}")
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                if piece:
                    chunks += 1
                    text.append(piece)
                    first = first or time.perf_counter()
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings
    t1 = time.perf_counter()
    details = (usage or {}).get("prompt_tokens_details") or {}
    return {"latency_s": t1 - t0, "ttft_s": None if first is None else first - t0,
            "completion_tokens": usage["completion_tokens"] if usage else chunks,
            "chunks": chunks, "prompt_tokens": (usage or {}).get("prompt_tokens"),
            "cached_tokens": details.get("cached_tokens"),
            "prompt_n": (timings or {}).get("prompt_n"), "timings": timings,
            "text": "".join(text)}


def load_level(server: Server, C: int, R: int, first: int, args, mode) -> dict:
    """C clients started together, each sending R requests back to back (request numbers
    from ``first`` on, one each); aggregate tokens/s, p95 latency and time to first token."""
    import httpx

    results: list[list[dict]] = [[] for _ in range(C)]
    failures: list[str] = []
    spans: list[tuple[float, float]] = []
    barrier = threading.Barrier(C)

    def client(c: int) -> None:
        with httpx.Client(timeout=REQUEST_TIMEOUT) as http:
            try:
                barrier.wait()
                t0 = time.perf_counter()
                for i in range(R):
                    path, body = request_body(request_messages(first + c * R + i), *mode,
                                              args.max_tokens)
                    results[c].append(stream_request(http, server.base, path, body))
                spans.append((t0, time.perf_counter()))
            except Exception as e:  # noqa: BLE001 (the level fails with its first reason)
                failures.append(str(e) or type(e).__name__)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(C)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise ChildFailed(f"{C} clients: {failures[0]}")
    runs = [r for rs in results for r in rs]
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    tokens = sum(r["completion_tokens"] for r in runs)
    decode = sorted((r["completion_tokens"] - 1) / (r["latency_s"] - r["ttft_s"]) for r in runs
                    if r["ttft_s"] is not None and r["completion_tokens"] > 1
                    and r["latency_s"] > r["ttft_s"])
    return {"clients": C, "requests": len(runs), "wall_s": wall, "completion_tokens": tokens,
            "tok_s": tokens / wall,
            "decode_tok_s": decode[len(decode) // 2] if decode else None,
            "p95_latency_s": p95([r["latency_s"] for r in runs]),
            "p95_ttft_s": p95([r["ttft_s"] for r in runs if r["ttft_s"] is not None]),
            "runs": [{k: v for k, v in r.items() if k != "text"} for r in runs]}


def conversation(server: Server, args, mode) -> dict:
    """``--turns`` turns, the whole conversation sent each turn: the prompt tokens evaluated
    per turn (llama-server's timings.prompt_n; else prompt tokens minus usage's cached tokens;
    else all of them), their sum, and the conversation's final length."""
    import httpx

    messages = [{"role": "system", "content": "You are a patient gardener who gives clear, "
                                              "practical advice."}]
    turns = []
    with httpx.Client(timeout=REQUEST_TIMEOUT) as http:
        for question in CONVERSATION[:args.turns]:
            messages.append({"role": "user", "content": question})
            path, body = request_body(messages, *mode, args.max_tokens)
            r = stream_request(http, server.base, path, body)
            messages.append({"role": "assistant", "content": r["text"]})
            if r["prompt_n"] is not None:
                r["evaluated"], r["evaluated_from"] = r["prompt_n"], "timings.prompt_n"
            elif r["cached_tokens"] is not None:
                r["evaluated"] = r["prompt_tokens"] - r["cached_tokens"]
                r["evaluated_from"] = "usage cached_tokens"
            else:
                r["evaluated"], r["evaluated_from"] = r["prompt_tokens"], "no cache reported"
            turns.append({k: v for k, v in r.items() if k != "text"})
    evaluated = sum(t["evaluated"] for t in turns)
    final = turns[-1]["prompt_tokens"] + turns[-1]["completion_tokens"]
    return {"turns": turns, "evaluated": evaluated, "prompt_tokens": sum(
        t["prompt_tokens"] for t in turns), "final_length": final, "ratio": evaluated / final,
        "evaluated_from": sorted({t["evaluated_from"] for t in turns})}


def attempt(section: dict, name: str, fn, *a) -> None:
    """section[name] = fn(*a), or {"failed": one line}."""
    try:
        section[name] = fn(*a)
    except (ChildFailed, Skip, OSError) as e:
        log(f"[{name}] {e}")
        section[name] = {"failed": str(e)}


def measure_server(server: Server, args, mode) -> dict:
    """Warm-up, the load levels and the conversation on a started server."""
    import httpx

    out = {"start_s": server.start_s, "levels": {}}
    with httpx.Client(timeout=REQUEST_TIMEOUT) as http:
        path, body = request_body(request_messages(10_000), *mode, args.max_tokens)
        out["warmup"] = {k: v for k, v in stream_request(http, server.base, path, body).items()
                         if k != "text"}
    first = 0
    for C in args.clients:
        log(f"[{server.name}] {C} client(s) x {args.requests} requests ...")
        attempt(out["levels"], str(C), load_level, server, C, args.requests, first, args, mode)
        first += C * args.requests
    log(f"[{server.name}] a {args.turns}-turn conversation ...")
    attempt(out, "conversation", conversation, server, args, mode)
    return out


def run_server(doc: dict, name: str, cmd: list[str], port: int, args, mode, work: str,
               cwd: str | None = None) -> None:
    log(f"[{name}] starting: {' '.join(cmd)}")
    server = Server(name, cmd, port, args.threads, os.path.join(work, name + ".log"), cwd)
    try:
        with server:
            log(f"[{name}] up in {server.start_s:.1f} s")
            doc["servers"][name] = {"command": " ".join(cmd[1:] if cmd[0] == sys.executable
                                                        else cmd),
                                    **measure_server(server, args, mode)}
    except (ChildFailed, OSError) as e:
        log(f"[{name}] {e}")
        doc["servers"][name] = {"failed": str(e), "command": " ".join(cmd)}


def cli_decode(path: str, args, mode) -> dict:
    """Our CLI's generation tok/s on the file, the best of CLI_RUNS runs, on request 0's
    prompt (through the chat template when the file has one)."""
    messages = request_messages(0)
    if mode[0]:
        prompt = ["--chat", "--system", messages[0]["content"], messages[1]["content"]]
    else:
        prompt = [raw_prompt(messages, mode[1])]
    cmd = [sys.executable, "main.py", path, *prompt, "-n", str(args.max_tokens), "--greedy",
           "--json", "-t", str(args.threads)]
    runs = []
    for _ in range(CLI_RUNS):
        proc = subprocess.run(cmd, cwd=ROOT, env=thread_env(args.threads),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=START_TIMEOUT)
        if proc.returncode != 0:
            raise ChildFailed(f"main.py failed (exit {proc.returncode}: "
                              f"{last_line(proc.stderr)})")
        record = json.loads(proc.stdout.strip().splitlines()[-1])
        runs.append({"tps": record["generation"]["tps"],
                     "tokens": record["generation"]["tokens"],
                     "prefill_tps": record["prefill"]["tps"]})
    return {"command": " ".join(cmd[1:]), "tps": max(r["tps"] for r in runs), "runs": runs}


def ours_supports_parallel() -> bool:
    proc = subprocess.run([sys.executable, "main.py", "serve", "--help"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return "--parallel" in proc.stdout


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8],
                    help="concurrent clients of each load level (1 4 8)")
    ap.add_argument("--requests", type=int, default=3, help="requests per client (3)")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens of a request (64)")
    ap.add_argument("--turns", type=int, default=10, choices=range(1, len(CONVERSATION) + 1),
                    metavar="N", help="turns of the conversation (10)")
    ap.add_argument("--parallel", type=int, default=4,
                    help="llama-server's slots (-np), and ours' --parallel when it has it (4)")
    ap.add_argument("--ctx", type=int, default=8192, help="llama-server's -c (8192)")
    ap.add_argument("--file", choices=list(FILES), default="smollm2")
    ap.add_argument("--no-llama", action="store_true", help="ours alone: no llama-server")
    output_options(ap, CACHE_DIR)
    args = ap.parse_args(argv)
    if min(args.threads, args.requests, args.max_tokens, args.parallel, args.ctx,
           *args.clients) < 1:
        ap.error("-t, --clients, --requests, --max-tokens, --parallel and --ctx must be >= 1")
    if args.from_json:
        with open(args.from_json) as f:
            print_table(json.load(f), sys.stdout)
        return
    atexit.register(stop_all)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # so that the servers are stopped then too
        signal.signal(sig, lambda s, f: sys.exit(128 + s))

    mf = FILES[args.file]
    try:
        path, origin = locate(mf, args.cache_dir)
    except (Skip, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    chat = has_chat_template(path)
    mode = (chat, None if chat else RAW_TURNS[mf.key])
    parallel = ours_supports_parallel()
    doc = {"file": args.file, "path": path, "origin": origin, "threads": args.threads,
           "clients": args.clients, "requests": args.requests, "max_tokens": args.max_tokens,
           "turns": args.turns, "parallel": args.parallel, "ctx": args.ctx,
           "endpoint": "/v1/chat/completions" if chat else "/v1/completions",
           "ours_parallel_option": parallel, "busy_cores_before": busy_cores(),
           "skipped": [], "servers": {}}
    tools = None
    if not args.no_llama:
        try:
            tools = llama_cpp_tools(args.cache_dir, args.threads,
                                    (*LLAMA_CPP_TARGETS, "llama-server"))
            doc["llama.cpp"] = tools
        except Skip as e:
            log(f"[llama.cpp] {e}")
            doc["skipped"].append(str(e))
    log(f"[cli] {args.file}: {path} ({origin}); our CLI's decode speed ...")
    attempt(doc, "cli", cli_decode, path, args, mode)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as work:
        try:
            port = free_port()
            run_server(doc, "ours", [sys.executable, "main.py", "serve", path, "--port",
                                     str(port), "-t", str(args.threads), "--log-level", "warning",
                                     *(["--parallel", str(args.parallel)] if parallel else [])],
                       port, args, mode, work, cwd=ROOT)
            if tools:
                port = free_port()
                run_server(doc, "llama-server",
                           [os.path.join(tools["bin_dir"], "llama-server"), "-m", path,
                            "-t", str(args.threads), "-np", str(args.parallel), "-c",
                            str(args.ctx), "--host", "127.0.0.1", "--port", str(port),
                            "--no-webui"], port, args, mode, work)
        finally:
            stop_all()
    doc["loadavg_after"] = os.getloadavg()
    print_results(doc, args.json, print_table)


# -- the table --------------------------------------------------------------------------------

def print_table(doc: dict, out) -> None:
    w = out.write
    w(f"{doc['file']} ({os.path.basename(doc['path'])}), threads {doc['threads']}, "
      f"{doc['requests']} requests per client, max_tokens {doc['max_tokens']}, temperature 0, "
      f"{doc['endpoint']} streamed; {machine_load(doc)}\n")
    tools = doc.get("llama.cpp")
    if tools:
        w(f"llama-server: llama-cpp-python {tools['version']}'s llama.cpp, -np {doc['parallel']} "
          f"-c {doc['ctx']}; {tools['system_info']}\n")
    parallel = f"--parallel {doc['parallel']}" if doc["ours_parallel_option"] else "no --parallel"
    w(f"ours: main.py serve, {parallel}\n")
    for line in doc["skipped"]:
        w(f"skipped: {line}\n")
    servers = doc["servers"]
    a, b = servers.get("ours", {}), servers.get("llama-server", {})
    notes = [f"{who}: {s['failed']}" for who, s in (("ours", a), ("llama-server", b))
             if "failed" in s]
    w("\n| measure | ours | llama-server | ours / llama-server | target |\n"
      "|---|---|---|---|---|\n")

    def fmt(v, f):
        return "-" if v is None else f.format(v)

    def row(label, va, vb, f, target="-"):
        ratio = f"{va / vb:.2f}" if va and vb else "-"
        w(f"| {label} | {fmt(va, f)} | {fmt(vb, f)} | {ratio} | {target} |\n")

    for C in doc["clients"]:
        la = a.get("levels", {}).get(str(C), {})
        lb = b.get("levels", {}).get(str(C), {})
        for who, x in (("ours", la), ("llama-server", lb)):
            if "failed" in x:
                notes.append(f"{who}, {C} clients: {x['failed']}")
        n = f"{C} client{'s' if C > 1 else ''}"
        row(f"{n}: tokens/s, all clients", la.get("tok_s"), lb.get("tok_s"), "{:.1f}")
        row(f"{n}: p95 request latency, s", la.get("p95_latency_s"), lb.get("p95_latency_s"),
            "{:.2f}")
        row(f"{n}: p95 time to first token, s", la.get("p95_ttft_s"), lb.get("p95_ttft_s"),
            "{:.2f}")
    cli = doc.get("cli", {})
    if "failed" in cli:
        notes.append(f"CLI: {cli['failed']}")
    one = a.get("levels", {}).get("1", {}).get("decode_tok_s")
    if 1 in doc["clients"]:
        row("1 client: decode tok/s after the first token (median request)", one,
            b.get("levels", {}).get("1", {}).get("decode_tok_s"), "{:.1f}")
    if cli.get("tps"):
        target = "-"
        if one:
            ok = one / cli["tps"] >= 0.9
            target = (f"1 client's decode / CLI = {one / cli['tps']:.2f} >= 0.9 "
                      f"{'met' if ok else 'MISSED'}")
        row(f"our CLI decode, tok/s (-n {doc['max_tokens']} --greedy)", cli["tps"], None,
            "{:.1f}", target)
    ca, cb = a.get("conversation", {}), b.get("conversation", {})
    for who, x in (("ours", ca), ("llama-server", cb)):
        if "failed" in x:
            notes.append(f"{who}, conversation: {x['failed']}")
    t = doc["turns"]
    row(f"{t}-turn conversation: prompt tokens sent", ca.get("prompt_tokens"),
        cb.get("prompt_tokens"), "{}")
    row(f"{t}-turn conversation: prompt tokens evaluated", ca.get("evaluated"),
        cb.get("evaluated"), "{}")
    row(f"{t}-turn conversation: final length, tokens", ca.get("final_length"),
        cb.get("final_length"), "{}")
    target = "-"
    if ca.get("ratio") is not None:
        target = f"<= 1.2 {'met' if ca['ratio'] <= 1.2 else 'MISSED'}"
    row(f"{t}-turn conversation: evaluated / final length", ca.get("ratio"), cb.get("ratio"),
        "{:.2f}", target)
    for who, x in (("ours", ca), ("llama-server", cb)):
        if x.get("evaluated_from"):
            w(f"\n{who}: prompt tokens evaluated read from {', '.join(x['evaluated_from'])}")
    w("\n")
    if notes:
        w("\nfailures:\n" + "".join(f"- {n}\n" for n in notes))
    w(f"\ntokens/s: the completion tokens of a level's requests (clients x {doc['requests']}) "
      f"over its wall time; p95 by nearest rank over those requests\n" + TARGETS + "\n")


if __name__ == "__main__":
    main()
