"""The agent modules a workspace can bind: each turns a binding request into a run config's `agent:` section
and declares whether the agent supports permission requests (required before autonomy activates).

    scripted   {"module": "scripted", "scenario": "/abs/scenario.yaml"}       the declared-turn agent
    inference  {"module": "inference", "seed": 42, "threads": 2}               the local llama.cpp agent
    codex      {"module": "codex"}      npx @zed-industries/codex-acp@0.16.0          (declares permission requests)
    claude     {"module": "claude"}     npx @zed-industries/claude-agent-acp@0.23.1   (declares permission requests)
    command    {"module": "command", "command": [...], "supports_permission_requests": bool}   any ACP agent

Every module also takes `env` (variables for the agent). An unknown module or key is a 422 naming it.

The adapters are pinned to the versions the adapter tests run (tests/scripted/test_codex_sandbox.py and
test_claude_sandbox.py import `ADAPTERS`): an unpinned `npx --yes` would run whatever npm serves that day.
To run another version, bind `{"module": "command", "command": ["npx", "--yes", "PACKAGE@VERSION"],
"supports_permission_requests": true}`, or change `ADAPTERS` and run those tests.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

__all__ = ["ADAPTERS", "MODULES", "BindingError", "agent_section"]

MODULES = ("scripted", "inference", "codex", "claude", "command")
ADAPTERS = {"codex": "@zed-industries/codex-acp@0.16.0", "claude": "@zed-industries/claude-agent-acp@0.23.1"}


class BindingError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def agent_section(binding: dict[str, Any]) -> dict[str, Any]:
    """The `agent:` section a binding request names (BindingError when it cannot be used)."""
    module = binding.get("module")
    if module not in MODULES:
        raise BindingError("module", f"module must be one of {', '.join(MODULES)} (got {module!r})")
    known = {"module", "env", *_KEYS[module]}
    unknown = set(binding) - known
    if unknown:
        raise BindingError(sorted(unknown)[0], f"{module} takes {sorted(known)}; not {sorted(unknown)}")
    env = binding.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise BindingError("env", "env must map names to strings")
    if module == "scripted":
        scenario = binding.get("scenario")
        if not isinstance(scenario, str) or not Path(scenario).is_absolute() or not Path(scenario).is_file():
            raise BindingError("scenario", "scenario must be the absolute path of a scenario file")
        command, permissions = [sys.executable, "-m", "scripted_agents", scenario], True
    elif module == "inference":
        seed, threads = binding.get("seed", 42), binding.get("threads", 2)
        if not (isinstance(seed, int) and isinstance(threads, int) and threads > 0):
            raise BindingError("seed", "seed and threads must be integers (threads at least 1)")
        command = [sys.executable, "-m", "harness", "agent", "inference", "--seed", str(seed), "--threads",
                   str(threads)]  # fmt: skip
        permissions = True
    elif module in ADAPTERS:
        command, permissions = ["npx", "--yes", ADAPTERS[module]], True
    else:
        given = binding.get("command")
        if not isinstance(given, list) or not given or not all(isinstance(a, str) and a for a in given):
            raise BindingError("command", "command must be a non-empty list of strings")
        command = list(given)
        permissions = binding.get("supports_permission_requests", False)
        if not isinstance(permissions, bool):
            raise BindingError("supports_permission_requests", "supports_permission_requests must be true or false")
    return {"command": command, "supports_permission_requests": permissions, "env": env}


_KEYS: dict[str, set[str]] = {
    "scripted": {"scenario"},
    "inference": {"seed", "threads"},
    "codex": set(),
    "claude": set(),
    "command": {"command", "supports_permission_requests"},
}
