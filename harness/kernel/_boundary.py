"""The task boundary's git: preconditions checked from one libgit2 read (kept from the read taken while the
agent closed its session when nothing changed since), the change meter, and the completed-task record.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pygit2
from pygit2.enums import FileMode

from ..budget._changes import ChangeMeter
from ..git._preconditions import GitState, blocked, check_git, read_git_state, repository_dirs
from ..git._repository_events import RepositoryEvents
from ..git._upstreams import Upstreams
from ..git._worktree_events import WorktreeEvents
from ..record._records import RecordType
from ..record._terminals import Stop
from ._completed import CompletedTasks
from ._parts import Agent, RunParts, _closer

__all__ = ["Boundary"]

#: Config fields that do not change which queue a run drains (its remembered completions stay).
_NOT_THE_QUEUE = {"source", "role_source", "autonomy", "autonomy_sources", "autonomy_warnings"}


class Boundary(RunParts):
    """The seam of a `Run` that reads git at the task boundaries."""

    # --- git at the boundaries -----------------------------------------------------------------

    def _check_git(
        self, *, left_by_task: str | None, state: GitState | None = None, while_closing: bool = False
    ) -> Stop | None:
        state = state or self._git_state()
        if state is None:
            return blocked("git_worktree", f"{self.config.workspace} is not a git worktree")
        stop = check_git(state, left_by_task=left_by_task)
        read = {"git_read": "while_closing"} if while_closing else {}
        self.transcript.record(RecordType.PRECONDITIONS, ok=stop is None, failed=dict(stop.reason) if stop else None,
                               **read)  # fmt: skip
        return stop

    def _git_state(self) -> GitState | None:
        if self.git_dir is None:
            return None
        meter = self._change_meter()
        if meter is not None:
            meter.before_boundary_read()
        state = self._read_git()
        if meter is not None:  # the next task's changes are counted from this read
            meter.boundary(clean=not state.changes, ignored=state.ignored, head=state.head)
        return state

    def _read_git(self) -> GitState:
        assert self.git_dir is not None
        if self._repo is None:
            self._repo = pygit2.Repository(str(self.git_dir))
            self._upstreams = Upstreams(self._repo, repository_dirs(self.git_dir))
        return read_git_state(self.config.workspace, self.git_dir, self._repo, self._upstreams)

    def _read_while_closing(self, agent: Agent) -> GitState | None:
        """The boundary's git read, taken while the agent closes the last session (it is otherwise idle then,
        and so is the agent while the kernel reads after the answer); None where it could not be confirmed.

        Only where the agent can change nothing the read depends on but the worktree's files: the OS sandbox
        on, with its private HOME and TMP and `.git` read-only (the agent cannot commit, switch branches or
        start a merge, nor write a configuration, exclude or hard-linked file outside), the workspace the
        worktree's root (its events cover all git reads) and no submodule (whose own git dir the read
        consults). Both event queues are emptied first: `_boundary_state` keeps the read only if neither had
        an event until the close was answered, so what the agent wrote as it closed the session is read again,
        after the answer. What raises no event is not: a write through a shared memory mapping or by Linux AIO
        made in that window is seen by the next full read (the next boundary's), as one made just after the
        answer always was."""
        sandbox, env = self.config.sandbox, self.config.agent.env
        private = sandbox.home is None and sandbox.tmp is None and not {"HOME", "XDG_CONFIG_HOME"} & set(env)
        if not agent.link.closing or sandbox.mode == "off" or sandbox.git_writable or not private:
            return None
        # with an overlay the worktree changes only when the kernel applies a task, after the close: its writes
        # are events, so `_boundary_state` reads git again whenever something was applied
        if self.git_dir is None:
            return None
        meter, repository = self._change_meter(), self._repository_watch()
        if meter is None or meter.events is None or meter.events.blind or repository is None or repository.blind:
            return None
        moved = repository.changed()  # also by someone else than the agent (a person's commit)
        if self._beyond_events and not moved:  # as last time: the read after the answer is the boundary's
            return None
        meter.before_boundary_read()
        try:
            state = self._read_git()
            assert self._repo is not None
            if moved or self._beyond_events is None:  # the index is read afresh by the status above
                workdir = self._repo.workdir
                self._beyond_events = (
                    workdir is None
                    or Path(workdir).resolve() != self.config.workspace.resolve()
                    or any(entry.mode == FileMode.COMMIT for entry in self._repo.index)
                )
        except (pygit2.GitError, OSError):  # judged after the answer, by the read then
            return None
        return None if self._beyond_events else state

    def _boundary_state(self, early: GitState | None) -> tuple[GitState | None, bool]:
        """The state the boundary judges: the read taken while closing when nothing has changed since (True),
        else a read now. Any worktree event counts, one beneath an ignored directory too."""
        meter, repository = self._meter, self._repository_events
        quiet = (early is not None and meter is not None and meter.events is not None and repository is not None
                 and not meter.events.changed(strict=True))  # fmt: skip
        if quiet and repository is not None and repository.changed():
            quiet, self._beyond_events = False, None  # the index may hold a gitlink now: looked at again next time
        if quiet:
            assert early is not None and meter is not None
            meter.boundary(clean=not early.changes, ignored=early.ignored, head=early.head)
            return early, True
        return self._git_state(), False

    def _repository_watch(self) -> RepositoryEvents | None:
        """The inotify watches on the repository's own directories (opened once; None where they cannot be)."""
        if self._repository_events is None and not self._repository_unwatched and self.git_dir is not None:
            try:
                self._repository_events = RepositoryEvents(repository_dirs(self.git_dir))
            except OSError:
                self._repository_unwatched = True
                return None
            self.teardown.add("repository_events", _closer(self._repository_events))
        return self._repository_events

    def _change_meter(self) -> ChangeMeter | None:
        """The run's change meter (opened at the first git read, its inotify watches with it); None when
        git cannot be read here (the git precondition says why)."""
        if self._meter is None and self.git_dir is not None:
            try:
                events: WorktreeEvents | None = WorktreeEvents(self.config.workspace)
            except OSError:  # no inotify here (or no descriptor left): every measure reads git
                events = None
            try:
                self._meter = ChangeMeter(self.config.workspace, self.git_dir, events)
                self._meter.overlay = self._overlay
            except (pygit2.GitError, OSError):
                if events is not None:
                    events.close()
                return None
            self.teardown.add("changes", _closer(self._meter))  # its inotify descriptor
        return self._meter

    # --- the queue -----------------------------------------------------------------------------

    def _completed_store(self) -> CompletedTasks | None:
        if self.completions is not None:
            return CompletedTasks(self.completions, forget_when_drained=False)
        if not self.remembers:
            return None
        # The queue: this config, as written (an edited config is a fresh record), and what it drains.
        written = hashlib.sha256(self.config.model_dump_json(exclude=_NOT_THE_QUEUE).encode()).hexdigest()
        queue = f"{self.config.role.trigger}:{self.config.source or 'inline'}:{written}"
        return CompletedTasks.beside(self.transcript_path.parent, workspace=self.config.workspace, git_dir=self.git_dir,
                              queue=queue)  # fmt: skip
