"""The script a fake model API plays: a YAML list of replies, each a list of items, the same file for both APIs.

    - - shell: python3 -m pytest -q     # reply 1: call the shell tool the request offers
    - - say: The tests pass.             # reply 2: an assistant message; the turn ends
      - tool: Write                       #   (any tool by name, with its input as the API takes it)
        input: {file_path: notes.txt, content: "done\\n"}

Reply N answers the agent's N-th model request (for the Messages API: the N-th that offers the `Bash` tool);
a reply that calls a tool asks for another request, which the next reply answers. A request past the last reply
gets an empty assistant message, which ends the turn.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError, model_validator

__all__ = ["KINDS", "Script", "ScriptError", "ScriptItem", "ScriptSource", "as_script", "load_script", "parse_script"]

#: The item kinds, each a key of its own.
KINDS = ("say", "shell", "tool")

_SHAPE = (
    "a script is a list of replies, each a list of items: {say: TEXT}, {shell: COMMAND}, {tool: NAME, input: {...}}"
)


class ScriptError(ValueError):
    """A script that cannot be played; the message names the file, the reply, the item and the key."""


class ScriptItem(BaseModel):
    """One item of a reply: exactly one of `say`, `shell` or `tool` (with `input` only beside `tool`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    say: str | None = None
    shell: Annotated[str, Field(min_length=1)] | None = None
    tool: Annotated[str, Field(min_length=1)] | None = None
    input: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ScriptItem:
        given = [kind for kind in KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(f"an item has exactly one of say, shell or tool (got {', '.join(given) or 'none'})")
        if self.input is not None and self.tool is None:
            raise ValueError("input goes with tool only")
        return self

    @property
    def kind(self) -> Literal["say", "shell", "tool"]:
        return "say" if self.say is not None else "shell" if self.shell is not None else "tool"


class Script(RootModel[Annotated[list[Annotated[list[ScriptItem], Field(min_length=1)]], Field(min_length=1)]]):
    """The replies, in order."""

    @property
    def replies(self) -> list[list[ScriptItem]]:
        return self.root


#: What a caller may hand over as a script: a `Script`, a script file's path, or the replies as data.
ScriptSource = Script | str | os.PathLike[str] | Sequence[Sequence[Mapping[str, Any]]]


def _where(loc: tuple[int | str, ...]) -> str:
    """`reply 2, item 1, key input` for a pydantic location (0-based list indexes, then field names)."""
    indexes = [part for part in loc if isinstance(part, int)]
    parts = [f"{label} {index + 1}" for label, index in zip(("reply", "item"), indexes, strict=False)]
    keys = [part for part in loc if isinstance(part, str)]
    if keys:
        parts.append(f"key {'.'.join(keys)}")
    return ", ".join(parts)


def _problem(error: Any) -> str:
    """One validation error as a user reads it: where, then what (in the script's own words where they help)."""
    where, depth = _where(error["loc"]), len(error["loc"])
    kind, message = error["type"], error["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        message = "unknown key (an item has one of say, shell or tool; input goes beside tool)"
    elif kind == "too_short":
        message = "no replies" if depth == 0 else "an empty reply (a reply has at least one item)"
    elif kind in ("list_type", "model_type"):
        message = ("not a list of replies", "not a list of items", "not a mapping")[min(depth, 2)]
        message += f" (got {type(error['input']).__name__})"
    return f"{where}: {message}" if where else message


def parse_script(data: Any, source: str = "the script") -> Script:
    """`data` (the YAML as loaded) as a `Script`, or a `ScriptError` naming each bad reply, item and key."""
    if data is None:
        raise ScriptError(f"{source}: empty ({_SHAPE})")
    try:
        return Script.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(error) for error in exc.errors()]
        raise ScriptError(f"{source}: " + "; ".join(problems) + f" ({_SHAPE})") from None


def load_script(path: str | os.PathLike[str]) -> Script:
    """Read and check a script file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptError(f"{path}: cannot read the script: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScriptError(f"{path}: not YAML: {exc}") from None
    return parse_script(data, str(path))


def as_script(script: ScriptSource) -> Script:
    """A `Script`, a script file's path, or its replies as data (`[[{"shell": "make"}], [{"say": "done"}]]`)."""
    if isinstance(script, Script):
        return script
    if isinstance(script, str | os.PathLike):
        return load_script(script)
    return parse_script(script)
