"""A workspace's config on the server: the sections of a `loop-harness run` config, checked by the same models.

A registration (or an edit) names what a run config names, bar two sections the server owns:

    workspace: {path: /abs/worktree, commit: {message: ..., push: true}}   (or `path:` alone, as before)
    queue:     the host connection (`host:` is the older name for it)
    policy, sandbox, limits, autonomy, role (a mapping: a file path is the CLI's)

`agent:` is the binding's (`PUT .../agent/binding`, whose `env` is the agent's environment) and
`transcripts:` the server's (under its state directory). The sections are kept as written and validated
by `parse_config`, the CLI's own function, so an error names the same key (`policy.rules.0.decision`).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

from ..config._config import Config, GitHubQueueConfig, parse_config
from ..config._exceptions import ConfigError

__all__ = ["SECTIONS", "WorkspaceConfigError", "merged", "queue_identity", "run_config", "sections_of", "written"]

#: What a workspace keeps, in a run config's spelling (`workspace` holds the commit; its path is fixed).
SECTIONS = ("commit", "queue", "policy", "sandbox", "limits", "autonomy", "role")
_OWNED = {"agent": "the agent is the binding's: PUT /api/workspaces/{id}/agent/binding (its env included)",
          "transcripts": "the server places transcripts under its state directory"}  # fmt: skip
#: The host fields that say which queue this is: change one and the completed ids are another queue's.
_GITHUB_IDENTITY = ("api_url", "repo", "assignee")


class WorkspaceConfigError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def sections_of(body: dict[str, Any], *, path_required: bool) -> tuple[str | None, dict[str, Any]]:
    """The worktree path a body names (None when it names none) and its sections as written (the older
    `host:` read as `queue:`, `workspace: {commit}` as `commit`). Unknown and server-owned keys refused."""
    body = dict(body)
    for key, why in _OWNED.items():
        if key in body:
            raise WorkspaceConfigError(key, f"{key}: not a workspace's section here: {why}")
    if "host" in body:
        if "queue" in body:
            raise WorkspaceConfigError("host", "host is the older name of queue: give one of them")
        body["queue"] = body.pop("host")
    if "commit" in body:
        raise WorkspaceConfigError("commit", "write it as workspace.commit (workspace: {path: ..., commit: {...}})")
    path = body.pop("path", None)
    workspace = body.pop("workspace", None)
    if isinstance(workspace, dict):
        unknown = set(workspace) - {"path", "commit"}
        if unknown:
            raise WorkspaceConfigError("workspace", f"a workspace mapping has `path` and `commit` (got "
                                       f"{sorted(workspace)})")  # fmt: skip
        if path is not None and "path" in workspace:
            raise WorkspaceConfigError("path", "give the path once: workspace.path or path")
        path = workspace.get("path", path)
        if "commit" in workspace:  # `commit:` with nothing under it is the defaults, as in a run config
            commit = workspace["commit"]
            body["commit"] = None if commit is False else {} if commit is None else commit  # None: no commits
    elif workspace is not None:
        if path is not None:
            raise WorkspaceConfigError("path", "give the path once: workspace or path")
        path = workspace
    unknown = set(body) - set(SECTIONS)
    if unknown:
        raise WorkspaceConfigError(sorted(unknown)[0], f"unknown keys {sorted(unknown)} (known: workspace, path, "
                                   f"{', '.join(s for s in SECTIONS if s != 'commit')}, host)")  # fmt: skip
    if path_required and path is None:
        raise WorkspaceConfigError("path", "path must be the absolute path of a git worktree")
    sandbox = body.get("sandbox")
    for key in ("home", "tmp"):  # a run config resolves these beside its file; the server has none to offer
        value = sandbox.get(key) if isinstance(sandbox, dict) else None
        if isinstance(value, str) and not (value.startswith("/") or value.startswith("~")):
            raise WorkspaceConfigError(f"sandbox.{key}", f"sandbox.{key}: give an absolute path (got {value!r})")
    if isinstance(body.get("role"), str):
        raise WorkspaceConfigError("role", "role: give the role inline (a mapping); a role file is read by the "
                                   "CLI, relative to its config file")  # fmt: skip
    return path, body  # a None value drops that section (PATCH); `written` keeps the rest


def written(sections: dict[str, Any]) -> dict[str, Any]:
    """A whole config (POST, PUT): a section given as `null` is one left out (its defaults)."""
    return {k: v for k, v in sections.items() if v is not None}


def merged(current: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A PATCH: each section given replaces that section; `null` removes it (its defaults again)."""
    result = copy.deepcopy(current)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = value
    return result


def run_config(path: str, sections: dict[str, Any], *, agent: dict[str, Any], transcripts: Path,
               hide: list[str], base_dir: Path) -> Config:  # fmt: skip
    """The run config these sections make with this agent: `parse_config` as the CLI calls it (a
    WorkspaceConfigError naming the key when it is not valid). `hide` adds to the sandbox's own list."""
    data: dict[str, Any] = {k: copy.deepcopy(v) for k, v in sections.items() if k != "commit"}
    data["workspace"] = {"path": path, "commit": sections["commit"]} if "commit" in sections else path
    data["agent"] = agent
    data["transcripts"] = str(transcripts)
    sandbox = data.get("sandbox")
    if hide:
        if sandbox is not None and not isinstance(sandbox, dict):
            raise WorkspaceConfigError("sandbox", f"sandbox: a mapping (got {type(sandbox).__name__})")
        own = (sandbox or {}).get("hide", [])
        data["sandbox"] = {**(sandbox or {}), "hide": [*own, *hide] if isinstance(own, list) else own}
    try:
        return parse_config(data, base_dir=base_dir)
    except ConfigError as exc:
        raise WorkspaceConfigError(exc.key, str(exc)) from None
    except (TypeError, ValueError, RuntimeError, OSError) as exc:  # a shape no model check caught: a 422, not a 500
        raise WorkspaceConfigError("", f"this config cannot be used: {type(exc).__name__}: {exc}") from None


def queue_identity(config: Config) -> str:
    """Which queue a workspace drains, for its completed ids: the provider, the trigger, and for GitHub the
    API, repository and assignee. Anything else (the policy, limits, a memory queue's task list, other
    workspaces) may change and the completed ids stand: a completed T1 is that queue's T1."""
    queue = config.queue
    parts: dict[str, Any] = {"provider": queue.provider, "trigger": str(config.role.trigger)}
    if isinstance(queue, GitHubQueueConfig):
        # as GitHub reads them: logins and repository names ignore case, an API URL its trailing slash (`Acme/Widgets`
        # after `acme/widgets` is the same queue: its completed ids stand)
        parts.update({k: getattr(queue, k).lower().rstrip("/") for k in _GITHUB_IDENTITY})
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
