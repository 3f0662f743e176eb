"""The inference agent's tools, and the two renderings of a session's history.

The history is kept structured, in OpenAI's chat shape: `user` messages, `assistant` messages (a `content`
text, or one call in `tool_calls`) and `tool` results (`tool_call_id`, `name`, `content`; `invalid: True`
when they answer arguments that did not parse). The local backend renders it as ChatML in the
`chatml-function-calling` style (`chatml_messages`, `render_chatml`); the endpoint backend sends it as OpenAI
messages with the tools as function tools (`openai_messages`, `openai_tools`).

Local tool calls are grammar-constrained: the model first picks `functions.<name>:`
or `message:` (a grammar over exactly those heads), then writes the arguments
under a grammar built from the tool's JSON schema. `maxLength` on every
string keeps a small model from writing until its token budget runs out.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "ACTION_TOOLS",
    "INSTRUCTIONS",
    "NOT_CARRIED_OUT",
    "NOT_JSON",
    "TOOLS",
    "chatml_messages",
    "head_grammar_text",
    "openai_messages",
    "openai_tools",
    "render_chatml",
    "system_prompt",
]

TOOLS: dict[str, dict[str, Any]] = {
    "write_file": {
        "description": "Create or overwrite a text file in the workspace.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "maxLength": 80, "description": "path relative to the workspace"},
                "content": {"type": "string", "maxLength": 240},
            },
            "required": ["path", "content"],
        },
    },
    "read_file": {
        "description": "Read a text file from the workspace.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "maxLength": 80}},
            "required": ["path"],
        },
    },
    "run_command": {
        "description": "Run a shell command in the workspace.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "maxLength": 160}},
            "required": ["command"],
        },
    },
    "finish": {
        "description": "Say that the task is done, with a short summary.",
        "parameters": {
            "type": "object",
            "properties": {"summary": {"type": "string", "maxLength": 200}},
            "required": ["summary"],
        },
    },
}
#: The tools carried out through the client (fs/*, terminal/*) after a permission request.
ACTION_TOOLS = ("write_file", "read_file", "run_command")


#: What the agent is: the system message an endpoint gets (its server's chat template shows the tools).
INSTRUCTIONS = "You are a coding agent working in a git workspace. Do the task with the tools."
#: What the model is told when it called a tool with arguments that do not parse.
NOT_JSON = "Those arguments are not valid JSON."
#: The result an endpoint is shown for a call the turn ended on (a refusal, a cancel) before it was carried out.
NOT_CARRIED_OUT = "not carried out: the turn ended first"


def system_prompt(tools: dict[str, dict[str, Any]]) -> str:
    """The local system message: what the agent is, and its tools in the chatml-function-calling style."""
    listed = "\n".join(
        f"functions.{name}:\n{spec['description']}\n{json.dumps(spec['parameters'])}" for name, spec in tools.items()
    )
    return (
        INSTRUCTIONS
        + "\n\n# Tools\n"
        + listed
        + "\n\nTo call a tool, begin with 'functions.<name>:' and then its JSON arguments. "
        "To reply in text, begin with 'message:'."
    )


def head_grammar_text(names: list[str] | None = None) -> str:
    """GBNF for the first tokens of a reply: a tool head, or a plain message."""
    heads = " | ".join(f'"functions.{name}:"' for name in names or TOOLS)
    return f'root ::= functions | "message:"\nfunctions ::= {heads}\n'


def render_chatml(messages: list[dict[str, str]]) -> str:
    """ChatML, ending with the open assistant turn the model completes."""
    body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return body + "<|im_start|>assistant\n"


def chatml_messages(history: list[dict[str, Any]], tools: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """The local rendering: the system prompt, then each message as the chatml-function-calling text the
    model reads and writes (`functions.<name>:` + arguments, `message:` + text, a result as a user message)."""
    out = [{"role": "system", "content": system_prompt(tools)}]
    for message in history:
        role, content = message["role"], message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            function = message["tool_calls"][0]["function"]
            out.append({"role": "assistant", "content": f"functions.{function['name']}:\n{function['arguments']}"})
        elif role == "assistant":
            out.append({"role": "assistant", "content": f"message:\n{content}"})
        elif role == "tool":
            said = content if message.get("invalid") else f"Result of {message['name']}: {content}"
            out.append({"role": "user", "content": said})
        else:
            out.append({"role": role, "content": content})
    return out


def openai_tools(tools: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools as OpenAI function tools."""
    return [{"type": "function", "function": {"name": name, "description": spec["description"],
                                              "parameters": spec["parameters"]}}
            for name, spec in tools.items()]  # fmt: skip


def openai_messages(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The endpoint rendering: the instructions as the system message, then the history as OpenAI messages,
    each with only the keys the API defines. Every call gets its result: one the turn ended on is answered
    `NOT_CARRIED_OUT`, and a result whose call the history window dropped is dropped too (strict servers
    refuse either)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": INSTRUCTIONS}]
    calls: set[str] = set()
    answered = {m.get("tool_call_id") for m in history if m["role"] == "tool"}
    for message in history:
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            made = [{"id": c["id"], "type": "function",
                     "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                    for c in message["tool_calls"]]  # fmt: skip
            out.append({"role": "assistant", "content": "", "tool_calls": made})  # null: llama-cpp-python refuses it
            calls.update(c["id"] for c in made)
            out += [{"role": "tool", "tool_call_id": c["id"], "content": NOT_CARRIED_OUT}
                    for c in made if c["id"] not in answered]  # fmt: skip
        elif role == "tool":
            if message["tool_call_id"] in calls:
                out.append({"role": "tool", "tool_call_id": message["tool_call_id"], "content": message["content"]})
        else:
            out.append({"role": role, "content": message.get("content") or ""})
    return out
