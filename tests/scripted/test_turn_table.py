"""The turn table, without an agent: what follows each stop reason, what a turn did, and the counters."""

from __future__ import annotations

import pytest

from harness import CONTINUE_PROMPT, STANDING_PROMPT, Stop, Terminal
from harness.budget._budget import NewSegment
from harness.kernel._turns import NextPrompt, PromptKind, TurnOutcome, after_turn, before_turn
from harness.pytest_plugin import LOOP_SCRIPTED

pytestmark = LOOP_SCRIPTED

REFUSAL = {"kind": "policy_refusal", "source": "fs/write_text_file", "rule_id": "git", "refusal": {"kind": "denied"}}
ACTED = {"tool_calls": 2, "client_calls": 1}
AGENT_REFUSED = {"kind": "refusal", "stop_reason": "refusal"}


@pytest.mark.parametrize(
    ("outcome", "single_prompt", "standing", "expected"),
    [
        # A refusal on record decides, whatever the stop reason and whatever the turn did.
        (TurnOutcome("end_turn", **ACTED, refusal=REFUSAL), False, 0, Stop(Terminal.BLOCKED_POLICY, REFUSAL)),
        (TurnOutcome("max_tokens", refusal=REFUSAL), False, 0, Stop(Terminal.BLOCKED_POLICY, REFUSAL)),
        (TurnOutcome("refusal", refusal=REFUSAL), True, 0, Stop(Terminal.BLOCKED_POLICY, REFUSAL)),
        (TurnOutcome("cancelled", refusal=REFUSAL), False, 2, Stop(Terminal.BLOCKED_POLICY, REFUSAL)),
        # The agent's own refusal and cancel end the session.
        (TurnOutcome("refusal", **ACTED), False, 0, Stop(Terminal.FAILED, AGENT_REFUSED)),
        (TurnOutcome("refusal"), True, 0, Stop(Terminal.FAILED, AGENT_REFUSED)),
        (TurnOutcome("cancelled"), False, 1,
         Stop(Terminal.CANCELLED, {"kind": "agent_cancelled", "stop_reason": "cancelled"})),
        # A cut-off turn is continued, in a single prompt too, and spends no standing answer.
        (TurnOutcome("max_tokens"), False, 1, NextPrompt(CONTINUE_PROMPT, PromptKind.CONTINUE_AFTER_MAX_TOKENS, 1)),
        (TurnOutcome("max_turn_requests", **ACTED), True, 0,
         NextPrompt(CONTINUE_PROMPT, PromptKind.CONTINUE_AFTER_MAX_TURN_REQUESTS, 0)),
        # end_turn of a single prompt ends it, acting or not.
        (TurnOutcome("end_turn"), True, 0, Stop(Terminal.END_TURN, {"kind": "end_turn", "acted": False})),
        (TurnOutcome("end_turn", client_calls=1), True, 2,
         Stop(Terminal.END_TURN, {"kind": "end_turn", "acted": True})),
        # A task's turn that acted completes it; a tool call alone or a client call alone is acting.
        (TurnOutcome("end_turn", **ACTED), False, 0,
         Stop(Terminal.COMPLETED, {"kind": "end_turn", "tool_calls": 2, "client_calls": 1})),
        (TurnOutcome("end_turn", tool_calls=1), False, 2,
         Stop(Terminal.COMPLETED, {"kind": "end_turn", "tool_calls": 1, "client_calls": 0})),
        (TurnOutcome("end_turn", client_calls=1), False, 0,
         Stop(Terminal.COMPLETED, {"kind": "end_turn", "tool_calls": 0, "client_calls": 1})),
        # A turn that did nothing gets the standing answer until they are spent.
        (TurnOutcome("end_turn"), False, 0, NextPrompt(STANDING_PROMPT, PromptKind.STANDING_POLICY, 1)),
        (TurnOutcome("end_turn"), False, 1, NextPrompt(STANDING_PROMPT, PromptKind.STANDING_POLICY, 2)),
        (TurnOutcome("end_turn"), False, 2,
         Stop(Terminal.BLOCKED_AWAITING_INPUT, {"kind": "no_tool_call", "standing_answers": 2, "limit": 2})),
    ],
)  # fmt: skip
def test_what_follows_a_turn(outcome, single_prompt, standing, expected):
    assert after_turn(outcome, single_prompt=single_prompt, standing=standing, standing_answers=2) == expected


def test_no_standing_answers_blocks_at_the_first_idle_turn():
    step = after_turn(TurnOutcome("end_turn"), single_prompt=False, standing=0, standing_answers=0)
    assert step == Stop(Terminal.BLOCKED_AWAITING_INPUT, {"kind": "no_tool_call", "standing_answers": 0, "limit": 0})


SPENT = Stop(Terminal.MAX_ITERATIONS, {"kind": "budget", "stop_code": "AGENT_MODEL_TURN_LIMIT", "current": 4,
                                      "limit": 3, "key": "limits.max_iterations", "source": "file"})  # fmt: skip
SEGMENT = NewSegment("model_turns", 1, 2)


@pytest.mark.parametrize(
    ("budget", "cancel", "expected"),
    [
        (None, False, None),
        (SPENT, False, SPENT),
        (SEGMENT, False, SEGMENT),
        (None, True, Stop(Terminal.CANCELLED, {"kind": "user_cancel", "during": "turn_boundary"})),
        # A spent budget says more than a cancel at the same boundary; a cancel wins over a new segment.
        (SPENT, True, SPENT),
        (SEGMENT, True, Stop(Terminal.CANCELLED, {"kind": "user_cancel", "during": "turn_boundary"})),
    ],
)
def test_whether_the_next_turn_may_start(budget, cancel, expected):
    assert before_turn(budget=budget, cancel_requested=cancel) == expected


def test_prompt_kinds_are_what_the_transcript_records():
    assert [str(k) for k in PromptKind] == [
        "task", "standing_policy", "continue_after_max_tokens", "continue_after_max_turn_requests",
        "continue_new_segment",
    ]  # fmt: skip
