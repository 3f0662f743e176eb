"""A run's assembly, before the first task: the worktree lock, the activation checks, the sandbox plan, its
egress, the client, the agent link and the host tools (each registered with the run's teardown).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..git._preconditions import blocked, repository_dirs
from ..git._worktree_lock import WorktreeBusy, lock_worktree
from ..link._agent_link import AgentLink
from ..link._client import KernelClient
from ..link._transport import agent_environment
from ..record._records import RecordType
from ..record._recovery import TOKEN_VARIABLE
from ..record._terminals import Stop
from ..sandbox._egress import Egress
from ..sandbox._exec import ExecHost
from ..sandbox._sandbox import (
    PROXY_PORT,
    Sandbox,
    SandboxError,
    find_bwrap,
    plan_sandbox,
    runs_base,
    sandbox_unavailable,
)
from ._parts import Agent, RunParts, _closer, remove_tree

if TYPE_CHECKING:
    from ..host._mcp_host import HostToolServer

__all__ = ["Assembly", "terminal_environment"]

#: Paths a `teardown_error` of the run's directory names (`left_count` says how many there were).
_LEFT_SHOWN = 20


def terminal_environment(token: str) -> dict[str, str]:
    """The environment every command run for the agent starts with (before PATH is confined)."""
    return {**agent_environment(), "GIT_TERMINAL_PROMPT": "0", TOKEN_VARIABLE: token}


class Assembly(RunParts):
    """The seam of a `Run` that starts what the run needs."""

    # --- preparing: preconditions, sandbox, agent ----------------------------------------------

    async def prepare(self, *, single_prompt: bool) -> Agent | Stop:
        """Everything before the first task: the started agent, or the Stop that prevented it."""
        busy = self._lock_worktree()
        if busy is not None:
            return busy
        if not single_prompt:
            stop = await self._activate()
            if stop is not None:
                return stop
        planned = self._plan_sandbox()
        if isinstance(planned, Stop):
            return planned
        sandbox, egress, tools_socket = None, None, None
        if planned is not None:
            sandbox, egress, tools_socket = await self._open_egress(*planned)
            self._overlay = sandbox.overlay
            if self._meter is not None:
                self._meter.overlay = self._overlay
        commands_env = self._confine(terminal_environment(self.token))
        # `X=1` alone is harmless only for a name not in the environment of a command the agent runs, ours or its own
        self.policy.commands_environment([*commands_env, *self.config.agent.env])
        client = KernelClient(
            policy=self.policy,
            transcript=self.transcript,
            exec_host=ExecHost(commands_env, sandbox=sandbox),
            interactive_handler=self.interactive_handler,
        )
        client.overlay = self._overlay
        self.teardown.add("terminals", client.exec_host.release_all)
        link = AgentLink(
            self.config.agent,
            self.config.limits,
            cwd=self.config.source.parent if self.config.source else Path.cwd(),
            transcript=self.transcript,
            client=client,
            token=self.token,
            on_spawn=lambda pid: self.active.agent_started(self.marker, pid),
            confine=self._confine,
            sandbox=sandbox,
        )
        self.teardown.add("agent", link.close)
        self.agent = Agent(client, link, None)  # its refusals count from now on, even if the start fails
        stop = await link.start()
        if stop is not None:
            return stop
        self.agent = Agent(client, link, await self._start_host_tools(link, egress, tools_socket))
        return self.agent

    def _lock_worktree(self) -> Stop | None:
        """One loop per worktree: taken before anything else, given back when the run's teardown ends."""
        if self.worktree_locked or self.git_dir is None:  # no git dir: the git precondition refuses the run
            return None
        try:
            lock = lock_worktree(self.git_dir)
        except WorktreeBusy as exc:
            return blocked("workspace_free", str(exc), lock=exc.lock_file)

        async def release() -> None:
            lock.release()

        self.teardown.add("worktree_lock", release)
        return None

    async def _activate(self) -> Stop | None:
        if not self.config.agent.supports_permission_requests:
            return blocked(
                "agent_permission_support",
                "the bound agent does not declare that it asks before acting "
                "(set agent.supports_permission_requests: true for an agent that sends permission requests)",
            )
        if self.policy.interactive:
            return blocked("policy_non_empty", "the policy has no rules: an empty policy is the interactive path")
        return await self.host.authorize(self.provider) or self._check_git(left_by_task=None)

    def _protected_files(self) -> list[Path]:
        """The run's own files: its config, its role, its transcript (and their directory, when the
        transcripts are kept inside the worktree)."""
        files = [p for p in (self.config.source, self.config.role_source, self.transcript_path) if p]
        transcripts = self.transcript_path.resolve().parent
        if transcripts.is_relative_to(self.config.workspace.resolve()):
            files.append(transcripts)
        return files

    def _confine(self, env: dict[str, str]) -> dict[str, str]:
        """No directory on PATH the agent could plant a program in (`.venv/bin/git` under `write **`)."""
        if "PATH" in env:
            if env["PATH"] not in self._confined:  # the same PATH twice a run (agent, terminals): listed once
                self._confined[env["PATH"]] = self.policy.search_path(env["PATH"])
            kept = self._confined[env["PATH"]]
            if kept != env["PATH"]:
                dropped = [e for e in env["PATH"].split(os.pathsep) if e not in kept.split(os.pathsep)]
                self.transcript.record(RecordType.SEARCH_PATH_CONFINED, dropped=dropped)
            env["PATH"] = kept
        return env

    def _plan_sandbox(self) -> tuple[Sandbox, Path] | Stop | None:
        """The OS sandbox for this run and its private directory, or a BlockedPrecondition saying why it
        cannot start: never a silent run without one (None: the config turned it off)."""
        settings = self.config.sandbox
        if settings.mode == "off":
            self.transcript.record(RecordType.SANDBOX, mode="off")
            return None
        bwrap = find_bwrap(settings.bwrap)
        cause = sandbox_unavailable(bwrap)
        if cause is None and bwrap is not None:
            try:
                run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=runs_base()))
            except (SandboxError, OSError) as exc:
                return blocked("sandbox_available", f"no private directory for the run: {exc}", mode=settings.mode)
            self.teardown.add("sandbox", lambda: self._remove_run_dir(run_dir))
            git_dirs = repository_dirs(self.git_dir) if self.git_dir else []
            try:
                sandbox = plan_sandbox(settings, bwrap=bwrap, worktree=self.config.workspace,
                                       rules=self.config.policy.rules,
                                       protected_globs=(".git", ".git/**", *self.config.policy.protected_paths),
                                       protected_files=[*self._protected_files(), self.transcript_path.parent],
                                       git_dirs=git_dirs, run_dir=run_dir, agent_env=self.config.agent.env)  # fmt: skip
                return sandbox, run_dir
            except (SandboxError, OSError) as exc:
                cause = f"the sandbox could not be planned: {exc}"
        return blocked("sandbox_available", f"{cause}; to run without the OS sandbox set sandbox: {{mode: off}}",
                       mode=settings.mode)  # fmt: skip

    async def _remove_run_dir(self, run_dir: Path) -> None:
        """The run's private directory, gone with whatever the agent left in it; what could not be removed is
        named in the transcript (a `teardown_error` of step `sandbox`), never left in silence."""
        if self._overlay is not None:
            self._overlay.close()
        left, error = await asyncio.to_thread(remove_tree, run_dir)
        if left and not self.transcript.closed:
            self.transcript.record(RecordType.TEARDOWN_ERROR, step="sandbox", left=left[:_LEFT_SHOWN],
                                   left_count=len(left),
                                   error=f"{len(left)} path(s) in {run_dir} could not be removed: {error}")  # fmt: skip

    async def _open_egress(self, sandbox: Sandbox, run_dir: Path) -> tuple[Sandbox, Egress, socket.socket]:
        """The sandbox's ways out, all through the kernel: the filtering proxy (when a network rule allows a
        host) and the host-tools port, bound now so the agent's sandbox can relay it before the server runs."""
        egress = Egress(run_dir, self.policy.judge_host, self.transcript.record)
        self.teardown.add("egress", egress.close)
        await egress.start()
        tools_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.teardown.add("host_tools", _closer(tools_socket))  # until the server takes it over
        tools_socket.bind(("127.0.0.1", 0))
        port = tools_socket.getsockname()[1]
        proxy = any(r.kind == "network" and r.decision == "allow" for r in self.policy.rules)
        sandbox = dataclasses.replace(sandbox, proxy=(PROXY_PORT, egress.proxy_socket) if proxy else None,
                                      tools=(port, egress.tools_socket))  # fmt: skip
        self.transcript.record(RecordType.SANDBOX, **sandbox.describe())
        return sandbox, egress, tools_socket

    async def _start_host_tools(
        self, link: AgentLink, egress: Egress | None, tools_socket: socket.socket | None
    ) -> HostToolServer | None:
        """Serve the host's tools over MCP when the agent can use an HTTP MCP server."""
        if not link.supports_http_mcp:
            self.transcript.record(
                RecordType.HOST_TOOLS, served=False, why="the agent does not advertise mcpCapabilities.http"
            )
            return None
        from ..host._host_tools import HostTools  # the MCP server costs ~0.5 s to import: only when it is used
        from ..host._mcp_host import HostToolServer

        tools = HostTools(self.provider, workspace=self.config.workspace, git_dir=self.git_dir,
                          base_branch=self.config.queue.base_branch, host_calls=self.host.call)  # fmt: skip
        server = HostToolServer(tools, self.transcript)
        self.teardown.add("host_tools", server.stop)
        await server.start(tools_socket)
        if egress is not None:
            egress.tools_port = server.port
        self.transcript.record(RecordType.HOST_TOOLS, served=True, port=server.port,
                               allowlist=self.config.role.tools or "all")  # fmt: skip
        return server
