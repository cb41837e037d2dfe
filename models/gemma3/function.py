"""The FunctionGemma chat format (Applications/CausalLM/models/gemma3/function.cpp).

``apply_function_gemma_template(chat_input)`` turns nntr_config's ``chat_input``
(``{"messages": [...], "tools": [...]}``, OpenAI-style) into the prompt text:

    <bos>
    per message (role "assistant" is written "model"):
        not a tool message:  <start_of_turn>{role}\\n + content (when it is a string)
        first developer/system message: every tool as
            <start_function_declaration>declaration:{name},description:<escape>{d}<escape>,
              parameters:{properties:{...},required:[...],type:<escape>OBJECT<escape>}
            <end_function_declaration>
        tool_calls:          <start_function_call>call:{name}{k:v,...}<end_function_call>
        not a tool message:  <end_of_turn>\\n
        a tool message:      <start_function_response>response:{name}{value:{content}}
                             <end_function_response>
    <start_of_turn>model\\n

A parameter is ``key:{description:<escape>..<escape>,type:<escape>UPPER<escape>,
properties:{...},required:[...]}`` (each part only when present, nested properties recursively).
Object keys come out in sorted order, as the C++ (nlohmann::json objects are ordered maps)
writes them; a non-string argument or tool result is compact JSON.
"""

from __future__ import annotations

import orjson

from causallm.errors import CausalLMError


def escape_value(value) -> str:
    return f"<escape>{_string(value, 'a string value')}<escape>"


def _string(value, what: str) -> str:
    if not isinstance(value, str):
        raise CausalLMError(f"chat_input: expected {what}, got {value!r}")
    return value


def _object(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise CausalLMError(f"chat_input: expected {what} to be an object, got {value!r}")
    return value


def _list(value, what: str) -> list:
    if not isinstance(value, list):
        raise CausalLMError(f"chat_input: expected {what} to be a list, got {value!r}")
    return value


def format_parameters(properties: dict) -> str:
    """``key:{description:..,type:..,properties:{..},required:[..]}`` per property, joined
    by commas."""
    entries = []
    for key, val in sorted(_object(properties, "'properties'").items()):
        val = _object(val, f"property '{key}'")
        parts = []
        if "description" in val:
            parts.append(f"description:{escape_value(val['description'])}")
        if "type" in val:
            parts.append(f"type:{escape_value(_string(val['type'], 'a type name').upper())}")
        if "properties" in val:
            parts.append(f"properties:{{{format_parameters(val['properties'])}}}")
        if "required" in val:
            required = ",".join(escape_value(r) for r in _list(val["required"], "'required'"))
            parts.append(f"required:[{required}]")
        entries.append(f"{key}:{{{','.join(parts)}}}")
    return ",".join(entries)


def format_function_declaration(tool: dict) -> str:
    """``declaration:{name},description:<escape>..<escape>,parameters:{...}`` of one tool."""
    tool = _object(tool, "a tool")
    if "function" not in tool:
        return ""
    func = _object(tool["function"], "a tool's 'function'")
    out = (f"declaration:{_string(func.get('name', ''), 'a function name')},"
           f"description:{escape_value(func.get('description', ''))},parameters:{{")
    if "parameters" in func:
        params = _object(func["parameters"], "'parameters'")
        if "properties" in params:
            out += f"properties:{{{format_parameters(params['properties'])}}},"
        if "required" in params:
            required = ",".join(escape_value(r) for r in _list(params["required"], "'required'"))
            out += f"required:[{required}],"
        if "type" in params:
            out += f"type:{escape_value(_string(params['type'], 'a type name').upper())}"
    return out + "}"


def format_argument_value(value) -> str:
    """A string as it is, anything else as compact JSON with sorted keys."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def apply_function_gemma_template(chat_input: dict) -> str:
    """The FunctionGemma prompt of ``chat_input`` (see the module docstring)."""
    chat_input = _object(chat_input, "chat_input")
    if "messages" not in chat_input:
        raise CausalLMError("chat_input: missing key 'messages' (a list of {role, content})")
    tools = _list(chat_input["tools"], "'tools'") if "tools" in chat_input else None
    prompt = ["<bos>"]
    tools_inserted = False
    for message in _list(chat_input["messages"], "'messages'"):
        message = _object(message, "a message")
        role = _string(message.get("role", ""), "a role name")
        if role == "assistant":
            role = "model"
        if role != "tool":
            prompt.append(f"<start_of_turn>{role}\n")
        if isinstance(message.get("content"), str):
            prompt.append(message["content"])
        if not tools_inserted and tools is not None and role in ("developer", "system"):
            for tool in tools:
                prompt.append(f"<start_function_declaration>{format_function_declaration(tool)}"
                              f"<end_function_declaration>")
            tools_inserted = True
        for call in _list(message.get("tool_calls") or [], "'tool_calls'"):
            call = _object(call, "a tool call")
            func = _object(call.get("function"), "a tool call's 'function'")
            name = _string(func.get("name"), "a function name")
            prompt.append(f"<start_function_call>call:{name}{{")
            args = func.get("arguments")
            if isinstance(args, dict):
                prompt.append(",".join(f"{k}:{format_argument_value(v)}"
                                       for k, v in sorted(args.items())))
            elif isinstance(args, str):
                prompt.append(args)
            prompt.append("}<end_function_call>")
        if role != "tool":
            prompt.append("<end_of_turn>\n")
        elif "content" in message:
            name = _string(message.get("name", ""), "a tool name")
            content = format_argument_value(message["content"])
            prompt.append(f"<start_function_response>response:{name}{{value:{content}}}"
                          f"<end_function_response>")
    prompt.append("<start_of_turn>model\n")
    return "".join(prompt)


def function_gemma_prompt(chat_input: dict, tokenizer) -> str:
    """``apply_function_gemma_template(chat_input)`` for ``CausalLM.run``, which lets the
    tokenizer add its own special tokens: when ``tokenizer`` (a causallm Tokenizer) already
    puts ``<bos>`` first by itself (Gemma's tokenizer.json does), the template's literal
    ``<bos>`` is dropped, so the prompt encodes with one BOS as transformers'
    ``apply_chat_template`` gives (the C++ encodes without special tokens: docs/nntrainer.md,
    "Prompt encoding without special tokens")."""
    prompt = apply_function_gemma_template(chat_input)
    bos = tokenizer.Encode("<bos>", add_special_tokens=False)
    if len(bos) == 1 and tokenizer.Encode("")[:1] == bos:
        prompt = prompt[len("<bos>"):]
    return prompt
