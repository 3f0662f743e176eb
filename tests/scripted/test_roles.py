"""Roles and the host's MCP tools: allowlists, triggers, terminations, both hosts."""

from __future__ import annotations

import asyncio
import json

import pytest

from harness import Terminal, load_config, read_transcript
from harness.config._config import HOST_TOOLS, GitHubQueueConfig, MemoryQueueConfig
from harness.host._host_tools import DEFAULT_TOOLS, HostToolError, HostTools
from harness.pytest_plugin import LOOP_SCRIPTED
from harness.queues import HostToolProvider, Task, make_provider
from harness.testing import write_yaml
from scripted_agents.presets import scenario, turn
from tests.helpers.fakegithub import FakeGitHub

pytestmark = LOOP_SCRIPTED

MCP_AGENT = {"agent": {"mcp_http": True}}
REVIEWER = {
    "prompt": "Review the proposed change. Do not edit the worktree.",
    "tools": ["get_commits_status", "plan_verification", "get_issue", "submit_review"],
    "trigger": "ProposalAwaitingReview",
    "termination": "ReviewSubmitted",
}


def task_branch(name):
    """Steps that put the task's work on a branch of its own, pushed: what a proposal is opened from."""
    return [
        {"terminal": {"command": "git", "args": ["checkout", "-q", "-b", name]}},
        {"terminal": {"command": "git", "args": ["push", "-q", "-u", "origin", name]}},
    ]


def run_with_provider(run_loop, config_path, **options):
    """Run with the provider built here, so the test can read what the host recorded."""
    config = load_config(config_path)
    provider = make_provider(config.queue, trigger=config.role.trigger)
    return run_loop(config_path, provider=provider, **options), provider


def messages(result):
    return [
        r["msg"]["params"]["update"]["content"]["text"]
        for r in read_transcript(result.transcript)
        if r["type"] == "rpc" and r["dir"] == "in" and r["msg"].get("method") == "session/update"
        and r["msg"]["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]  # fmt: skip


def host_calls(result):
    return [(r["tool"], r["outcome"]) for r in read_transcript(result.transcript) if r["type"] == "host_tool"]


def test_an_empty_allowlist_keeps_the_default_tools(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(
        scenario({None: [turn({"mcp_list": {}}, {"mcp_call": {"tool": "get_issue"}})]}, **MCP_AGENT)
    )
    result = run_loop(harness_config(path, tasks=[{"id": "T1", "title": "Add a greeting", "body": "say hi"}]))

    assert result.terminal is Terminal.IDLE
    said = messages(result)
    assert (
        "mcp tools: get_issue, open_proposal, submit_review, get_commits_status, plan_verification, ask_question"
        in said
    )
    issue = json.loads(next(m for m in said if m.startswith("mcp get_issue: "))[len("mcp get_issue: ") :])
    assert issue == {"id": "T1", "title": "Add a greeting", "body": "say hi", "kind": "issue"}


def test_an_allowlist_hides_and_refuses_a_tool(scripted_scenario, harness_config, run_loop):
    steps = [{"mcp_list": {}}, {"mcp_call": {"tool": "open_proposal", "arguments": {"title": "sneaky"}}}]
    path = scripted_scenario(scenario({None: [turn(*steps)]}, **MCP_AGENT))
    config = harness_config(path, role={"tools": ["get_issue"]})

    result, host = run_with_provider(run_loop, config)

    said = messages(result)
    assert "mcp tools: get_issue" in said  # open_proposal is not listed ...
    assert "mcp open_proposal: tool 'open_proposal' is not available to this task" in said  # ... nor callable
    assert host_calls(result) == [("open_proposal", "refused")]
    assert host.proposals == []


def test_proposal_opened_meets_the_termination(scripted_scenario, harness_config, run_loop):
    propose = {"mcp_call": {"tool": "open_proposal", "arguments": {"title": "Add a greeting", "body": "as asked"}}}
    steps = [{"read": {"path": "README.md"}}, *task_branch("task-T1"), propose]
    path = scripted_scenario(scenario({None: [turn(*steps)]}, **MCP_AGENT))
    config = harness_config(
        path, role={"termination": "ProposalOpened"}, sandbox={"mode": "off"}
    )  # it pushes a branch itself

    result, host = run_with_provider(run_loop, config)

    assert result.terminal is Terminal.IDLE
    assert host.proposals == [
        {"id": "P1", "task": "T1", "title": "Add a greeting", "body": "as asked", "head": "task-T1"}
    ]
    assert host_calls(result) == [("open_proposal", "ok")]


def test_a_proposal_from_the_base_branch_is_refused_with_the_way_out(scripted_scenario, harness_config, run_loop):
    propose = {"mcp_call": {"tool": "open_proposal", "arguments": {"title": "Add a greeting"}}}
    path = scripted_scenario(scenario({None: [turn({"read": {"path": "README.md"}}, propose)]}, **MCP_AGENT))
    result, host = run_with_provider(run_loop, harness_config(path, role={"termination": "ProposalOpened"}))

    assert host.proposals == []
    assert host_calls(result) == [("open_proposal", "error")]
    said = next(m for m in messages(result) if m.startswith("mcp open_proposal: "))
    assert "the base branch 'main'" in said and "push it" in said
    assert (result.terminal, result.reason["termination"]) == (Terminal.BLOCKED_AWAITING_INPUT, "ProposalOpened")


def test_a_permission_request_for_an_allowed_host_tool_is_answered_by_the_allowlist(
    scripted_scenario, harness_config, run_loop
):
    # Claude asks before any MCP tool, titled mcp__<server>__<tool>, kind other (no policy rule kind fits).
    def ask(tool):
        return {"tool_call": {"title": f"mcp__loop-harness-host__{tool}", "kind": "other", "permission": True}}

    propose = {"mcp_call": {"tool": "open_proposal", "arguments": {"title": "Add a greeting"}}}
    path = scripted_scenario(
        scenario({None: [turn(*task_branch("task-T1"), ask("open_proposal"), propose)]}, **MCP_AGENT)
    )
    result, host = run_with_provider(
        run_loop, harness_config(path, role={"termination": "ProposalOpened"}, sandbox={"mode": "off"})
    )  # its agent pushes a branch itself: the upstream is outside any sandbox

    assert result.terminal is Terminal.IDLE, result.reason
    assert result.tasks[0].rule_ids == ["git", "builtin:host-tool"]
    assert [p["title"] for p in host.proposals] == ["Add a greeting"]

    # Outside the allowlist the request is the policy's, and no rule governs kind `other`.
    path = scripted_scenario(
        scenario({None: [turn(ask("open_proposal"), propose)]}, **MCP_AGENT), name="b-scenario.yaml"
    )
    result, host = run_with_provider(run_loop, harness_config(path, name="b-loop.yaml", role={"tools": ["get_issue"]}))
    assert result.terminal is Terminal.BLOCKED_POLICY
    assert result.reason["refusal"]["kind"] == "unmatched" and result.reason["tool_kind"] == "other"
    assert host.proposals == []


def test_an_unmet_termination_waits_for_input(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({None: [turn({"read": {"path": "README.md"}})]}, **MCP_AGENT))
    result = run_loop(harness_config(path, role={"termination": "ProposalOpened"}))

    assert result.terminal is Terminal.BLOCKED_AWAITING_INPUT
    assert result.reason["kind"] == "termination"
    assert result.reason["stop_reason"] == "termination"
    assert result.reason["termination"] == "ProposalOpened"


def test_a_review_role_drains_the_proposal_queue(scripted_scenario, harness_config, run_loop, tmp_path):
    review = turn(
        {"mcp_call": {"tool": "get_issue"}},
        {"mcp_call": {"tool": "plan_verification"}},
        {"mcp_call": {"tool": "get_commits_status"}},
        {"mcp_call": {"tool": "submit_review", "arguments": {"verdict": "approve", "body": "looks right"}}},
    )
    role = write_yaml(tmp_path / "reviewer.yaml", REVIEWER)
    proposals = [{"id": "P7", "title": "Fix the parser", "branch": "main"}, {"id": "P8", "title": "Add docs"}]
    config = harness_config(scripted_scenario(scenario({None: [review]}, **MCP_AGENT)),
                            tasks=[], queue={"proposals": proposals}, role=str(role))  # fmt: skip

    result, host = run_with_provider(run_loop, config)

    assert result.terminal is Terminal.IDLE
    assert [t.id for t in result.tasks] == ["P7", "P8"]
    assert [(r["proposal"], r["verdict"]) for r in host.reviews] == [("P7", "approve"), ("P8", "approve")]
    first_prompt = next(r for r in read_transcript(result.transcript)
                        if r["type"] == "rpc" and r["msg"].get("method") == "session/prompt")  # fmt: skip
    assert first_prompt["msg"]["params"]["prompt"][0]["text"].startswith("Review the proposed change.")
    assert ("submit_review", "ok") in host_calls(result)


def test_the_seed_example_role_cannot_submit_its_review(scripted_scenario, harness_config, run_loop):
    # The autonomy contract's example reviewer role allowlists only get_commits_status and plan_verification, so the
    # ReviewSubmitted it asks for can never be met: the run says so instead of pretending.
    example = {**REVIEWER, "tools": ["get_commits_status", "plan_verification"]}
    review = turn({"mcp_call": {"tool": "plan_verification"}},
                  {"mcp_call": {"tool": "submit_review", "arguments": {"verdict": "approve"}}})  # fmt: skip
    config = harness_config(scripted_scenario(scenario({None: [review]}, **MCP_AGENT)), tasks=[],
                            queue={"proposals": [{"id": "P1", "title": "Fix"}]}, role=example)  # fmt: skip

    result = run_loop(config)

    assert host_calls(result) == [("plan_verification", "ok"), ("submit_review", "refused")]
    assert result.terminal is Terminal.BLOCKED_AWAITING_INPUT
    assert result.reason["termination"] == "ReviewSubmitted"


def test_submitting_a_review_of_an_issue_is_an_error_not_a_crash(scripted_scenario, harness_config, run_loop):
    wrong = turn({"mcp_call": {"tool": "submit_review", "arguments": {"verdict": "approve"}}})
    result = run_loop(harness_config(scripted_scenario(scenario({None: [wrong]}, **MCP_AGENT))))
    assert host_calls(result) == [("submit_review", "error")]
    assert any("submit_review needs a proposal to review" in m for m in messages(result))


def test_an_agent_without_http_mcp_gets_no_host_tools(scripted_scenario, harness_config, run_loop):
    path = scripted_scenario(scenario({None: [turn({"read": {"path": "README.md"}})]}))
    result = run_loop(harness_config(path))
    record = next(r for r in read_transcript(result.transcript) if r["type"] == "host_tools")
    assert record["served"] is False
    new_session = next(r for r in read_transcript(result.transcript)
                       if r["type"] == "rpc" and r["msg"].get("method") == "session/new")  # fmt: skip
    assert new_session["msg"]["params"]["mcpServers"] == []


def test_an_unknown_tool_in_a_role_is_a_config_error(scripted_scenario, harness_config):
    from harness import ConfigError

    config = harness_config(scripted_scenario(scenario({None: [turn()]})), role={"tools": ["rm_rf"]})
    with pytest.raises(ConfigError, match=r"role\.tools: .*unknown host tool"):
        load_config(config)


def test_a_github_review_role_reviews_requested_pull_requests(scripted_scenario, harness_config, run_loop, monkeypatch):
    github = FakeGitHub()
    monkeypatch.setenv("FAKE_GH_TOKEN", github.token)
    github.add_pull(11, "Fix the parser", reviewers=["agent"])
    github.add_pull(12, "Not for us", reviewers=["someone"])
    github.add_pull(13, "Add docs", reviewers=["someone", "agent"])
    review = turn({"mcp_call": {"tool": "submit_review", "arguments": {"verdict": "request_changes", "body": "why?"}}})
    queue = {"provider": "github", "api_url": github.url, "repo": github.repo, "assignee": "agent",
             "token_env": "FAKE_GH_TOKEN"}  # fmt: skip
    config = harness_config(scripted_scenario(scenario({None: [review]}, **MCP_AGENT)), tasks=[], queue=queue,
                            role=REVIEWER)  # fmt: skip
    try:
        result = run_loop(config)
    finally:
        github.close()

    assert result.terminal is Terminal.IDLE
    assert [t.id for t in result.tasks] == ["11", "13"]
    reviews = github.made("POST", f"/repos/{github.repo}/pulls/")
    assert [(c[1], c[2]) for c in reviews] == [
        (f"/repos/{github.repo}/pulls/11/reviews", {"event": "REQUEST_CHANGES", "body": "why?"}),
        (f"/repos/{github.repo}/pulls/13/reviews", {"event": "REQUEST_CHANGES", "body": "why?"}),
    ]


#: The task's work pushed to its own branch, back on main, then a proposal from that branch.
PROPOSE_FROM_TASK_BRANCH = turn(
    *task_branch("task-5"),
    {"terminal": {"command": "git", "args": ["checkout", "-q", "main"]}},
    {"mcp_call": {"tool": "open_proposal", "arguments": {"title": "Greeting", "body": "done", "branch": "task-5"}}},
)


def run_on_github(scripted_scenario, harness_config, run_loop, monkeypatch, agent_turn, *, script=None):
    """A ProposalOpened task (issue 5) on the loopback GitHub; `script` is (method, path prefix, *responses)
    for the host to answer first. Returns the result and the host, to read what it was asked."""
    github = FakeGitHub()
    monkeypatch.setenv("FAKE_GH_TOKEN", github.token)
    github.add_issue(5, "Add a greeting")
    if script:
        method, prefix, *responses = script
        github.script(method, f"/repos/{github.repo}{prefix}", *responses)
    queue = {"provider": "github", "api_url": github.url, "repo": github.repo, "assignee": "agent",
             "token_env": "FAKE_GH_TOKEN", "on_complete": ["comment"], "max_retries": 2,
             "backoff_base_s": 0.01}  # fmt: skip
    config = harness_config(scripted_scenario(scenario({None: [agent_turn]}, **MCP_AGENT)), tasks=[], queue=queue,
                            role={"termination": "ProposalOpened"})  # fmt: skip
    try:
        return run_loop(config), github
    finally:
        github.close()


def github_proposal_run(scripted_scenario, harness_config, run_loop, monkeypatch, *responses):
    """PROPOSE_FROM_TASK_BRANCH on the loopback GitHub, whose pull-request endpoint first answers `responses`."""
    return run_on_github(scripted_scenario, harness_config, run_loop, monkeypatch, PROPOSE_FROM_TASK_BRANCH,
                         script=("POST", "/pulls", *responses))  # fmt: skip


def test_a_github_proposal_is_a_pull_request_from_the_branch(scripted_scenario, harness_config, run_loop, monkeypatch):
    result, github = github_proposal_run(scripted_scenario, harness_config, run_loop, monkeypatch)

    assert result.terminal is Terminal.IDLE
    assert [c[2] for c in github.made("POST", f"/repos/{github.repo}/pulls")] == [
        {"title": "Greeting", "body": "done", "head": "task-5", "base": "main"}
    ]


def test_a_host_tool_call_is_retried_through_a_flaky_host(scripted_scenario, harness_config, run_loop, monkeypatch):
    result, github = github_proposal_run(scripted_scenario, harness_config, run_loop, monkeypatch,
                                         {"status": 502, "raw": b"Bad Gateway"})  # fmt: skip
    assert result.terminal is Terminal.IDLE, result.reason
    assert len(github.made("POST", f"/repos/{github.repo}/pulls")) == 2  # the 502, then the pull request
    assert host_calls(result) == [("open_proposal", "ok")]


def test_a_host_that_stays_down_ends_the_run_in_its_own_terminal(
    scripted_scenario, harness_config, run_loop, monkeypatch
):
    down = {"status": 503, "raw": b"Service Unavailable"}
    result, github = github_proposal_run(scripted_scenario, harness_config, run_loop, monkeypatch, down, down, down)

    # not BlockedAwaitingInput: nobody's input helps while the host is down
    assert result.terminal is Terminal.BLOCKED_HOST_UNAVAILABLE, result.reason
    assert "503" in json.dumps(result.reason)
    assert len(github.made("POST", f"/repos/{github.repo}/pulls")) == 3  # the call and max_retries retries
    assert host_calls(result) == [("open_proposal", "error")]


def test_a_host_that_refuses_the_proposal_leaves_the_run_awaiting_input(
    scripted_scenario, harness_config, run_loop, monkeypatch
):
    refused = {"status": 422, "body": {"message": "Validation Failed"}}
    result, _github = github_proposal_run(scripted_scenario, harness_config, run_loop, monkeypatch, refused)

    # the host is up and answered: a person can act on that, so this is not an outage
    assert (result.terminal, result.reason["kind"]) == (Terminal.BLOCKED_AWAITING_INPUT, "termination")
    assert host_calls(result) == [("open_proposal", "error")]


def test_an_outage_in_another_tool_does_not_take_the_blame(scripted_scenario, harness_config, run_loop, monkeypatch):
    down = {"status": 503, "raw": b"Service Unavailable"}
    check = turn({"read": {"path": "README.md"}}, {"mcp_call": {"tool": "get_commits_status"}})
    result, _github = run_on_github(scripted_scenario, harness_config, run_loop, monkeypatch, check,
                                    script=("GET", "/commits/", down, down, down))  # fmt: skip

    assert host_calls(result) == [("get_commits_status", "error")]
    assert (result.terminal, result.reason["kind"]) == (Terminal.BLOCKED_AWAITING_INPUT, "termination")


# --- the host tools' seam: what a queue provider of your own must (not) have ----------------------


class _OwnQueue:
    """A provider with only what the kernel needs (QueueProvider), none of the host tools' operations."""

    name = "mine"

    async def check_authorized(self) -> None: ...

    async def list_tasks(self) -> list[Task]:
        return []

    async def mark_done(self, task: Task) -> None: ...

    async def aclose(self) -> None: ...


async def _direct(op, fn, *args, retry=True):  # HostCalls.call without retries
    return await fn(*args)


def test_a_queue_of_your_own_needs_no_host_tool_operations(tmp_path):
    tools = HostTools(_OwnQueue(), workspace=tmp_path, git_dir=None, base_branch="main", host_calls=_direct)
    binding = tools.bind(Task("7", "seven"), [])

    assert not isinstance(_OwnQueue(), HostToolProvider)
    with pytest.raises(HostToolError, match=r"^the mine host does not support commits_status$"):
        asyncio.run(tools.call(binding, "get_commits_status", {"ref": "abc123"}))
    assert asyncio.run(tools.call(binding, "get_issue", {}))["id"] == "7"  # what needs no host still works
    assert binding.used == ["get_issue"]


def test_both_shipped_providers_serve_the_host_tools_and_the_config_knows_them_all():
    memory = make_provider(MemoryQueueConfig(provider="memory", tasks=[{"id": "T1"}]))
    github = make_provider(GitHubQueueConfig(provider="github", repo="o/r", assignee="bot"))
    try:
        assert isinstance(memory, HostToolProvider) and isinstance(github, HostToolProvider)
    finally:
        asyncio.run(github.aclose())
    assert DEFAULT_TOOLS == HOST_TOOLS  # role allowlists are checked against the tools that exist


def test_a_proposal_opened_as_the_agent_closes_the_session_still_counts(scripted_scenario, harness_config, run_loop):
    """The task's host tools are served until its session/close is answered (the kernel sends the close and
    goes on with its bookkeeping meanwhile): a proposal the agent opens as it winds the session down meets
    the termination, as it did when the close was awaited in place."""
    propose = {"mcp_call": {"tool": "open_proposal", "arguments": {"title": "Add a greeting", "body": "on close"}}}
    work = turn({"read": {"path": "README.md"}}, *task_branch("task-T1"), on_close=[propose])
    path = scripted_scenario(scenario({None: [work]}, **MCP_AGENT))
    config = harness_config(path, role={"termination": "ProposalOpened"}, sandbox={"mode": "off"})

    result, host = run_with_provider(run_loop, config)

    assert result.terminal is Terminal.IDLE, result.reason
    assert [p["body"] for p in host.proposals] == ["on close"]
    assert host_calls(result) == [("open_proposal", "ok")]
