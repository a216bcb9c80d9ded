"""Tool calling: `tools` and `tool_choice` to a grammar over the chat template's call format, and
the reply's text back to `tool_calls`.

Two formats, chosen by the chat template: Qwen2.5's (Hermes) `<tool_call>\\n{"name": ...,
"arguments": {...}}\\n</tool_call>` blocks when the template speaks of `<tool_call>`, else Llama 3's
bare JSON object `{"name": ..., "parameters": {...}}`. `required` and a named function constrain
the whole reply to calls whose arguments match the tool's JSON schema (compact JSON); `auto`
constrains a call's arguments once one is opened, where `<tool_call>` is one token of the
vocabulary (free text cannot spell it, so the grammar knows when a call begins), and leaves the
reply free otherwise; `none` constrains nothing. Calls are parsed from the finished text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from speculant.sampling.structured import StructuredOutput

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolRequest:
    functions: dict[str, dict]  # name -> its JSON schema of parameters
    choice: str  # "none", "auto", "required" or a function's name
    hermes: bool  # the Qwen2.5 format (else Llama 3's)
    single_token_tags: bool  # <tool_call> and </tool_call> are tokens of the vocabulary

    @property
    def arguments_key(self) -> str:
        return "arguments" if self.hermes else "parameters"


def tool_format(tokenizer) -> tuple[bool, bool]:
    """(Hermes format, its tags single tokens) of the model's chat template; read once per server."""
    template = getattr(tokenizer, "chat_template", None) or ""
    hermes = HERMES_OPEN in template
    tags = hermes and all(len(tokenizer.encode(t, add_special_tokens=False)) == 1 for t in (HERMES_OPEN, HERMES_CLOSE))
    return hermes, tags


def tool_request(tools: list[dict] | None, tool_choice: str | dict | None, fmt: tuple[bool, bool]) -> ToolRequest | None:
    """The request's tools; ValueError naming `tools` or `tool_choice` when malformed."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise ValueError("tool_choice: needs tools")
        return None
    functions = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"tools: tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}")
        parameters = fn.get("parameters") or {"type": "object"}
        if not isinstance(parameters, dict):
            raise ValueError(f"tools: tools[{i}].function.parameters must be a JSON schema object")
        functions[fn["name"]] = parameters
    return ToolRequest(functions, _choice(tool_choice, functions), *fmt)


def _choice(tool_choice: str | dict | None, functions: dict) -> str:
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise ValueError(f"tool_choice must be 'none', 'auto', 'required' or a function, got {tool_choice!r}")
        return tool_choice
    name = (tool_choice.get("function") or {}).get("name") if tool_choice.get("type") == "function" else None
    if name not in functions:
        raise ValueError(f"tool_choice names no function of tools: {name!r}")
    return name


def tool_constraint(req: ToolRequest) -> StructuredOutput | None:
    """The grammar of the reply, or None where it is free."""
    if req.choice == "none" or (req.choice == "auto" and not req.single_token_tags):
        return None
    names = list(req.functions) if req.choice in ("auto", "required") else [req.choice]
    call = {"anyOf": [_call_schema(req, n) for n in names], "x-guidance": {"whitespace_flexible": False}}
    if not req.hermes:
        return StructuredOutput.json_schema(call)
    open_, close = ("<tool_call>", "</tool_call>") if req.single_token_tags else ('"<tool_call>"', '"</tool_call>"')
    calls = "call" if req.choice not in ("auto", "required") else 'call ("\\n" call)*'
    start = f"start: TEXT | TEXT? {calls}\nTEXT: /(?s:.+)/" if req.choice == "auto" else f"start: {calls}"
    return StructuredOutput("grammar", f'{start}\ncall: {open_} "\\n" body "\\n" {close}\nbody: %json {json.dumps(call)}')


def _call_schema(req: ToolRequest, name: str) -> dict:
    properties = {"name": {"const": name}, req.arguments_key: req.functions[name]}
    return {"type": "object", "properties": properties, "required": ["name", req.arguments_key], "additionalProperties": False}


def extract_calls(req: ToolRequest, text: str) -> tuple[str | None, list[dict]]:
    """(the reply's content, its tool calls in the OpenAI shape); no calls: the text as content."""
    found = [m.group(1) for m in _HERMES_CALL.finditer(text)] if req.hermes else [text.strip().removeprefix("<|python_tag|>")]
    calls = [c for c in (_call(req, raw) for raw in found) if c is not None]
    if not calls:
        return text, []
    content = _HERMES_CALL.sub("", text).strip() if req.hermes else ""
    return content or None, calls


def _call(req: ToolRequest, raw: str) -> dict | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in req.functions:
        return None
    arguments = value.get(req.arguments_key, value.get("arguments", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": value["name"], "arguments": json.dumps(arguments)}}
