"""Faults the harness raises. Outcomes are `Stop`s, not exceptions.

* HarnessError
  + ConfigError          a config file that cannot be used (exit status 2)
  + HostSignal           a queue provider's answer the kernel turns into a terminal
    - RateLimited        the host asked us to wait (reset_at)
    - HostUnavailable    the host could not be reached or answered nonsense
    - HostUnauthorized   the host refused our credentials
    - HostRejected       the host refused one operation for good (403/404/422): not retried
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "HarnessError",
    "HostRejected",
    "HostSignal",
    "HostUnauthorized",
    "HostUnavailable",
    "RateLimited",
]


class HarnessError(Exception):
    """Base of every error the harness raises on purpose."""


class ConfigError(HarnessError):
    """A config that cannot be used; `key` names the offending key (dotted path)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key


class HostSignal(HarnessError):
    """Raised by a queue provider; the kernel retries or stops with a Blocked* terminal."""


class RateLimited(HostSignal):
    def __init__(self, reset_at: float | None, message: str = "rate limited") -> None:
        super().__init__(message)
        self.reset_at = reset_at  # epoch seconds when the host says we may retry; None if unknown


class HostUnavailable(HostSignal):
    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class HostUnauthorized(HostSignal):
    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class HostRejected(HostSignal):
    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause
