"""Budgets, stall detection and the question auto-answer heuristic as tables: pure functions, no agent, milliseconds.

Every cap is checked on both sides of its limit (the call it allows, the one that stops), and each stop
names its code, its count, its limit, the key and where the limit came from.
"""

import pytest

from harness import Terminal
from harness.budget._budget import (
    CONVERGE_PROMPT,
    NUDGE_PROMPT,
    Account,
    NewSegment,
    StopCode,
    convergence_window,
    repeated_cycle,
)
from harness.budget._questions import Option, choose, form_fields, restate
from harness.config._config import ConfigError
from harness.config._limits import DEFAULTS, resolve_autonomy
from harness.pytest_plugin import LOOP_SCRIPTED

pytestmark = LOOP_SCRIPTED


def account(written=None, *, max_iterations=100):
    resolved = resolve_autonomy(written or {}, max_iterations=max_iterations)
    sources = {**resolved.sources, "limits.max_iterations": "file"}
    return Account(resolved.config, sources, max_iterations=max_iterations)


def budget(**parts):
    return {"budget": parts}


def turns(per_segment, total, continuations):
    return budget(model_turns={"per_segment": per_segment, "total": total, "continuations": continuations})


def run_turns(acct, n):
    """Start up to n turns; the first answer that is not None (with the turn it came before)."""
    for i in range(n):
        step = acct.before_turn()
        if step is not None and not isinstance(step, NewSegment):
            return i + 1, step
        acct.turn_started()
    return None, None


def stopped(step, code, current, limit, key, source):
    assert step.terminal is Terminal.MAX_ITERATIONS
    kind = "stall" if code.startswith("STALL") else "budget"
    assert {k: step.reason[k] for k in ("kind", "stop_code", "current", "limit", "key", "source")} == {
        "kind": kind, "stop_code": code, "current": current, "limit": limit, "key": key, "source": source,
    }  # fmt: skip


# --- model turns -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "max_iterations", "stops_before", "code", "current", "limit", "key"),
    [
        # total below the segments: the total stops the 6th turn
        (turns(10, 5, 0), 100, 6, StopCode.MODEL_TURN_TOTAL_LIMIT, 6, 5, "budget.model_turns.total"),
        # one segment of 3, no continuation: the 4th turn is the segment's 4th
        (turns(3, 50, 0), 100, 4, StopCode.MODEL_TURN_SEGMENT_LIMIT, 4, 3, "budget.model_turns.per_segment"),
        # two continuations: three segments of 3, then the segment limit
        (turns(3, 50, 2), 100, 10, StopCode.MODEL_TURN_SEGMENT_LIMIT, 4, 3, "budget.model_turns.per_segment"),
        # the agent's own cap (limits.max_iterations) below the budgets
        (turns(10, 50, 0), 4, 5, StopCode.AGENT_MODEL_TURN_LIMIT, 5, 4, "limits.max_iterations"),
        # a tie between the total and the agent's cap: the total is named
        (turns(10, 4, 0), 4, 5, StopCode.MODEL_TURN_TOTAL_LIMIT, 5, 4, "budget.model_turns.total"),
    ],
)
def test_model_turn_budgets_stop_the_turn_after_the_last_allowed(
    written, max_iterations, stops_before, code, current, limit, key
):
    acct = account(written, max_iterations=max_iterations)
    turn, step = run_turns(acct, 100)
    assert turn == stops_before
    stopped(step, code, current, limit, key, "file")


def test_a_segment_ceiling_with_continuations_left_starts_a_new_segment():
    acct = account(turns(2, 50, 1))
    answers = []
    for _ in range(5):
        answers.append(acct.before_turn())
        if isinstance(answers[-1], NewSegment | type(None)):
            acct.turn_started()
    assert answers[:3] == [None, None, NewSegment("model_turns", 1, 1)]
    assert acct.counts.continuations == 1 and acct.counts.segment_turns == 2
    assert answers[4].reason["stop_code"] == "MODEL_TURN_SEGMENT_LIMIT"


@pytest.mark.parametrize(("total", "window"), [(1, 1), (4, 1), (10, 2), (20, 4), (250, 50), (20000, 50)])
def test_the_convergence_window_is_the_final_fifth_at_most_fifty(total, window):
    assert convergence_window(total) == window


def test_the_convergence_instruction_goes_out_once_inside_the_window():
    acct = account(turns(100, 10, 0))  # window 2: before turns 9 and 10
    sent = []
    for _ in range(10):
        assert acct.before_turn() is None
        sent.append(acct.converge_now())
        acct.turn_started()
    assert sent == [False] * 8 + [True, False]
    assert "Stop broad exploration" in CONVERGE_PROMPT and "report truthfully" in CONVERGE_PROMPT


# --- tool calls --------------------------------------------------------------------------------

CALLS = {"per_segment": 5, "rate": None}


def call(acct, n, *, kind="execute", title="run", now=0.0, step=0.0):
    """Announce n calls; the first answer that is not None, with its call number."""
    for i in range(n):
        outcome = acct.tool_call(f"c{i}", {"kind": kind, "title": title}, now=now + i * step)
        if outcome is not None:
            return i + 1, outcome
    return None, None


def test_the_aggregate_tool_call_cap_stops_the_call_after_the_last_allowed():
    acct = account(budget(tool_calls=CALLS, model_turns={"per_segment": 10, "total": 20, "continuations": 0}))
    number, outcome = call(acct, 200)
    assert number == 6
    stopped(outcome, "AGGREGATE_TOOL_CALL_LIMIT", 6, 5, "budget.tool_calls.per_segment", "file")


def test_a_tool_call_segment_ceiling_with_a_continuation_left_is_a_new_segment():
    acct = account(budget(tool_calls=CALLS, model_turns={"per_segment": 10, "total": 20, "continuations": 1}))
    number, outcome = call(acct, 200)
    assert (number, outcome) == (6, NewSegment("tool_calls", 1, 1))
    assert acct.counts.segment_tool_calls == 0 and acct.counts.tool_calls == 6
    number, outcome = call(acct, 200)  # the next segment: 5 more are allowed
    assert number == 6 and outcome.reason["stop_code"] == "AGGREGATE_TOOL_CALL_LIMIT"


@pytest.mark.parametrize(
    ("per_tool", "kind", "title", "stops_at"),
    [
        ({"execute": 2}, "execute", "Run ls", 3),
        ({"edit": 2}, "execute", "Run ls", None),  # another kind: not counted
        ({"Run LS": 1}, "execute", "run ls", 2),  # a title, ignoring case
        ({"bash": 0}, "other", "Bash", 1),  # a cap of 0 forbids the tool
    ],
)
def test_per_tool_caps_count_a_kind_or_a_title(per_tool, kind, title, stops_at):
    acct = account(budget(tool_calls={"per_segment": 100, "rate": None, "per_tool": per_tool}))
    number, outcome = call(acct, 5, kind=kind, title=title)
    assert number == stops_at
    if stops_at is not None:
        key = next(iter(per_tool))
        stopped(outcome, "PER_TOOL_CALL_LIMIT", stops_at, per_tool[key], f"budget.tool_calls.per_tool.{key}", "file")
        assert outcome.reason["tool"] == key


@pytest.mark.parametrize(
    ("step", "stops_at"),
    [
        (0.1, 4),  # 4 calls inside 1 s: the 4th breaks 3 per second
        (0.5, None),  # 2 per second: never more than 3 in a window
        (0.34, None),  # the 1st call has left the window when the 4th comes at 1.02 s
        (0.33, 4),  # ... and has not at 0.99 s
    ],
)
def test_the_rate_cap_counts_calls_inside_a_sliding_window(step, stops_at):
    acct = account(budget(tool_calls={"per_segment": 100, "rate": {"count": 3, "window_seconds": 1}}))
    number, outcome = call(acct, 8, step=step)
    assert number == stops_at
    if stops_at is not None:
        stopped(outcome, "TOOL_CALL_RATE_LIMIT", 4, 3, "budget.tool_calls.rate.count", "file")


# --- stall rules --------------------------------------------------------------------------------


def end(acct, call_id, status, **fields):
    return acct.tool_update(call_id, {"status": status, **fields})


def test_consecutive_errors_stop_at_the_limit_and_a_success_resets_them():
    acct = account({"stall": {"max_consecutive_errors": 3}})
    outcomes = []
    for i, status in enumerate(["failed", "failed", "completed", "failed", "failed", "failed"]):
        acct.tool_call(f"c{i}", {"kind": "read", "title": f"read {i}"}, now=0)
        outcomes.append(end(acct, f"c{i}", status))
    assert outcomes[:5] == [None] * 5
    stopped(outcomes[5], "STALL_CONSECUTIVE_ERRORS", 3, 3, "stall.max_consecutive_errors", "file")


def test_failed_mutations_count_edit_delete_and_move_calls_only():
    acct = account({"stall": {"failed_mutation_attempts": 3, "max_consecutive_errors": 100}})
    outcomes = []
    for i, kind in enumerate(["edit", "execute", "delete", "read", "move"]):
        acct.tool_call(f"c{i}", {"kind": kind, "title": f"t{i}"}, now=0)
        outcomes.append(end(acct, f"c{i}", "failed"))
    assert outcomes[:4] == [None] * 4
    stopped(outcomes[4], "STALL_FAILED_MUTATIONS", 3, 3, "stall.failed_mutation_attempts", "file")


def test_a_kind_that_only_an_update_names_still_counts_as_a_mutation():
    acct = account({"stall": {"failed_mutation_attempts": 1, "max_consecutive_errors": 100}})
    acct.tool_call("c1", {"title": "apply"}, now=0)
    assert end(acct, "c1", "failed", kind="edit").reason["stop_code"] == "STALL_FAILED_MUTATIONS"


@pytest.mark.parametrize(
    ("history", "repeats", "cycle"),
    [
        (["a", "a", "a"], 3, 1),
        (["a", "a"], 3, None),
        (["x", "a", "b", "a", "b", "a", "b"], 3, 2),
        (["a", "b", "c", "a", "b", "c", "a", "b", "c"], 3, 3),
        (["a", "b", "c", "d"] * 3, 3, 4),
        (["a", "b", "c", "d", "e"] * 3, 3, None),  # a cycle of 5 is not looked for
        (["a", "b", "a", "b", "a", "c"], 3, None),
        (["a", "a", "b", "a", "a"], 2, 1),
    ],
)
def test_a_repeated_cycle_of_one_to_four_calls_is_found(history, repeats, cycle):
    assert repeated_cycle(history, repeats) == cycle


def test_the_same_call_repeated_stops_and_different_arguments_do_not():
    acct = account({"stall": {"repeated_cycles": 3}})
    outcomes = []
    for i in range(3):
        acct.tool_call(
            f"c{i}", {"kind": "execute", "title": "git status", "rawInput": {"command": "git status"}}, now=0
        )
        outcomes.append(end(acct, f"c{i}", "completed"))
    stopped(outcomes[2], "STALL_REPEATED_TOOL_CALLS", 3, 3, "stall.repeated_cycles", "file")
    assert outcomes[2].reason["cycle_length"] == 1
    acct = account({"stall": {"repeated_cycles": 3}})
    for i in range(6):
        acct.tool_call(f"c{i}", {"kind": "execute", "title": "run", "rawInput": {"command": f"pytest -k t{i}"}}, now=0)
        assert end(acct, f"c{i}", "completed") is None


def test_arguments_an_update_brings_later_make_calls_differ():
    """Claude Code announces a call with an empty rawInput and sends the arguments in an update."""
    acct = account({"stall": {"repeated_cycles": 2}})
    for i in range(4):
        acct.tool_call(f"c{i}", {"kind": "read", "title": "Read", "rawInput": {}}, now=0)
        acct.tool_update(f"c{i}", {"rawInput": {"file_path": f"f{i}.py"}})
        assert end(acct, f"c{i}", "completed") is None


def test_tool_only_turns_nudge_then_stop_and_a_message_resets_them():
    acct = account({"stall": {"tool_only_turns": 4, "tool_only_nudge": 2}})
    answers = [acct.turn_ended(tool_calls=1, said=False) for _ in range(2)]
    assert answers == [None, NUDGE_PROMPT]
    assert acct.turn_ended(tool_calls=3, said=True) is None  # said something: the count starts over
    assert acct.turn_ended(tool_calls=0, said=False) is None  # no tool call: not a tool-only turn
    answers = [acct.turn_ended(tool_calls=1, said=False) for _ in range(4)]
    assert answers[:3] == [None, NUDGE_PROMPT, None]
    stopped(answers[3], "STALL_TOOL_ONLY_TURNS", 4, 4, "stall.tool_only_turns", "file")


# --- changes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "lines", "code"),
    [(3, 100, None), (4, 100, "FILE_CHANGE_LIMIT"), (3, 101, "LINE_CHANGE_LIMIT"), (4, 101, "FILE_CHANGE_LIMIT")],
)
def test_change_caps_allow_their_count(files, lines, code):
    acct = account(budget(changes={"files_total": 3, "lines_total": 100}))
    outcome = acct.changes(files, lines)
    if code is None:
        assert outcome is None
    else:
        key = "budget.changes.files_total" if code == "FILE_CHANGE_LIMIT" else "budget.changes.lines_total"
        stopped(outcome, code, files if code == "FILE_CHANGE_LIMIT" else lines, 3 if "FILE" in code else 100, key,
                "file")  # fmt: skip


# --- where a limit came from --------------------------------------------------------------------


def test_each_key_comes_from_the_env_the_file_the_profile_or_the_default(monkeypatch):
    monkeypatch.setenv("LOOP_HARNESS_AUTONOMY__BUDGET__TOOL_CALLS__PER_SEGMENT", "7")
    monkeypatch.setenv("LOOP_HARNESS_AUTONOMY__STALL__REPEATED_CYCLES", "9")
    written = {"profile": "strict", "budget": {"tool_calls": {"per_segment": 30}, "changes": {"files_total": 8}}}
    resolved = resolve_autonomy(written)
    rows = {key: (value, source) for key, value, source in resolved.rows()}
    assert rows["budget.tool_calls.per_segment"] == (7, "env LOOP_HARNESS_AUTONOMY__BUDGET__TOOL_CALLS__PER_SEGMENT")
    assert rows["stall.repeated_cycles"] == (9, "env LOOP_HARNESS_AUTONOMY__STALL__REPEATED_CYCLES")
    assert rows["budget.changes.files_total"] == (8, "file")
    assert rows["budget.changes.lines_total"] == (500, "profile strict")
    assert rows["questions.auto_answer"] == (True, "default")
    assert rows["profile"] == ("strict", "file")


def test_the_environment_picks_the_profile_and_can_switch_a_cap_off(monkeypatch):
    monkeypatch.setenv("LOOP_HARNESS_AUTONOMY__PROFILE", "long")
    monkeypatch.setenv("LOOP_HARNESS_AUTONOMY__BUDGET__TOOL_CALLS__RATE", "null")
    resolved = resolve_autonomy({"profile": "strict"})
    assert resolved.config.profile == "long" and resolved.config.budget.model_turns.total == 500
    assert resolved.config.budget.tool_calls.rate is None
    assert resolved.source("budget.tool_calls.rate.count").startswith("env ")


@pytest.mark.parametrize(
    ("env", "written", "key", "words"),
    [
        ({"LOOP_HARNESS_AUTONOMY__BUDGET__TOOL_CALLS__PER_SEGMENT": "many"}, {},
         "autonomy.budget.tool_calls.per_segment", "from env LOOP_HARNESS_AUTONOMY__BUDGET__TOOL_CALLS__PER_SEGMENT"),
        ({"LOOP_HARNESS_AUTONOMY__BUDGETS__X": "1"}, {}, "autonomy.budgets.x", "names no autonomy key"),
        ({}, {"budget": {"tool_calls": {"per_segmnt": 3}}}, "autonomy.budget.tool_calls.per_segmnt", "Extra inputs"),
        ({}, {"budget": {"model_turns": {"total": 0}}}, "autonomy.budget.model_turns.total", "greater than or equal"),
        ({}, {"profile": "fast"}, "autonomy.profile", "not a profile"),
        ({}, {"budget": {"tool_calls": {"per_tool": {"bash": -1}}}}, "autonomy.budget.tool_calls",
         "a count of 0 or more"),
    ],
)  # fmt: skip
def test_a_bad_limit_names_its_key(monkeypatch, env, written, key, words):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        resolve_autonomy(written)
    assert caught.value.key == key
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("written", "max_iterations", "warning"),
    [
        (turns(30, 20, 0), 100, "a segment never ends before the total"),
        (turns(5, 50, 1), 100, "budget.model_turns.total (50) is never reached"),
        (turns(10, 20, 1), 4, "limits.max_iterations (4) stops a task before"),
        (budget(tool_calls={"per_segment": 10, "per_tool": {"edit": 20}}), 20, "per_tool.edit (20) is above"),
        (budget(tool_calls={"per_segment": 1000, "rate": {"count": 10, "window_seconds": 10}}), 20,
         "ends a turn before budget.tool_calls.per_segment (1000)"),
        ({"stall": {"tool_only_nudge": 9, "tool_only_turns": 8}}, 20, "the nudge is never sent"),
    ],
)  # fmt: skip
def test_caps_another_cap_makes_unreachable_are_warned_of(written, max_iterations, warning):
    resolved = resolve_autonomy(written, max_iterations=max_iterations)
    assert any(warning in w for w in resolved.warnings), resolved.warnings


def test_the_shipped_defaults_raise_no_warning():
    assert resolve_autonomy({}).warnings == ()
    assert resolve_autonomy({}).config.model_dump() == DEFAULTS


# --- questions ----------------------------------------------------------------------------------


def options(*labels):
    return [Option(label.split(":")[0], label) for label in labels]


@pytest.mark.parametrize(
    ("labels", "chosen", "confidence", "low"),
    [
        (["Rewrite the module", "Minimal fix (recommended)"], "Minimal fix (recommended)", 0.9, False),
        (["Use the default config", "Experimental fast path"], "Use the default config", 0.9, False),
        (["Advanced: custom allocator", "Keep malloc"], "Keep malloc", 0.6, False),
        (["Plan A", "Plan B"], "Plan A", 0.4, True),  # no signal: the first option
        (["Simple but risky", "Complex rewrite", "Standard approach"], "Standard approach", 0.9, False),
        (["Destructive reset", "Risky migration"], "Destructive reset", 0.4, True),  # all avoided: the first
        (["Over-engineered plugin system", "A function"], "A function", 0.6, False),
        (["Defaultish naming", "Plain"], "Defaultish naming", 0.4, True),  # whole words only
    ],
)
def test_the_question_heuristic_prefers_safe_simple_options(labels, chosen, confidence, low):
    choice = choose("How?", options(*labels))
    assert (choice.option.label, choice.confidence, choice.low_confidence) == (chosen, confidence, low)
    assert choice.rationale


def test_the_ledger_is_restated_with_low_confidence_marked():
    ledger = [choose("Which DB?", options("SQLite (default)", "Postgres")), choose("Name?", options("a", "b"))]
    text = restate(ledger)
    assert "'Which DB?': 'SQLite (default)' (marked 'default')" in text
    assert "'Name?': 'a' [low confidence]" in text
    assert restate([]) == ""


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"properties": {"db": {"type": "string", "enum": ["sqlite", "postgres"]}}},
         [("db", ["sqlite", "postgres"], None)]),
        ({"properties": {"db": {"type": "string", "oneOf": [{"const": "s", "title": "SQLite (recommended)"}]}}},
         [("db", ["SQLite (recommended)"], None)]),
        ({"properties": {"n": {"type": "integer", "default": 3}}}, [("n", [], 3)]),
        ({"properties": {"why": {"type": "string"}}, "required": ["why"]}, "field 'why' needs an answer"),
        ({"properties": {"why": {"type": "string"}}}, []),  # optional free text: left out
        ({"properties": {"tags": {"type": "array", "items": {"enum": ["x", "y"]}}}}, [("tags", ["x", "y"], None)]),
    ],
)  # fmt: skip
def test_an_elicitation_form_becomes_questions_or_says_why_not(schema, expected):
    fields = form_fields("Setup", {"type": "object", **schema})
    if isinstance(expected, str):
        assert isinstance(fields, str) and expected in fields
        return
    assert [(f.name, [o.label for o in f.options], f.default) for f in fields] == expected


def test_updates_of_calls_never_announced_are_not_kept():
    acct = account()
    for i in range(1000):
        assert acct.tool_update(f"ghost{i}", {"status": "in_progress", "rawInput": {"x": "y" * 100}}) is None
    assert acct._calls == {}
