"""The loop kernel: one agent, one workspace, a queue of tasks, one terminal per run.

    run
     ├─ activate: preconditions (static, host, git)    → BlockedPrecondition
     ├─ start the agent (AgentLink), initialize         → Failed
     └─ per task (a session each), per turn (a session/prompt):
          the stop reason + what the turn did → the next prompt, or the task's terminal

`Kernel` is the facade a caller holds (config, `cancel`, `steer`, `status`); each `run()` makes a
`Run` (harness/kernel/_run.py) that holds what the run opened. The link maps agent faults, deadlines and
cancels to stops; `HostCalls` maps host trouble (retries, back-off) to Blocked* stops. Every message
and decision lands in the transcript, and the terminal is its last line.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ..config._config import Config, MemoryQueueConfig, check_transcripts_outside
from ..config._exceptions import ConfigError
from ..git._preconditions import blocked
from ..link._agent_link import VERSION
from ..link._client import InteractiveHandler
from ..models import LockError, ModelLock
from ..policy._policy import Policy
from ..queues import QueueProvider, make_provider
from ..record._records import RecordType
from ..record._recovery import ActiveRuns
from ..record._results import RunResult, TaskResult
from ..record._terminals import Stop, Terminal
from ..record._transcript import Transcript
from ._model_server import check_endpoint_allowed, describe_endpoint, pin_mismatch
from ._run import Controls, Run, RunState

__all__ = ["Kernel", "RunState", "default_transcript_path"]

#: Terminals a refusal recorded after the fact overrides (a fault or a cancel says more).
_SUCCESS = frozenset({Terminal.IDLE, Terminal.COMPLETED, Terminal.END_TURN, Terminal.MAX_ITERATIONS,
                      Terminal.BLOCKED_AWAITING_INPUT})  # fmt: skip


def default_transcript_path(config: Config) -> Path:
    """`<transcripts>/run-<UTC time>-<random>.jsonl`, by default under the XDG state dir."""
    base = config.transcripts
    if base is None:
        state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
        base = Path(state) / "loop-harness" / "transcripts"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return base / f"run-{stamp}-{secrets.token_hex(3)}.jsonl"


class Kernel:
    """Runs one config: `await Kernel(config).run()` drains the queue once.

    Parameters:
        config: the validated run config.
        provider: the queue provider (default: the one the config names).
        interactive_handler: answers permission requests when the rule list is empty.
        transcript_path: where the JSONL transcript goes (default: `default_transcript_path`).
        observer: called with every transcript record as it is written (progress, tests).
        on_task_boundary: awaited between tasks, after a task completed and before the queue is listed
            again, with the number completed so far in this run (the soak samples and checks there).
        worktree_locked: the caller holds the worktree's lock (harness/git/_worktree_lock.py) for this run;
            otherwise the run takes it before anything else, and a second loop is refused.
        completions: a file the caller keys by its own queue identity (the control server) where completed
            task ids are kept, whatever the provider, and never cleared at `Idle`; the next run skips them.
    """

    def __init__(
        self,
        config: Config,
        *,
        provider: QueueProvider | None = None,
        interactive_handler: InteractiveHandler | None = None,
        transcript_path: Path | None = None,
        observer: Callable[[dict[str, Any]], None] | None = None,
        on_task_boundary: Callable[[int], Awaitable[None]] | None = None,
        worktree_locked: bool = False,
        completions: Path | None = None,
    ) -> None:
        self.config = config
        self.provider = provider or make_provider(config.queue, trigger=config.role.trigger)
        # The memory host forgets what it completed when its process ends: the kernel remembers (per
        # workspace and queue, beside the transcripts) for the provider it made itself from the config.
        self._remembers = provider is None and isinstance(config.queue, MemoryQueueConfig)
        self.interactive_handler = interactive_handler
        self.transcript_path = transcript_path or default_transcript_path(config)
        self.observer = observer
        self.on_task_boundary = on_task_boundary
        self.worktree_locked = worktree_locked
        self.completions = completions
        self._controls = Controls()
        self._run: Run | None = None  # the current (or last) run
        self._ended: dict[str, Any] = {}  # the last run's terminal, once it has one

    @property
    def state(self) -> RunState:
        if self._run is None:
            return RunState.NEW
        return self._run.state

    @property
    def status(self) -> dict[str, Any]:
        """The loop status: state, current task and iteration (or the terminal), and the rule ids that
        decided its requests."""
        run = self._run
        if run is None:
            return {"state": RunState.NEW, "rule_ids": []}
        where = self._ended if run.state is RunState.ENDED else run.position
        return {"state": run.state, **where, "rule_ids": run.rule_ids}

    @property
    def steering_pending(self) -> list[str]:
        """Steering queued for the next turn boundary and not yet delivered."""
        return list(self._controls.steering)

    @property
    def transcript_bytes(self) -> int:
        """Bytes written to this run's transcript so far."""
        return self._run.transcript.bytes_written if self._run is not None else 0

    def __repr__(self) -> str:
        status = ", ".join(f"{k}={v}" for k, v in self.status.items())
        return f"<Kernel [{status}]>"

    # --- control from outside (another task, a signal handler, another thread) -----------------

    def steer(self, text: str) -> None:
        """Queue advisory text for the agent; it is delivered at the next turn boundary."""
        self._controls.steer(text)

    def cancel(self) -> None:
        """A user's cancel: the run ends `Cancelled` (after session/cancel, grace, kill)."""
        self._controls.cancel()

    # --- the run -------------------------------------------------------------------------------

    async def run(self, *, task_id: str | None = None, prompt: str | None = None) -> RunResult:
        """Drain the queue (default), run one named task, or run a single prompt.

        Raises ConfigError, before anything is written, when the transcript (or the completions file) would go
        inside the workspace (or through a hard link), and when its directory cannot be written."""
        # `transcripts:` is checked when the config loads; this covers --transcript (through a symlink too) and
        # the default directory (a workspace that is $HOME, or holds $XDG_STATE_HOME).
        check_transcripts_outside(self.config.workspace, self.transcript_path.resolve().parent, key="transcript")
        if self.completions is not None:  # inside, the agent could write ids there and have tasks skipped as done
            check_transcripts_outside(self.config.workspace, self.completions.resolve().parent, key="completions")
        if self.transcript_path.exists() and self.transcript_path.stat().st_nlink > 1:
            raise ConfigError("transcript", f"{self.transcript_path} has other names (hard links): the transcript "
                              "would be written wherever they are; give a new file")  # fmt: skip
        endpoint, pinned = self.config.agent.endpoint, None
        if endpoint is not None:  # a model server the sandbox would never let the agent reach: said before the run
            check_endpoint_allowed(self.config, Policy(self.config.policy.rules, self.config.workspace))
            if endpoint.pin is not None:
                try:
                    pinned = ModelLock.load().endpoint(endpoint.pin)
                except LockError as exc:
                    raise ConfigError("agent.endpoint.pin", str(exc)) from None
        active = ActiveRuns(self.transcript_path.parent)
        try:
            recovered = active.recover()  # runs whose kernel died: ended Failed/restarted
            transcript = Transcript(self.transcript_path, observer=self.observer)
            marker, token, trust = active.begin(self.transcript_path)
        except OSError as exc:
            raise ConfigError("transcripts", f"cannot write {self.transcript_path}: {exc.strerror or exc}") from None
        run = self._run = Run(
            self.config,
            self.provider,
            transcript=transcript,
            transcript_path=self.transcript_path,
            active=active,
            marker=marker,
            token=token,
            controls=self._controls,
            interactive_handler=self.interactive_handler,
            on_task_boundary=self.on_task_boundary,
            remembers=self._remembers,
            worktree_locked=self.worktree_locked,
            completions=self.completions,
        )
        mode = "prompt" if prompt is not None else "task" if task_id is not None else "queue"
        model_server = {"endpoint": await asyncio.to_thread(describe_endpoint, endpoint)} if endpoint else {}
        mismatch = pin_mismatch(model_server["endpoint"], pinned) if pinned is not None else None
        transcript.record(
            RecordType.RUN_START,
            mode=mode,
            kernel_version=VERSION,
            workspace=str(self.config.workspace),
            config=str(self.config.source) if self.config.source else None,
            agent=self.config.agent.command,
            provider=self.provider.name,
            rules=[r.id for r in self.config.policy.rules],
            limits=self.config.resolved_limits(),
            **model_server,
            **trust,  # what recovery checks a marker against, should this kernel die
        )
        for ended in recovered:
            transcript.record(RecordType.RECOVERED, **ended)
        tasks: list[TaskResult] = []
        run.state, run.position = RunState.RUNNING, {"mode": mode}
        try:
            if mismatch is not None:  # not the model models.lock pins: no agent is started on it
                stop = blocked("model_server", mismatch, pin=endpoint.pin if endpoint else None)
                transcript.record(RecordType.PRECONDITIONS, ok=False, failed=dict(stop.reason))
            else:
                stop = await self._drive(run, tasks, task_id=task_id, prompt=prompt)
        except asyncio.CancelledError:
            await run.teardown.close()
            self._finish(run, Stop(Terminal.CANCELLED, {"kind": "interrupted"}), tasks)
            raise
        except Exception as exc:  # a kernel fault still ends the run in a terminal
            transcript.record(RecordType.KERNEL_ERROR, error=repr(exc), traceback=traceback.format_exc())
            stop = Stop(Terminal.FAILED, {"kind": "kernel_error", "error": repr(exc)})
        await run.teardown.close()  # a call the agent made after its last turn has been answered by now
        refused = run.refused()
        if refused is not None and stop.terminal in _SUCCESS:
            stop = refused
        return self._finish(run, stop, tasks)

    @staticmethod
    async def _drive(run: Run, tasks: list[TaskResult], *, task_id: str | None, prompt: str | None) -> Stop:
        agent = await run.prepare(single_prompt=prompt is not None)
        if isinstance(agent, Stop):
            return agent
        if prompt is not None:
            run.transcript.record(RecordType.TASK_START, task={"id": None, "title": "single prompt"})
            stop = (await run.session(agent, prompt, task=None))[0]
            return await run.land_prompt(agent, stop)  # a prompt's changes land as a task's do
        return await run.drain(agent, tasks, only=task_id)

    def _finish(self, run: Run, stop: Stop, tasks: list[TaskResult]) -> RunResult:
        self._ended = {"terminal": stop.terminal.value}
        run.state = RunState.ENDED
        run.transcript.record(
            RecordType.TERMINAL,
            terminal=stop.terminal.value,
            reason=dict(stop.reason),
            tasks=[t.to_json() for t in tasks],
            steering_undelivered=len(self._controls.steering),
        )
        run.transcript.close()
        run.active.end(run.marker)
        return RunResult(stop, tasks, self.transcript_path)
