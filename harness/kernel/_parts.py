"""What every seam of a run shares: its state, the controls that reach it from outside, its teardown, the
started agent, the attributes each seam reads and writes (`RunParts`, set in `Run.__init__`), and the helpers
that close and remove what a run opened.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pygit2

from .._flag import Flag
from ..budget._changes import ChangeMeter
from ..config._config import Config
from ..git._preconditions import GitState
from ..git._repository_events import RepositoryEvents
from ..git._upstreams import Upstreams
from ..host._hostcalls import HostCalls
from ..link._agent_link import AgentLink
from ..link._client import InteractiveHandler, KernelClient
from ..policy._policy import Policy
from ..queues import QueueProvider
from ..record._records import RecordType
from ..record._recovery import ActiveRuns
from ..record._terminals import Stop
from ..record._transcript import Transcript
from ..sandbox._overlay import WorktreeOverlay

if TYPE_CHECKING:
    from ..host._mcp_host import HostToolServer

__all__ = ["Agent", "Controls", "RunParts", "RunState", "Teardown", "remove_tree"]


class RunState(StrEnum):
    NEW = "new"  # made, not yet run
    RUNNING = "running"
    ENDED = "ended"  # its terminal is the transcript's last line


@dataclass
class Controls:
    """What reaches a run from outside (another task, a signal handler, another thread): a user's
    cancel, and steering for the next turn boundary. Made with the Kernel, before any event loop."""

    cancel_requested: bool = False
    steering: list[str] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _event: Flag | None = None
    _transcript: Transcript | None = None

    def bind(self, transcript: Transcript) -> Flag:
        """The running loop's cancel flag (set already if a cancel came first)."""
        self._loop, self._event, self._transcript = asyncio.get_running_loop(), Flag(), transcript
        if self.cancel_requested:
            self._event.set()
        return self._event

    def cancel(self) -> None:
        self.cancel_requested = True
        if self._event is not None:
            self._in_loop(self._event.set)

    def steer(self, text: str) -> None:
        self._in_loop(self._queue, text)

    def take_steering(self) -> list[str]:
        notes, self.steering = self.steering, []
        return notes

    def _queue(self, text: str) -> None:
        self.steering.append(text)
        if self._transcript is not None and not self._transcript.closed:
            self._transcript.record(RecordType.STEER_QUEUED, text=text, pending=len(self.steering))

    def _in_loop(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or _running_loop() is loop:
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)


class Teardown:
    """How to close what a run opened, in a fixed order whatever was opened: stop serving the agent,
    then release its terminals, ... Each step runs whatever the one before did; a failure is recorded."""

    ORDER = ("agent", "terminals", "host_tools", "provider", "egress", "sandbox", "changes", "repository_events",
             "completed", "worktree_lock")  # fmt: skip

    def __init__(self, transcript: Transcript) -> None:
        self.transcript = transcript
        self._steps: dict[str, Callable[[], Awaitable[None]]] = {}

    def add(self, name: str, close: Callable[[], Awaitable[None]]) -> None:
        assert name in self.ORDER, name
        self._steps[name] = close

    async def close(self) -> None:
        steps, self._steps = self._steps, {}
        for name in self.ORDER:
            if name not in steps:
                continue
            try:
                await steps[name]()
            except Exception as exc:
                if not self.transcript.closed:
                    self.transcript.record(RecordType.TEARDOWN_ERROR, step=name, error=f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class Agent:
    """The started agent: the client that serves its requests, its link, and the host tools' MCP
    server (None when the agent cannot use an HTTP MCP server)."""

    client: KernelClient
    link: AgentLink
    host_tools: HostToolServer | None


class RunParts:
    """What each seam of a `Run` reads and writes (all set in `Run.__init__`), and the one call a seam makes
    into another (the assembly's activation checks git the way the boundary does)."""

    config: Config
    provider: QueueProvider
    transcript: Transcript
    transcript_path: Path
    active: ActiveRuns
    marker: Path
    token: str
    controls: Controls
    cancel_event: Flag
    interactive_handler: InteractiveHandler | None
    remembers: bool
    completions: Path | None
    worktree_locked: bool
    teardown: Teardown
    git_dir: Path | None
    policy: Policy
    host: HostCalls
    agent: Agent | None
    _repo: pygit2.Repository | None
    _upstreams: Upstreams | None
    _meter: ChangeMeter | None
    _overlay: WorktreeOverlay | None
    _repository_events: RepositoryEvents | None
    _repository_unwatched: bool
    _beyond_events: bool | None
    _confined: dict[str, str]

    def _check_git(
        self, *, left_by_task: str | None, state: GitState | None = None, while_closing: bool = False
    ) -> Stop | None:
        raise NotImplementedError  # the boundary's (`_boundary.Boundary`)


def _closer(thing: socket.socket | ChangeMeter | RepositoryEvents) -> Callable[[], Awaitable[None]]:
    async def close() -> None:
        thing.close()  # a socket: a no-op once the host-tools server has taken it over and closed it

    return close


def remove_tree(root: Path) -> tuple[list[str], str | None]:
    """Remove `root` and all in it, what its owner made unremovable too (a directory without write or search
    permission: chmod 500, 000): the directory that holds a refused entry, and a directory that could not be
    opened, get owner rwx back and the entry is removed again, once. Returns what is still there (and the first
    error). The agent has ended by now (its teardown step comes first): nothing swaps a path for a symlink
    between the check and the chmod, and no chmod follows one."""
    left: dict[str, str] = {}  # path: why (a directory is tried again after what is in it: each named once)
    tried: set[str] = set()

    def again(function: Callable[..., Any], path: str, exc: Any) -> None:
        error = exc[1] if isinstance(exc, tuple) else exc  # onerror's exc_info, or onexc's exception
        if isinstance(error, FileNotFoundError):
            return
        try:
            if path in tried:
                raise error
            tried.add(path)
            if path != str(root):  # never the directory `root` is in
                _grant(os.path.dirname(path))
            if _grant(path):  # a directory that could not be opened, or emptied
                _rmtree(path, again)
            else:
                os.unlink(path)
        except FileNotFoundError:  # gone meanwhile (with its parent)
            return
        except OSError as failed:
            left.setdefault(path, f"{type(failed).__name__}: {failed}")

    if os.path.lexists(root):
        try:
            _rmtree(str(root), again)
        except RecursionError:  # deeper than Python's stack: say so rather than end the teardown
            left.setdefault(str(root), "RecursionError: nested too deep to remove")
    return list(left), next(iter(left.values()), None)


def _grant(path: str) -> bool:
    """Owner read, write and search on `path` if it is a directory (never through a symlink); True if it is one."""
    mode = os.lstat(path).st_mode
    if not stat.S_ISDIR(mode):
        return False
    os.chmod(path, stat.S_IMODE(mode) | stat.S_IRWXU)
    return True


def _rmtree(path: str, handler: Callable[[Callable[..., Any], str, Any], None]) -> None:
    if sys.version_info >= (3, 12):  # onerror is deprecated there
        shutil.rmtree(path, onexc=handler)
    else:
        shutil.rmtree(path, onerror=handler)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
