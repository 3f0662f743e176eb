"""One run of the kernel: what it opened, and the loop over tasks and turns.

`Kernel.run()` makes a `Run` once its transcript is open; the run's parts are made in order, each
registering how it is closed with the run's `Teardown`:

    Run(...)                 policy, host calls, git dir              (never optional)
    run.prepare()            preconditions → sandbox → egress → client → agent link → host tools
                             → `Agent` (client, link, host tools), or the Stop that prevented it
    run.drain(agent, ...)    per task a session, per turn a prompt: `_turns` decides what follows
    run.teardown.close()     agent, terminals, host tools, provider, egress, sandbox dir: in that order

`Run` is the drain loop and the session; its seams are mixins over `RunParts` (what they share, set here in
`__init__`): `_assembly.Assembly` (prepare), `_boundary.Boundary` (git at the boundaries), `_landing.Landing`
(what a task changed, judged and landed), and `_parts` (controls, teardown, the helpers).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pygit2

from ..budget._budget import CONVERGE_PROMPT, Account, NewSegment, StopCode
from ..budget._changes import ChangeMeter
from ..budget._questions import restate
from ..budget._watch import TaskWatch
from ..config._config import Config
from ..git._commit import commit_task
from ..git._preconditions import GitState, blocked, check_git, find_git_dir
from ..git._repository_events import RepositoryEvents
from ..git._upstreams import Upstreams
from ..host._hostcalls import HostCalls
from ..link._agent_link import Interrupted
from ..link._client import InteractiveHandler
from ..policy._change_set import (
    change_refusal,
)
from ..policy._policy import Policy
from ..queues import QueueProvider, Task
from ..record._records import RecordType
from ..record._recovery import ActiveRuns
from ..record._results import TaskResult
from ..record._terminals import Stop, Terminal
from ..record._transcript import Transcript
from ..sandbox._overlay import WorktreeOverlay
from ._assembly import Assembly
from ._boundary import Boundary
from ._landing import Landing
from ._parts import Agent, Controls, RunState, Teardown, _resolve, remove_tree
from ._turns import SEGMENT_PROMPT, PromptKind, TurnOutcome, after_turn, before_turn

__all__ = ["Agent", "Controls", "Run", "RunState", "Teardown", "remove_tree"]


class Run(Assembly, Boundary, Landing):
    """One `Kernel.run()`: made once its transcript is open; see the module docstring."""

    def __init__(
        self,
        config: Config,
        provider: QueueProvider,
        *,
        transcript: Transcript,
        transcript_path: Path,
        active: ActiveRuns,
        marker: Path,
        token: str,
        controls: Controls,
        interactive_handler: InteractiveHandler | None,
        on_task_boundary: Callable[[int], Awaitable[None]] | None,
        remembers: bool,
        worktree_locked: bool = False,
        completions: Path | None = None,
    ) -> None:
        self.config = config
        self.provider = provider
        self.transcript = transcript
        self.transcript_path = transcript_path
        self.active = active
        self.marker = marker
        self.token = token  # carried by every process the run starts (see _recovery)
        self.controls = controls
        self.cancel_event = controls.bind(transcript)
        self.interactive_handler = interactive_handler
        self.on_task_boundary = on_task_boundary
        self.remembers = remembers
        self.completions = completions  # the caller's own record of completed tasks (the server's)
        self.worktree_locked = worktree_locked  # the caller holds the worktree's lock
        self.state = RunState.NEW
        self.position: dict[str, Any] = {}  # mode, or the current task and iteration
        self.teardown = Teardown(transcript)
        transcript.on_fault = self._stop_for_the_disk  # its disk filled: the run ends Failed, kind disk_full
        self.teardown.add("provider", provider.aclose)
        self.git_dir = find_git_dir(config.workspace)  # None: not a git worktree (a precondition says so)
        self._repo: pygit2.Repository | None = None  # opened at the first git state read
        self._upstreams: Upstreams | None = None  # with it
        self._meter: ChangeMeter | None = None  # opened at the first git read
        self._overlay: WorktreeOverlay | None = None  # the sandbox's copy-on-write worktree, when it has one
        self._repository_events: RepositoryEvents | None = None  # opened at the first read while closing
        self._repository_unwatched = False  # its watches could not be set up: no read while closing
        # The git read consults what no event queue watches: a submodule's git dir (the index holds a gitlink), or
        # the worktree beyond the workspace. None: not looked at yet.
        self._beyond_events: bool | None = None
        self._confined: dict[str, str] = {}  # PATH as given: PATH as the agent gets it
        self.last_counts: dict[str, Any] = {}  # the last session's budget counts (its task_end record)
        self.policy = Policy(
            config.policy.rules,
            config.workspace,
            protected_globs=config.policy.protected_paths,
            protected_files=self._protected_files(),
            masked_reads=config.sandbox.mode != "off",  # commands run where read denies are masked
        )
        self.host = HostCalls(config.queue, transcript, self._sleep_or_cancel)
        self.agent: Agent | None = None  # once prepare() started it

    # --- what the facade reads -----------------------------------------------------------------

    @property
    def rule_ids(self) -> list[str]:
        return list(self.agent.client.rule_ids) if self.agent is not None else []

    def refused(self) -> Stop | None:
        """A refusal stops the run wherever it happened: in a turn, or in a call that came late. So does a full
        disk under the transcript (after a refusal: the verdict on the agent comes first)."""
        if self.agent is not None and self.agent.client.refusals:
            return Stop(Terminal.BLOCKED_POLICY, self.agent.client.refusals[0])
        fault = self.transcript.fault
        return Stop(Terminal.FAILED, fault) if fault is not None else None

    def _stop_for_the_disk(self) -> None:
        """The transcript met a full disk: the running turn is stopped now, not when the agent ends it (a budget's
        interrupt; `refused()` then names the fault). Called wherever the transcript was written: any thread."""
        watch = self.agent.client.watch if self.agent is not None else None
        if watch is not None:
            watch.interrupt.get_loop().call_soon_threadsafe(_resolve, watch.interrupt)

    async def drain(self, agent: Agent, tasks: list[TaskResult], *, only: str | None) -> Stop:
        """Run the queue's tasks in order until it is empty (`only`: just that task)."""
        completed: set[str] = set()
        store = self._completed_store()
        earlier = store.load() if store is not None else {}
        if store is not None:

            async def close_store() -> None:
                store.close()

            self.teardown.add("completed", close_store)
        skipped: set[str] = set()
        last: TaskResult | None = None
        closing_read: GitState | None = None  # the read taken while the last task's session closed
        while True:
            early = closing_read or (self._read_while_closing(agent) if last is not None else None)
            closing_read = None
            # The last session/close answered before anything is judged at the boundary: a call the agent made
            # meanwhile was refused, and what it wrote is in the git read (read again if the early one missed it).
            await agent.link.session_closed()
            if last is not None and self.on_task_boundary is not None:
                await self.on_task_boundary(len(completed))
            if self.controls.cancel_requested:
                return Stop(Terminal.CANCELLED, {"kind": "user_cancel", "during": "task_boundary"})
            refused = self.refused()
            if refused is not None:
                return refused
            listing = await self.host.call("list_tasks", self.provider.list_tasks)
            if isinstance(listing, Stop):
                return listing
            if len(skipped) < len(earlier):  # tasks completed by an earlier run: each said once per run
                listed = [t for t in listing if t.id not in completed and (only is None or t.id == only)]
                for done in [t for t in listed if t.id in earlier and t.id not in skipped]:
                    skipped.add(done.id)
                    reason = {"kind": "completed_earlier", **earlier[done.id]}
                    tasks.append(TaskResult(done.id, done.title, Terminal.COMPLETED, reason))
                    self.transcript.record(
                        RecordType.TASK_SKIPPED, task={"id": done.id, "title": done.title}, reason=reason
                    )
                    if only is not None:
                        return Stop(Terminal.COMPLETED, reason)
            # the next task: the first one listed (a long queue is not copied at every boundary)
            task = next((t for t in listing if t.id not in completed and t.id not in skipped
                         and (only is None or t.id == only)), None)  # fmt: skip
            state, while_closing = self._boundary_state(early) if last is not None else (None, False)
            if last is not None:
                last.left_changes = list(state.changes) if state else []
            if task is None:
                if only is not None:
                    return blocked("task_assigned", f"task {only!r} is not in the queue", task=only)
                # never Idle with work left behind: the last task's changes stop the run as they stop a next task
                if last is not None and state is not None and check_git(state, left_by_task=last.id) is not None:
                    stop = self._check_git(left_by_task=last.id, state=state, while_closing=while_closing)
                    assert stop is not None
                    return stop
                if store is not None and store.forget_when_drained:
                    store.clear()  # the queue is drained: the next run of it starts afresh
                idle = {"kind": "queue_empty", "completed": len(completed)}
                return Stop(Terminal.IDLE, {**idle, "skipped_completed_earlier": len(skipped)} if skipped else idle)
            if last is not None:
                stop = await self.host.authorize(self.provider) or self._check_git(
                    left_by_task=last.id, state=state, while_closing=while_closing
                )
                if stop is not None:
                    return stop
            result = await self._run_task(agent, task)
            tasks.append(result)
            if result.terminal is not Terminal.COMPLETED:
                self._keep_unlanded(result)
                return Stop(result.terminal, result.reason)
            # the boundary's git read, taken while the agent closes the session (kept at the boundary below only if
            # nothing changed since); what the agent wrote as it closed the session is judged too
            closing_read = self._read_while_closing(agent)
            await agent.link.session_closed()
            refusal = self._land_overlay(result) or self._judge_changes(result)  # what lands is what the rules allow
            if refusal is not None:
                return refusal
            if self.config.commit is not None:  # the kernel owns git: commit (and push) what the task did
                # what the policy allows of the task's changes; what was ignored when it started is not one
                start_ignored = self._meter.ignored_at_start if self._meter is not None else frozenset()
                committed = await commit_task(
                    self.config.workspace, self.config.commit, task.id, task.title,
                    policy=self.policy, ignored=start_ignored, git_dir=self.git_dir,
                )  # fmt: skip
                self.transcript.record(RecordType.COMMIT, task=task.id, **committed)
                if committed.get("refused"):  # a refused change written after the boundary judged: none of it
                    late = change_refusal(committed["refused"], committed["refused_total"])
                    return self._refuse_changes(result, late)
            completed.add(task.id)  # skipped from now on, even if the host cannot mark it done
            if store is not None:
                try:
                    store.add(task.id, self.transcript_path)  # and by the next run of this queue
                except OSError as exc:
                    self.transcript.record(RecordType.COMPLETION_NOT_KEPT, task=task.id, error=exc.strerror or str(exc))
            outcome = await self.host.call("mark_done", self.provider.mark_done, task)
            if isinstance(outcome, Stop):
                result.mark_done_error = dict(outcome.reason)
            if only is not None:  # a single-task run ends with its task
                await agent.link.session_closed()
                state = self._git_state()
                result.left_changes = list(state.changes) if state else []
                # never Completed with work left behind: the changes stop it as they would stop a next task
                return self._check_git(left_by_task=task.id, state=state) or Stop(Terminal.COMPLETED, result.reason)
            last = result

    async def _run_task(self, agent: Agent, task: Task) -> TaskResult:
        self.position = {"task": task.id, "iteration": 0}
        self.transcript.record(RecordType.TASK_START, task={"id": task.id, "title": task.title})
        started = time.monotonic()
        prompt = _task_prompt(self.config.role.prompt, task)
        host_stops: dict[str, Stop] = {}
        watch = self._new_watch()
        if agent.host_tools is None:
            agent.client.begin_task()
            stop, iterations = await self.session(agent, prompt, task=task, watch=watch)
            used: list[str] = []
        else:
            binding = agent.host_tools.tools.bind(task, self.config.role.tools)
            binding.ask = lambda question, options: watch.answer("ask_question", question, options)
            agent.client.begin_task(binding.allowed)
            with agent.host_tools.serving(binding) as entry:
                stop, iterations = await self.session(agent, prompt, task=task, mcp_servers=[entry], watch=watch)
                await agent.link.session_closed()  # its tools are served, and their use counted, until then
            used, host_stops = binding.used, binding.host_stops
        stop = self._check_termination(stop, used, host_stops=host_stops)
        result = TaskResult(
            id=task.id,
            title=task.title,
            terminal=stop.terminal,
            reason=dict(stop.reason),  # built for this task, not shared
            rule_ids=list(agent.client.rule_ids),
            iterations=iterations,
            tokens=self._tokens(agent),
            seconds=time.monotonic() - started,
            failed_tool_calls=self.last_counts.get("failed_tool_calls", 0),
        )
        # the budget counts go on the record only: a run keeps one TaskResult per task in memory
        self.transcript.record(RecordType.TASK_END, **result.to_json(), budget=self.last_counts)
        return result

    def _check_termination(self, stop: Stop, used: list[str], *, host_stops: dict[str, Stop]) -> Stop:
        """After Completed, the role's termination must be met, or the run waits for a person; when the
        tool it needs could not reach the host (rate limit, outage), that is why, and its terminal ends it."""
        termination = self.config.role.termination
        if stop.terminal is not Terminal.COMPLETED or termination is None:
            return stop
        needed = {"ProposalOpened": "open_proposal", "ReviewSubmitted": "submit_review"}[termination]
        if needed in used:
            return stop
        if needed in host_stops:
            return host_stops[needed]
        reason = {
            "kind": "termination",
            "stop_reason": "termination",
            "termination": termination,
            "detail": f"the task completed without a successful {needed}",
            "completed": dict(stop.reason),
        }
        return Stop(Terminal.BLOCKED_AWAITING_INPUT, reason)

    # --- a session, turn by turn ---------------------------------------------------------------

    async def session(
        self,
        agent: Agent,
        first_prompt: str,
        *,
        task: Task | None,
        mcp_servers: list[dict[str, Any]] | None = None,
        watch: TaskWatch | None = None,
    ) -> tuple[Stop, int]:
        """Run one session to its end: the stop, and the number of prompt rounds."""
        meta = {"loopHarness": {"taskId": task.id, "title": task.title}} if task else {}
        session_id = await agent.link.new_session(self.config.workspace, meta, mcp_servers or [])
        if isinstance(session_id, Stop):
            return session_id, 0
        watch = watch or self._new_watch()
        agent.client.watch = watch
        text, kind = first_prompt, str(PromptKind.TASK)
        standing = iterations = 0
        try:
            while True:
                budget = watch.tripped if isinstance(watch.tripped, Stop) else watch.account.before_turn()
                step = before_turn(budget=budget, cancel_requested=self.controls.cancel_requested)
                if isinstance(step, Stop):
                    return step, iterations
                if isinstance(step, NewSegment):
                    self.transcript.record(RecordType.BUDGET, event="new_segment", why=step.why,
                                           continuation=step.continuation, limit=step.limit)  # fmt: skip
                iterations += 1
                converge = watch.account.converge_now()  # before the round is counted: the rounds left
                watch.account.turn_started()
                counts = self._counts(watch)
                self.position = {"task": task.id if task else None, "iteration": iterations, **counts}
                text, kind = self._with_notes(watch, text, kind, converge=converge)
                turn = agent.client.begin_turn(session_id)
                self.transcript.record(RecordType.TURN, iteration=iterations, prompt_kind=kind, budget=counts)
                answer = await agent.link.prompt(session_id, text, cancel=self.cancel_event, interrupt=watch.interrupt)
                if isinstance(answer, Stop):
                    return answer, iterations
                refused = self.refused()
                if isinstance(answer, Interrupted):  # a budget cancelled the turn
                    if refused is not None:
                        return refused, iterations
                    stop = _interrupted(watch.tripped, answer)
                    if stop is not None:
                        return stop, iterations
                    text, kind = SEGMENT_PROMPT, str(PromptKind.CONTINUE_NEW_SEGMENT)
                    continue
                if refused is None:  # a refusal says more than a budget
                    stop = watch.turn_ended(tool_calls=turn.tool_calls)
                    if stop is not None:
                        return stop, iterations
                outcome = TurnOutcome(answer, turn.tool_calls, turn.client_calls, refused.reason if refused else None)
                next_ = after_turn(outcome, single_prompt=task is None, standing=standing,
                                   standing_answers=self.config.limits.standing_answers)  # fmt: skip
                if isinstance(next_, Stop):
                    return next_, iterations
                text, kind, standing = next_.text, str(next_.kind), next_.standing
        finally:
            self.last_counts = self._counts(watch)
            agent.client.watch = None
            await agent.client.exec_host.release_session(session_id)
            await agent.link.end_session(session_id)

    def _new_watch(self) -> TaskWatch:
        """A fresh account for a session, its change meter started on the tree as it is now."""
        account = Account(self.config.autonomy, self.config.autonomy_sources,
                          max_iterations=self.config.limits.max_iterations)  # fmt: skip
        meter = self._change_meter()
        if meter is not None:
            try:
                meter.start()
            except (pygit2.GitError, OSError) as exc:
                self.transcript.record(RecordType.BUDGET, event="changes_unmeasured", error=str(exc))
                return TaskWatch(account, None, self.transcript)
        return TaskWatch(account, meter, self.transcript)

    def _with_notes(self, watch: TaskWatch, text: str, kind: str, *, converge: bool) -> tuple[str, str]:
        """The prompt with the operator's steering, the kernel's nudges and the decisions it took."""
        text, kind = self._with_steering(text, kind)
        if converge:
            watch.notes.append(("convergence", CONVERGE_PROMPT))
        notes, watch.notes = watch.notes, []
        for name, note in notes:
            self.transcript.record(RecordType.BUDGET, event=name, **self._counts(watch))
            text, kind = f"{text}\n\n{note}", f"{kind}+{name}"
        decisions = watch.take_decisions()
        if decisions:
            text, kind = f"{text}\n\n{restate(decisions)}", f"{kind}+decisions"
        return text, kind

    @staticmethod
    def _counts(watch: TaskWatch) -> dict[str, Any]:
        """What the progress line shows: turn cur/max · total cur/max · cont cur/max, and tool calls."""
        counts, budget = watch.account.counts, watch.account.autonomy.budget
        return {
            "turn": [counts.segment_turns, budget.model_turns.per_segment],
            "total": [counts.model_turns, budget.model_turns.total],
            "cont": [counts.continuations, budget.model_turns.continuations],
            "tool_calls": [counts.segment_tool_calls, budget.tool_calls.per_segment],
            "files": counts.files,
            "lines": counts.lines,
            "failed_tool_calls": counts.failed_tool_calls,
        }

    def _tokens(self, agent: Agent) -> dict[str, Any] | None:
        """The task's token usage: the prompt answer's, else the last `usage_update` (Codex reports only
        that: context tokens `used` of `size`)."""
        if agent.link.last_usage:
            return agent.link.last_usage
        usage = agent.client.context_usage
        return dict(usage) if usage else None

    def _with_steering(self, text: str, kind: str) -> tuple[str, str]:
        notes = self.controls.take_steering()
        if not notes:
            return text, kind
        self.transcript.record(RecordType.STEER_DELIVERED, count=len(notes))
        steering = "\n".join(f"- {n}" for n in notes)
        return f"{text}\n\nSteering from the operator (advisory):\n{steering}", f"{kind}+steering"

    async def _sleep_or_cancel(self, seconds: float) -> bool:
        """Sleep; True if a user cancel arrived meanwhile."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.cancel_event.wait(), seconds)
        return self.cancel_event.is_set()


def _interrupted(tripped: Stop | NewSegment | None, answer: Interrupted) -> Stop | None:
    """The stop a budget interrupt ends the task with; None: a new segment goes on."""
    detail = {"agent_stop_reason": answer.agent_stop_reason, "killed": answer.killed}
    if isinstance(tripped, Stop):
        return Stop(tripped.terminal, {**tripped.reason, **detail})
    assert tripped is not None
    if answer.killed:  # it ignored session/cancel: there is no session left to continue
        reason = {"kind": "budget", "stop_code": str(StopCode.AGGREGATE_TOOL_CALL_LIMIT),
                  "key": "budget.tool_calls.per_segment",
                  "detail": "the agent did not stop for session/cancel at a segment ceiling", **detail}  # fmt: skip
        return Stop(Terminal.MAX_ITERATIONS, reason)
    return None


def _task_prompt(prefix: str, task: Task) -> str:
    parts = [prefix.strip()] if prefix.strip() else []
    parts.append(f"Task {task.id}: {task.title}".rstrip(": "))
    if task.body:
        parts.append(task.body)
    return "\n\n".join(parts)
