"""The shipped transcript schema: it agrees with the kernel's vocabulary, and it rejects what a reader
could not rely on. (Every transcript the suite writes is validated against it: see tests/conftest.py.)"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from harness import Stop, Terminal, testing
from harness.pytest_plugin import LOOP_SCRIPTED
from harness.record._records import RecordType, transcript_schema
from harness.record._terminals import REASON_KINDS
from scripted_agents.presets import scenario, write_turn

pytestmark = LOOP_SCRIPTED

SCHEMA = transcript_schema()
VALID = jsonschema.Draft202012Validator(SCHEMA)

TERMINAL = {"seq": 9, "t": 1.5, "type": "terminal", "terminal": "BlockedPolicy",
            "reason": {"kind": "policy_refusal", "source": "fs/write_text_file"},
            "tasks": [{"id": "T1", "terminal": "BlockedPolicy", "reason": {"kind": "policy_refusal"}}]}  # fmt: skip
DROP = object()  # a change that removes the field
POLICY = {"seq": 4, "t": 0.2, "type": "policy", "source": "fs/read_text_file", "decision": "refuse",
          "rule_ids": [], "reason": {"kind": "unmatched"}, "outcome": "refused", "path": ".git/config"}  # fmt: skip


def test_the_schema_names_every_record_type_the_kernel_writes():
    assert SCHEMA["properties"]["type"]["enum"] == [t.value for t in RecordType]
    assert set(SCHEMA["$defs"]["records"]) == {t.value for t in RecordType}
    dispatch = {c["if"]["properties"]["type"]["const"]: c["then"]["$ref"] for c in SCHEMA["else"]["allOf"]}
    assert dispatch == {t.value: f"#/$defs/records/{t.value}" for t in RecordType}


def test_the_schema_holds_each_terminals_reason_kinds():
    checks = SCHEMA["$defs"]["stop"]["allOf"]
    kinds = {c["if"]["properties"]["terminal"]["const"]: c["then"]["properties"]["reason"]["properties"]["kind"]["enum"]
             for c in checks}  # fmt: skip
    assert {t: set(k) for t, k in kinds.items()} == {t.value: set(k) for t, k in REASON_KINDS.items()}
    assert set(SCHEMA["$defs"]["terminal_name"]["enum"]) == {t.value for t in Terminal}


def test_the_schema_is_shipped_inside_the_package():
    import harness

    shipped = Path(harness.__file__).parent / "transcript.schema.json"
    assert json.loads(shipped.read_text()) == SCHEMA
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize(
    ("record", "change"),
    [
        (TERMINAL, {"terminal": "Completed"}),  # a policy refusal is no reason to complete
        (TERMINAL, {"reason": {"source": "x"}}),  # a reason without a kind
        (TERMINAL, {"terminal": "Done"}),  # not one of the eleven
        (TERMINAL, {"tasks": [{"id": "T1", "terminal": "Idle", "reason": {"kind": "end_turn"}}]}),  # a task's too
        (TERMINAL, {"seq": 0}),  # seq counts from 1
        (TERMINAL, {"t": None}),
        (POLICY, {"decision": "deny"}),  # the record says refuse (a deny rule, or no rule)
        (POLICY, {"rule_ids": "read-all"}),
        (POLICY, {"reason": DROP}),
        (POLICY, {"type": "policy_decision"}),  # an unknown record type
        ({"seq": 2, "t": 0.1, "type": "rpc", "dir": "in", "msg": {"id": 1, "result": {}}}, {}),  # no jsonrpc
        ({"seq": 2, "t": 0.1, "type": "rpc", "dir": "in", "msg": {"jsonrpc": "2.0"}}, {}),  # neither method nor id
        ({"seq": 2, "t": 0.1, "type": "rpc", "dir": "sideways", "msg": {"jsonrpc": "2.0", "id": 1}}, {}),
        ({"seq": 3, "t": 0.1, "type": "turn", "iteration": 1, "prompt_kind": "please"}, {}),
        ({"seq": 3, "t": 0.1, "type": "sandbox", "mode": "workspace-write"}, {}),  # on, without its argv
    ],
)
def test_the_schema_rejects_what_a_reader_could_not_rely_on(record, change):
    if change:  # a valid record, broken in one field
        assert VALID.is_valid(record)
    broken = {k: v for k, v in {**copy.deepcopy(record), **change}.items() if v is not DROP}
    assert not VALID.is_valid(broken), broken


@pytest.mark.parametrize(
    "record",
    [
        TERMINAL,
        POLICY,
        {**POLICY, "decision": "interactive", "reason": DROP, "outcome": {"outcome": "cancelled"}},
        {"seq": 7, "t": 3.0, "type": "rpc", "dir": "out", "truncated": True, "bytes": 2_000_000},  # kept whole-ish
        {"seq": 3, "t": 0.1, "type": "turn", "iteration": 2, "prompt_kind": "standing_policy+steering"},
        {"seq": 2, "t": 0.0, "type": "sandbox", "mode": "off"},
        {"seq": 9, "t": 1.0, "type": "usage", "usage": None, "meta": {"timings": {}}},  # an answer with _meta only
    ],
)
def test_the_schema_accepts_what_the_kernel_writes(record):
    record = {k: v for k, v in record.items() if v is not DROP}
    assert VALID.is_valid(record), list(VALID.iter_errors(record))


def test_a_stop_with_a_reason_its_terminal_does_not_carry_is_a_bug():
    with pytest.raises(ValueError, match="not a reason kind of Completed"):
        Stop(Terminal.COMPLETED, {"kind": "policy_refusal"})
    assert Stop(Terminal.FAILED, {"kind": "restarted"}).terminal is Terminal.FAILED


def test_records_picks_a_type_and_matching_fields(scripted_scenario, harness_config, run_loop, harness_workspace):
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n")]}))
    result = run_loop(harness_config(path, commit={"message": "{id}"}))  # nothing left behind (issue 30)

    writes = testing.records(result, "policy", source="fs/write_text_file")
    target = str(harness_workspace.path / "src" / "a.txt")
    assert [(r["decision"], r["path"], r["rule_ids"]) for r in writes] == [("allow", target, ["write-src"])]
    assert [r["prompt_kind"] for r in testing.records(result, RecordType.TURN)] == ["task"]
    assert testing.records(result.transcript, "terminal", terminal="Idle")[0]["reason"]["kind"] == "queue_empty"
    assert testing.records(result, "policy", decision="refuse") == []
    with pytest.raises(ValueError, match="'polcy' is not a valid RecordType"):
        testing.records(result, "polcy")


def test_a_transcript_with_a_bad_line_fails_validation_naming_it(tmp_path_factory):
    path = tmp_path_factory.mktemp("forged") / "run.jsonl"  # not under tmp_path: conftest would check it too
    start = {"seq": 1, "t": 0.0, "type": "run_start", "mode": "queue", "kernel_version": "0", "workspace": "/w",
             "config": None, "agent": ["a"], "provider": "memory", "rules": [],
             "limits": {"values": {}, "sources": {}, "warnings": []}}  # fmt: skip
    lines = [start, {**POLICY, "seq": 2, "decision": "deny"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(AssertionError, match=r"record 2 \(policy\): 'deny' is not one of"):
        testing.assert_transcript_valid(path)
