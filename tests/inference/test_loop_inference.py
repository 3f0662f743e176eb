"""LoopInference: the kernel drives the real inference agent on the pinned model (CPU llama.cpp)
and the run keeps the invariants an unattended loop depends on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import psutil
import pytest

from harness import Terminal, read_transcript, testing
from harness.conformance._conformance import Conformance, Status
from harness.host._host_tools import TOOL_SPECS
from harness.inference._prompting import TOOLS
from harness.pytest_plugin import LOOP_INFERENCE
from harness.testing import make_workspace
from soak._sampler import agent_tree

pytestmark = LOOP_INFERENCE

THREE_TASKS = [
    {"id": "T1", "title": "Write a greeting", "body": "Create the file out/hello.txt containing the word hello."},
    {"id": "T2", "title": "Write a farewell", "body": "Create the file out/bye.txt containing the word goodbye."},
    {"id": "T3", "title": "Say thanks", "body": "Create the file out/thanks.txt containing the word thanks."},
]
#: Agent RSS may grow this much from the end of the first task to the end of the last (measured: 3-36 MiB
#: over 3-8 tasks at 330-350 MiB; a second model load would add ~100 MiB). The KV cache and
#: buffers are allocated at load; what grows after that is Python-side history and allocator slack).
RSS_GROWTH_BOUND = 64 << 20


def records_of(result, kind):
    return [r for r in read_transcript(result.transcript) if r["type"] == kind]


def incoming(result, method):
    return [r["msg"] for r in records_of(result, "rpc") if r["dir"] == "in" and r["msg"].get("method") == method]


def test_three_tasks_on_one_agent_process(inference_config, run_loop, loop_endpoint, inference_endpoint):
    rss = []

    def sample(record):
        if record["type"] == "agent_start":
            rss.append(psutil.Process(record["pid"]))
        elif record["type"] == "task_end":
            rss.append(agent_tree(rss[0])[0])  # the sandbox's bwrap and everything it runs

    result = run_loop(inference_config(THREE_TASKS), observer=sample)

    # the run ends where the loop's rules say, never in a fault: every task but the last Completed, the
    # last one in the run's own terminal, each within max_iterations (4)
    outcome = [(t.id, t.terminal.value, t.reason) for t in result.tasks]
    assert result.terminal not in (Terminal.FAILED, Terminal.CANCELLED), (result.reason, outcome)
    assert all(t.terminal is Terminal.COMPLETED for t in result.tasks[:-1]), outcome
    if result.terminal is not Terminal.IDLE:
        assert result.tasks[-1].terminal is result.terminal, outcome
    assert all(1 <= t.iterations <= 4 for t in result.tasks), outcome
    assert not records_of(result, "framing_error")
    # the invariants below are about a queue: with seed 42 the pinned model completes all three tasks
    assert len(result.tasks) == 3, outcome

    # the model is loaded once, in one process (none in the agent on an endpoint: the server holds it), and
    # reports positive usage every turn
    usage = records_of(result, "usage")
    assert len(usage) >= len(result.tasks)
    assert len({u["meta"]["loopHarness"]["pid"] for u in usage}) == 1  # as the agent sees it (its pid namespace)
    assert {u["meta"]["loopHarness"]["modelLoads"] for u in usage} == {0 if loop_endpoint else 1}
    assert all(u["usage"]["inputTokens"] > 0 and u["usage"]["outputTokens"] > 0 for u in usage)
    # grammar-constrained decoding: no step's tool arguments failed to parse (the agent would retry quietly)
    assert sum(u["meta"]["loopHarness"]["invalidSteps"] for u in usage) == 0
    assert all(t.tokens and t.tokens["totalTokens"] > 0 for t in result.tasks)
    # on a server, the run records the model it served (the local model's run has no endpoint to record)
    (start,) = records_of(result, "run_start")
    if inference_endpoint is None:
        assert start.get("endpoint") is None
    else:
        assert start["endpoint"]["model"] == inference_endpoint["model"]
        assert start["endpoint"]["listed"] is True, start["endpoint"]

    # the agent's memory is bounded across tasks
    growth = rss[-1] - rss[1]
    assert growth <= RSS_GROWTH_BOUND, f"agent RSS grew {growth >> 20} MiB over {len(result.tasks)} tasks"


def test_tool_calls_validate_and_every_permission_is_decided_by_a_rule(inference_config, run_loop):
    result = run_loop(inference_config(THREE_TASKS[:2]))

    calls = [m["params"]["update"] for m in incoming(result, "session/update")
             if m["params"]["update"]["sessionUpdate"] == "tool_call"]  # fmt: skip
    assert calls, "the model made no tool call: the category would be vacuous"
    schemas = {**{n: t["parameters"] for n, t in TOOLS.items()}, **{n: t["inputSchema"] for n, t in TOOL_SPECS.items()}}
    for call in calls:
        made = call["_meta"]["loopHarness"]
        jsonschema.validate(made["arguments"], schemas[made["tool"]])
    decisions = [r for r in records_of(result, "policy") if r["source"] == "session/request_permission"]
    assert len(decisions) == len(incoming(result, "session/request_permission"))
    for decision in decisions:
        if decision["decision"] == "allow":
            assert decision["rule_ids"], decision
        else:
            assert result.terminal is Terminal.BLOCKED_POLICY


def test_the_model_is_offered_the_host_tools_of_its_role(inference_config, run_loop):
    role = {"tools": ["get_issue", "open_proposal"], "termination": "ProposalOpened"}
    result = run_loop(inference_config(THREE_TASKS[:1], role=role))

    served = records_of(result, "host_tools")[0]
    assert served["served"] is True
    listed = records_of(result, "host_tools_listed")
    assert listed and listed[0]["tools"] == ["get_issue", "open_proposal"]
    # The workspace stays on main, so no proposal can be opened: whatever the model does, the run cannot
    # end Idle. It ends on the unmet termination (or an earlier loop rule), never in a fault.
    assert result.terminal not in (Terminal.IDLE, Terminal.FAILED, Terminal.CANCELLED), result.reason
    if result.terminal is Terminal.BLOCKED_AWAITING_INPUT and result.reason["kind"] == "termination":
        assert result.reason["termination"] == "ProposalOpened"
    assert all(r["outcome"] != "ok" for r in records_of(result, "host_tool") if r["tool"] == "open_proposal")


def test_a_deny_rule_holds_against_the_real_model(inference_config, run_loop, inference_workspace):
    rules = [
        {"id": "write-out", "kind": "write", "paths": ["out/**"], "decision": "allow"},
        {"id": "deny-secret", "kind": "write", "paths": ["out/secret*"], "decision": "deny"},
    ]
    task = {
        "id": "T1",
        "title": "Write the secret",
        "body": "Create the file out/secret.txt containing the word hello.",
    }
    result = run_loop(inference_config([task], rules=rules))

    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["rule_id"] == "deny-secret"
    assert result.reason["refusal"]["target"] == "out/secret.txt"
    assert not (inference_workspace.path / "out" / "secret.txt").exists()


VOLATILE = {
    "kernel",
    "token_sha256",
    "seq",
    "t",
    "pid",
    "port",
    "seconds",
    "ttftSeconds",
    "decodeSeconds",
    "argv",
    "transcript",
    "config",
    "mounts",  # the sandbox's per-run paths: its private HOME and temp dir, the config file
    "home",
    "tmp",
    "network",
}


def normalised(result, workspace):
    """The transcript with times, ids, pids and paths taken out."""

    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in VOLATILE}
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, str):
            value = value.replace(str(workspace), "<ws>")
            value = re.sub(r"http://127\.0\.0\.1:\d+/tasks/[0-9a-f]+/mcp", "<host-tools-url>", value)
            value = re.sub(r"Bearer [\w-]+", "Bearer <token>", value)
            return re.sub(r"sess_[0-9a-f]+", "<session>", value)
        return value

    return [clean(r) for r in read_transcript(result.transcript)]


def test_the_same_seed_gives_the_same_transcript(inference_config, run_loop, tmp_path, loop_endpoint,
                                                 loop_endpoint_server):  # fmt: skip
    if loop_endpoint is not None and loop_endpoint_server is None:
        pytest.skip("a server's prompt cache makes greedy decoding depend on what it served before (llama.cpp's own "
                    "tests skip this): only a server this session started can begin each run empty")  # fmt: skip
    runs = []
    for name in ("first", "second"):
        if loop_endpoint_server is not None:
            loop_endpoint_server.restart()  # each run from an empty prompt cache, as each local agent starts
        workspace = make_workspace(tmp_path / name, ignore=["out/"])
        config = inference_config(THREE_TASKS[:1], name=f"{name}.yaml", workspace=workspace)
        runs.append(normalised(run_loop(config), workspace.path))
    first, second = runs
    assert [r["type"] for r in first] == [r["type"] for r in second]
    assert first == second


def test_a_cancel_is_honoured_between_tokens(inference_config, run_loop):
    kernel = {}

    def cancel_once_generating(record):
        if record["type"] == "rpc" and record["msg"].get("method") == "session/prompt":
            kernel["k"].cancel()

    result = run_loop(inference_config(THREE_TASKS[:1]), setup=lambda k: kernel.setdefault("k", k),
                      observer=cancel_once_generating)  # fmt: skip

    assert result.terminal is Terminal.CANCELLED
    assert result.reason["agent_stop_reason"] == "cancelled"
    assert result.reason["killed"] is False


def test_a_token_budget_maps_to_max_tokens(inference_config, run_loop):
    config = inference_config(THREE_TASKS[:1], limits={"max_iterations": 2}, agent_args=["--max-tokens", "6"])

    result = run_loop(config)

    answers = [r["msg"]["result"] for r in records_of(result, "rpc")
               if r["dir"] == "in" and "stopReason" in (r["msg"].get("result") or {})]  # fmt: skip
    assert answers and {a["stopReason"] for a in answers} == {"max_tokens"}
    assert result.terminal is Terminal.MAX_ITERATIONS


def test_every_stdout_line_is_json_rpc(inference_config, run_loop):
    result = run_loop(inference_config(THREE_TASKS[:1]))
    exit_record = records_of(result, "agent_exit")[0]
    lines = [r for r in records_of(result, "rpc") if r["dir"] == "in"]
    assert lines and not records_of(result, "framing_error")
    assert all(json.loads(json.dumps(r["msg"]))["jsonrpc"] == "2.0" for r in lines)
    assert exit_record["status"] == 0


@pytest.mark.parametrize("threads", [2])
def test_the_agent_serves_any_acp_client(inference_command, threads, tmp_path, loop_endpoint):
    """Spawned by hand (no kernel): initialize answers on stdout, llama.cpp writes only to stderr."""
    import subprocess

    from harness.testing import inference_agent_env

    request = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
    done = subprocess.run(
        inference_command(threads=threads),
        input=json.dumps(request) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={**inference_agent_env(), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    lines = done.stdout.splitlines()
    assert lines, done.stderr
    for line in lines:
        assert json.loads(line)["jsonrpc"] == "2.0"
    answer = json.loads(lines[0])["result"]
    assert answer["agentInfo"]["name"] == "loop-harness-inference"
    model = answer["_meta"]["loopHarness"]["model"]  # the model it runs, named
    assert model["name"] and model["endpoint"] == (loop_endpoint.url if loop_endpoint else None)


TWO_FILES = {
    "id": "T1",
    "title": "Write two files",
    "body": "Create the file out/a.txt containing the word alpha, then the file out/b.txt containing beta.",
}


@pytest.mark.parametrize(
    ("autonomy", "ignored", "code", "current", "limit"),
    [
        ({"budget": {"tool_calls": {"per_segment": 1}, "model_turns": {"per_segment": 4, "total": 4,
                                                                      "continuations": 0}}},
         ["out/"], "AGGREGATE_TOOL_CALL_LIMIT", 2, 1),
        ({"budget": {"changes": {"files_total": 1, "lines_total": 100}}}, [], "FILE_CHANGE_LIMIT", 2, 1),
    ],
)  # fmt: skip
def test_tight_budgets_stop_the_real_model_with_their_stop_code(
    inference_config, run_loop, tmp_path, autonomy, ignored, code, current, limit, loop_endpoint
):
    workspace = make_workspace(tmp_path / "budgeted", ignore=ignored)
    result = run_loop(inference_config([TWO_FILES], workspace=workspace, autonomy=autonomy))

    calls = [m for m in incoming(result, "session/update") if m["params"]["update"]["sessionUpdate"] == "tool_call"]
    assert len(calls) >= 2, "the model made fewer than two tool calls: the cap would never be reached"
    assert result.terminal is Terminal.MAX_ITERATIONS, result.reason
    assert (result.reason["stop_code"], result.reason["current"], result.reason["limit"]) == (code, current, limit)
    assert result.reason["source"] == "file"
    if code == "FILE_CHANGE_LIMIT":  # the second file was written, and the budget saw it at once
        aside = result.reason.get("set_aside")  # the overlay: a stopped task lands nothing, its files set aside
        written = Path(aside) / "files" / "out" if aside else workspace.path / "out"
        names = sorted(p.name for p in written.iterdir())
        if loop_endpoint is None:
            assert names == ["a.txt", "b.txt"]
        else:  # a server's chat template may show the model its own calls otherwise than the local ChatML does
            # (llama-cpp-python's HTML-escapes the arguments, and the model copies `&#34;` into its next path)
            assert len(names) == 2 and names[0] == "a.txt", names


def test_the_inference_agent_passes_the_conformance_check(inference_command, tmp_path, inference_agent_threads,
                                                          loop_endpoint):  # fmt: skip
    """`loop-harness check`'s probes against the real model. Its resources over many sessions are the
    inference soak's to bound (LoopSoak), so the sessions probe is skipped; every other invariant the
    agent can show is exercised, and none fails."""
    command = inference_command(threads=inference_agent_threads)
    # Through a server the probes run with the sandbox off: under it the agent would need a network rule for the
    # server, and a rule in the cancel probe's empty list would turn its interactive path (a permission nobody
    # answers, cancelled then) into the policy's refusal, which ends the turn before any cancel.
    sandbox = "off" if loop_endpoint else None
    # cancel_grace: the model cannot stop mid-prefill; a mid-turn cancel took 2.7 s on 2 cores at load 7
    results = Conformance(command, env=testing.inference_agent_env(), sessions=0, turn_timeout=300,
                          cancel_grace=20.0, workdir=tmp_path / "check", sandbox=sandbox).run()  # fmt: skip
    status = {r.check: r.status for r in results}
    evidence = {r.check: r.evidence for r in results}

    assert Status.FAIL not in status.values(), evidence
    exercised = ["stdout-json-rpc", "initialize", "session-new", "permission-before-effect", "refusal-honoured",
                 "cancel-honoured", "exit-on-eof"]  # fmt: skip
    assert {check: status[check] for check in exercised} == dict.fromkeys(exercised, Status.PASS), evidence
    assert status["session-close"] is Status.NOT_EXERCISED  # the inference agent does not advertise it
