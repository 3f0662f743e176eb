"""Scenario files: which turns the scripted agent plays for which task.

    agent: {name: scripted, protocol_version: 1, mcp_http: false}
    startup: [ {stderr_flood: 1000} ]          # steps before reading stdin (optional)
    tasks:
      - id: T1                                  # match the task id (session/new _meta)
        turns:
          - steps:
              - message: "Working on it"
              - tool_call: {id: c1, title: "Write a.txt", kind: edit, locations: [a.txt],
                            permission: true}
              - write: {path: a.txt, content: "hello\n"}
            stop: end_turn
      - title: "Fix the bug"                    # or match the task title
        turns: [...]
      - prompt_contains: "hello"                # or a substring of the first prompt
        turns: [...]
      - turns: [...]                            # no matcher: the default

A task's turns are played one per `session/prompt`; when they run out, the
last one repeats. Turn keys: `steps`, `stop` (a stop reason, default
end_turn), `ignore_cancel` (keep going after session/cancel: the kernel
must kill us), `cancel_stop_reason` (what to answer a cancel with,
default cancelled), `after_stop` (steps played right after the turn's
answer: calls that come too late), `on_close` (steps played when the
session is closed, before the `session/close` answer: what an agent does
as it winds a session down; none that asks the client anything). A
`write` or `terminal` step may name another `session` id than its own.
"""

from __future__ import annotations

import yaml

# Agent start-up time is measured in milliseconds: typing and dataclasses cost
# about 10 ms to import (pathlib 5 ms more), so the scripted agent uses none of them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["STEP_KINDS", "Scenario", "ScenarioError", "TaskScript", "Turn", "load_scenario"]

STEP_KINDS = frozenset(
    {
        "message",
        "thought",
        "plan",
        "tool_call",
        "tool_calls",
        "elicit",
        "tool_update",
        "write",
        "read",
        "terminal",
        "run",
        "sleep",
        "hang",
        "crash",
        "garbage",
        "stderr_flood",
        "big_message",
        "usage",
        "echo_prompt",
        "spawn_child",
        "growing_message",
        "leak",
        "mcp_list",
        "mcp_call",
    }
)
#: Steps that ask the client something over stdio: not playable on close, where the reader that would read the
#: answer waits (`mcp_*` go to the host's MCP server over HTTP, and can).
ASKING_STEPS = frozenset({"tool_call", "tool_calls", "elicit", "write", "read", "terminal"})
STOP_REASONS = frozenset({"end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"})


class ScenarioError(ValueError):
    pass


class Turn:
    __slots__ = ("after_stop", "cancel_stop_reason", "ignore_cancel", "on_close", "steps", "stop")

    def __init__(
        self,
        steps: tuple[dict[str, Any], ...] = (),
        stop: str = "end_turn",
        ignore_cancel: bool = False,
        cancel_stop_reason: str = "cancelled",
        after_stop: tuple[dict[str, Any], ...] = (),
        on_close: tuple[dict[str, Any], ...] = (),
    ) -> None:
        self.steps = steps
        self.stop = stop
        self.ignore_cancel = ignore_cancel
        self.cancel_stop_reason = cancel_stop_reason
        self.after_stop = after_stop
        self.on_close = on_close


class TaskScript:
    __slots__ = ("id", "prompt_contains", "title", "turns")

    def __init__(
        self,
        turns: tuple[Turn, ...],
        id: str | None = None,
        title: str | None = None,
        prompt_contains: str | None = None,
    ) -> None:
        self.turns = turns
        self.id = id
        self.title = title
        self.prompt_contains = prompt_contains

    def turn(self, index: int) -> Turn:
        return self.turns[min(index, len(self.turns) - 1)]


class Scenario:
    __slots__ = ("mcp_http", "name", "protocol_version", "startup", "tasks")

    def __init__(
        self,
        tasks: tuple[TaskScript, ...],
        name: str = "scripted",
        protocol_version: int = 1,
        startup: tuple[dict[str, Any], ...] = (),
        mcp_http: bool = False,
    ) -> None:
        self.tasks = tasks
        self.name = name
        self.protocol_version = protocol_version
        self.startup = startup
        self.mcp_http = mcp_http  # advertise mcpCapabilities.http (and use the session's MCP servers)

    def script_for(self, task_id: str | None, title: str | None, prompt: str) -> TaskScript | None:
        """The first script whose matcher fits; the default (no matcher) if none does."""
        for script in self.tasks:
            if script.id is not None and script.id == task_id:
                return script
            if script.title is not None and script.title == title:
                return script
            if script.prompt_contains is not None and script.prompt_contains in prompt:
                return script
        return next((s for s in self.tasks if s.id is None and s.title is None and s.prompt_contains is None), None)


def load_scenario(path: str) -> Scenario:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(f"cannot load scenario {path}: {exc}") from None
    return parse_scenario(data)


def parse_scenario(data: Any) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError("a scenario is a mapping with a 'tasks' list")
    _only(data, {"agent", "startup", "tasks"}, "scenario")
    agent = data.get("agent") or {}
    _only(agent, {"name", "protocol_version", "mcp_http"}, "agent")
    tasks = data.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise ScenarioError("tasks: a non-empty list is required")
    scripts = tuple(_task(t, f"tasks[{i}]") for i, t in enumerate(tasks))
    startup = tuple(_step(s, f"startup[{i}]") for i, s in enumerate(data.get("startup") or []))
    return Scenario(
        scripts,
        name=str(agent.get("name", "scripted")),
        protocol_version=int(agent.get("protocol_version", 1)),
        startup=startup,
        mcp_http=bool(agent.get("mcp_http", False)),
    )


def _task(data: Any, where: str) -> TaskScript:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: a task script is a mapping")
    _only(data, {"id", "title", "prompt_contains", "turns"}, where)
    turns = data.get("turns")
    if not isinstance(turns, list) or not turns:
        raise ScenarioError(f"{where}.turns: a non-empty list is required")
    return TaskScript(
        tuple(_turn(t, f"{where}.turns[{i}]") for i, t in enumerate(turns)),
        id=None if data.get("id") is None else str(data["id"]),
        title=data.get("title"),
        prompt_contains=data.get("prompt_contains"),
    )


def _turn(data: Any, where: str) -> Turn:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: a turn is a mapping")
    _only(data, {"steps", "stop", "ignore_cancel", "cancel_stop_reason", "after_stop", "on_close"}, where)
    for key in ("stop", "cancel_stop_reason"):
        if key in data and data[key] not in STOP_REASONS:
            raise ScenarioError(f"{where}.{key}: {data[key]!r} is not a stop reason ({sorted(STOP_REASONS)})")
    steps = data.get("steps") or []
    return Turn(
        tuple(_step(s, f"{where}.steps[{i}]") for i, s in enumerate(steps)),
        stop=data.get("stop", "end_turn"),
        ignore_cancel=bool(data.get("ignore_cancel", False)),
        cancel_stop_reason=data.get("cancel_stop_reason", "cancelled"),
        after_stop=tuple(_step(s, f"{where}.after_stop[{i}]") for i, s in enumerate(data.get("after_stop") or [])),
        on_close=tuple(_closing_step(s, f"{where}.on_close[{i}]") for i, s in enumerate(data.get("on_close") or [])),
    )


def _closing_step(data: Any, where: str) -> dict[str, Any]:
    step = _step(data, where)
    if next(iter(step)) in ASKING_STEPS:
        raise ScenarioError(f"{where}: an on_close step asks the client nothing ({sorted(ASKING_STEPS)} do)")
    return step


def _step(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict) or len(data) != 1:
        raise ScenarioError(f"{where}: a step is a mapping with exactly one key")
    kind = next(iter(data))
    if kind not in STEP_KINDS:
        raise ScenarioError(f"{where}: unknown step {kind!r} (known: {', '.join(sorted(STEP_KINDS))})")
    return data


def _only(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(data) - allowed
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(allowed)})")
