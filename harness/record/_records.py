"""The transcript's vocabulary: every record type (the reason kinds live beside the terminals).

The shipped JSON Schema (`harness/transcript.schema.json`) says the same thing field by field; a test
keeps the two in step with `RecordType` and `REASON_KINDS`.
"""

from __future__ import annotations

import json
from enum import StrEnum
from importlib import resources
from typing import Any

__all__ = ["RecordType", "transcript_schema"]


class RecordType(StrEnum):
    """The `type` of a transcript record, in roughly the order a run writes them."""

    RUN_START = "run_start"  # first line: mode, workspace, agent argv, rule ids, recovery trust
    RECOVERED = "recovered"  # a run whose kernel died, ended by this one (or a marker refused)
    PRECONDITIONS = "preconditions"  # activation and each task boundary: ok, or the failed check
    SANDBOX = "sandbox"  # the bwrap argv and mounts (or mode off)
    SEARCH_PATH_CONFINED = "search_path_confined"  # PATH entries dropped (a write rule could plant a program)
    AGENT_START = "agent_start"
    AGENT_EXIT = "agent_exit"  # its exit status, stderr size, and the processes it left that were ended
    RPC = "rpc"  # every JSON-RPC message, `dir` in or out
    RPC_UNDELIVERED = "rpc_undelivered"  # a message the agent was gone before it could read
    FRAMING_ERROR = "framing_error"
    HOST_TOOLS = "host_tools"  # whether the host tools are served over MCP, and where
    HOST_TOOLS_LISTED = "host_tools_listed"
    HOST_TOOL = "host_tool"  # one host tool call: ok, error or refused
    HOST_RETRY = "host_retry"  # a host call retried after a rate limit or an outage
    TASK_START = "task_start"
    TASK_SKIPPED = "task_skipped"  # completed by an earlier run of the same queue
    TURN = "turn"  # one session/prompt round
    TURN_CANCELLED = "turn_cancelled"
    STEER_QUEUED = "steer_queued"
    STEER_DELIVERED = "steer_delivered"
    USAGE = "usage"  # the prompt answer's token usage
    BUDGET = "budget"  # a budget or stall rule tripped, a new segment, a nudge or the convergence instruction
    QUESTION = "question"  # an agent's question and the kernel's answer: the decision ledger
    POLICY = "policy"  # one decision: allow, refuse (a deny rule or no rule) or interactive
    EGRESS = "egress"  # one network connection the sandbox's proxy allowed or refused
    TASK_END = "task_end"
    COMMIT = "commit"  # the kernel's commit (and push) of a completed task
    COMPLETION_NOT_KEPT = "completion_not_kept"
    DISK_FULL = "disk_full"  # the disk under the transcript is full (or failing): the run ends Failed
    KERNEL_ERROR = "kernel_error"
    TEARDOWN_ERROR = "teardown_error"
    TERMINAL = "terminal"  # last line: the run's terminal, its reason and every task's


def transcript_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) every transcript line validates against."""
    text = resources.files("harness").joinpath("transcript.schema.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema
