"""The host's tools, bound to the task at hand: what an agent may ask of the tracker.

    get_issue           the task: id, title, body (and the head branch of a proposal)
    open_proposal       open a proposal from the task's branch (memory: recorded; GitHub: a pull request)
    submit_review       review the proposal being worked on (approve, request_changes or comment)
    get_commits_status  the checks on a ref (default: the proposal's head, else HEAD)
    plan_verification   the steps to verify the change: the files it touches, and what to run
    ask_question        a question with options: no person is there, so the kernel answers it at once
                        (question auto-answer) and keeps the choice on the task's decision ledger

A role's allowlist decides which of them a task's agent sees and may call; an empty allowlist
keeps them all. This module is transport-free: `_mcp_host.py` serves it over MCP.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pygit2

from ..budget._questions import Choice, Option
from ..queues import HostToolProvider, QueueProvider, Task, TaskKind
from ..record._terminals import Stop

__all__ = ["DEFAULT_TOOLS", "TOOL_SPECS", "HostToolError", "HostTools", "TaskBinding"]

T = TypeVar("T")

TOOL_SPECS: dict[str, dict[str, Any]] = {
    "get_issue": {
        "description": "The task you are working on: its id, title and body.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    "open_proposal": {
        "description": "Propose your change for review: opens a proposal (pull request) from your branch.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 120},
                "body": {"type": "string", "maxLength": 400},
                "branch": {"type": "string", "maxLength": 100},  # default: the current branch
            },
            "required": ["title"],
        },
    },
    "submit_review": {
        "description": "Submit your review of the proposal you are reviewing.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "verdict": {"type": "string", "enum": ["approve", "request_changes", "comment"]},
                "body": {"type": "string", "maxLength": 400},
            },
            "required": ["verdict"],
        },
    },
    "get_commits_status": {
        "description": "The status of the checks on a commit (default: the proposal's head).",
        "inputSchema": {"type": "object", "properties": {"ref": {"type": "string", "maxLength": 80}}},
    },
    "plan_verification": {
        "description": "How to verify the change: the files it touches and what to run.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    "ask_question": {
        "description": "Ask a question with a few options. No person is watching: it is answered at once, "
        "preferring the recommended, default or simplest option. Put the option you recommend first.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "question": {"type": "string", "maxLength": 400},
                "options": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 10,
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string", "maxLength": 80},
                            "label": {"type": "string", "maxLength": 200},
                            "description": {"type": "string", "maxLength": 400},
                        },
                        "required": ["label"],
                    },
                },
            },
            "required": ["question", "options"],
        },
    },
}
DEFAULT_TOOLS = tuple(TOOL_SPECS)  # the config's HOST_TOOLS, which role allowlists are checked against (a test)


class HostCall(Protocol):
    """`HostCalls.call`: `await fn(*args)` under the run's retry rules: its result, or a Stop."""

    def __call__(
        self, op: str, fn: Callable[..., Awaitable[T]], *args: Any, retry: bool = True
    ) -> Awaitable[T | Stop]: ...


class HostToolError(Exception):
    """A tool call that cannot be carried out (the agent sees it as a failed tool call)."""


@dataclass
class TaskBinding:
    """One task's view of the host tools: which it may use, and which it used."""

    task: Task
    allowed: frozenset[str]
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    used: list[str] = field(default_factory=list)  # tools called successfully, in order
    # ask_question's answerer (the task's budgets watch): the choice, or None when a person must answer
    ask: Callable[[str, list[Option]], Choice | None] | None = None
    host_stops: dict[str, Stop] = field(default_factory=dict)  # operation -> the host signal it ran into


class HostTools:
    def __init__(
        self,
        provider: QueueProvider,
        *,
        workspace: Path,
        git_dir: Path | None,
        base_branch: str,
        host_calls: HostCall,
    ) -> None:
        self.provider = provider
        self.base_branch = base_branch  # what proposals are opened against
        self.host_calls = host_calls  # the run's retry rules (HostCalls.call)
        self.workspace = workspace
        self.git_dir = git_dir

    def bind(self, task: Task, allowlist: list[str]) -> TaskBinding:
        allowed = frozenset(allowlist) & frozenset(TOOL_SPECS) if allowlist else frozenset(DEFAULT_TOOLS)
        return TaskBinding(task, allowed)

    async def call(self, binding: TaskBinding, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Carry out one allowed tool call; raises HostToolError for a call that cannot be done."""
        task = binding.task
        if name == "get_issue":
            result: dict[str, Any] = {"id": task.id, "title": task.title, "body": task.body, "kind": task.kind}
            if task.branch:
                result["branch"] = task.branch
        elif name == "open_proposal":
            if task.kind is not TaskKind.ISSUE:
                raise HostToolError("open_proposal works on an issue, and this task is a proposal to review")
            head = self._head_branch(arguments.get("branch"))
            title, body = str(arguments.get("title") or task.title), str(arguments.get("body") or "")
            result = await self._host(binding, "open_proposal", lambda h: h.open_proposal(task, title=title, body=body,
                                                                                          head=head))  # fmt: skip
        elif name == "submit_review":
            if task.kind is not TaskKind.PROPOSAL:
                raise HostToolError("submit_review needs a proposal to review, and this task is an issue")
            verdict = arguments.get("verdict")
            if verdict not in ("approve", "request_changes", "comment"):
                raise HostToolError(f"verdict must be approve, request_changes or comment (got {verdict!r})")
            body = str(arguments.get("body", ""))
            result = await self._host(
                binding, "submit_review", lambda h: h.submit_review(task, verdict=verdict, body=body)
            )
        elif name == "get_commits_status":
            ref = str(arguments.get("ref") or task.branch or self._head_sha())
            result = {"ref": ref, **await self._host(binding, "commits_status", lambda h: h.commits_status(ref))}
        elif name == "plan_verification":
            result = self._plan(task)
        elif name == "ask_question":
            result = _ask(binding, arguments)
        else:
            raise HostToolError(f"unknown tool {name!r}")
        binding.used.append(name)
        return result

    async def _host(
        self, binding: TaskBinding, operation: str, call: Callable[[HostToolProvider], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """One host operation under the run's retry rules; a host that stays unusable is a tool error
        for the agent, and its Stop is kept for the task's end (a termination it blocked)."""
        provider = self.provider
        if not isinstance(provider, HostToolProvider):
            raise HostToolError(f"the {provider.name} host does not support {operation}")
        outcome = await self.host_calls(operation, lambda: call(provider))
        if isinstance(outcome, Stop):
            if outcome.reason.get("kind") != "host_rejected":  # a refusal (403/404/422) is an answer, not a host down
                binding.host_stops[operation] = outcome
            raise HostToolError(f"the host could not do {operation}: {json.dumps(outcome.reason, default=str)}")
        return outcome

    def _repo(self) -> pygit2.Repository:
        if self.git_dir is None:
            raise HostToolError("the workspace is not a git worktree")
        return pygit2.Repository(str(self.git_dir))

    def _branch(self) -> str:
        repo = self._repo()
        if repo.head_is_detached or repo.head_is_unborn:
            raise HostToolError("HEAD is not on a branch: there is nothing to propose from")
        return repo.head.shorthand

    def _head_branch(self, named: Any) -> str:
        """The proposal's head: the branch the agent names, else the workspace's; never the base."""
        if named is not None and (
            not isinstance(named, str) or not pygit2.reference_is_valid_name(f"refs/heads/{named}")
        ):
            raise HostToolError(f"branch must be a branch name (got {named!r})")
        head = named or self._branch()
        if head == self.base_branch:
            raise HostToolError(
                f"the proposal's branch is the base branch {head!r}: commit the task's work on a branch of its own, "
                "push it, and open the proposal from it (argument 'branch', or check it out)"
            )
        return head

    def _head_sha(self) -> str:
        repo = self._repo()
        return "HEAD" if repo.head_is_unborn else str(repo.head.target)

    def _plan(self, task: Task) -> dict[str, Any]:
        """The files the change touches (from git, when its branch is here) and the checks to run."""
        changed: list[str] = []
        repo = self._repo()
        head = _resolve(repo, task.branch) if task.branch else None
        base = _resolve(repo, "main") or _resolve(repo, "master")
        if head is not None and base is not None:
            diff = repo.diff(repo.merge_base(head, base) or base, head)
            changed = sorted({patch.delta.new_file.path for patch in diff if patch is not None})
        steps = [
            f"read the change on {task.branch or 'the working branch'}"
            + (f" ({len(changed)} file(s): {', '.join(changed[:10])})" if changed else ""),
            "check that it does what the task asks, and nothing else",
            "run the project's tests",
            "check get_commits_status for the change's head",
        ]
        return {"proposal": task.id, "changed_files": changed, "steps": steps}


def _ask(binding: TaskBinding, arguments: dict[str, Any]) -> dict[str, Any]:
    question, raw = arguments.get("question"), arguments.get("options")
    if not isinstance(question, str) or not isinstance(raw, list) or not raw:
        raise HostToolError("ask_question needs a question (text) and options (a list of {id, label, description})")
    options = []
    for index, entry in enumerate(raw):
        entry = {"label": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or not isinstance(entry.get("label"), str):
            raise HostToolError(f"option {index} has no label")
        options.append(
            Option(str(entry.get("id") or entry["label"]), entry["label"], str(entry.get("description", "")))
        )
    choice = binding.ask(question, options) if binding.ask is not None else None
    if choice is None:
        raise HostToolError("no answer: this question needs a person, and the run now waits for one")
    return {"answer": choice.option.id, "label": choice.option.label, "confidence": choice.confidence,
            "rationale": choice.rationale, "answered_by": "loop-harness (no person is watching)"}  # fmt: skip


def _resolve(repo: pygit2.Repository, name: str) -> pygit2.Oid | None:
    for ref in (f"refs/heads/{name}", f"refs/remotes/origin/{name}"):
        if ref in repo.references:
            return repo.references[ref].peel(pygit2.Commit).id
    return None
