"""Talking to a control server under test: wait until a workspace's loop status says what the test waits for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx


def wait_for(client: httpx.Client, workspace_id: str, predicate: Callable[[dict[str, Any]], bool],
             timeout: float = 60.0) -> dict[str, Any]:  # fmt: skip
    """The first `GET .../loop` status the predicate accepts (polled every 0.1 s), or an AssertionError showing
    the last one."""
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = client.get(f"/api/workspaces/{workspace_id}/loop").json()
        if predicate(status):
            return status
        time.sleep(0.1)
    raise AssertionError(f"the loop never got there: {status}")
