"""The run object's parts, without an agent: teardown order and failures, the facade's status."""

from __future__ import annotations

import asyncio

import pytest

from harness import Terminal, load_config, read_transcript
from harness.kernel._kernel import Kernel, RunState
from harness.kernel._run import Teardown
from harness.pytest_plugin import LOOP_SCRIPTED
from harness.record._transcript import Transcript
from scripted_agents.presets import scenario, write_turn

pytestmark = LOOP_SCRIPTED


def test_teardown_closes_in_its_order_whatever_order_things_were_opened(tmp_path):
    transcript = Transcript(tmp_path / "t.jsonl")
    closed: list[str] = []

    def step(name: str, fail: bool = False):
        async def close() -> None:
            closed.append(name)
            if fail:
                raise OSError(f"{name} would not close")

        return close

    teardown = Teardown(transcript)
    for name in ("sandbox", "provider", "agent", "egress", "terminals"):  # the order a run opens them in
        teardown.add(name, step(name, fail=name == "agent"))
    asyncio.run(teardown.close())
    asyncio.run(teardown.close())  # a second close closes nothing twice
    transcript.close()

    assert closed == ["agent", "terminals", "provider", "egress", "sandbox"]  # host_tools was never opened
    errors = [r for r in read_transcript(transcript.path) if r["type"] == "teardown_error"]
    assert [(e["step"], e["error"]) for e in errors] == [("agent", "OSError: agent would not close")]


def test_a_later_registration_replaces_an_earlier_one_of_the_same_step(tmp_path):
    """The host-tools port is closed by its server once the server has taken it over, not twice."""
    closed: list[str] = []

    async def socket_only() -> None:
        closed.append("socket")

    async def server() -> None:
        closed.append("server")

    transcript = Transcript(tmp_path / "t.jsonl")
    teardown = Teardown(transcript)
    teardown.add("host_tools", socket_only)
    teardown.add("host_tools", server)
    asyncio.run(teardown.close())
    transcript.close()
    assert closed == ["server"]
    with pytest.raises(AssertionError):
        teardown.add("database", server)  # a step with no place in the order is a bug


def test_the_facade_says_where_the_run_is(scripted_scenario, harness_config):
    path = scripted_scenario(scenario({"T1": [write_turn("src/a.txt", "a\n")]}))
    kernel = Kernel(load_config(harness_config(path, commit={"message": "{id}"})))  # nothing left behind (issue 30)
    assert kernel.state is RunState.NEW and kernel.status == {"state": "new", "rule_ids": []}
    assert kernel.transcript_bytes == 0

    result = asyncio.run(kernel.run())

    assert result.terminal is Terminal.IDLE
    assert kernel.state is RunState.ENDED
    assert kernel.status == {"state": "ended", "terminal": "Idle", "rule_ids": ["write-src", "read-all"]}
    assert kernel.transcript_bytes == result.transcript.stat().st_size
