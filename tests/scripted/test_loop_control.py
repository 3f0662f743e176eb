"""Steering, queue order, skipping completed ids, host back-off that recovers, roles."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from harness import Terminal, read_transcript
from harness.pytest_plugin import LOOP_SCRIPTED
from scripted_agents.presets import scenario, turn, write_turn

pytestmark = LOOP_SCRIPTED


def rpc(records, direction, method=None):
    return [
        r
        for r in records
        if r["type"] == "rpc" and r["dir"] == direction and (method is None or r["msg"].get("method") == method)
    ]


def test_steering_sent_mid_turn_arrives_at_the_next_turn_boundary(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(
        scenario(
            {
                "T1": [
                    turn({"message": "step one"}, {"sleep": 0.05}, {"message": "still on step one"}, stop="max_tokens"),
                    write_turn("src/a.txt", "a\n", commit="T1"),
                ]
            }
        )
    )
    kernel = {}

    def steer_mid_turn(record):
        if record["type"] == "rpc" and "step one" in str(record["msg"]) and "still" not in str(record["msg"]):
            kernel["k"].steer("use tabs, not spaces")

    result = run_loop(harness_config(path, commit={"message": "{id}"}), setup=lambda k: kernel.setdefault("k", k),
                      observer=steer_mid_turn)  # fmt: skip

    assert result.terminal is Terminal.IDLE  # steering never stops the loop
    records = read_transcript(result.transcript)
    kinds = [r["type"] for r in records]
    queued = kinds.index("steer_queued")
    first_answer = next(i for i, r in enumerate(records) if r["type"] == "rpc" and "stopReason" in str(r["msg"]))
    prompts = rpc(records, "out", "session/prompt")
    second_prompt = records.index(prompts[1])
    # queued during turn 1, after its first update and before its answer; delivered with turn 2
    assert queued < first_answer < second_prompt
    assert "still on step one" in str(records[queued + 1 : first_answer + 1])
    assert "use tabs, not spaces" not in str(prompts[0])
    assert "use tabs, not spaces" in prompts[1]["msg"]["params"]["prompt"][0]["text"]
    assert not rpc(records, "out", "session/cancel")
    assert kinds.index("steer_delivered") < second_prompt


def test_a_completed_id_is_skipped_when_the_host_cannot_close_it(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(
        scenario(
            {
                "T1": [write_turn("src/a.txt", "a\n", commit="T1")],
                "T2": [write_turn("src/b.txt", "b\n", commit="T2")],
            }
        )
    )
    queue = {"faults": [{"op": "mark_done", "signal": "rejected", "task": "T1", "times": 99, "cause": "403 forbidden"}]}
    result = run_loop(harness_config(path, tasks=[{"id": "T1"}, {"id": "T2"}], queue=queue, commit={"message": "{id}"}))

    assert result.terminal is Terminal.IDLE
    assert [t.id for t in result.tasks] == ["T1", "T2"]  # T1 stays listed, yet runs once
    assert result.tasks[0].mark_done_error == {"kind": "host_rejected", "op": "mark_done", "cause": "403 forbidden"}
    assert result.tasks[1].mark_done_error is None
    starts = [r["task"]["id"] for r in read_transcript(result.transcript) if r["type"] == "task_start"]
    assert starts == ["T1", "T2"]


@pytest.mark.parametrize(
    ("order", "expected"), [("created", ["early", "middle", "late"]), ("updated", ["late", "early", "middle"])]
)
def test_queue_order_is_the_declared_one(scripted_scenario, harness_config, run_loop, order, expected):
    path = scripted_scenario(scenario({None: [turn({"read": {"path": "README.md"}})]}))
    tasks = [
        {"id": "late", "created": 30, "updated": 1},
        {"id": "early", "created": 10, "updated": 2},
        {"id": "middle", "created": 20, "updated": 3},
    ]
    result = run_loop(harness_config(path, tasks=tasks, queue={"order": order}))

    assert result.terminal is Terminal.IDLE
    assert [t.id for t in result.tasks] == expected
    starts = [r["task"]["id"] for r in read_transcript(result.transcript) if r["type"] == "task_start"]
    assert starts == expected


def test_a_rate_limit_that_clears_is_waited_out(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")]}))
    queue = {"faults": [{"op": "list_tasks", "signal": "rate_limited", "times": 2, "reset_in_s": 0.05}]}
    result = run_loop(harness_config(path, queue=queue, commit={"message": "{id}"}))

    assert result.terminal is Terminal.IDLE
    assert result.tasks[0].terminal is Terminal.COMPLETED
    retries = [r for r in read_transcript(result.transcript) if r["type"] == "host_retry"]
    assert [(r["cause"], r["retry"]) for r in retries] == [("rate_limited", 1), ("rate_limited", 2)]
    assert all(0 < r["delay_s"] <= 0.05 for r in retries)


def test_a_rate_limit_beyond_the_wait_budget_blocks_at_once(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")]}))
    queue = {"faults": [{"op": "list_tasks", "signal": "rate_limited", "reset_in_s": 3600}], "max_wait_s": 60}
    result = run_loop(harness_config(path, queue=queue))

    assert result.terminal is Terminal.BLOCKED_RATE_LIMITED
    assert result.reason["retries"] == 0


def test_an_outage_that_clears_is_retried(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")]}))
    queue = {"faults": [{"op": "list_tasks", "signal": "unavailable", "times": 2}], "backoff_base_s": 0.01}
    result = run_loop(harness_config(path, queue=queue, commit={"message": "{id}"}))
    assert result.terminal is Terminal.IDLE
    assert [(t.id, t.terminal) for t in result.tasks] == [("T1", Terminal.COMPLETED)]
    retries = [r for r in read_transcript(result.transcript) if r["type"] == "host_retry"]
    assert [(r["op"], r["cause"], r["retry"]) for r in retries] == [  # both faults happened, each retried
        ("list_tasks", "scripted outage", 1),
        ("list_tasks", "scripted outage", 2),
    ]


def test_the_role_prefix_starts_every_task_prompt(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")]}))
    config = harness_config(
        path,
        tasks=[{"id": "T1", "title": "Add a", "body": "Create src/a.txt"}],
        role={"prompt": "You are the release engineer.", "trigger": "IssueAssigned"},
    )
    result = run_loop(config)

    first = rpc(read_transcript(result.transcript), "out", "session/prompt")[0]
    assert first["msg"]["params"]["prompt"][0]["text"] == (
        "You are the release engineer.\n\nTask T1: Add a\n\nCreate src/a.txt"
    )


def test_each_task_gets_its_own_session_on_one_agent_process(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(
        scenario(
            {
                "T1": [write_turn("src/a.txt", "a\n", commit="T1")],
                "T2": [write_turn("src/b.txt", "b\n", commit="T2")],
                "T3": [write_turn("src/c.txt", "c\n", commit="T3")],
            }
        )
    )
    result = run_loop(
        harness_config(path, tasks=[{"id": "T1"}, {"id": "T2"}, {"id": "T3"}], commit={"message": "{id}"})
    )

    records = read_transcript(result.transcript)
    assert len([r for r in records if r["type"] == "agent_start"]) == 1
    sessions = [r["msg"]["params"]["_meta"]["loopHarness"]["taskId"] for r in rpc(records, "out", "session/new")]
    assert sessions == ["T1", "T2", "T3"]
    # Each session is closed when its task ends (the agent advertises session/close), before the next opens.
    order = [
        (r["msg"]["method"], r["msg"]["params"].get("sessionId"))
        for r in rpc(records, "out")
        if r["msg"].get("method") in ("session/new", "session/close")
    ]
    opened = [
        r["msg"]["result"]["sessionId"] for r in rpc(records, "in") if "sessionId" in (r["msg"].get("result") or {})
    ]
    assert order == [m for sid in opened for m in (("session/new", None), ("session/close", sid))]


def test_steering_from_another_thread(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(
        scenario({"T1": [turn({"message": "working"}, stop="max_tokens"), write_turn("src/a.txt", "a\n", commit="T1")]})
    )
    kernel = {}

    def steer_from_a_thread(record):
        if record["type"] == "rpc" and "working" in str(record["msg"]):
            worker = threading.Thread(target=kernel["k"].steer, args=("from the operator's thread",))
            worker.start()
            worker.join()

    result = run_loop(harness_config(path, commit={"message": "{id}"}), setup=lambda k: kernel.setdefault("k", k),
                      observer=steer_from_a_thread)  # fmt: skip

    prompts = rpc(read_transcript(result.transcript), "out", "session/prompt")
    assert "from the operator's thread" in prompts[1]["msg"]["params"]["prompt"][0]["text"]
    assert result.terminal is Terminal.IDLE


def test_the_loop_status_carries_the_rule_ids(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")]}))
    seen = []
    kernel = {}

    def watch(record):
        if record["type"] == "policy":
            seen.append(kernel["k"].status)

    run_loop(harness_config(path), setup=lambda k: kernel.setdefault("k", k), observer=watch)

    assert seen[-1]["state"] == "running" and seen[-1]["task"] == "T1" and seen[-1]["iteration"] == 1
    assert [s["rule_ids"] for s in seen] == [
        ["write-src"],
        ["write-src"],
        ["write-src", "read-all"],
        ["write-src", "read-all", "git"],
    ]
    assert kernel["k"].status["state"] == "ended"
    assert "state=ended" in repr(kernel["k"])


def test_usage_reported_only_by_usage_update_reaches_the_task_result(scripted_scenario, harness_config, run_loop):
    # Codex's adapter answers session/prompt without usage and reports context tokens by usage_update.
    t1 = write_turn("src/a.txt", "a\n", commit="T1")
    t1["steps"].insert(0, {"usage": {"used": 1200, "size": 8192}})
    t1["steps"].insert(-1, {"usage": {"used": 1800, "size": 8192}})  # before its commit (read-only: it ends the turn)
    path = scripted_scenario(scenario({"T1": [t1], "T2": [write_turn("src/b.txt", "b\n", commit="T2")]}))
    result = run_loop(harness_config(path, tasks=[{"id": "T1"}, {"id": "T2"}], commit={"message": "{id}"}))

    assert result.terminal is Terminal.IDLE
    assert result.tasks[0].tokens == {"used": 1800, "size": 8192}  # the last one reported
    assert result.tasks[1].tokens is None  # T1's figures are not carried into T2's session


#: the sandbox with directory binds (a test says `worktree` where both designs are meant)
BIND = {"mode": "workspace-write", "worktree": "bind"}
#: after the kernel's bookkeeping
STRAY_ON_CLOSE = [{"sleep": 0.5}, {"run": {"script": "mkdir -p src && echo stray > src/stray.txt"}}]


def test_the_boundary_waits_for_the_close_answer_and_sees_what_the_agent_wrote_while_closing(
    scripted_scenario, harness_config, run_loop
):
    """session/close goes out as a task ends and is answered while the kernel does the task's bookkeeping:
    the boundary's git read must wait for the answer, or what the agent writes as it closes the session
    would pass the clean-tree check and be taken up by the next task."""
    first = turn({"read": {"path": "README.md"}}, on_close=STRAY_ON_CLOSE)  # leaves the tree as it found it
    path = scripted_scenario(scenario({"T1": [first], "T2": [turn({"read": {"path": "README.md"}})]}))
    result = run_loop(harness_config(path, tasks=[{"id": "T1"}, {"id": "T2"}]))

    assert result.terminal is Terminal.BLOCKED_PRECONDITION
    assert (result.reason["check"], result.reason["left_by_task"]) == ("git_clean_tree", "T1")
    assert result.reason["changes"] == ["?? src/stray.txt"]
    assert [t.id for t in result.tasks] == ["T1"]  # T2 never started on the tree T1's agent left
    records = read_transcript(result.transcript)
    close = next(r["seq"] for r in rpc(records, "in") if r["msg"].get("result") == {})
    boundary = next(r for r in records if r["type"] == "preconditions" and not r["ok"])
    assert close < boundary["seq"]
    assert "git_read" not in boundary  # the read taken while closing missed the write: git was read again


@pytest.mark.parametrize("worktree", ["bind", "overlay"])
def test_the_boundary_keeps_the_git_read_taken_while_the_agent_closed_only_when_nothing_changed(
    scripted_scenario, harness_config, run_loop, worktree
):
    """The boundary reads git while the agent closes the last session; with no event in the worktree or the
    repository until the close is answered, that read is the boundary's (the transcript says so)."""
    path = two_reading_tasks(scripted_scenario)
    result = run_loop(harness_config(path, tasks=[{"id": "T1"}, {"id": "T2"}], sandbox={**BIND, "worktree": worktree}))

    assert (result.terminal, [t.id for t in result.tasks]) == (Terminal.IDLE, ["T1", "T2"])
    boundaries = [r for r in read_transcript(result.transcript) if r["type"] == "preconditions"]
    assert [(r["ok"], r.get("git_read")) for r in boundaries] == [(True, None), (True, "while_closing")]


def read_while_closing(records):
    """Each boundary's preconditions record: whether it kept the git read taken while the agent closed."""
    return [r.get("git_read") == "while_closing" for r in records if r["type"] == "preconditions"][1:]


def two_reading_tasks(scripted_scenario, on_close=()):
    reading = turn({"read": {"path": "README.md"}})
    first = turn({"read": {"path": "README.md"}}, on_close=list(on_close)) if on_close else reading
    return scripted_scenario(scenario({"T1": [first], "T2": [reading]}))


PERSON_IN_THE_WINDOW = {
    "commit": (["commit", "-q", "--allow-empty", "-m", "by hand"], "git_unpushed_commits", "1 commit(s) on 'main'"),
    "branch": (["checkout", "-q", "-b", "by-hand"], "git_upstream", "branch 'by-hand' has no upstream"),
    "merge": (None, "git_edit_session", "a merge is in progress"),
}


@pytest.mark.parametrize(("args", "check", "detail"), PERSON_IN_THE_WINDOW.values(), ids=PERSON_IN_THE_WINDOW.keys())
def test_what_changes_in_the_repository_while_the_agent_closes_is_seen_at_the_boundary(
    scripted_scenario, harness_config, run_loop, harness_workspace, args, check, detail
):
    """Under the sandbox the agent cannot touch `.git`, but someone else can (a person's commit, a branch
    switch, a merge left half done): the repository's own directories are watched, so a change there after the
    read taken while the agent closed the session sends the boundary back to git once the close is answered."""
    path = two_reading_tasks(scripted_scenario, on_close=[{"sleep": 0.6}])

    def by_hand():
        if args is None:
            (harness_workspace.path / ".git" / "MERGE_HEAD").write_text(harness_workspace.git("rev-parse", "HEAD"))
        else:
            harness_workspace.git(*args)

    def in_the_window(record):
        if record["type"] == "task_end" and record["id"] == "T1":  # the close is out, its answer 0.6 s away
            threading.Timer(0.3, by_hand).start()  # after the read taken meanwhile

    result = run_loop(harness_config(path, tasks=[{"id": "T1"}, {"id": "T2"}]), observer=in_the_window)

    assert (result.terminal, result.reason["check"]) == (Terminal.BLOCKED_PRECONDITION, check)
    assert result.reason["detail"].startswith(detail)
    assert [t.id for t in result.tasks] == ["T1"]
    assert read_while_closing(read_transcript(result.transcript)) == [False]


def test_a_write_beneath_an_ignored_directory_while_closing_sends_the_boundary_back_to_git(
    scripted_scenario, harness_config, run_loop, harness_workspace
):
    """Keeping the early read takes no reasoning about what git ignores: any worktree event in the window counts
    (what is ignored may have changed meanwhile); the tree is still clean, read after the answer."""
    harness_workspace.commit("ignore src/out/", {".gitignore": "src/out/\n"})
    harness_workspace.git("push", "-q")
    harness_workspace.write("src/out/old", "built\n")  # there before the run: the write below is its only event
    appending = [{"sleep": 0.4}, {"run": {"script": "echo more >> src/out/old"}}]  # src/ is writable in the sandbox
    result = run_loop(harness_config(two_reading_tasks(scripted_scenario, on_close=appending),
                                     tasks=[{"id": "T1"}, {"id": "T2"}]))  # fmt: skip

    assert (result.terminal, [t.id for t in result.tasks]) == (Terminal.IDLE, ["T1", "T2"])
    assert read_while_closing(read_transcript(result.transcript)) == [False]
    assert (harness_workspace.path / "src" / "out" / "old").read_text() == "built\nmore\n"  # the write happened


def test_a_git_read_that_fails_while_the_agent_closes_is_read_again_after_the_answer(
    scripted_scenario, harness_config, run_loop, harness_workspace
):
    """A ref that points nowhere for a moment (someone's half-written update) fails the early read: the boundary
    reads git after the answer instead, as it always did, and the run goes on."""
    path = two_reading_tasks(scripted_scenario, on_close=[{"sleep": 0.6}])
    ref = harness_workspace.path / ".git" / "refs" / "remotes" / "origin" / "main"
    good = ref.read_text()

    def break_then_mend(record):
        if record["type"] == "task_end" and record["id"] == "T1":  # before the early read: it meets the broken ref
            ref.write_text("1" * 40 + "\n")
            threading.Timer(0.2, ref.write_text, (good,)).start()

    result = run_loop(harness_config(path, tasks=[{"id": "T1"}, {"id": "T2"}]), observer=break_then_mend)

    assert (result.terminal, [t.id for t in result.tasks]) == (Terminal.IDLE, ["T1", "T2"])
    assert read_while_closing(read_transcript(result.transcript)) == [False]


def test_no_read_while_closing_where_the_agent_could_change_what_it_depends_on(
    scripted_scenario, harness_config, run_loop, harness_workspace
):
    """With `.git` writable the agent could commit as it closes the session, with the sandbox off or the user's
    HOME as its own it could write what git reads outside (a config include, an excludes file), with a
    submodule the read consults a git dir no queue watches: in each the boundary reads git after the answer,
    even when nothing changed."""
    path, tasks = two_reading_tasks(scripted_scenario), [{"id": "T1"}, {"id": "T2"}]
    writable = run_loop(harness_config(path, "writable.yaml", tasks=tasks, sandbox={"git_writable": True}))
    off = run_loop(harness_config(path, "off.yaml", tasks=tasks, sandbox={"mode": "off"}))
    shared_home = run_loop(harness_config(path, "home.yaml", tasks=tasks, sandbox={"home": str(Path.home())}))
    head = harness_workspace.git("rev-parse", "HEAD").strip()
    harness_workspace.git("update-index", "--add", "--cacheinfo", f"160000,{head},vendored")
    (harness_workspace.path / "vendored").mkdir()  # not checked out: an empty directory, as git leaves it
    harness_workspace.git("commit", "-q", "-m", "a submodule")
    harness_workspace.git("push", "-q")
    gitlink = run_loop(harness_config(path, "gitlink.yaml", tasks=tasks))

    for result in (writable, off, shared_home, gitlink):
        assert (result.terminal, [t.id for t in result.tasks]) == (Terminal.IDLE, ["T1", "T2"])
        assert read_while_closing(read_transcript(result.transcript)) == [False]


def test_a_submodule_added_while_the_run_goes_on_ends_the_reads_while_closing(
    scripted_scenario, harness_config, run_loop, harness_workspace
):
    """Whether the index holds a gitlink is looked at again after any change in the repository: one committed
    by someone while T1's session closes stops the read while closing from T2's boundary on."""
    reading = turn({"read": {"path": "README.md"}})
    path = scripted_scenario(scenario({"T1": [turn({"read": {"path": "README.md"}}, on_close=[{"sleep": 0.6}])],
                                       "T2": [reading], "T3": [reading]}))  # fmt: skip

    (harness_workspace.path / "vendored").mkdir()  # empty: git does not see it, and it raises no event later

    def add_a_submodule():  # in the repository only: the worktree stays quiet
        head = harness_workspace.git("rev-parse", "HEAD").strip()
        harness_workspace.git("update-index", "--add", "--cacheinfo", f"160000,{head},vendored")
        harness_workspace.git("commit", "-q", "-m", "a submodule")
        harness_workspace.git("push", "-q")

    def in_the_window(record):
        if record["type"] == "task_end" and record["id"] == "T1":
            threading.Timer(0.3, add_a_submodule).start()

    result = run_loop(harness_config(path, tasks=[{"id": f"T{i}"} for i in (1, 2, 3)]), observer=in_the_window)

    assert (result.terminal, [t.id for t in result.tasks]) == (Terminal.IDLE, ["T1", "T2", "T3"])
    assert read_while_closing(read_transcript(result.transcript)) == [False, False]  # T1's and T2's boundaries


def test_the_agents_own_commit_while_closing_is_seen_where_git_is_writable(scripted_scenario, harness_config, run_loop):
    committing = [{"sleep": 0.3}, {"run": {"script": "git commit -q --allow-empty -m stray"}}]
    path = two_reading_tasks(scripted_scenario, on_close=committing)
    result = run_loop(harness_config(path, tasks=[{"id": "T1"}, {"id": "T2"}], sandbox={"git_writable": True}))

    assert (result.terminal, result.reason["check"]) == (Terminal.BLOCKED_PRECONDITION, "git_unpushed_commits")
    assert (result.reason["left_by_task"], [t.id for t in result.tasks]) == ("T1", ["T1"])


def test_a_single_task_run_reports_what_the_agent_wrote_while_closing(scripted_scenario, harness_config, run_loop):
    """`--task`: the run ends with its task, and the changes it names are read once the close is answered: left
    behind, they end the run BlockedPrecondition (issue 30), not Completed."""
    first = turn({"read": {"path": "README.md"}}, on_close=STRAY_ON_CLOSE)
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [first]}))), task_id="T1")

    assert (result.terminal, result.reason["check"]) == (Terminal.BLOCKED_PRECONDITION, "git_clean_tree")
    assert (result.reason["changes"], result.reason["left_by_task"]) == (["?? src/stray.txt"], "T1")
    assert result.tasks[0].terminal is Terminal.COMPLETED
    assert result.tasks[0].left_changes == ["?? src/stray.txt"]


def test_the_kernels_commit_takes_what_the_agent_wrote_while_closing(
    scripted_scenario, harness_config, run_loop, harness_workspace
):
    """`workspace.commit`: the task's commit waits for the close's answer, so it holds the task's last writes
    and the next boundary finds the tree clean."""
    first = turn({"read": {"path": "README.md"}}, on_close=STRAY_ON_CLOSE)
    path = scripted_scenario(scenario({"T1": [first]}))
    result = run_loop(harness_config(path, tasks=[{"id": "T1"}], commit={"message": "{id}"}))

    assert result.terminal is Terminal.IDLE
    commits = [r for r in read_transcript(result.transcript) if r["type"] == "commit"]
    assert [(c["task"], c["committed"]) for c in commits] == [("T1", True)]
    assert harness_workspace.git("show", "--name-only", "--format=", commits[0]["sha"]).split() == ["src/stray.txt"]
    assert result.tasks[0].left_changes == []


def test_a_cancel_while_the_agent_closes_the_session_ends_the_run_at_the_boundary(
    scripted_scenario, harness_config, run_loop
):
    """A user's cancel that arrives while the last session/close is still unanswered (the kernel has done the
    task's bookkeeping) is seen at the boundary, once the close is answered: the next task never starts."""
    first = turn({"read": {"path": "README.md"}}, on_close=[{"sleep": 0.6}])
    path = scripted_scenario(scenario({"T1": [first], "T2": [turn({"read": {"path": "README.md"}})]}))
    kernel = {}

    def cancel_while_closing(record):
        if record["type"] == "task_end":  # the close is out, its answer 0.6 s away
            threading.Timer(0.3, kernel["k"].cancel).start()

    result = run_loop(harness_config(path, tasks=[{"id": "T1"}, {"id": "T2"}]),
                      setup=lambda k: kernel.setdefault("k", k), observer=cancel_while_closing)  # fmt: skip

    assert (result.terminal, result.reason) == (Terminal.CANCELLED, {"kind": "user_cancel", "during": "task_boundary"})
    assert [t.id for t in result.tasks] == ["T1"]
    assert [r["task"]["id"] for r in read_transcript(result.transcript) if r["type"] == "task_start"] == ["T1"]
