"""What the policy answers and the moment it answers for: `Verdict`, `Turn`, and the refusal every judge falls back to.

The base the other policy modules import; it imports nothing of the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Turn", "Verdict", "refuse", "safely"]


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    rule_ids: tuple[str, ...] = ()
    reason: Mapping[str, Any] = field(default_factory=dict)
    paths: tuple[str, ...] = ()  # the judged paths, resolved, relative to the worktree
    option_id: str | None = None  # a permission request: the option to select (None: answer `cancelled`)
    ask: bool = False  # a permission request on the interactive path: a person decides
    argv: tuple[str, ...] = ()  # a terminal: what to run
    workdir: str | None = None  # a terminal: where (absolute)


@dataclass(frozen=True)
class Turn:
    """What the policy knows of the moment a request arrived, in wire order."""

    open_session: str | None = None  # the session whose turn was running (None: no turn was)
    sessions: AbstractSet[str] = frozenset()  # every session the kernel opened in this run (not copied)
    host_tools: frozenset[str] = frozenset()  # the kernel's own MCP tools the task's role allows
    approvals: frozenset[tuple[str, str]] = frozenset()  # interactive path: (rule kind, target) a person allowed


def safely(judge: Callable[..., Verdict], *args: Any) -> Verdict:
    """Anything a request makes the policy trip over is a refusal, never an exception (an `IndexError` from
    an odd argv is the agent's doing; one that escaped would end the run as the kernel's crash)."""
    try:
        return judge(*args)
    except Exception as exc:  # every failure to judge is a refusal
        return refuse("unparseable", why=f"the request could not be judged: {type(exc).__name__}: {exc}")


def refuse(kind: str, **detail: Any) -> Verdict:
    return Verdict(False, (), {"kind": kind, **detail})
