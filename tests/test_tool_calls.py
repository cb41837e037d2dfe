"""OpenAI tool calls (causallm/tool_calls.py) against real chat templates and the formats'
published examples.

- Rendering: tests/fixtures/tool-calls.json (tools/fixtures_tool_calls.py) holds transformers'
  text of conversations with calls and results, written as its documentation shapes them, for
  the real templates of Qwen2.5, Qwen3, Hermes 3, Llama 3.1, Llama 3.2, Mistral Nemo, Mistral
  Small 3.2 and Ministral 3 (tests/data/chat_templates/). The same conversations as an OpenAI
  client sends them, through check_tools and prepare_messages and causallm.chat, must give that
  text, and raise where it raised.
- Reading back: the text a template writes after the generation prompt for an assistant's calls
  is what the model was trained to generate; parse_tool_calls must return those calls.
- Exact outputs from llama.cpp's tests/test-chat.cpp and vLLM's tool-parser tests (facts of each
  format), malformed ones staying content, and every stream cut giving the whole answer's result;
  the streamed deltas are accumulated by the ``openai`` client's own stream state.
- tool_call_schema's forced text: the templates' calls satisfy it (checked with jsonschema).
"""

import json
import os
import re

import pytest

from causallm.chat import ChatTemplate
from causallm.errors import CausalLMError
from causallm.tool_calls import (MISTRAL, ToolCallStream, ToolRequestError, check_tools,
                                 detect_family, finish_reason, parse_tool_calls,
                                 prepare_messages, tool_call_schema)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "tests", "fixtures", "tool-calls.json"), encoding="utf-8") as f:
    FIXTURE = json.load(f)
TEMPLATES = FIXTURE["templates"]
CASES = [(name, i) for name, t in TEMPLATES.items() for i in range(len(t["cases"]))]
TOOLS, _ = check_tools({"tools": FIXTURE["tools_openai"]})

FAMILY = {"hermes-3": "hermes", "qwen2.5": "hermes", "qwen3": "hermes", "llama-3.1": "llama3",
          "llama-3.2": "llama3", "mistral-nemo": "mistral", "ministral-3": "mistral_args",
          "mistral-small-3.2": "mistral_call_id"}
"""The family of every template folder that calls tools; the others have none we read."""
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "</s>")
QWEN3_EMPTY_THINKING = "<think>\n\n</think>\n\n"


@pytest.fixture(autouse=True)
def fixed_clock(chat_clock):
    chat_clock(FIXTURE["now"])


def template(name):
    return ChatTemplate.fromFolder(os.path.join(ROOT, TEMPLATES[name]["folder"]))


def bare(calls):
    """Calls without their ids: (name, arguments as a value)."""
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def streamed(text, family, cuts, tools=None):
    """``(content, calls, deltas)`` of ``text`` fed in the pieces ``cuts`` make."""
    stream = ToolCallStream(family, tools)
    deltas, start = [], 0
    for cut in [*cuts, len(text)]:
        deltas += stream.feed(text[start:cut])
        start = cut
    deltas += stream.finish()
    return stream.content, stream.calls, deltas


def assert_streams_agree(text, family, tools=None):
    """Cut once at every character boundary, and at all of them: the content and calls (ids
    too, when the model wrote them) equal the whole text's; the deltas say the same."""
    content, calls = parse_tool_calls(text, family, tools)
    model_ids = [c["id"] for c in calls] if family in ("mistral", "mistral_call_id") else None
    for cuts in [[i] for i in range(len(text) + 1)] + [list(range(1, len(text)))]:
        got_content, got_calls, deltas = streamed(text, family, cuts, tools)
        assert (got_content, bare(got_calls)) == (content, bare(calls)), cuts
        assert "".join(d.get("content", "") for d in deltas) == (content or "")
        assert [c for d in deltas for c in d.get("tool_calls", [])] == [
            {"index": k, **c} for k, c in enumerate(got_calls)]
        if model_ids is not None and [c["id"] for c in got_calls] != model_ids:
            # a model-written id is kept; a missing one is drawn fresh each time
            assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c["id"]) for c in got_calls)
    return content, calls


# -- check_tools --------------------------------------------------------------------------------
def test_check_tools_returns_the_tools_for_the_template():
    tools, choice = check_tools({"tools": FIXTURE["tools_openai"]})
    assert tools == FIXTURE["tools_hf"] and choice == "auto"  # parameters added where absent
    assert check_tools({}) == (None, "none")
    assert check_tools({"tools": [], "tool_choice": "auto"}) == (None, "auto")
    assert check_tools({"tools": tools, "tool_choice": "required"})[1] == "required"
    named = {"type": "function", "function": {"name": "get_time"}}
    assert check_tools({"tools": tools, "tool_choice": named})[1] == named


@pytest.mark.parametrize("body,param", [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": ["get_weather"]}, "tools[0]"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f" * 65}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]},
     "tools[0].function.description"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f"}},
                {"type": "function", "function": {"name": "f"}}]}, "tools[1].function.name"),
    ({"tool_choice": "any"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     "tool_choice.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"function": {"name": "f"}}}, "tool_choice"),
])
def test_check_tools_refuses_what_openai_refuses(body, param):
    with pytest.raises(ToolRequestError) as e:
        check_tools(body)
    assert e.value.param == param and isinstance(e.value, CausalLMError)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"'{param}")


# -- prepare_messages ---------------------------------------------------------------------------
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}


@pytest.mark.parametrize("messages,param", [
    ([{"role": "assistant", "tool_calls": {"id": "x"}}], "messages[0].tool_calls"),
    ([{"role": "assistant", "tool_calls": [{"id": "x", "type": "function"}]}],
     "messages[0].tool_calls[0]"),
    ([{"role": "assistant", "tool_calls": [{**CALL, "id": None}]}], "messages[0].tool_calls[0].id"),
    ([{"role": "assistant", "tool_calls": [{**CALL, "function": {"arguments": "{}"}}]}],
     "messages[0].tool_calls[0].function.name"),
    ([{"role": "assistant", "tool_calls": [{**CALL, "function": {
        "name": "f", "arguments": "{city: Paris}"}}]}],
     "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "assistant", "tool_calls": [{**CALL, "function": {
        "name": "f", "arguments": "[1, 2]"}}]}], "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "tool", "tool_call_id": "call_1", "content": "21"}], "messages[0].tool_call_id"),
    ([{"role": "assistant", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_2", "content": "21"}], "messages[1].tool_call_id"),
    ([{"role": "assistant", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": None}], "messages[1].content"),
])
def test_prepare_messages_refuses_malformed_calls(messages, param):
    with pytest.raises(ToolRequestError) as e:
        prepare_messages(messages)
    assert e.value.param == param and "\n" not in str(e.value)


def test_prepare_messages_leaves_its_input_alone():
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21"}]
    before = json.dumps(messages)
    out = prepare_messages(messages, "mistral")
    assert json.dumps(messages) == before
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert out[1]["content"] == "" and out[2]["name"] == "get_weather"
    assert re.fullmatch(r"[A-Za-z0-9]{9}", out[1]["tool_calls"][0]["id"])
    assert out[2]["tool_call_id"] == out[1]["tool_calls"][0]["id"]


@pytest.mark.slow
@pytest.mark.parametrize("name,i", CASES, ids=[f"{n}-{TEMPLATES[n]['cases'][i]['title']}"
                                               for n, i in CASES])
def test_openai_messages_render_as_transformers_renders_its_form(name, i):
    case = TEMPLATES[name]["cases"][i]
    chat = template(name)
    messages = prepare_messages(case["openai"], FAMILY[name])
    if "error" in case:
        with pytest.raises(CausalLMError):
            chat.render(messages, case["add_generation_prompt"], TOOLS)
    else:
        assert chat.render(messages, case["add_generation_prompt"], TOOLS) == case["expected"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mistral-nemo", "mistral-small-3.2"])
def test_mistral_templates_get_the_nine_character_ids_they_demand(name):
    """OpenAI-style ids (which these templates refuse) become 9 letters and digits, the same for
    a call and its result."""
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21"}]
    with pytest.raises(CausalLMError, match="Tool call IDs should be alphanumeric"):
        template(name).render(prepare_messages(messages), True, TOOLS)
    text = template(name).render(prepare_messages(messages, FAMILY[name]), True, TOOLS)
    call_id = prepare_messages(messages, FAMILY[name])[1]["tool_calls"][0]["id"]
    assert re.fullmatch(r"[A-Za-z0-9]{9}", call_id) and text.count(call_id) == 2


# -- the family ---------------------------------------------------------------------------------
def test_family_of_every_template_folder():
    folder = os.path.join(ROOT, "tests", "data", "chat_templates")
    names = sorted(n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n)))
    assert set(FAMILY) <= set(names)
    for name in names:
        chat = ChatTemplate.fromFolder(os.path.join(folder, name))
        assert detect_family(chat) == FAMILY.get(name), name
    assert detect_family(ChatTemplate.fromFolder(os.path.join(ROOT, "res", "tiny-llama"))) is None
    # Hermes 3's folder has a plain default template and the tool_use one: tools pick the latter
    hermes = ChatTemplate.fromFolder(os.path.join(folder, "hermes-3"))
    assert detect_family(hermes.templates["default"]) is None


# -- reading back what the templates write ------------------------------------------------------
REPLIES = [(name, i) for name, i in CASES
           if TEMPLATES[name]["cases"][i]["kind"] == "reply"
           and "expected" in TEMPLATES[name]["cases"][i]]


def reply_of(name, case):
    """The text after the generation prompt, without the end-of-turn token."""
    prompt, full = TEMPLATES[name]["prompt"], case["expected"]
    assert full.startswith(prompt)
    reply = full[len(prompt):].rstrip("\n")
    end = next(e for e in END_OF_TURN if reply.endswith(e))
    return reply[:-len(end)]


@pytest.mark.slow
@pytest.mark.parametrize("name,i", REPLIES, ids=[f"{n}-{TEMPLATES[n]['cases'][i]['title']}"
                                                 for n, i in REPLIES])
def test_the_calls_a_template_writes_are_read_back(name, i):
    case = TEMPLATES[name]["cases"][i]
    family, reply = FAMILY[name], reply_of(name, case)
    content, calls = assert_streams_agree(reply, family, TOOLS)
    sent = case["hf"][-1]
    assert bare(calls) == [(c["function"]["name"], c["function"]["arguments"])
                           for c in sent["tool_calls"]]
    if family in ("mistral", "mistral_call_id"):  # the model writes the ids
        assert [c["id"] for c in calls] == [c["id"] for c in sent["tool_calls"]]
    else:
        pattern = r"[A-Za-z0-9]{9}" if family in MISTRAL else r"call_[0-9a-f]{24}"
        assert all(re.fullmatch(pattern, c["id"]) and c["type"] == "function" for c in calls)
    expected = sent["content"] if sent["content"] and sent["content"] in reply else ""
    if reply.startswith(QWEN3_EMPTY_THINKING):
        expected = QWEN3_EMPTY_THINKING + expected
    assert content == (expected.rstrip() or None)


def test_fixture_holds_calls_of_every_family_and_content_before_them():
    families = {FAMILY[name] for name, _ in REPLIES}
    assert families == set(FAMILY.values())
    texts = [reply_of(n, TEMPLATES[n]["cases"][i]) for n, i in REPLIES]
    assert any(t.startswith("Let me check.[TOOL_CALLS]") for t in texts)  # Ministral 3
    assert any(t.startswith("Let me check.\n<tool_call>") for t in texts)  # Qwen2.5


# -- exact outputs of each format ---------------------------------------------------------------
SPECIAL = {"type": "function", "function": {"name": "special_function", "parameters": {
    "type": "object", "properties": {"arg1": {"type": "integer"}}, "required": ["arg1"]}}}
WITH_OPT = {"type": "function", "function": {"name": "special_function_with_opt"}}
ONE = ("special_function", {"arg1": 1})
TWO = ("special_function_with_opt", {"arg1": 1, "arg2": 2})
HELLO = "Hello, world!\nWhat's up?"
HERMES_CALL = '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>'

FORMATS = [  # (family, model output, content, calls); from llama.cpp's tests/test-chat.cpp
    ("hermes", HERMES_CALL, None, [ONE]),
    ("hermes", HELLO + "\n" + HERMES_CALL, HELLO, [ONE]),
    ("hermes", HERMES_CALL + "\n<tool_call>\n{\"name\": \"special_function_with_opt\", "
     "\"arguments\": {\"arg1\": 1, \"arg2\": 2}}\n</tool_call>", None, [ONE, TWO]),
    ("hermes", '<tool_call>\n{"name": "special_function", "arguments": {"arg', None, []),
    ("hermes", HELLO, HELLO, []),
    ("mistral", '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, '
     '"id": "123456789"}]', None, [ONE]),
    ("mistral_call_id", '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}',
     None, [ONE]),
    ("mistral_call_id", '[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
     '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}',
     None, [ONE, TWO]),
    ("mistral_args", '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', None, [ONE]),
    ("mistral_args", HELLO + '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', HELLO, [ONE]),
    # from vLLM's tests (tests/entrypoints/openai/tool_parsers/, tests/tool_use/)
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments":{"a": 3.5, "b": 4}}]', None,
     [("add", {"a": 3.5, "b": 4})]),
    ("llama3", '{"name": "searchTool", "parameters": {"query": "test query", "limit": 10}}',
     None, [("searchTool", {"query": "test query", "limit": 10})]),
    ("llama3", '{"name": "searchTool", "arguments": {"query": "test"}}', None,
     [("searchTool", {"query": "test"})]),
    ("llama3", '{"name": "searchTool", "parameters": {"query": "test1"}}; '
     '{"name": "getOpenIncidentsTool", "parameters": {}}; '
     '{"name": "searchTool", "parameters": {"query": "test2"}}', None,
     [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {}),
      ("searchTool", {"query": "test2"})]),
    ("llama3", '{"name": "searchTool", "parameters": {"query": "test1"}} ; '
     '{"name": "getOpenIncidentsTool", "parameters": {}}', None,
     [("searchTool", {"query": "test1"}), ("getOpenIncidentsTool", {})]),
    ("llama3", '{"name": "searchTool", "parameters": {"query": "test {value} [complex]",'
     '"nested": {"inner": "more {brackets}"}}}', None,
     [("searchTool", {"query": "test {value} [complex]", "nested": {"inner": "more {brackets}"}})]),
    ("llama3", '{"name": "parserTool", "parameters": {"text": "He said \\"Hello {world}\\""}}',
     None, [("parserTool", {"text": 'He said "Hello {world}"'})]),
    ("llama3", '{"name": "invalidTool", "parameters": {invalid json}', None, []),
    ("llama3", "This is just some text without any tool calls", None, []),
    # Llama 3 may put <|python_tag|> before its JSON (vLLM's llama3_json parser)
    ("llama3", '<|python_tag|>{"name": "special_function", "parameters": {"arg1": 1}}', None,
     [ONE]),
]


@pytest.mark.slow
@pytest.mark.parametrize("family,text,content,calls", FORMATS)
def test_exact_outputs_of_each_format(family, text, content, calls):
    got_content, got_calls = assert_streams_agree(text, family)
    assert bare(got_calls) == calls
    assert got_content == (text if not calls else content)
    for call in got_calls:  # arguments as OpenAI sends them: the object's JSON text
        assert call["function"]["arguments"] == json.dumps(
            json.loads(call["function"]["arguments"]), ensure_ascii=False)
    if family == "mistral_call_id":
        assert [c["id"] for c in got_calls] == re.findall(r"\[CALL_ID\](\w+)", text)


NOT_CALLS = [  # (family, text): each stays content, exactly
    ("hermes", '<tool_call>\n{"name": "special_function", "arguments": {bad}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"x": NaN}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"arguments": {}}\n</tool_call>'),
    ("hermes", "Use <tool_call> tags: <tool_call>\nnot JSON\n</tool_call> end"),
    ("llama3", '{"answer": 42}'),
    ("llama3", 'Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} ok?'),
    ("llama3", '<|python_tag|>brave_search.call(query="weather")'),
    ("llama3", '{"name": "f", "parameters": {}, "arguments": {}}'),
    ("mistral", "[TOOL_CALLS][]"),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}'),
    ("mistral_args", '[TOOL_CALLS]special_function[ARGS]{"arg1": }'),
    ("mistral_args", "[TOOL_CALLS] special_function[ARGS]{}"),
    ("mistral_args", "[TOOL_CALLS]special_function{}"),
    ("mistral_call_id", '[TOOL_CALLS]special_function[CALL_ID][ARGS]{"arg1": 1}'),
]


@pytest.mark.parametrize("family,text", NOT_CALLS)
def test_what_is_not_a_call_stays_content(family, text):
    assert assert_streams_agree(text, family) == (text, [])


def test_text_around_calls_is_kept_and_whitespace_touching_them_is_not():
    text = f"Checking.  \n{HERMES_CALL}\n\n{HERMES_CALL}\nDone. \n"
    content, calls = assert_streams_agree(text, "hermes")
    assert content == "Checking.  \nDone. \n" and bare(calls) == [ONE, ONE]
    assert assert_streams_agree(f"{HERMES_CALL}\n\nDone.", "hermes")[0] == "Done."
    text = ' {"name": "special_function", "parameters": {"arg1": 1}} \nThat is all.'
    assert assert_streams_agree(text, "llama3")[0] == "That is all."
    assert assert_streams_agree("  Hello  ", "llama3") == ("  Hello  ", [])


def test_calls_of_undeclared_tools_stay_content():
    tools = [SPECIAL, WITH_OPT]
    assert bare(assert_streams_agree(HERMES_CALL, "hermes", tools)[1]) == [ONE]
    other = HERMES_CALL.replace("special_function", "rm_rf")
    assert assert_streams_agree(other, "hermes", tools) == (other, [])
    text = '[TOOL_CALLS]rm_rf[ARGS]{"arg1": 1}'
    assert assert_streams_agree(text, "mistral_args", tools) == (text, [])


def test_content_is_given_at_once_and_a_possible_call_is_held():
    stream = ToolCallStream("hermes")
    assert stream.feed("Sure, ") == [{"content": "Sure,"}]  # the space waits: a call may follow
    assert stream.feed("I will <tool") == [{"content": " I will"}]
    assert stream.feed("_call>\n{\"name\": \"special_function\", ") == []
    (delta,) = stream.feed('"arguments": {"arg1": 1}}\n</tool_call>')
    assert delta["tool_calls"][0]["index"] == 0 and delta["tool_calls"][0]["function"] == {
        "name": "special_function", "arguments": '{"arg1": 1}'}
    assert stream.finish() == [] and stream.content == "Sure, I will"
    stream = ToolCallStream("llama3")
    assert stream.feed('{"answer": ') == []  # the reply's first '{' may open a call
    assert "".join(d["content"] for d in stream.feed("42} and")) == '{"answer": 42} and'
    stream = ToolCallStream(None)
    assert stream.feed("<tool_call>") == [{"content": "<tool_call>"}]


def test_the_openai_client_accumulates_the_deltas_into_the_same_message():
    openai_streaming = pytest.importorskip("openai.lib.streaming.chat")
    from openai.types.chat import ChatCompletionChunk

    text = f"Checking.\n{HERMES_CALL}\n" + HERMES_CALL.replace('"arg1": 1', '"arg1": 2')
    stream = ToolCallStream("hermes")
    deltas = [{"role": "assistant", "content": ""}]
    for i in range(0, len(text), 3):
        deltas += stream.feed(text[i:i + 3])
    deltas += stream.finish()
    state = openai_streaming.ChatCompletionStreamState()
    reason = finish_reason(stream.calls, "stop")
    for k, delta in enumerate(deltas + [{}]):
        state.handle_chunk(ChatCompletionChunk.model_validate({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": reason if k == len(deltas) else None}]}))
    choice = state.get_final_completion().choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == stream.content == "Checking."
    assert [{"id": c.id, "type": c.type, "function": {"name": c.function.name,
                                                      "arguments": c.function.arguments}}
            for c in choice.message.tool_calls] == stream.calls
    assert bare(stream.calls) == [ONE, ("special_function", {"arg1": 2})]


def test_finish_reason_and_families():
    assert finish_reason([{}], "stop") == "tool_calls"
    assert finish_reason([{}], "length") == "length" and finish_reason([], "stop") == "stop"
    with pytest.raises(ValueError, match="unknown tool-call family 'qwen'"):
        ToolCallStream("qwen")
    assert parse_tool_calls(HERMES_CALL, None) == (HERMES_CALL, [])


# -- forcing a call ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FAMILY))
def test_a_forced_call_is_the_text_the_template_writes(name):
    """The template's one-call reply, after any text before the call, is prefix + JSON + suffix
    with the JSON satisfying the schema; a call of another tool does not."""
    jsonschema = pytest.importorskip("jsonschema")
    family = FAMILY[name]
    case = next(c for c in TEMPLATES[name]["cases"] if c["title"] == "reply: 1 call")
    reply = reply_of(name, case)
    named = {"type": "function", "function": {"name": "get_weather"}}
    forced = tool_call_schema(TOOLS, named, family)
    prefix = forced.prefix
    if family == "mistral_call_id":  # a fresh id in the prefix; the template wrote its own
        assert re.fullmatch(r"\[TOOL_CALLS\]get_weather\[CALL_ID\][A-Za-z0-9]{9}\[ARGS\]", prefix)
        prefix = re.sub(r"(?<=\[CALL_ID\])\w+", case["hf"][-1]["tool_calls"][0]["id"], prefix)
    start = reply.index(prefix) if prefix else len(reply) - len(reply.lstrip())
    assert reply.endswith(forced.suffix)
    body = json.loads(reply[start + len(prefix):len(reply) - len(forced.suffix)])
    jsonschema.validate(body, forced.schema)
    assert bare(parse_tool_calls(forced.prefix + json.dumps(body) + forced.suffix, family,
                                 TOOLS)[1]) == [("get_weather", {"city": "Zürich",
                                                                 "unit": "celsius"})]
    other = tool_call_schema(TOOLS, {"type": "function", "function": {"name": "get_time"}},
                             family)
    if family not in ("mistral_args", "mistral_call_id"):  # there the name is in the prefix
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(body, other.schema)
        jsonschema.validate(body, tool_call_schema(TOOLS, "required", family).schema)
    else:
        assert other.prefix.startswith("[TOOL_CALLS]get_time")
        assert tool_call_schema(TOOLS, "required", family) is None  # two tools: no schema names
        assert tool_call_schema(TOOLS[:1], "required", family).prefix.startswith(
            "[TOOL_CALLS]get_weather")
    assert tool_call_schema(TOOLS, "auto", family) is None
    assert tool_call_schema(TOOLS, "none", family) is None
