"""Each of the eleven terminals, reached by a scripted run, with its reason."""

from __future__ import annotations

from harness import CONTINUE_PROMPT, STANDING_PROMPT, Terminal, read_transcript
from harness.pytest_plugin import LOOP_SCRIPTED
from scripted_agents.presets import scenario, turn, write_turn

pytestmark = LOOP_SCRIPTED

TWO_TASKS = [{"id": "T1", "title": "Add a greeting"}, {"id": "T2", "title": "Add a farewell"}]


def prompts(result):
    """The text of every session/prompt the kernel sent, in order."""
    return [
        r["msg"]["params"]["prompt"][0]["text"]
        for r in read_transcript(result.transcript)
        if r["type"] == "rpc" and r["dir"] == "out" and r["msg"].get("method") == "session/prompt"
    ]


def test_idle_after_draining_the_queue(scripted_scenario, harness_config, run_loop, harness_workspace):
    path = scripted_scenario(
        scenario(
            {
                "T1": [write_turn("src/hello.txt", "hello\n", commit="T1: greeting")],
                "T2": [write_turn("src/bye.txt", "bye\n", commit="T2: farewell")],
            }
        )
    )
    result = run_loop(harness_config(path, tasks=TWO_TASKS, commit={"message": "{id}: {title}"}))  # .git: read-only

    assert result.terminal is Terminal.IDLE
    assert result.reason == {"kind": "queue_empty", "completed": 2}
    assert [(t.id, t.terminal) for t in result.tasks] == [("T1", Terminal.COMPLETED), ("T2", Terminal.COMPLETED)]
    assert result.tasks[0].rule_ids == ["write-src", "read-all", "git"]
    assert harness_workspace.pushed_log()[:2] == ["T2: Add a farewell", "T1: Add a greeting"]  # the kernel's


def test_completed_for_a_single_task_run(scripted_scenario, harness_config, run_loop, harness_workspace):
    path = scripted_scenario(
        scenario(
            {
                "T1": [write_turn("src/hello.txt", "hello\n", commit="T1")],
                "T2": [write_turn("src/bye.txt", "bye\n", commit="T2")],
            }
        )
    )
    result = run_loop(harness_config(path, tasks=TWO_TASKS, commit={"message": "{id}"}), task_id="T2")

    assert result.terminal is Terminal.COMPLETED
    assert result.reason == {"kind": "end_turn", "tool_calls": 1, "client_calls": 3}
    assert [t.id for t in result.tasks] == ["T2"]
    assert (harness_workspace.path / "src/bye.txt").exists()
    assert not (harness_workspace.path / "src/hello.txt").exists()


def test_end_turn_for_a_single_prompt_run(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({None: [turn({"message": "hello to you too"})]}))
    result = run_loop(harness_config(path), prompt="say hello")

    assert result.terminal is Terminal.END_TURN
    assert result.reason == {"kind": "end_turn", "acted": False}
    assert prompts(result) == ["say hello"]


def test_cancelled_by_the_user_mid_turn(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [turn({"message": "thinking hard"}, {"hang": True})]}))
    kernel = {}

    def cancel_when_the_agent_speaks(record):
        if record["type"] == "rpc" and "thinking hard" in str(record["msg"]):
            kernel["k"].cancel()

    result = run_loop(
        harness_config(path), setup=lambda k: kernel.setdefault("k", k), observer=cancel_when_the_agent_speaks
    )

    assert result.terminal is Terminal.CANCELLED
    assert result.reason == {"kind": "user_cancel", "during": "turn", "agent_stop_reason": "cancelled", "killed": False}
    sent = [r["msg"].get("method") for r in read_transcript(result.transcript) if r["type"] == "rpc"]
    assert "session/cancel" in sent


def test_cancelled_when_the_agent_cancels_its_turn(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [turn({"message": "giving up"}, stop="cancelled")]}))
    result = run_loop(harness_config(path))

    assert result.terminal is Terminal.CANCELLED
    assert result.reason == {"kind": "agent_cancelled", "stop_reason": "cancelled"}


def test_max_iterations_when_the_agent_never_finishes(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [turn({"message": "still going"}, stop="max_tokens")]}))
    result = run_loop(harness_config(path, limits={"max_iterations": 3}))

    assert result.terminal is Terminal.MAX_ITERATIONS
    assert result.reason == {"kind": "budget", "stop_code": "AGENT_MODEL_TURN_LIMIT", "current": 4, "limit": 3,
                             "key": "limits.max_iterations", "source": "file"}  # fmt: skip
    assert result.tasks[0].iterations == 3
    assert prompts(result)[1:] == [CONTINUE_PROMPT, CONTINUE_PROMPT]


def test_blocked_policy_on_an_unmatched_request(scripted_scenario, harness_config, run_loop, harness_workspace):
    path = scripted_scenario(scenario({"T1": [write_turn("docs/notes.md", "notes\n")]}))
    result = run_loop(harness_config(path))

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["kind"] == "policy_refusal"
    assert result.reason["source"] == "session/request_permission"
    assert (result.reason["tool"], result.reason["tool_kind"]) == ("Write docs/notes.md", "edit")
    assert result.reason["rule_id"] is None
    assert result.reason["refusal"] == {"kind": "unmatched", "rule_kind": "write", "target": "docs/notes.md"}
    assert not (harness_workspace.path / "docs/notes.md").exists()


def test_blocked_awaiting_input_after_the_standing_answers(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [turn({"message": "What should I do?"})]}))
    result = run_loop(harness_config(path, limits={"standing_answers": 2}))

    assert result.terminal is Terminal.BLOCKED_AWAITING_INPUT
    assert result.reason == {"kind": "no_tool_call", "standing_answers": 2, "limit": 2}
    assert prompts(result)[1:] == [STANDING_PROMPT, STANDING_PROMPT]


def test_a_think_tool_call_is_a_tool_call(scripted_scenario, harness_config, run_loop):
    # design.md: "end_turn after at least one tool call" -> Completed; `think` needs no permission.
    thinking = turn({"tool_call": {"title": "Plan the change", "kind": "think"}})
    result = run_loop(harness_config(scripted_scenario(scenario({"T1": [thinking]})), limits={"standing_answers": 1}))

    assert result.terminal is Terminal.IDLE
    assert (result.tasks[0].terminal, result.tasks[0].reason["tool_calls"]) == (Terminal.COMPLETED, 1)
    assert len(prompts(result)) == 1  # no standing answer was needed


def test_blocked_rate_limited_after_bounded_retries(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")]}))
    queue = {
        "faults": [{"op": "list_tasks", "signal": "rate_limited", "times": 10, "reset_in_s": 0.02}],
        "max_retries": 2,
    }
    result = run_loop(harness_config(path, queue=queue))

    assert result.terminal is Terminal.BLOCKED_RATE_LIMITED
    assert result.reason["kind"] == "rate_limited"
    assert result.reason["retries"] == 2
    assert isinstance(result.reason["reset_at"], float)
    retries = [r for r in read_transcript(result.transcript) if r["type"] == "host_retry"]
    assert [r["retry"] for r in retries] == [1, 2]


def test_blocked_precondition_on_a_dirty_tree(scripted_scenario, harness_config, run_loop, harness_workspace):
    harness_workspace.write("scratch.txt", "left here by a person\n")
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")]}))
    result = run_loop(harness_config(path))

    assert result.terminal is Terminal.BLOCKED_PRECONDITION
    assert result.reason["check"] == "git_clean_tree"
    assert result.reason["changes"] == ["?? scratch.txt"]
    assert result.tasks == []


def test_blocked_host_unavailable_after_bounded_retries(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n", commit="T1")]}))
    queue = {
        "faults": [{"op": "list_tasks", "signal": "unavailable", "times": 10, "cause": "connection refused"}],
        "max_retries": 2,
        "backoff_base_s": 0.01,
    }
    result = run_loop(harness_config(path, queue=queue))

    assert result.terminal is Terminal.BLOCKED_HOST_UNAVAILABLE
    assert result.reason["kind"] == "host_unavailable"
    assert result.reason["cause"] == "connection refused"
    assert result.reason["retries"] == 2


def test_failed_when_the_agent_refuses(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({"T1": [turn({"message": "I cannot help with that"}, stop="refusal")]}))
    result = run_loop(harness_config(path))

    assert result.terminal is Terminal.FAILED
    assert result.reason == {"kind": "refusal", "stop_reason": "refusal"}
