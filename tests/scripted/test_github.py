"""The GitHub queue against a real HTTP server on loopback: pagination, rate limits, outages, auth."""

from __future__ import annotations

import time

import pytest

from harness import Terminal, read_transcript
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from scripted_agents.presets import scenario, turn
from tests.helpers.fakegithub import FakeGitHub

pytestmark = LOOP_SCRIPTED

READ_ONLY = turn({"read": {"path": "README.md"}})  # acts (a client call), leaves the tree clean


@pytest.fixture(name="github")
def github_fixture(monkeypatch):
    server = FakeGitHub(per_page_cap=2)
    monkeypatch.setenv("FAKE_GH_TOKEN", server.token)
    yield server
    server.close()


@pytest.fixture(name="github_config")
def github_config_fixture(scripted_scenario, harness_config, github):
    def write(**queue):
        settings = {
            "provider": "github",
            "api_url": github.url,
            "repo": github.repo,
            "assignee": "agent",
            "token_env": "FAKE_GH_TOKEN",
            "backoff_base_s": 0.01,
            "max_retries": 3,
            **queue,
        }
        return harness_config(scripted_scenario(scenario({None: [READ_ONLY]})), tasks=[], queue=settings)

    return write


def fill(github, count=5):
    for number in range(1, count + 1):
        github.add_issue(number, f"Issue {number}")
    github.add_issue(6, "Somebody else's", assignee="someone")
    github.add_issue(7, "A pull request", pull_request={"url": "x"})  # pull requests are issues too


def started(result):
    return [r["task"]["id"] for r in read_transcript(result.transcript) if r["type"] == "task_start"]


@LOOP_SLOW
def test_drains_issues_across_pages_through_a_secondary_rate_limit(github, github_config, run_loop):
    fill(github)
    github.script("GET", f"/repos/{github.repo}/issues", {"status": 403, "headers": {"retry-after": "0"},
                  "body": {"message": "You have exceeded a secondary rate limit"}}, contains="page=2")  # fmt: skip

    result = run_loop(github_config())

    assert result.terminal is Terminal.IDLE
    assert started(result) == ["1", "2", "3", "4", "5"]  # created order, over three pages
    assert all(t.terminal is Terminal.COMPLETED for t in result.tasks)
    retries = [r for r in read_transcript(result.transcript) if r["type"] == "host_retry"]
    assert [(r["op"], r["cause"]) for r in retries] == [("list_tasks", "rate_limited")]
    assert [c[2] for c in github.made("PATCH", f"/repos/{github.repo}/issues/")] == [
        {"state": "closed", "state_reason": "completed"}
    ] * 5
    assert len(github.made("POST", f"/repos/{github.repo}/issues/")) == 5  # a comment each
    assert all("page=" in c[1] for c in github.made("GET", f"/repos/{github.repo}/issues")[1:])


@LOOP_SLOW
def test_a_primary_limit_waits_for_the_reset(github, github_config, run_loop):
    fill(github, 1)
    reset = int(time.time()) + 2
    limited = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}
    github.script("GET", f"/repos/{github.repo}/issues", {"status": 403, "headers": limited})

    result = run_loop(github_config())

    assert result.terminal is Terminal.IDLE
    retry = next(r for r in read_transcript(result.transcript) if r["type"] == "host_retry")
    assert 0 < retry["delay_s"] <= 2.0


def test_a_primary_limit_past_the_wait_budget_blocks(github, github_config, run_loop):
    fill(github, 1)
    reset = int(time.time()) + 3600
    limited = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}
    github.script("GET", f"/repos/{github.repo}/issues", {"status": 429, "headers": limited})

    result = run_loop(github_config(max_wait_s=60))

    assert result.terminal is Terminal.BLOCKED_RATE_LIMITED
    assert result.reason["reset_at"] == float(reset)
    assert result.reason["retries"] == 0


def test_a_secondary_limit_without_retry_after_backs_off_then_blocks(github, github_config, run_loop):
    fill(github, 1)
    limited = {"status": 403, "body": {"message": "You have exceeded a secondary rate limit."}}
    github.script("GET", f"/repos/{github.repo}/issues", *[limited] * 10)

    result = run_loop(github_config())

    assert result.terminal is Terminal.BLOCKED_RATE_LIMITED
    assert result.reason == {**result.reason, "reset_at": None, "retries": 3}


def test_flaky_502s_are_retried(github, github_config, run_loop):
    fill(github, 2)
    github.script("GET", f"/repos/{github.repo}/issues", {"status": 502, "raw": b"Bad Gateway"}, {"status": 502})
    result = run_loop(github_config())
    assert result.terminal is Terminal.IDLE
    assert started(result) == ["1", "2"]


def test_5xx_after_retries_is_host_unavailable(github, github_config, run_loop):
    fill(github, 1)
    github.script("GET", f"/repos/{github.repo}/issues", *[{"status": 503}] * 10)
    result = run_loop(github_config())
    assert result.terminal is Terminal.BLOCKED_HOST_UNAVAILABLE
    assert result.reason["cause"] == f"GET /repos/{github.repo}/issues answered 503"
    assert result.reason["retries"] == 3


def test_a_body_that_is_not_json_is_host_unavailable(github, github_config, run_loop):
    fill(github, 1)
    github.script("GET", f"/repos/{github.repo}/issues",
                  *[{"status": 200, "raw": b"<html>maintenance</html>"}] * 10)  # fmt: skip
    result = run_loop(github_config())
    assert result.terminal is Terminal.BLOCKED_HOST_UNAVAILABLE
    assert "not JSON" in result.reason["cause"]


def test_a_host_that_times_out_is_host_unavailable(github, github_config, run_loop):
    fill(github, 1)
    github.script("GET", f"/repos/{github.repo}/issues", *[{"delay": 1.0, "body": []}] * 4)
    result = run_loop(github_config(request_timeout_s=0.2))
    assert result.terminal is Terminal.BLOCKED_HOST_UNAVAILABLE
    assert "ReadTimeout" in result.reason["cause"]
    assert result.reason["retries"] == 3


def test_an_unreachable_host_is_host_unavailable(github, github_config, run_loop):
    github.close()
    result = run_loop(github_config())
    assert result.terminal is Terminal.BLOCKED_HOST_UNAVAILABLE
    assert "ConnectError" in result.reason["cause"]
    assert result.tasks == []


def test_a_bad_token_blocks_before_any_task(github, github_config, run_loop, monkeypatch):
    fill(github, 1)
    monkeypatch.setenv("FAKE_GH_TOKEN", "wrong")
    result = run_loop(github_config())
    assert result.terminal is Terminal.BLOCKED_PRECONDITION
    assert result.reason["check"] == "host_authorized"
    assert "401" in result.reason["detail"]
    assert not [r for r in read_transcript(result.transcript) if r["type"] == "agent_start"]


def test_an_unset_token_variable_blocks_before_any_task(github, github_config, run_loop, monkeypatch):
    monkeypatch.delenv("FAKE_GH_TOKEN")
    result = run_loop(github_config())
    assert result.terminal is Terminal.BLOCKED_PRECONDITION
    assert "FAKE_GH_TOKEN is not set" in result.reason["detail"]
    assert github.calls == []


@pytest.mark.parametrize("status", [403, 404, 422])
def test_a_completed_issue_that_cannot_be_closed_is_skipped(github, github_config, run_loop, status):
    fill(github, 2)
    github.script("PATCH", f"/repos/{github.repo}/issues/1", {"status": status, "body": {"message": "nope"}})

    result = run_loop(github_config())

    assert result.terminal is Terminal.IDLE
    assert started(result) == ["1", "2"]  # #1 is still open on the host, yet runs once
    assert result.tasks[0].mark_done_error["kind"] == "host_rejected"
    assert f"answered {status}" in result.tasks[0].mark_done_error["cause"]


def test_order_updated_and_unassign_on_complete(github, github_config, run_loop):
    github.add_issue(1, "old but touched last", updated="2026-03-09")
    github.add_issue(2, "newer, untouched", updated="2026-03-01")
    result = run_loop(github_config(order="updated", on_complete=["unassign"]))

    assert started(result) == ["2", "1"]
    assert [c[2] for c in github.made("DELETE", f"/repos/{github.repo}/issues/")] == [{"assignees": ["agent"]}] * 2
    assert not github.made("PATCH", "/")


def test_a_retried_mark_done_comments_once(github, github_config, run_loop):
    fill(github, 1)
    github.script("PATCH", f"/repos/{github.repo}/issues/1", {"status": 502})
    result = run_loop(github_config())
    assert result.terminal is Terminal.IDLE
    assert len(github.made("POST", f"/repos/{github.repo}/issues/1/comments")) == 1
    assert len(github.made("PATCH", f"/repos/{github.repo}/issues/1")) == 2


def test_a_next_link_to_another_host_is_not_followed(github, github_config, run_loop):
    fill(github, 1)
    elsewhere = '<https://evil.invalid/steal?page=2>; rel="next"'
    github.script("GET", f"/repos/{github.repo}/issues", {"status": 200, "body": [], "headers": {"Link": elsewhere}})
    result = run_loop(github_config(max_retries=0))
    assert result.terminal is Terminal.BLOCKED_HOST_UNAVAILABLE
    assert "leaves" in result.reason["cause"]
