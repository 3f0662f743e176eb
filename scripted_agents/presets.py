"""Scenario building blocks, so tests read as what the agent does.

scenario({"T1": [write_turn("src/a.txt", "a\\n", commit="T1")]})
"""

from __future__ import annotations

from typing import Any

__all__ = ["commit_step", "conformant", "scenario", "turn", "write_turn"]


def turn(*steps: dict[str, Any], stop: str = "end_turn", **options: Any) -> dict[str, Any]:
    """One declared turn: its steps and the stop reason it ends with."""
    return {"steps": list(steps), "stop": stop, **options}


def commit_step(message: str) -> dict[str, Any]:
    """Commit everything and push, the way a well-behaved agent leaves the workspace."""
    script = f"git add -A && git commit -q -m '{message}' && git push -q"
    return {"terminal": {"command": "bash", "args": ["-lc", script], "on_failure": "end_turn"}}


def write_turn(path: str, content: str, *, commit: str | None = None, call_id: str = "call_write") -> dict[str, Any]:
    """Ask to edit `path`, write it through the client, read it back, optionally commit and push."""
    steps: list[dict[str, Any]] = [
        {
            "tool_call": {
                "id": call_id,
                "title": f"Write {path}",
                "kind": "edit",
                "locations": [path],
                "raw_input": {"path": path},
                "permission": True,
            }
        },
        {"write": {"path": path, "content": content}},
        {"read": {"path": path, "expect": content}},
    ]
    if commit:
        steps.append(commit_step(commit))
    return turn(*steps)


def scenario(by_task: dict[str | None, list[dict[str, Any]]], **top: Any) -> dict[str, Any]:
    """A scenario from {task id (None = default): [turns]}."""
    tasks = []
    for task_id, turns in by_task.items():
        entry: dict[str, Any] = {"turns": turns}
        if task_id is not None:
            entry["id"] = task_id
        tasks.append(entry)
    return {"tasks": tasks, **top}


def conformant(**top: Any) -> dict[str, Any]:
    """A scenario that passes `loop-harness check`: asked to create out/hello.txt it asks, then writes it
    through the client (and stops if refused); asked to create out/1.txt and more (the cancel-running probe) it
    works for 10 s, a tool call every 0.1 s, answering a cancel at once; to anything else it answers one
    sentence."""
    return {
        "tasks": [
            {"prompt_contains": "out/hello.txt", "turns": [write_turn("out/hello.txt", "hello\n")]},
            {"prompt_contains": "out/1.txt", "turns": [turn({"tool_calls": {"count": 100, "interval": 0.1}})]},
            {"turns": [turn({"message": "ready"})]},
        ],
        **top,
    }
