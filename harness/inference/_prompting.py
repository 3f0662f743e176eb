"""The inference agent's tools and its ChatML prompt, in the `chatml-function-calling` style.

Tool calls are grammar-constrained: the model first picks `functions.<name>:`
or `message:` (a grammar over exactly those heads), then writes the arguments
under a grammar built from the tool's JSON schema. `maxLength` on every
string keeps a small model from writing until its token budget runs out.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ACTION_TOOLS", "TOOLS", "head_grammar_text", "render_chatml", "system_prompt"]

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


def system_prompt(tools: dict[str, dict[str, Any]]) -> str:
    """The system message: what the agent is, and its tools in the chatml-function-calling style."""
    listed = "\n".join(
        f"functions.{name}:\n{spec['description']}\n{json.dumps(spec['parameters'])}" for name, spec in tools.items()
    )
    return (
        "You are a coding agent working in a git workspace. Do the task with the tools.\n\n# Tools\n"
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
