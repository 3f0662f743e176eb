"""What the conformance probes leave to judge: one probe's transcript records and workspace change, and the
readings every check shares (what the agent did after a cancel, what an effect carried out was)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["IN_FLIGHT_S", "Probe", "carried_out", "changed_paths", "snapshot", "target", "work_after_cancel"]

#: What the agent sent within this of the cancel crossed it on the wire (it may not have read the cancel yet):
#: only what comes later is work after the cancel.
IN_FLIGHT_S = 0.5
#: Requests that wind down what was running (a terminal killed, released, its output collected): what a cancel
#: asks for, not work after it.
WIND_DOWN = frozenset({"terminal/kill", "terminal/release", "terminal/output", "terminal/wait_for_exit"})
#: The session/update kinds that are a turn's work: ACP lets them come after session/cancel, but only before the
#: prompt's answer (a usage or commands update may come whenever).
TURN_UPDATES = frozenset({"agent_message_chunk", "agent_thought_chunk", "tool_call", "tool_call_update", "plan"})


@dataclass
class Probe:
    name: str
    records: list[dict[str, Any]]
    transcript: Path
    changed: list[str]  # workspace files added, changed or removed (outside .git)
    terminal: str
    reason: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def rpc(self, direction: str, method: str | None = None) -> Iterator[dict[str, Any]]:
        for record in self.records:
            is_rpc = record["type"] == "rpc" and record["dir"] == direction
            if is_rpc and (method is None or record["msg"].get("method") == method):
                yield record

    def answer(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """The response record to a request record (the other direction, the same id)."""
        other = "in" if request["dir"] == "out" else "out"
        wanted = request["msg"].get("id")
        return next((r for r in self.rpc(other) if "method" not in r["msg"] and r["msg"].get("id") == wanted), None)


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` but .git, by content digest (a symlink by its target); what cannot be read is
    marked so, not skipped (an agent's unreadable file or directory is a change too)."""
    files: dict[str, str] = {}

    def unreadable(error: OSError) -> None:
        if error.filename:
            files[os.path.relpath(error.filename, root)] = f"unreadable: {error.strerror}"

    for directory, subdirectories, names in os.walk(root, onerror=unreadable):
        if directory == str(root):
            subdirectories[:] = [d for d in subdirectories if d != ".git"]
        for name in [*names, *(d for d in subdirectories if os.path.islink(os.path.join(directory, d)))]:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            try:
                if os.path.islink(path):
                    files[relative] = "-> " + os.readlink(path)
                else:
                    with open(path, "rb") as f:
                        files[relative] = hashlib.file_digest(f, "sha256").hexdigest()
            except OSError as exc:
                files[relative] = f"unreadable: {exc.strerror}"
    return files


def changed_paths(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))


def carried_out(probe: Probe, request: dict[str, Any]) -> bool:
    """The kernel did what the agent asked (answered it with a result, not the policy's refusal)."""
    answer = probe.answer(request)
    return answer is not None and "result" in answer["msg"]


def work_after_cancel(probe: Probe) -> str:
    """What the agent started after session/cancel: a request (but winding a terminal down) or a new tool call
    more than IN_FLIGHT_S after it; a request or a turn's session/update after its answer to the prompt. "" for
    nothing."""
    sent = next(probe.rpc("out", "session/cancel"), None)
    if sent is None:
        return ""
    prompts = list(probe.rpc("out", "session/prompt"))
    answer = probe.answer(prompts[-1]) if prompts else None
    seen, answered, work = False, False, []
    for record in probe.records:
        seen = seen or record is sent
        answered = answered or record is answer
        if not seen or record["type"] != "rpc" or record["dir"] != "in":
            continue
        message, late = record["msg"], record["t"] - sent["t"] > IN_FLIGHT_S
        method = message.get("method")
        at = f" +{(record['t'] - sent['t']) * 1000:.0f} ms"
        if method == "session/update":
            update = (message.get("params") or {}).get("update") or {}
            kind = update.get("sessionUpdate")
            if answered and kind in TURN_UPDATES:
                work.append(f"session/update {kind} after its answer{at}")
            elif kind == "tool_call" and late:
                work.append(f"tool call {str(update.get('title') or update.get('toolCallId'))!r}{at}")
        elif method is not None and "id" in message and method not in WIND_DOWN and (late or answered):
            work.append(f"{method} {target(message)}".rstrip() + at)
    if not work:
        return ""
    last = work[-1].rsplit(" +", 1)[-1]
    return (
        f"{len(work)} request(s), tool call(s) or update(s) after it, the last at +{last}: "
        + ", ".join(work[:4])
        + (", ..." if len(work) > 4 else "")
    )


def target(message: dict[str, Any]) -> str:
    params = message.get("params") or {}
    call = params.get("toolCall") or {}
    return str(params.get("path") or params.get("command") or call.get("title") or "")
