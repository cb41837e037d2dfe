"""Make tests/fixtures/tool-calls.json: transformers' text of conversations with tool calls, for
every template folder under tests/data/chat_templates/ whose template calls tools.

Each conversation is written twice, by hand: as an OpenAI client sends it (a call's
``arguments`` a JSON string, an assistant message with calls and ``content: null``, a tool
result without ``name``, a function without ``parameters``) and in the form transformers'
chat-template documentation gives (``arguments`` the object, ``content: ""``, the result's
``name``, every function with a ``parameters`` schema). The HF form is rendered with
``apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False)`` on the
folder loaded as tools/fixtures_chat.py loads it (same fixed clock); a template that raises is
recorded as ``{"error": ...}``. The OpenAI form is what tests/test_tool_calls.py turns into the HF
form (causallm.tool_calls.prepare_messages / check_tools) before rendering with causallm.chat.

Two kinds of cases:

- ``history``: a user turn, the assistant's calls, their results, then the generation prompt
  (the prompt of the turn after the calls);
- ``reply``: a user turn and the assistant's calls with ``add_generation_prompt`` false, and
  ``prompt``, the user turn with it true: the text after the prompt is the reply the model was
  trained to write for those calls, which the parser must read back.

Usage:  python tools/fixtures_tool_calls.py [--out tests/fixtures/tool-calls.json]
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from fixtures_chat import (DATA, NOW, ROOT, WEATHER, fixed_clock, render,  # noqa: E402
                           report, tokenizer_of, write)

FOLDERS = ("hermes-3", "llama-3.1", "llama-3.2", "ministral-3", "mistral-nemo",
           "mistral-small-3.2", "qwen2.5", "qwen3")
"""The template folders whose templates call tools in a format causallm.tool_calls reads."""

CLOCK_OPENAI = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in UTC."}}
CLOCK_HF = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in UTC.",
    "parameters": {"type": "object", "properties": {}}}}
TOOLS_OPENAI = [WEATHER, CLOCK_OPENAI]
TOOLS_HF = [WEATHER, CLOCK_HF]

USER = {"role": "user", "content": "Weather in Zürich, and the time?"}
CALLS = [  # (id, name, arguments as an object, the same as an OpenAI client's JSON string)
    ("a1B2c3D4e", "get_weather", {"city": "Zürich", "unit": "celsius"},
     '{"city": "Z\\u00fcrich", "unit": "celsius"}'),
    ("Z9y8X7w6V", "get_time", {}, "{}"),
]
RESULTS = ['{"temperature": 21, "sky": "clear"}', '"12:30"']


def assistant(calls, content, shape: str) -> dict:
    """An assistant turn making ``calls``; no text is ``null`` for OpenAI, ``""`` for HF."""
    return {"role": "assistant", "content": content if shape == "hf" else content or None,
            "tool_calls": [{"id": i, "type": "function",
                            "function": {"name": n, "arguments": a if shape == "hf" else s}}
                           for i, n, a, s in calls]}


def results(calls, shape: str) -> list[dict]:
    """The calls' results; HF's carry the function's name (OpenAI's do not)."""
    return [{"role": "tool", "tool_call_id": i, "content": r,
             **({"name": n} if shape == "hf" else {})}
            for (i, n, _, _), r in zip(calls, RESULTS)]


def cases() -> list[dict]:
    out = []
    for k in (1, 2):
        calls = CALLS[:k]
        for content in ("", "Let me check."):
            title = f"{k} call{'s' if k > 1 else ''}" + (" after text" if content else "")
            out.append({"title": f"reply: {title}", "kind": "reply",
                        "openai": [USER, assistant(calls, content, "openai")],
                        "hf": [USER, assistant(calls, content, "hf")],
                        "add_generation_prompt": False})
        out.append({"title": f"history: {k} call{'s' if k > 1 else ''} and results",
                    "kind": "history",
                    "openai": [USER, assistant(calls, "", "openai"), *results(calls, "openai")],
                    "hf": [USER, assistant(calls, "", "hf"), *results(calls, "hf")],
                    "add_generation_prompt": True})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "tool-calls.json"))
    args = ap.parse_args(argv)

    import transformers

    out = {"transformers_version": transformers.__version__, "now": NOW.isoformat(),
           "tools_openai": TOOLS_OPENAI, "tools_hf": TOOLS_HF, "templates": {}}
    with fixed_clock():
        for name in FOLDERS:
            folder = os.path.join(DATA, name)
            tok = tokenizer_of(folder)
            prompt = {"title": "prompt", "hf": [USER], "add_generation_prompt": True}
            render(tok, prompt, [USER], TOOLS_HF, True, {})
            rendered = []
            for case in cases():
                render(tok, case, case["hf"], TOOLS_HF, case["add_generation_prompt"], {})
                rendered.append(case)
            out["templates"][name] = {"folder": os.path.relpath(folder, ROOT),
                                      "prompt": prompt["expected"], "cases": rendered}
            report(name, rendered)
    write(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
