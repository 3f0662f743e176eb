"""The run transcript: append-only JSONL, one record per line, flushed as written.

It holds every JSON-RPC message in both directions (`rpc`, with `dir` in/out),
each policy decision with its rule ids (`policy`), the turn and task
boundaries, framing errors, the agent's exit, and finally the run's
`terminal`. A line is written whole or not at all, so the file stays valid
JSONL whatever the agent does. Strings longer than `max_string` characters
are cut (and marked), which bounds a record's size without dropping it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

__all__ = ["Transcript", "compact_json", "read_transcript"]

from ._records import RecordType

Observer = Callable[[dict[str, Any]], None]


class Transcript:
    def __init__(self, path: Path, *, max_string: int = 64 * 1024, observer: Observer | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.bytes_written = 0
        # One write(2) per record on an append-only descriptor: the record has reached the OS when `record`
        # returns, before the kernel acts on what it records (no buffer of ours to lose on kill -9).
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        self._max_string = max_string
        self._observers: list[Observer] = [observer] if observer else []
        # `rpc` records (two thirds of a task's) go to every observer but one that says `wants_rpc = False`
        self._rpc_observers = [o for o in self._observers if getattr(o, "wants_rpc", True)]
        self._seq = 0
        self._t0 = time.monotonic_ns()

    def record(self, type: RecordType, **fields: Any) -> dict[str, Any]:
        """Append one record and return it (with its sequence number and time)."""
        self._seq += 1
        # `str(type)`: the plain name (the encoder would ask the enum for its value through Python code)
        entry = {"seq": self._seq, "t": self._now(), "type": str(type), **fields}
        line = compact_json(entry)
        if len(line) > 2 * self._max_string:
            entry = _bounded(entry, self._max_string)
            line = compact_json(entry)
        if len(line) > 16 * self._max_string:  # many short strings: keep the record, drop its payload
            kept = {k: v for k, v in entry.items() if k in ("seq", "t", "type", "dir", "source", "decision")}
            entry = {**kept, "truncated": True, "bytes": len(line)}
            line = compact_json(entry)
        self._write(line + b"\n")
        for observer in self._observers:
            observer(entry)
        return entry

    def record_rpc(self, direction: str, message: dict[str, Any], wire: bytes) -> dict[str, Any]:
        """An `rpc` record of `message` as it crossed the pipe: `wire` is its JSON text (what the kernel sent,
        or the agent's line, valid UTF-8), embedded as is rather than encoded a second time. A line with a
        carriage return (JSON whitespace that a reader's universal newlines would split on) or past the string
        bound is encoded from the message as any record."""
        if len(wire) > 2 * self._max_string or b"\r" in wire:
            return self.record(RecordType.RPC, dir=direction, msg=message)
        self._seq += 1
        t = self._now()
        self._write(b'{"seq":%d,"t":%r,"type":"rpc","dir":"%s","msg":%s}\n'
                    % (self._seq, t, direction.encode(), wire.strip()))  # fmt: skip
        entry = {"seq": self._seq, "t": t, "type": "rpc", "dir": direction, "msg": message}
        for observer in self._rpc_observers:
            observer(entry)
        return entry

    def _now(self) -> float:
        """Seconds since the transcript opened, to the microsecond (whole microseconds over 1e6 print as
        `2.639299`, as `round(..., 6)` would, for a fifth of its cost)."""
        return (time.monotonic_ns() - self._t0) // 1000 / 1e6

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            return
        written = os.write(self._fd, data)
        if written < len(data):  # a short write (a full disk, a signal): the rest, until all of it is down
            view = memoryview(data)[written:]
            while view:
                view = view[os.write(self._fd, view) :]
        self.bytes_written += len(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def closed(self) -> bool:
        return self._fd is None


def compact_json(entry: dict[str, Any]) -> bytes:
    """A record or a message as compact UTF-8 JSON (pydantic-core's encoder: a quarter of `json.dumps`'s cost)."""
    try:
        return to_json(entry, fallback=str)
    except PydanticSerializationError:  # a lone surrogate (an agent can send one, escaped): kept as its escape
        return json.dumps(entry, separators=(",", ":"), default=str, ensure_ascii=True).encode()


def read_transcript(path: Path) -> list[dict[str, Any]]:
    """Parse a transcript; raises ValueError naming the first line that is not a JSON object."""
    records = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
            if not isinstance(record, dict) or "type" not in record:
                raise ValueError(f"{path}:{number}: not a transcript record")
            records.append(record)
    return records


def _bounded(value: Any, limit: int) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}…[truncated {len(value) - limit} chars]"
    if isinstance(value, dict):
        return {k: _bounded(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_bounded(v, limit) for v in value]
    return value
