"""Calls to the queue's host, with the retry rules every provider shares.

* `RateLimited`: wait until the host's reset time when it fits the run's
  waiting budget (`queue.max_wait_s`), else stop `BlockedRateLimited`
  with `{reset_at, retries}`.
* `HostUnavailable` (and any unexpected provider error): back off
  exponentially with jitter, then stop `BlockedHostUnavailable` with the cause.
* `HostUnauthorized`: stop `BlockedPrecondition` (check `host_authorized`).
* `HostRejected`: not retried; the caller decides (a failed mark-done is recorded).

The waiting budget is shared by every call of the run; a user cancel ends any wait.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..config._config import QueueConfig
from ..config._exceptions import HostRejected, HostUnauthorized, HostUnavailable, RateLimited
from ..git._preconditions import blocked
from ..record._records import RecordType
from ..record._terminals import Stop, Terminal
from ..record._transcript import Transcript

if TYPE_CHECKING:
    from ..queues import QueueProvider

__all__ = ["HostCalls"]

T = TypeVar("T")

MAX_BACKOFF_S = 60.0


class HostCalls:
    def __init__(
        self,
        config: QueueConfig,
        transcript: Transcript,
        sleep_or_cancel: Callable[[float], Awaitable[bool]],
        *,
        clock: Callable[[], float] = time.time,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        self.transcript = transcript
        self.waited = 0.0
        self._sleep_or_cancel = sleep_or_cancel
        self._clock = clock
        self._jitter = jitter

    async def authorize(self, provider: QueueProvider) -> Stop | None:
        outcome = await self.call("check_authorized", provider.check_authorized)
        return outcome if isinstance(outcome, Stop) else None

    async def call(self, op: str, fn: Callable[..., Awaitable[T]], *args: Any, retry: bool = True) -> T | Stop:
        """`await fn(*args)` with retries; a `Stop` when the host cannot be used."""
        retries = 0
        while True:
            try:
                return await fn(*args)
            except RateLimited as exc:
                delay = self._until(exc.reset_at) if exc.reset_at is not None else self._backoff(retries)
                if not retry or retries >= self.config.max_retries or self.waited + delay > self.config.max_wait_s:
                    return Stop(
                        Terminal.BLOCKED_RATE_LIMITED,
                        {
                            "kind": "rate_limited",
                            "op": op,
                            "reset_at": exc.reset_at,
                            "retries": retries,
                            "waited_s": round(self.waited, 3),
                        },
                    )
                cause = "rate_limited"
            except HostUnauthorized as exc:
                return blocked("host_authorized", f"the host refused our credentials: {exc.cause}", op=op)
            except HostRejected as exc:
                return Stop(Terminal.BLOCKED_HOST_UNAVAILABLE, {"kind": "host_rejected", "op": op, "cause": exc.cause})
            except Exception as exc:  # HostUnavailable, or a provider fault: never crash the loop
                cause = exc.cause if isinstance(exc, HostUnavailable) else f"{type(exc).__name__}: {exc}"
                delay = self._backoff(retries)
                if not retry or retries >= self.config.max_retries or self.waited + delay > self.config.max_wait_s:
                    return Stop(
                        Terminal.BLOCKED_HOST_UNAVAILABLE,
                        {
                            "kind": "host_unavailable",
                            "op": op,
                            "cause": cause,
                            "retries": retries,
                            "waited_s": round(self.waited, 3),
                        },
                    )
            retries += 1
            self.waited += delay
            self.transcript.record(RecordType.HOST_RETRY, op=op, cause=cause, retry=retries, delay_s=round(delay, 3))
            if await self._sleep_or_cancel(delay):
                return Stop(Terminal.CANCELLED, {"kind": "user_cancel", "during": f"host_wait:{op}"})

    def _until(self, reset_at: float) -> float:
        return max(0.0, reset_at - self._clock())

    def _backoff(self, retries: int) -> float:
        base = min(self.config.backoff_base_s * 2.0**retries, MAX_BACKOFF_S)
        return base * (0.5 + 0.5 * self._jitter())
