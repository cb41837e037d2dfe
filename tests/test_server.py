"""``causallm serve``: the real server in a subprocess (``python main.py serve``) on a free port,
driven by the official ``openai`` client and by raw httpx.

res/tiny-llama (whose tokenizer_config.json carries a chat template) answers chat and text
completions; greedy answers must equal what the CLI and the Python API give for the same prompt,
streamed or not, one request at a time or several at once. bert-st-mean answers embeddings,
checked against sentence-transformers' (its expected.npz). A client that drops its stream (or
the connection of a request not streamed) stops its generation (``/health`` counts it) and the
server answers the next request; every bad request is a 400 with OpenAI's error body, after
which the server still serves.
"""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import causallm  # noqa: E402
from causallm import main  # noqa: E402
from cli import run_cli  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "res", "tiny-llama")
BERT = os.path.join(ROOT, "tests", "fixtures", "bert-st-mean")
T5 = os.path.join(ROOT, "tests", "fixtures", "t5-flan-short")  # one worker, no chat template
PROMPTS = ["Strings are immutable sequences of", "The for statement", "A dictionary maps",
           "Exceptions are raised when"]
QUESTION = [{"role": "user", "content": "What is a list?"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir, log_path, *extra):
    """``python main.py serve model_dir`` on a free port -> (process, base URL), once /health
    answers."""
    port = free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "main.py", "serve", model_dir, "--port", str(port),
                             "--log-level", "warning", *extra], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {open(log_path).read()}")
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise AssertionError(f"the server did not come up: {open(log_path).read()}")


def stop_server(proc):
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # a context of 1800 positions: room for a generation long enough to drop mid-way
    proc, url = start_server(TINY, tmp_path_factory.mktemp("serve") / "server.log", "-n", "1500",
                             "-c", "1800")
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def embedding_server(tmp_path_factory):
    proc, url = start_server(BERT, tmp_path_factory.mktemp("serve") / "server.log",
                             "--model-name", "bert")
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def local():
    """The same model through the Python API, in this process."""
    return causallm.load(TINY)


def cli_text(capsys, prompt, n, *extra):
    """``python main.py res/tiny-llama PROMPT --greedy -n N --json``'s text (tests/cli.py)."""
    p = run_cli(TINY, prompt, "--greedy", "-n", n, "--json", *extra)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])["text"]


def complete(url, **body):
    r = httpx.post(url + "/v1/completions", json={"model": "tiny-llama", **body}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


# ------------------------------------------------------------------------------ answers
@pytest.mark.slow
def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == ["tiny-llama"]
    assert client.models.retrieve("tiny-llama").id == "tiny-llama"
    health = httpx.get(server + "/health").json()
    assert health["status"] == "ok" and health["model"] == "tiny-llama"


@pytest.mark.slow
def test_completion_equals_the_cli(client, capsys):
    want = cli_text(capsys, PROMPTS[0], 40)
    got = client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=40,
                                    temperature=0)
    assert got.choices[0].text == want
    assert got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 40 and got.usage.prompt_tokens == 7
    assert got.usage.total_tokens == 47 and got.model == "tiny-llama"


@pytest.mark.slow
def test_streamed_completion_equals_the_cli(client, capsys):
    want = cli_text(capsys, PROMPTS[1], 30)
    chunks = list(client.completions.create(model="any-name", prompt=PROMPTS[1], max_tokens=30,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) > 2 and "".join(texts) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30


@pytest.mark.slow
def test_chat_completion_equals_the_python_api_and_the_cli(client, local, capsys):
    done = local.complete(QUESTION, greedy=True, max_new_tokens=48)
    assert done.text == cli_text(capsys, QUESTION[0]["content"], 48, "--chat")
    got = client.chat.completions.create(model="tiny-llama", messages=QUESTION, max_tokens=48,
                                         temperature=0)
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == done.text
    assert got.choices[0].finish_reason == done.finish_reason
    assert got.usage.prompt_tokens == done.prompt_tokens
    assert got.usage.completion_tokens == done.completion_tokens


@pytest.mark.slow
def test_streamed_chat_completion_equals_the_python_api(client, local):
    want = local.generate(QUESTION, greedy=True, max_new_tokens=48)
    stream = client.chat.completions.create(model="tiny-llama", messages=QUESTION,
                                            max_completion_tokens=48, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.usage is None for c in chunks)  # no include_usage


@pytest.mark.slow
def test_text_parts_and_a_system_message(client, local):
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": [{"type": "text", "text": "What is "},
                                             {"type": "text", "text": "a tuple?"}]}]
    want = local.generate([messages[0], {"role": "user", "content": "What is a tuple?"}],
                          greedy=True, max_new_tokens=20)
    got = client.chat.completions.create(model="x", messages=messages, max_tokens=20,
                                         temperature=0)
    assert got.choices[0].message.content == want


@pytest.mark.slow
def test_a_developer_message_is_a_system_message(client, local):
    """OpenAI's newer name for the system role reaches the template as "system"."""
    want = local.generate([{"role": "system", "content": "Answer briefly."}, QUESTION[0]],
                          greedy=True, max_new_tokens=12)
    got = client.chat.completions.create(model="x", messages=[
        {"role": "developer", "content": "Answer briefly."}, QUESTION[0]], max_tokens=12,
        temperature=0)
    assert got.choices[0].message.content == want


@pytest.mark.slow
def test_stop_penalties_and_logit_bias_equal_the_python_api(client, local, capsys):
    full = local.generate(PROMPTS[1], greedy=True, max_new_tokens=30)
    stop = full.split()[3]
    got = client.completions.create(model="x", prompt=PROMPTS[1], max_tokens=30, temperature=0,
                                    stop=[stop, "zzz"])
    assert got.choices[0].text == full[:full.index(stop)] == cli_text(
        capsys, PROMPTS[1], 30, "--stop", stop)
    assert got.choices[0].finish_reason == "stop"
    chunks = client.chat.completions.create(model="x", messages=QUESTION, max_tokens=30,
                                            temperature=0, stop="\n", stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        local.generate(QUESTION, greedy=True, max_new_tokens=30, stop="\n")
    penalized = local.generate(PROMPTS[1], greedy=True, max_new_tokens=30,
                               presence_penalty=1.5, frequency_penalty=0.5)
    assert penalized != full
    assert client.completions.create(
        model="x", prompt=PROMPTS[1], max_tokens=30, temperature=0, presence_penalty=1.5,
        frequency_penalty=0.5).choices[0].text == penalized
    first = local.complete(PROMPTS[1], greedy=True, max_new_tokens=30).result.generated_ids[0][0]
    banned = local.generate(PROMPTS[1], greedy=True, max_new_tokens=30,
                            bad_words_ids=[[first]])
    assert banned != full
    assert client.completions.create(
        model="x", prompt=PROMPTS[1], max_tokens=30, temperature=0,
        logit_bias={str(first): -100}).choices[0].text == banned


@pytest.mark.slow
def test_sampling_with_a_seed_repeats(client):
    def sample():
        return client.completions.create(model="x", prompt=PROMPTS[2], max_tokens=24,
                                         temperature=1.3, top_p=0.95, seed=11).choices[0].text

    first = sample()
    assert sample() == first
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="x", prompt=PROMPTS[2], max_tokens=24, temperature=1.3, top_p=0.95, seed=11,
        stream=True) if c.choices)
    assert streamed == first


@pytest.mark.slow
def test_concurrent_requests_each_get_their_own_answer(server):
    alone = [complete(server, prompt=p, max_tokens=32, temperature=0)["choices"][0]["text"]
             for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        answers = list(pool.map(
            lambda p: complete(server, prompt=p, max_tokens=32, temperature=0)
            ["choices"][0]["text"], PROMPTS * 2))
    assert answers == alone * 2


LONG = {"model": "x", "prompt": PROMPTS[1], "max_tokens": 1500, "temperature": 0}
"""Greedy, this prompt runs 1500 tokens without an EOS: a generation that is counted as
stopped was cut short."""


def wait_for_stopped(server, count):
    for _ in range(600):  # the server notices at its next token
        if httpx.get(server + "/health").json()["generations_stopped"] >= count:
            break
        time.sleep(0.2)
    assert httpx.get(server + "/health").json()["generations_stopped"] == count


@pytest.mark.slow
def test_a_dropped_stream_stops_its_generation(server, local):
    before = httpx.get(server + "/health").json()["generations_stopped"]
    with httpx.Client(timeout=300) as c:
        with c.stream("POST", server + "/v1/completions", json={**LONG, "stream": True}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
    wait_for_stopped(server, before + 1)
    want = local.generate(PROMPTS[3], greedy=True, max_new_tokens=16)
    assert complete(server, prompt=PROMPTS[3], max_tokens=16,
                    temperature=0)["choices"][0]["text"] == want


@pytest.mark.slow
def test_a_dropped_request_stops_its_generation(server, local):
    """A non-streamed request whose connection closes while its answer is being generated."""
    before = httpx.get(server + "/health").json()["generations_stopped"]
    body = json.dumps(LONG).encode()
    port = int(server.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    wait_for_stopped(server, before + 1)
    want = local.generate(PROMPTS[2], greedy=True, max_new_tokens=16)
    assert complete(server, prompt=PROMPTS[2], max_tokens=16,
                    temperature=0)["choices"][0]["text"] == want


# ------------------------------------------------------------------------------ embeddings
@pytest.mark.slow
def test_embeddings_equal_sentence_transformers(embedding_server):
    ref = np.load(os.path.join(BERT, "expected.npz"))
    sentences = [str(s) for s in ref["sentences"]]
    client = openai.OpenAI(base_url=embedding_server + "/v1", api_key="unused", max_retries=0)
    got = client.embeddings.create(model="bert", input=sentences)  # base64 on the wire
    assert [d.index for d in got.data] == list(range(len(sentences)))
    np.testing.assert_allclose(np.array([d.embedding for d in got.data]), ref["embeddings"],
                               atol=1e-5)
    assert got.usage.prompt_tokens == int(ref["lengths"].sum())
    r = httpx.post(embedding_server + "/v1/embeddings",
                   json={"model": "bert", "input": sentences[1], "encoding_format": "float"})
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], ref["embeddings"][1], atol=1e-5)
    r = httpx.post(embedding_server + "/v1/completions", json={"prompt": "hi"})
    assert r.status_code == 400 and "does not generate" in r.json()["error"]["message"]


BAD_EMBEDDINGS = {  # name -> (body, the param named)
    "empty string": ({"input": ""}, "input"),
    "an empty string in the list": ({"input": ["a", ""]}, "input"),
    "empty list": ({"input": []}, "input"),
    "no input": ({"model": "bert"}, "input"),
    "token ids": ({"input": [1, 2]}, "input"),
    "too many texts": ({"input": ["a"] * 2049}, "input"),
    "encoding_format of no kind": ({"input": "a", "encoding_format": "int8"},
                                   "encoding_format"),
    "dimensions": ({"input": "a", "dimensions": 8}, "dimensions"),
    "model a number": ({"input": "a", "model": 1}, "model"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_EMBEDDINGS))
def test_bad_embedding_requests_are_400_naming_the_field(embedding_server, case):
    body, param = BAD_EMBEDDINGS[case]
    r = httpx.post(embedding_server + "/v1/embeddings", json=body, timeout=300)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert len(r.json()["error"]["message"].splitlines()) == 1


@pytest.mark.slow
def test_a_language_model_does_not_embed(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="tiny-llama", input="hi")
    assert e.value.status_code == 400
    assert "does not embed" in e.value.body["message"]


# ------------------------------------------------------------------------------ bad requests
CHAT = {"model": "tiny-llama", "messages": QUESTION}
BAD = {  # name -> (path, raw body or JSON object, the param named)
    "malformed JSON": ("/v1/chat/completions", b'{"messages": [', None),
    "not an object": ("/v1/chat/completions", [1, 2], None),
    "no messages": ("/v1/chat/completions", {"model": "x"}, "messages"),
    "messages not a list": ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    "message without role": ("/v1/chat/completions", {"messages": [{"content": "hi"}]},
                             "messages[0].role"),
    "a role of no kind": ("/v1/chat/completions",
                          {"messages": [{"role": "bogus", "content": "hi"}]}, "messages[0].role"),
    "a message not an object": ("/v1/chat/completions", {"messages": ["hi"]}, "messages[0]"),
    "content null": ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]},
                     "messages[0].content"),
    "content absent": ("/v1/chat/completions", {"messages": [{"role": "user"}]},
                       "messages[0].content"),
    "assistant content null without calls": (
        "/v1/chat/completions", {"messages": [QUESTION[0], {"role": "assistant", "content": None},
                                              {"role": "user", "content": "and?"}]},
        "messages[1].content"),
    "an image in a system message": ("/v1/chat/completions", {"messages": [{
        "role": "system", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
        "messages[0].content[0]"),
    "name a number": ("/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "hi", "name": 5}]},
                      "messages[0].name"),
    "include_usage a string": ("/v1/chat/completions",
                               {**CHAT, "stream": True, "stream_options": {"include_usage": "y"}},
                               "stream_options.include_usage"),
    "content a number": ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]},
                         "messages[0].content"),
    "image part without a URL": ("/v1/chat/completions",
                                 {"messages": [{"role": "user",
                                                "content": [{"type": "image_url"}]}]},
                                 "messages[0].content[0].image_url"),
    "image from the network": ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]},
        "messages[0].content[0].image_url"),
    "a part of no known type": ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "audio"}]}]}, "messages[0].content"),
    "a tool result answering no call": ("/v1/chat/completions",
                                        {"messages": [{"role": "tool", "content": "x"}]},
                                        "messages[0].tool_call_id"),
    "max_tokens 0": ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, "max_tokens"),
    "max_tokens beyond the cache": ("/v1/chat/completions", {**CHAT, "max_tokens": 10 ** 6},
                                    "max_tokens"),
    "max_tokens a string": ("/v1/completions", {"prompt": "x", "max_tokens": "10"},
                            "max_tokens"),
    "max_completion_tokens -1": ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -1},
                                 "max_completion_tokens"),
    "temperature -1": ("/v1/chat/completions", {**CHAT, "temperature": -1}, "temperature"),
    "temperature a string": ("/v1/completions", {"prompt": "x", "temperature": "hot"},
                             "temperature"),
    "top_p 1.5": ("/v1/chat/completions", {**CHAT, "top_p": 1.5}, "top_p"),
    "seed a float": ("/v1/completions", {"prompt": "x", "seed": 1.5}, "seed"),
    "n 0": ("/v1/chat/completions", {**CHAT, "n": 0}, "n"),
    "n 17": ("/v1/chat/completions", {**CHAT, "n": 17}, "n"),
    "stream a string": ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream"),
    "stream_options without stream": ("/v1/chat/completions",
                                      {**CHAT, "stream_options": {"include_usage": True}},
                                      "stream_options"),
    "stop a number": ("/v1/completions", {"prompt": "x", "stop": 5}, "stop"),
    "logit_bias not numbers": ("/v1/completions", {"prompt": "x", "logit_bias": {"5": "a"}},
                               "logit_bias"),
    "logit_bias other than -100": ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 3}},
                                   "logit_bias"),
    "logit_bias token out of range": ("/v1/completions",
                                      {"prompt": "x", "logit_bias": {"99999": -100}},
                                      "logit_bias"),
    "presence_penalty a string": ("/v1/completions", {"prompt": "x", "presence_penalty": "3"},
                                  "presence_penalty"),
    "min_p 2": ("/v1/completions", {"prompt": "x", "min_p": 2}, "min_p"),
    "empty stop string": ("/v1/completions", {"prompt": "x", "stop": [""]}, "stop"),
    "model a number": ("/v1/completions", {"prompt": "x", "model": 3}, "model"),
    "no prompt": ("/v1/completions", {"model": "x"}, "prompt"),
    "two prompts": ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    "token id out of range": ("/v1/completions", {"prompt": [1, 99999]}, "prompt"),
    "top_logprobs without logprobs": ("/v1/chat/completions", {**CHAT, "top_logprobs": 2},
                                      "top_logprobs"),
    "top_logprobs 21": ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21},
                        "top_logprobs"),
    "completion logprobs 6": ("/v1/completions", {"prompt": "x", "logprobs": 6}, "logprobs"),
    "logprobs a string": ("/v1/chat/completions", {**CHAT, "logprobs": "yes"}, "logprobs"),
    "a tool without a name": ("/v1/chat/completions",
                              {**CHAT, "tools": [{"type": "function", "function": {}}]},
                              "tools[0].function.name"),
    "tools the template cannot call": (
        "/v1/chat/completions",
        {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    "prompt longer than the cache": ("/v1/completions", {"prompt": "word " * 2000}, "prompt"),
    "streamed prompt longer than the cache": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "word " * 2000}], "stream": True},
        "messages"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD))
def test_bad_requests_are_400_with_an_error_body(server, case):
    path, body, param = BAD[case]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server + path, content=content, headers={"Content-Type": "application/json"},
                   timeout=300)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    if "longer than the cache" in case:
        assert error["code"] == "context_length_exceeded"
    if case == "max_tokens beyond the cache":  # worded as the CLI's -n and the API's
        assert "is more than the context: " in error["message"]


SERVER_BAD = {"max_new_tokens": 0, "temperature": -1, "top_k": -1, "top_p": 2, "min_p": 1.5,
              "typical_p": 0, "repetition_penalty": 0, "presence_penalty": "x",
              "frequency_penalty": [], "seed": -1, "stop": ""}
"""A bad value of each generation option the server takes as a field of the same rule."""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SERVER_BAD))
def test_a_bad_option_is_refused_by_the_rule_the_cli_and_the_api_use(server, name):
    """The server's fields follow causallm/generation/options.py, as the CLI's flags and the
    API's keywords do (tests/test_options.py): the same expected values in the 400."""
    from causallm.generation.options import OPTIONS

    field = OPTIONS[name].field
    r = httpx.post(server + "/v1/completions", json={"prompt": "x", field: SERVER_BAD[name]})
    assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert r.json()["error"]["message"].startswith(
        f"'{field}' must be {OPTIONS[name].expected}, got ")


@pytest.mark.slow
def test_errors_through_the_client_and_the_server_keeps_serving(client, server, local):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=QUESTION, max_tokens=0)
    assert e.value.status_code == 400 and e.value.body["param"] == "max_tokens"
    for path, method in (("/v1/nothing", "GET"), ("/v1/models", "POST"),
                         ("/v1/models/other", "GET")):
        r = httpx.request(method, server + path)
        assert r.status_code in (404, 405) and set(r.json()["error"]) >= {"message", "type"}
    want = local.generate(PROMPTS[2], greedy=True, max_new_tokens=12)
    assert complete(server, prompt=PROMPTS[2], max_tokens=12,
                    temperature=0)["choices"][0]["text"] == want


@pytest.mark.slow
def test_serve_without_the_extra_names_it(tmp_path):
    """With starlette unimportable the command is one error line naming the extra."""
    blocker = tmp_path / "starlette"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('blocked', name='starlette')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    p = run_cli("serve", TINY, env=env, process=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.startswith("error: causallm serve needs Starlette and uvicorn")
    assert "causallm[serve]" in p.stderr and len(p.stderr.splitlines()) == 1


@pytest.mark.parametrize("args,message", [
    (("-n", "20000000"), "error: -n 20000000 is more than the context: 512 positions (max_seq_len "
                         "in "),
    (("-c", "0"), "error: -c must be an integer >= 1, got 0"),
    (("-c", "64", "-n", "65"), "error: -n 65 is more than the context: 64 positions (-c)"),
    (("--parallel", "100000", "-c", "100000"),
     "error: not enough memory for a context of 100000 positions (-c; 100000 slots (--parallel, "
     "slots)): the KV caches of 100000 sequence(s) x 100000 positions x 3072 bytes"),
])
def test_serve_refuses_what_exceeds_the_context_or_the_memory_before_loading(capsys, args,
                                                                             message):
    """What the KV caches would hold (the context, new tokens, slots) is checked before the
    graph is built or a weight read, and refused in one line naming the flag."""
    rc = main.main(["serve", TINY, *args])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.startswith(message) and err.count("\n") == 1, err


# ------------------------------------------------------------------------------ many users
def metrics(url) -> dict:
    """/metrics' samples: {name: value}, checking the text format's HELP/TYPE lines."""
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    values, typed = {}, set()
    for line in r.text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line and not line.startswith("#"):
            name, value = line.split()
            assert name.split("_sum")[0].split("_count")[0] in typed, name
            values[name] = float(value)
    return values


@pytest.mark.slow
def test_metrics_count_requests_tokens_and_slots(server):
    before = metrics(server)
    assert before["causallm_slots"] == 4  # the default --parallel
    complete(server, prompt=PROMPTS[0], max_tokens=8, temperature=0)
    after = metrics(server)
    assert after["causallm_requests_total"] == before["causallm_requests_total"] + 1
    assert after["causallm_generated_tokens_total"] == before["causallm_generated_tokens_total"] + 8
    assert after["causallm_time_to_first_token_seconds_count"] == \
        before["causallm_time_to_first_token_seconds_count"] + 1
    assert after["causallm_slots_busy"] == 0 and after["causallm_queue_depth"] == 0


@pytest.mark.slow
def test_a_resent_conversation_prefills_only_its_new_turn(client, local):
    """Each turn resends the whole conversation: the earlier turns are found in a slot (the
    cached tokens OpenAI's usage reports) and the answers are still the Python API's."""
    messages = [{"role": "system", "content": "You answer in one sentence."},
                {"role": "user", "content": "What is a tuple?"}]
    total = cached = 0
    for turn in range(3):
        r = client.chat.completions.create(model="x", messages=messages, max_tokens=12,
                                           temperature=0)
        answer = r.choices[0].message.content
        assert answer == local.generate(messages, greedy=True, max_new_tokens=12)
        if turn:
            assert r.usage.prompt_tokens_details.cached_tokens >= previous
        previous = r.usage.prompt_tokens
        total += r.usage.prompt_tokens
        cached += r.usage.prompt_tokens_details.cached_tokens
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": f"And question {turn}?"}]
    assert cached > total / 2


@pytest.mark.slow
def test_a_full_queue_is_503_and_the_server_keeps_serving(tmp_path, local):
    """One slot and no queue: a request that comes while a generation holds the slot is
    refused at once (503, Retry-After), and served once the slot is free."""
    proc, url = start_server(TINY, tmp_path / "server.log", "-n", "1500", "-c", "1800",
                             "--parallel", "1", "--queue", "0")
    try:
        busy = None
        for _ in range(5):  # in case the 1500 tokens are done before the request comes
            with httpx.Client(timeout=300) as c:
                with c.stream("POST", url + "/v1/completions",
                              json={**LONG, "stream": True}) as r:
                    lines = r.iter_lines()  # kept: closing it would close the stream
                    assert next(lines).startswith("data: ")  # it holds the one slot
                    busy = httpx.post(url + "/v1/completions",
                                      json={**LONG, "max_tokens": 4}, timeout=300)
            if busy.status_code == 503:
                break
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["code"] == "server_busy"
        for _ in range(100):  # the closed stream's slot is freed at the next step
            if metrics(url)["causallm_slots_busy"] == 0:
                break
            time.sleep(0.1)
        assert complete(url, prompt=PROMPTS[0], max_tokens=4, temperature=0)["choices"][0][
            "text"] == local.generate(PROMPTS[0], greedy=True, max_new_tokens=4)
    finally:
        stop_server(proc)


@pytest.mark.slow
def test_logprobs_of_chat_and_completions_streamed_and_not(client, local):
    """Each new token's log-probability and its alternatives (the model's distribution, before
    the configs' repetition penalty picks among them): the Python API's values (the same model
    alone), streamed or not."""
    body = dict(model="x", messages=QUESTION, max_tokens=8, temperature=0, logprobs=True,
                top_logprobs=2)
    whole = client.chat.completions.create(**body)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    request = local.request(QUESTION, max_new_tokens=8, greedy=True, logprobs=2)
    local.scheduler.generate([request])
    for entry, (token, lp, top) in zip(content, request.token_logprobs):
        assert entry.token == local.model.tokenizer.Decode([token])
        assert entry.logprob == pytest.approx(lp, abs=1e-4)
        assert entry.logprob <= entry.top_logprobs[0].logprob <= 0
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([v for _, v in top],
                                                                       abs=1e-4)
        assert bytes(entry.bytes).decode() == entry.token
    streamed = [e for c in client.chat.completions.create(**body, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)

    done = complete(server_url(client), prompt=PROMPTS[0], max_tokens=6, temperature=0,
                    logprobs=3)["choices"][0]
    lp = done["logprobs"]
    assert "".join(lp["tokens"]) == done["text"] and len(lp["tokens"]) == 6
    assert all(len(top) == 3 and max(top.values()) >= v
               for top, v in zip(lp["top_logprobs"], lp["token_logprobs"]))
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(6)]


def server_url(client) -> str:
    return str(client.base_url).rstrip("/").removesuffix("/v1")


@pytest.mark.slow
def test_n_choices_are_sequences_of_their_own(client):
    """n choices decode side by side; with a seed each draws its own tokens, the same on
    every request; streamed, each index's pieces make its whole answer."""
    body = dict(model="x", messages=QUESTION, max_tokens=10, temperature=0.9, seed=7, n=3)
    first = client.chat.completions.create(**body)
    again = client.chat.completions.create(**body)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices]
    assert len(set(texts)) > 1
    assert 3 <= first.usage.completion_tokens <= 30
    pieces = ["", "", ""]
    for chunk in client.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            pieces[c.index] += c.delta.content or ""
    assert pieces == texts


@pytest.fixture(scope="module")
def qwen_template(tmp_path_factory):
    """tiny-llama with Qwen2.5's chat template (its <tool_call> format), served with room for
    a long prompt (the tools rendered: 331 tokens) and an answer -> (folder, base URL)."""
    folder = tmp_path_factory.mktemp("tools") / "tiny-qwen-template"
    shutil.copytree(TINY, folder)
    shutil.copy(os.path.join(ROOT, "tests", "data", "chat_templates", "qwen2.5",
                             "chat_template.jinja"), folder / "chat_template.jinja")
    proc, url = start_server(str(folder), folder.parent / "server.log", "-n", "400")
    yield folder, url
    stop_server(proc)


@pytest.mark.slow
def test_tools_render_through_the_template_and_the_answer_is_read(qwen_template):
    """The tools are in the prompt the template renders (the Python API's prompt), and the
    answer, which this random model never makes a call of, comes back as content, the same
    streamed and not."""
    folder, url = qwen_template
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    body = dict(model="x", messages=QUESTION, max_tokens=12, temperature=0)
    plain = client.chat.completions.create(**body)
    with_tools = client.chat.completions.create(**body, tools=tools)
    local = causallm.load(str(folder))
    want = local.encode(QUESTION, tools=tools)
    assert with_tools.usage.prompt_tokens == len(want) > plain.usage.prompt_tokens
    message = with_tools.choices[0].message
    assert message.tool_calls is None and with_tools.choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(**body, tools=tools, stream=True)
                       if c.choices)
    assert streamed == message.content


@pytest.mark.slow
def test_image_parts_reach_a_vision_model_as_the_python_api_gives_them(tmp_path):
    """Gemma 3 vision (a fixture, with Gemma 3's chat template): image_url parts as data URLs
    in a chat message are the images of the generation, at the template's placeholders; the
    answer is the Python API's for the same messages and images. A text model refuses
    images; a part that is not an image is a 400 naming it."""
    folder = tmp_path / "gemma3-vision-chat"
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "gemma3-vision"), folder)
    shutil.copy(os.path.join(ROOT, "tests", "data", "chat_templates", "gemma-3",
                             "chat_template.json"), folder / "chat_template.json")
    paths = [os.path.join(ROOT, "tests", "fixtures", "images", n)
             for n in ("rgb-40x24.png", "rgba-20x36.png")]

    def part(path):
        data = base64.b64encode(open(path, "rb").read()).decode()
        return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}

    messages = [{"role": "user", "content": [part(paths[0]), part(paths[1]),
                                             {"type": "text", "text": "What differs?"}]}]
    proc, url = start_server(str(folder), tmp_path / "server.log")
    try:
        r = httpx.post(url + "/v1/chat/completions", json={
            "messages": messages, "max_tokens": 8, "temperature": 0}, timeout=300)
        assert r.status_code == 200, r.text
        local = causallm.load(str(folder))
        want = local.complete([{"role": "user", "content": [
            {"type": "image"}, {"type": "image"}, {"type": "text", "text": "What differs?"}]}],
            images=paths, greedy=True, max_new_tokens=8)
        assert r.json()["choices"][0]["message"]["content"] == want.text
        assert r.json()["usage"]["prompt_tokens"] == want.prompt_tokens > 32  # 2 x 16 image tokens
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="x", messages=messages, max_tokens=8, temperature=0, stream=True) if c.choices)
        assert streamed == want.text
        not_png = {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}
        bad = httpx.post(url + "/v1/chat/completions",
                         json={"messages": [{"role": "user", "content": [not_png]}]})
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "messages[0].content[0].image_url"
        # what a request's images would take is refused before any is decoded
        from PIL import Image

        huge = tmp_path / "huge.png"
        Image.new("1", (5000, 4000)).save(huge)  # 20 M pixels in a few kB
        bad = httpx.post(url + "/v1/chat/completions", json={"messages": [
            {"role": "user", "content": [part(huge)]}]})
        assert bad.status_code == 400
        assert bad.json()["error"]["message"] == \
            "messages[0].content[0].image_url: the image is 5000x4000, over 16777216 pixels"
        bad = httpx.post(url + "/v1/chat/completions", json={"messages": [
            {"role": "user", "content": [not_png] * 1000}]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
        assert "holds 1000 images; the model takes at most" in bad.json()["error"]["message"]
    finally:
        stop_server(proc)


@pytest.mark.slow
def test_a_text_model_refuses_images(server):
    data = base64.b64encode(open(os.path.join(ROOT, "tests", "fixtures", "images",
                                              "rgb-40x24.png"), "rb").read()).decode()
    r = httpx.post(server + "/v1/chat/completions", json={"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}]})
    assert r.status_code == 400 and "takes no images" in r.json()["error"]["message"]


@pytest.mark.slow
def test_an_assistant_call_with_null_content_is_accepted(qwen_template):
    """content null is OpenAI's form of an assistant message that only calls tools."""
    _, url = qwen_template
    messages = [QUESTION[0], {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 4},
                   timeout=300)
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_a_required_tool_call_is_forced_and_read_back(qwen_template):
    """tool_choice naming a function: the reply starts with the template's call marker and is
    held to the call's JSON (the function's parameters' schema), so even this random model
    calls it; streamed, the same call comes as one tool_calls delta."""
    _, url = qwen_template
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"], "additionalProperties": False}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    body = dict(model="x", messages=QUESTION, max_tokens=200, temperature=0, tools=tools,
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    r = client.chat.completions.create(**body)
    call, = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    deltas = [d for c in client.chat.completions.create(**body, stream=True) if c.choices
              for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == \
        [(call.function.name, json.loads(call.function.arguments))]
    with pytest.raises(openai.BadRequestError) as e:  # names a tool not declared
        client.chat.completions.create(**{**body, "tool_choice": {
            "type": "function", "function": {"name": "nope"}}})
    assert e.value.body["param"] == "tool_choice.function.name"


@pytest.mark.slow
def test_response_format_holds_the_answer_to_the_schema(client, local):
    """json_schema: the answer parses and validates (a random model's, so only the constraint
    makes it JSON), as the Python API's does, streamed too; a schema that is not one is a 400."""
    schema = {"type": "object", "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["answer", "score"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}}
    body = dict(model="x", messages=QUESTION, max_tokens=60, temperature=0, response_format=fmt)
    r = client.chat.completions.create(**body)
    value = json.loads(r.choices[0].message.content)
    assert value["answer"] in ("yes", "no") and 0 <= value["score"] <= 9
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == local.complete(
        QUESTION, greedy=True, max_new_tokens=60, response_format=fmt).text
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(**body, stream=True) if c.choices)
    assert streamed == r.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**{**body, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}})
    assert e.value.body["param"] == "response_format"


# ------------------------------------------------------------------------------ faults
@pytest.fixture(scope="module")
def t5_server(tmp_path_factory):
    """An encoder-decoder (the one worker's path), logging at info -> (base URL, log path)."""
    log_path = tmp_path_factory.mktemp("t5") / "server.log"
    proc, url = start_server(T5, log_path, "-n", "1500", "--log-level", "info")
    yield url, log_path
    stop_server(proc)


@pytest.mark.slow
def test_a_client_hanging_up_mid_request_is_one_log_line(t5_server):
    """Headers and part of a body, then the connection closes: one info line each, no
    traceback, and the server goes on."""
    url, log_path = t5_server
    port = int(url.rsplit(":", 1)[1])
    start = len(open(log_path).read())
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": \"hi")
    assert complete(url, prompt="hi", max_tokens=4, temperature=0)["choices"][0]["text"]
    for _ in range(100):
        log = open(log_path).read()[start:]
        if log.count("went away") >= 20:
            break
        time.sleep(0.1)
    assert log.count("INFO:     POST /v1/completions: the client went away before sending its "
                     "whole request") == 20
    assert "Traceback" not in log and "ERROR" not in log


@pytest.mark.slow
def test_a_prompt_too_long_is_refused_before_it_waits_its_turn(t5_server):
    """The one worker generates one request at a time; a prompt longer than the model takes
    is a 400 at once, while the generation ahead of it still runs (its [DONE] comes later)."""
    url, _ = t5_server
    events, started = [], threading.Event()

    def long_stream():
        with httpx.Client(timeout=300) as c:
            with c.stream("POST", url + "/v1/completions", json={**LONG, "stream": True}) as r:
                for line in r.iter_lines():
                    started.set()
                    if line == "data: [DONE]":
                        events.append("long stream done")

    thread = threading.Thread(target=long_stream)
    thread.start()
    assert started.wait(300)
    r = httpx.post(url + "/v1/completions", json={"prompt": "word " * 3000, "stream": True},
                   timeout=300)
    events.append("400")
    thread.join()
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "prompt"
    assert r.json()["error"]["message"] == \
        "the prompt has 3001 tokens but the model takes at most 2048"
    assert events == ["400", "long stream done"]


@pytest.mark.slow
def test_a_body_that_is_not_utf8_names_its_byte(server):
    body = b'{"messages": [{"role": "user", "content": "caf\xe9"}]}'
    r = httpx.post(server + "/v1/chat/completions", content=body,
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == \
        f"the request body is not valid UTF-8: byte 0xe9 at offset {body.index(0xe9)}"


@pytest.mark.slow
def test_errors_name_the_model_not_the_servers_paths(t5_server):
    url, _ = t5_server
    r = httpx.post(url + "/v1/chat/completions", json={"messages": QUESTION})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.startswith("t5-flan-short: the model has no chat template")
    assert message.endswith("send a prompt string to /v1/completions instead")  # a client's way
    assert ROOT not in message and os.path.basename(ROOT) not in message


@pytest.mark.slow
@pytest.mark.parametrize("model_dir,signals", [(TINY, 1), (T5, 1), (TINY, 2)],
                         ids=["scheduler", "one worker", "twice"])
def test_ctrl_c_stops_the_streams_in_flight_and_exits(tmp_path, model_dir, signals):
    """SIGINT while a long answer streams: the stream ends with a shutdown error event and
    the process exits 130 without a traceback (uvicorn alone would wait for the answer); a
    second SIGINT right after ends it at once."""
    context = ("-c", "1800") if model_dir == TINY else ()  # the decoder-only's context
    proc, url = start_server(model_dir, tmp_path / "server.log", "-n", "1500", *context)
    try:
        with httpx.Client(timeout=60) as c:
            with c.stream("POST", url + "/v1/completions", json={**LONG, "stream": True}) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
                for _ in range(signals):
                    proc.send_signal(signal.SIGINT)
                rest = []
                try:
                    rest.extend(lines)
                except httpx.RemoteProtocolError:  # the second signal may cut a chunk short
                    assert signals == 2
        assert proc.wait(10) == 130
    finally:
        stop_server(proc)
    log = open(tmp_path / "server.log").read()
    assert "Traceback" not in log and "CancelledError" not in log
    assert log.rstrip().endswith("interrupted")
    if signals == 1:
        assert rest[-4:] == [
            'data: {"error":{"message":"the server is shutting down","type":"server_error",'
            '"param":null,"code":"server_shutdown"}}', "", "data: [DONE]", ""]
        assert sum(line.startswith("data: {") for line in rest) < 1000  # cut short


@pytest.mark.slow
def test_a_port_in_use_is_found_before_the_model_loads(tmp_path):
    """The folder is not even read (an empty one here) when the port is taken."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = run_cli("serve", tmp_path, "--port", port, process=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr == (f"error: cannot listen on 127.0.0.1:{port}: the port is in use "
                        f"(another server?); choose another --port\n")
