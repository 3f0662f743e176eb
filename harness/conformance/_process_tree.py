"""The agent's process tree, counted: what the soak and the conformance check bound.

Under the OS sandbox the kernel starts bwrap, which starts the agent (and a network bridge) in a pid
namespace of its own; every count here covers the process the kernel started and everything below it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass

import psutil

__all__ = ["AgentCounters", "ExactCounters", "agent_counters", "agent_tree", "live_children", "what_the_agent_holds"]


class ExactCounters:
    """Counters that must come back exactly to their baseline at a quiet point."""

    def diff(self, baseline: ExactCounters) -> dict[str, tuple[int, int]]:
        """{resource: (baseline, now)} for every counter that differs."""
        mine, theirs = asdict(self), asdict(baseline)  # type: ignore[call-overload]
        return {k: (theirs[k], mine[k]) for k in mine if mine[k] != theirs[k]}


@dataclass(frozen=True)
class AgentCounters(ExactCounters):
    """The agent's, with everything below it (under the sandbox: bwrap, the agent, its network bridge)."""

    fds: int
    threads: int
    children: int  # live (non-zombie) descendants of the process the kernel started


def agent_tree(agent: psutil.Process) -> tuple[int, int, int]:
    """RSS, fds and threads of the agent with everything below it: under the OS sandbox the kernel starts
    bwrap, which starts the agent (and a network bridge) in a pid namespace of its own."""
    rss = fds = threads = 0
    for process in (agent, *agent.children(recursive=True)):
        try:
            with process.oneshot():
                rss, fds, threads = (
                    rss + process.memory_info().rss,
                    fds + process.num_fds(),
                    threads + process.num_threads(),
                )
        except psutil.NoSuchProcess:
            if process is agent:
                raise
    return rss, fds, threads


def agent_counters(agent: psutil.Process) -> AgentCounters:
    """The agent tree's counters (psutil.NoSuchProcess when the agent is gone)."""
    _rss, fds, threads = agent_tree(agent)
    return AgentCounters(fds=fds, threads=threads, children=len(live_children(agent)))


def live_children(process: psutil.Process) -> list[psutil.Process]:
    live = []
    for child in process.children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                live.append(child)
        except psutil.NoSuchProcess:
            continue
    return live


def what_the_agent_holds(agent: psutil.Process, resource: str) -> list[str]:
    """What the agent tree holds of `resource` now (as `soak._work.what_is_open` says for the kernel)."""
    try:
        tree = [agent, *agent.children(recursive=True)]
        if resource == "fds":  # every descriptor, not psutil's regular files only (a leaked pipe counts too)
            return [line for p in tree for line in _descriptors(p.pid)]
        if resource == "threads":
            return [f"pid {p.pid} ({p.name()}): {p.num_threads()} threads" for p in tree]
        if resource == "children":
            return [" ".join(p.cmdline()) for p in tree[1:] if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error as exc:
        return [f"cannot look: {exc}"]
    return []


def _descriptors(pid: int) -> list[str]:
    """`pid N fd K: target` for each of a process's open descriptors (Linux's /proc)."""
    lines = []
    with contextlib.suppress(OSError):
        for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
            with contextlib.suppress(OSError):
                lines.append(f"pid {pid} fd {fd}: {os.readlink(f'/proc/{pid}/fd/{fd}')}")
    return lines
