"""Each precondition failing on its own stops the run BlockedPrecondition, naming the check,
before any agent is started; a task that leaves changes stops the run before the next task."""

from __future__ import annotations

import pytest

from harness import Terminal, read_transcript
from harness.pytest_plugin import LOOP_SCRIPTED
from scripted_agents.presets import scenario, turn, write_turn

pytestmark = LOOP_SCRIPTED


@pytest.fixture(name="one_task")
def one_task_fixture(scripted_scenario):
    return scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")]}))


def assert_blocked_before_agent(result, check):
    assert result.terminal is Terminal.BLOCKED_PRECONDITION
    assert result.reason["kind"] == "precondition"
    assert result.reason["check"] == check
    assert result.tasks == []
    assert not [r for r in read_transcript(result.transcript) if r["type"] == "agent_start"]


def test_unpushed_commit(one_task, harness_config, run_loop, harness_workspace):
    harness_workspace.commit("local only", {"notes.txt": "not pushed\n"})
    result = run_loop(harness_config(one_task))
    assert_blocked_before_agent(result, "git_unpushed_commits")
    assert result.reason["ahead"] == 1
    assert result.reason["upstream"] == "origin/main"


def test_no_upstream(one_task, harness_config, run_loop, harness_workspace):
    harness_workspace.git("branch", "--unset-upstream")
    result = run_loop(harness_config(one_task))
    assert_blocked_before_agent(result, "git_upstream")
    assert result.reason["branch"] == "main"


def test_detached_head(one_task, harness_config, run_loop, harness_workspace):
    harness_workspace.git("checkout", "-q", "--detach")
    result = run_loop(harness_config(one_task))
    assert_blocked_before_agent(result, "git_upstream")
    assert "detached" in result.reason["detail"]


def test_dirty_tree(one_task, harness_config, run_loop, harness_workspace):
    harness_workspace.write("README.md", "edited by hand\n")
    result = run_loop(harness_config(one_task))
    assert_blocked_before_agent(result, "git_clean_tree")
    assert result.reason["changes"] == [".M README.md"]


def diverge(ws):
    """A `topic` branch and `main` (pushed) that both edit README.md: they conflict."""
    ws.git("checkout", "-q", "-b", "topic")
    ws.commit("topic edit", {"README.md": "topic\n"})
    ws.git("checkout", "-q", "main")
    ws.commit("main edit", {"README.md": "main\n"}, push=True)


def test_rebase_in_progress(one_task, harness_config, run_loop, harness_workspace):
    ws = harness_workspace
    diverge(ws)
    ws.git("checkout", "-q", "topic")
    ws.git("rebase", "main", check=False)  # stops on the conflict
    assert (ws.path / ".git" / "rebase-merge").is_dir()

    result = run_loop(harness_config(one_task))
    assert_blocked_before_agent(result, "git_edit_session")
    assert result.reason["session"] == "rebase"


def test_merge_in_progress(one_task, harness_config, run_loop, harness_workspace):
    ws = harness_workspace
    diverge(ws)
    ws.git("merge", "topic", check=False)  # stops on the conflict
    assert (ws.path / ".git" / "MERGE_HEAD").exists()
    result = run_loop(harness_config(one_task))
    assert_blocked_before_agent(result, "git_edit_session")
    assert result.reason["session"] == "merge"


def test_empty_policy(one_task, harness_config, run_loop):
    result = run_loop(harness_config(one_task, rules=[]))
    assert_blocked_before_agent(result, "policy_non_empty")


def test_agent_without_permission_support(one_task, harness_config, run_loop):
    result = run_loop(harness_config(one_task, supports_permission_requests=False))
    assert_blocked_before_agent(result, "agent_permission_support")


def test_unauthorized_host(one_task, harness_config, run_loop):
    result = run_loop(harness_config(one_task, queue={"authorized": False}))
    assert_blocked_before_agent(result, "host_authorized")


def test_not_a_git_worktree(one_task, harness_config, run_loop, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    config = harness_config(one_task)
    text = config.read_text().replace(str(tmp_path / "ws" / "workspace"), str(plain))
    config.write_text(text)
    result = run_loop(config)
    assert_blocked_before_agent(result, "git_worktree")


def test_changes_left_by_a_task_stop_the_next_one(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(
        scenario(
            {
                "T1": [write_turn("src/a.txt", "a\n")],  # writes, never commits
                "T2": [write_turn("src/b.txt", "b\n", commit="T2")],
            }
        )
    )
    result = run_loop(harness_config(path, tasks=[{"id": "T1"}, {"id": "T2"}]))

    assert result.terminal is Terminal.BLOCKED_PRECONDITION
    assert result.reason["check"] == "git_clean_tree"
    assert result.reason["left_by_task"] == "T1"
    assert result.reason["changes"] == ["?? src/a.txt"]
    assert [t.id for t in result.tasks] == ["T1"]


def test_unpushed_commit_left_by_a_task_stops_the_next_one(scripted_scenario, harness_config, run_loop):
    commit_only = {"terminal": {"command": "git", "args": ["commit", "-q", "-am", "T1 (not pushed)"]}}
    path = scripted_scenario(
        scenario(
            {
                "T1": [
                    turn(
                        *write_turn("src/a.txt", "a\n")["steps"],
                        {"terminal": {"command": "git", "args": ["add", "src/a.txt"]}},
                        commit_only,
                    )
                ],
                "T2": [write_turn("src/b.txt", "b\n", commit="T2")],
            }
        )
    )
    result = run_loop(harness_config(path, tasks=[{"id": "T1"}, {"id": "T2"}], sandbox={"git_writable": True}))

    assert result.terminal is Terminal.BLOCKED_PRECONDITION
    assert result.reason["check"] == "git_unpushed_commits"
    assert result.reason["left_by_task"] == "T1"


def test_changes_left_by_the_last_task_are_reported(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n")]}))
    result = run_loop(harness_config(path))

    # issue 30: never Idle with work left behind: the run ends as mid-queue, naming them
    assert result.terminal is Terminal.BLOCKED_PRECONDITION
    assert (result.reason["check"], result.reason["left_by_task"]) == ("git_clean_tree", "T1")
    assert result.reason["changes"] == ["?? src/a.txt"]
    assert result.tasks[0].terminal is Terminal.COMPLETED
    assert result.tasks[0].left_changes == ["?? src/a.txt"]
    assert result.to_json()["tasks"][0]["left_changes"] == ["?? src/a.txt"]


def test_a_second_loop_on_a_worktree_is_refused_while_the_first_runs(scripted_scenario, harness_config, run_loop,
                                                                      tmp_path, one_task):  # fmt: skip
    """Two `loop-harness run`s (or a run and a server's loop) on one worktree would race each other's agent:
    the second is refused before it starts one, and the worktree is free again once the first has ended."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    hangs = harness_config(scripted_scenario(scenario({"T1": [turn({"message": "busy"}, {"hang": True})]}),
                                             name="hangs.yaml"), name="hangs-loop.yaml")  # fmt: skip
    first = tmp_path / "transcripts" / "first.jsonl"
    cli = str(Path(sys.executable).parent / "loop-harness")
    process = subprocess.Popen([cli, "run", str(hangs), "--transcript", str(first)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while '"busy"' not in (first.read_text() if first.exists() else ""):
            assert time.monotonic() < deadline and process.poll() is None, "the first run never got going"
            time.sleep(0.05)

        second = run_loop(harness_config(one_task))

        assert_blocked_before_agent(second, "workspace_free")
        assert second.reason["lock"].endswith(".git/info/loop-harness.lock")
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
    assert read_transcript(first)[-1]["terminal"] == "Cancelled"
    committing = harness_config(one_task, commit={"message": "{id}"})  # nothing left behind (issue 30)
    assert run_loop(committing).terminal is Terminal.IDLE  # the lock went with the first run


def test_a_symlink_planted_as_the_worktree_lock_is_not_followed(one_task, harness_config, run_loop, harness_workspace,
                                                                 tmp_path):  # fmt: skip
    """The lock file is opened, and would be created or truncated: one planted as a symlink must touch nothing
    it names. The run refuses to start without the lock."""
    victim = tmp_path / "thesis.txt"
    victim.write_text("years of work\n")
    info = harness_workspace.path / ".git" / "info"
    info.mkdir(exist_ok=True)
    (info / "loop-harness.lock").symlink_to(victim)

    result = run_loop(harness_config(one_task))

    assert_blocked_before_agent(result, "workspace_free")
    assert "cannot be taken" in result.reason["detail"]
    assert victim.read_text() == "years of work\n"
