"""Budgets and stall detection through the CLI: a scripted agent runs into each cap and stall rule, and the run ends
`MaxIterations` with the stop code, the count, the limit, its key and where the limit came from. Also the
`limits` command, change accounting on real git worktrees, and questions answered on a ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import read_transcript
from harness.budget._changes import ChangeMeter
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from harness.testing import loop_config, make_workspace, write_yaml
from scripted_agents.presets import scenario, turn

pytestmark = LOOP_SCRIPTED

CLI = str(Path(sys.executable).parent / "loop-harness")
RULES = [
    {"id": "read-all", "kind": "read", "paths": ["**"], "decision": "allow"},
    {"id": "write-src", "kind": "write", "paths": ["src/**"], "decision": "allow"},
]
TURNS = {"per_segment": 50, "total": 100, "continuations": 0}


def run(tmp_path, turns, *, autonomy=None, limits=None, env=None, agent=None):
    """The CLI on one task; its JSON report and transcript records."""
    ws = make_workspace(tmp_path / "ws", ignore=["build/"])
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": turns}, **(agent or {})))
    extra = {"autonomy": autonomy} if autonomy is not None else {}
    config = loop_config(ws, path, rules=RULES, limits=limits, transcripts=str(tmp_path / "transcripts"),
                         sandbox={"mode": "off"}, **extra)  # fmt: skip
    config_path = write_yaml(tmp_path / "loop.yaml", config)
    done = subprocess.run([CLI, "run", str(config_path), "--json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})  # fmt: skip
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report, read_transcript(Path(report["transcript"]))


def updates(records):
    """The session/update payloads the agent sent, in order."""
    return [r["msg"]["params"]["update"] for r in records if r["type"] == "rpc" and r["dir"] == "in"
            and r["msg"].get("method") == "session/update"]  # fmt: skip


def budget(**parts):
    return {"budget": {"model_turns": TURNS, **parts}}


def calls(count, **spec):
    return {"tool_calls": {"count": count, **spec}}


def shell_write(script):
    """Announce a command, run it ourselves (as Codex does), then say it completed."""
    return [
        {"tool_call": {"id": "sh", "title": "Run a script", "kind": "execute", "raw_input": {"command": script}}},
        {"run": {"script": script}},
        {"tool_update": {"id": "sh", "status": "completed"}},
    ]


FOREVER = {"stop": "max_tokens"}

CASES = {
    "MODEL_TURN_TOTAL_LIMIT": (
        [turn({"message": "more"}, **FOREVER)],
        {"budget": {"model_turns": {"per_segment": 10, "total": 3, "continuations": 0}}}, None,
        (4, 3, "budget.model_turns.total"),
    ),
    "MODEL_TURN_SEGMENT_LIMIT": (
        [turn({"message": "more"}, **FOREVER)],
        {"budget": {"model_turns": {"per_segment": 2, "total": 50, "continuations": 1}}}, None,
        (3, 2, "budget.model_turns.per_segment"),
    ),
    "AGENT_MODEL_TURN_LIMIT": ([turn({"message": "more"}, **FOREVER)], {}, {"max_iterations": 2},
                               (3, 2, "limits.max_iterations")),
    "AGGREGATE_TOOL_CALL_LIMIT": ([turn(calls(200))], budget(tool_calls={"per_segment": 50, "rate": None}), None,
                                  (51, 50, "budget.tool_calls.per_segment")),
    "PER_TOOL_CALL_LIMIT": ([turn(calls(20))], budget(tool_calls={"per_segment": 100, "per_tool": {"execute": 3}}),
                            None, (4, 3, "budget.tool_calls.per_tool.execute")),
    "TOOL_CALL_RATE_LIMIT": ([turn(calls(20))], budget(tool_calls={"per_segment": 100,
                                                                   "rate": {"count": 5, "window_seconds": 60}}),
                             None, (6, 5, "budget.tool_calls.rate.count")),
    "FILE_CHANGE_LIMIT": ([turn(*shell_write("mkdir -p src && touch src/a src/b src/c"))],
                          budget(changes={"files_total": 2, "lines_total": 100}), None,
                          (3, 2, "budget.changes.files_total")),
    "LINE_CHANGE_LIMIT": ([turn(*shell_write("mkdir -p src && printf '%01000d' 0 > src/dense.txt"))],
                          budget(changes={"files_total": 10, "lines_total": 5}), None,
                          (13, 5, "budget.changes.lines_total")),  # one line of 1,000 bytes: ceil(1000 / 80)
    "STALL_REPEATED_TOOL_CALLS": ([turn(calls(20, same=True))], {"stall": {"repeated_cycles": 4}}, None,
                                  (4, 4, "stall.repeated_cycles")),
    "STALL_CONSECUTIVE_ERRORS": ([turn(calls(20, status="failed"))], {"stall": {"max_consecutive_errors": 3}}, None,
                                 (3, 3, "stall.max_consecutive_errors")),
    "STALL_FAILED_MUTATIONS": ([turn(calls(20, kind="edit", status="failed"))],
                               {"stall": {"failed_mutation_attempts": 2, "max_consecutive_errors": 50}}, None,
                               (2, 2, "stall.failed_mutation_attempts")),
    "STALL_TOOL_ONLY_TURNS": ([turn(calls(1), **FOREVER)],
                              {"stall": {"tool_only_turns": 3, "tool_only_nudge": 2}}, None,
                              (3, 3, "stall.tool_only_turns")),
}  # fmt: skip


@pytest.mark.parametrize("code", CASES)
def test_each_stop_code_ends_the_run_with_its_count_limit_and_source(tmp_path, code):
    turns, autonomy, limits, (current, limit, key) = CASES[code]
    report, records = run(tmp_path, turns, autonomy=autonomy, limits=limits)

    assert report["terminal"] == "MaxIterations", report
    reason = report["reason"]
    kind = "stall" if code.startswith("STALL") else "budget"
    assert {k: reason[k] for k in ("kind", "stop_code", "current", "limit", "key", "source")} == {
        "kind": kind, "stop_code": code, "current": current, "limit": limit, "key": key, "source": "file",
    }  # fmt: skip
    tripped = [r for r in records if r["type"] == "budget" and r["event"] == "tripped"]
    in_turn = code not in ("MODEL_TURN_TOTAL_LIMIT", "MODEL_TURN_SEGMENT_LIMIT", "AGENT_MODEL_TURN_LIMIT",
                           "STALL_TOOL_ONLY_TURNS")  # fmt: skip
    if in_turn:  # tripped mid-turn: the turn is cancelled for it (unless it ended first), never timed out
        assert tripped and tripped[0]["reason"]["stop_code"] == code
        cancelled = [r for r in records if r["type"] == "turn_cancelled"]
        assert all(r["why"] == "budget" and r["killed"] is False for r in cancelled), cancelled
    assert next(r for r in records if r["type"] == "task_end")["budget"]["total"][0] >= 1


@LOOP_SLOW
def test_two_hundred_calls_in_one_turn_stop_at_the_cap_not_the_turn_timeout(tmp_path):
    autonomy = budget(tool_calls={"per_segment": 50, "rate": None})
    report, records = run(tmp_path, [turn(calls(200, interval=0.01))], autonomy=autonomy, limits={"turn_timeout_s": 60})

    assert report["reason"]["stop_code"] == "AGGREGATE_TOOL_CALL_LIMIT"
    assert report["reason"]["current"] == 51  # within one call of the cap
    assert [r["why"] for r in records if r["type"] == "turn_cancelled"] == ["budget"]
    announced = [u for u in updates(records) if u["sessionUpdate"] == "tool_call"]
    assert len(announced) < 200  # the agent stopped when it was cancelled
    assert report["reason"]["agent_stop_reason"] == "cancelled"


def test_a_tool_call_segment_ceiling_continues_in_a_new_segment_while_continuations_last(tmp_path):
    autonomy = {"budget": {"model_turns": {"per_segment": 10, "total": 20, "continuations": 1},
                           "tool_calls": {"per_segment": 5, "rate": None}}}  # fmt: skip
    report, records = run(tmp_path, [turn(calls(8, interval=0.01))], autonomy=autonomy)

    kinds = [r["prompt_kind"] for r in records if r["type"] == "turn"]
    assert kinds == ["task", "continue_new_segment"]
    assert [r["event"] for r in records if r["type"] == "budget"] == ["segment_ceiling", "tripped"]
    assert report["reason"]["stop_code"] == "AGGREGATE_TOOL_CALL_LIMIT" and report["reason"]["current"] == 6


def test_a_limit_from_the_environment_says_so(tmp_path):
    name = "LOOP_HARNESS_AUTONOMY__BUDGET__TOOL_CALLS__PER_SEGMENT"
    report, records = run(tmp_path, [turn(calls(30))], autonomy=budget(tool_calls={"per_segment": 50, "rate": None}),
                          env={name: "7"})  # fmt: skip
    assert (report["reason"]["current"], report["reason"]["limit"]) == (8, 7)
    assert report["reason"]["source"] == f"env {name}"
    limits = records[0]["limits"]
    assert limits["values"]["autonomy.budget.tool_calls.per_segment"] == 7
    assert limits["sources"]["autonomy.budget.tool_calls.per_segment"] == f"env {name}"
    assert limits["sources"]["autonomy.budget.model_turns.total"] == "file"


def test_the_progress_line_shows_turn_total_and_continuations(tmp_path):
    autonomy = {"budget": {"model_turns": {"per_segment": 2, "total": 50, "continuations": 1}}}
    _, records = run(tmp_path, [turn({"message": "more"}, **FOREVER)], autonomy=autonomy)
    shown = [(r["budget"]["turn"], r["budget"]["total"], r["budget"]["cont"]) for r in records if r["type"] == "turn"]
    assert shown == [([1, 2], [1, 50], [0, 1]), ([2, 2], [2, 50], [0, 1]),
                     ([1, 2], [3, 50], [1, 1]), ([2, 2], [4, 50], [1, 1])]  # fmt: skip
    assert [r["event"] for r in records if r["type"] == "budget"] == ["new_segment"]


def test_a_nudge_and_the_convergence_instruction_reach_the_agent(tmp_path):
    autonomy = {"budget": {"model_turns": {"per_segment": 50, "total": 5, "continuations": 0}},
                "stall": {"tool_only_turns": 10, "tool_only_nudge": 2, "repeated_cycles": 10}}  # fmt: skip
    report, records = run(tmp_path, [turn(calls(1), {"echo_prompt": {}}, stop="max_tokens"),
                                     turn(calls(1, prefix="b"), stop="max_tokens")], autonomy=autonomy)  # fmt: skip
    kinds = [r["prompt_kind"] for r in records if r["type"] == "turn"]
    # turn 1 said something (its echo); turns 2 and 3 only called tools: the nudge goes with turn 4; the
    # convergence window of a 5-turn total is its last turn
    assert kinds == ["task", "continue_after_max_tokens", "continue_after_max_tokens",
                     "continue_after_max_tokens+nudge", "continue_after_max_tokens+convergence"]  # fmt: skip
    assert report["reason"]["stop_code"] == "MODEL_TURN_TOTAL_LIMIT"


# --- `loop-harness limits` ----------------------------------------------------------------------


@LOOP_SLOW
def test_limits_shows_env_over_file_over_profile_over_default(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    autonomy = {"profile": "strict", "budget": {"tool_calls": {"per_segment": 30}, "changes": {"files_total": 8}}}
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, tmp_path / "s.yaml", autonomy=autonomy))
    env = {**os.environ, "LOOP_HARNESS_AUTONOMY__BUDGET__TOOL_CALLS__PER_SEGMENT": "7"}
    shown = subprocess.run([CLI, "limits", str(config)], capture_output=True, text=True, env=env, check=True).stdout
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in shown.splitlines() if not line.startswith("warning")}
    assert rows["autonomy.budget.tool_calls.per_segment"] == [
        "7",
        "env LOOP_HARNESS_AUTONOMY__BUDGET__TOOL_CALLS__PER_SEGMENT",
    ]
    assert rows["autonomy.budget.changes.files_total"] == ["8", "file"]
    assert rows["autonomy.budget.changes.lines_total"] == ["500", "profile strict"]
    assert rows["autonomy.questions.auto_answer"] == ["true", "default"]
    assert rows["limits.max_iterations"] == ["20", "default"]
    as_json = json.loads(subprocess.run([CLI, "limits", str(config), "--json"], capture_output=True, text=True,
                                        env=env, check=True).stdout)  # fmt: skip
    assert as_json["values"]["autonomy.budget.tool_calls.per_segment"] == 7


@LOOP_SLOW
def test_limits_warns_of_a_cap_that_cannot_be_reached_and_names_a_bad_key(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    autonomy = {"budget": {"model_turns": {"per_segment": 30, "total": 20}}}
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, tmp_path / "s.yaml", autonomy=autonomy))
    shown = subprocess.run([CLI, "limits", str(config)], capture_output=True, text=True, check=True).stdout
    assert "warning: budget.model_turns.per_segment (30) is above budget.model_turns.total (20)" in shown
    bad = write_yaml(tmp_path / "bad.yaml", loop_config(ws, tmp_path / "s.yaml", autonomy={"stall": {"loops": 1}}))
    done = subprocess.run([CLI, "limits", str(bad)], capture_output=True, text=True)
    assert done.returncode == 2 and "autonomy.stall.loops" in done.stderr


# --- change accounting on real worktrees ------------------------------------------------------------


def test_changes_count_text_lines_binary_files_and_new_ignored_paths(tmp_path):
    ws = make_workspace(tmp_path / "ws", files={"src/old.txt": "a\nb\nc\n"}, ignore=["build/", "*.log"])
    (ws.path / "build").mkdir()
    (ws.path / "build" / "before").write_text("there before the task\n")
    meter = ChangeMeter(ws.path, ws.path / ".git")
    meter.start()
    assert meter.measure() == (0, 0) or meter.measure().files == 0
    (ws.path / "src" / "old.txt").write_text("a\nB\nc\nd\n")  # 1 changed (-1 +1), 1 added
    assert (meter.measure().files, meter.measure().lines) == (1, 3)
    (ws.path / "src" / "tool.bin").write_bytes(b"\x7fELF\0\0" * 100)  # binary: a file, no lines
    (ws.path / "build" / "out").write_text("x" * 10_000)  # inside an ignored directory there before: not new
    (ws.path / "run.log").write_text("y" * 10_000)  # a new ignored path: one file, no lines
    (ws.path / "src" / "dense.txt").write_text("z" * 800 + "\n")  # one line of 801 bytes: ceil(801 / 80) = 11
    changes = meter.measure()
    assert (changes.files, changes.lines) == (4, 3 + 11)
    (ws.path / "README.md").unlink()  # a deleted text file charges its lines
    readme_lines = len(ws.git("show", "HEAD:README.md").splitlines())
    assert (meter.measure().files, meter.measure().lines) == (5, 3 + 11 + readme_lines)
    assert meter.measure() == meter.diff_now()  # what status found is what a full diff finds


def test_an_agent_that_writes_without_a_word_is_stopped_at_the_turn_end(tmp_path):
    """No tool call, no kernel call: the task starts from the boundary's git read, and the turn-end measure
    (answered by the worktree's event queue when nothing happened) finds the files."""
    silent = turn({"run": {"script": "mkdir -p src && touch src/a src/b src/c"}})
    report, records = run(tmp_path, [silent], autonomy=budget(changes={"files_total": 2, "lines_total": 100}))

    assert report["terminal"] == "MaxIterations", report
    assert (report["reason"]["stop_code"], report["reason"]["current"], report["reason"]["limit"]) == (
        "FILE_CHANGE_LIMIT", 3, 2)  # fmt: skip
    assert not [u for u in updates(records) if u["sessionUpdate"] == "tool_call"]


def test_changes_the_agent_committed_still_count_against_the_task(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    meter = ChangeMeter(ws.path, ws.path / ".git")
    meter.start()
    ws.commit("agent's commit", {"src/new.py": "".join(f"line {i}\n" for i in range(30))})
    assert (meter.measure().files, meter.measure().lines) == (1, 30)
    meter.start()  # the next task starts from here
    assert (meter.measure().files, meter.measure().lines) == (0, 0)


# --- questions ---------------------------------------------------------------------------------------

FORM = {"message": "Which database?",
        "schema": {"properties": {"db": {"type": "string", "oneOf": [
            {"const": "pg", "title": "Postgres cluster (advanced)"},
            {"const": "sqlite", "title": "SQLite (recommended)"}]}}, "required": ["db"]}}  # fmt: skip


def test_an_elicitation_is_answered_on_the_ledger_and_restated_in_the_next_prompt(tmp_path):
    turns = [turn({"elicit": FORM}, calls(1), stop="max_tokens"), turn({"echo_prompt": {}}, calls(1, prefix="b"))]
    report, records = run(tmp_path, turns, autonomy={"questions": {"auto_answer": True}})

    assert report["terminal"] == "Idle", report
    said = [u["content"]["text"] for u in updates(records) if u["sessionUpdate"] == "agent_message_chunk"]
    assert 'elicitation answer: {"action": "accept", "content": {"db": "sqlite"}}' in said
    ledger = [r for r in records if r["type"] == "question"]
    assert [(r["outcome"], r["choice"], r["low_confidence"]) for r in ledger] == [("answered", "sqlite", False)]
    assert "marked 'recommended'" in ledger[0]["rationale"]
    echoed = next(s for s in said if s.startswith("prompt: "))
    assert "Which database? — db': 'SQLite (recommended)'" in echoed
    assert [r["prompt_kind"] for r in records if r["type"] == "turn"] == ["task", "continue_after_max_tokens+decisions"]


@pytest.mark.parametrize(
    ("autonomy", "step", "why"),
    [
        ({"questions": {"auto_answer": False}}, {"elicit": FORM}, "autonomy.questions.auto_answer is off"),
        ({}, {"elicit": {"message": "Why?", "schema": {"properties": {"why": {"type": "string"}},
                                                      "required": ["why"]}}},
         "field 'why' needs an answer no option or default gives"),
    ],
)  # fmt: skip
def test_a_question_that_needs_a_person_blocks_awaiting_input(tmp_path, autonomy, step, why):
    report, records = run(tmp_path, [turn(step, calls(1), {"hang": True})], autonomy=autonomy)

    assert report["terminal"] == "BlockedAwaitingInput"
    assert report["reason"]["kind"] == "question" and report["reason"]["why"] == why
    assert report["reason"]["via"] == "elicitation"
    assert [r["why"] for r in records if r["type"] == "turn_cancelled"] == ["budget"]


@LOOP_SLOW
def test_the_ask_question_host_tool_is_answered_at_once(tmp_path):
    options = [{"id": "yaml", "label": "A YAML file (default)"}, {"id": "db", "label": "A custom database"}]
    ask = {"mcp_call": {"tool": "ask_question", "arguments": {"question": "How is config stored?", "options": options}}}
    report, records = run(tmp_path, [turn(ask)], agent={"agent": {"mcp_http": True}})

    assert report["terminal"] == "Idle", report
    ledger = [r for r in records if r["type"] == "question"]
    assert [(r["via"], r["choice"]) for r in ledger] == [("ask_question", "yaml")]


def test_a_planted_fifo_or_symlink_is_counted_without_being_read(tmp_path):
    """The kernel measures what the agent made: a fifo would block an open(), a link to /dev/zero or to a file
    outside would have it read what is not the task's."""
    ws = make_workspace(tmp_path / "ws")
    meter = ChangeMeter(ws.path, ws.path / ".git")
    meter.start()
    (ws.path / "src").mkdir(exist_ok=True)
    os.mkfifo(ws.path / "src" / "pipe")
    (ws.path / "src" / "zero").symlink_to("/dev/zero")
    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n" * 10_000)
    (ws.path / "src" / "out").symlink_to(outside)
    changes = meter.measure()  # returns at all: the fifo was not opened for reading
    assert changes.lines < 10  # neither link was followed
    assert changes.files >= 2


@LOOP_SLOW
def test_after_a_stop_the_kernel_writes_nothing_more_for_the_turn(tmp_path):
    steps = [
        {"tool_call": {"id": "w1", "title": "Write two files", "kind": "edit"}},
        {"write": {"path": "src/a.txt", "content": "a\n"}},
        {"write": {"path": "src/b.txt", "content": "b\n"}},
        {"tool_update": {"id": "w1", "status": "completed"}},  # measured here: 2 files of 1
        {"write": {"path": "src/c.txt", "content": "c\n"}},  # sent before the cancel reached the agent
    ]
    report, records = run(tmp_path, [turn(*steps)], autonomy=budget(changes={"files_total": 1, "lines_total": 100}))

    assert report["reason"]["stop_code"] == "FILE_CHANGE_LIMIT"
    assert (report["reason"]["current"], report["reason"]["limit"]) == (2, 1)
    refused = [r for r in records if r["type"] == "budget" and r["event"] == "refused_after_stop"]
    assert [(r["source"], r["stop_code"]) for r in refused] == [("fs/write_text_file", "FILE_CHANGE_LIMIT")]
    assert not (tmp_path / "ws" / "workspace" / "src" / "c.txt").exists()
    assert (tmp_path / "ws" / "workspace" / "src" / "b.txt").exists()
