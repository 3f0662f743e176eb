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
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

__all__ = ["Transcript", "read_transcript"]

if TYPE_CHECKING:
    from ._records import RecordType

Observer = Callable[[dict[str, Any]], None]


class Transcript:
    def __init__(self, path: Path, *, max_string: int = 64 * 1024, observer: Observer | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.bytes_written = 0
        self._file: TextIO | None = path.open("a", encoding="utf-8")
        self._max_string = max_string
        self._observers: list[Observer] = [observer] if observer else []
        self._seq = 0
        self._t0 = time.monotonic()

    def record(self, type: RecordType, **fields: Any) -> dict[str, Any]:
        """Append one record and return it (with its sequence number and time)."""
        self._seq += 1
        entry = {"seq": self._seq, "t": round(time.monotonic() - self._t0, 6), "type": type, **fields}
        line = json.dumps(entry, separators=(",", ":"), default=str, ensure_ascii=False)
        if len(line) > 2 * self._max_string:
            entry = _bounded(entry, self._max_string)
            line = json.dumps(entry, separators=(",", ":"), default=str, ensure_ascii=False)
        if len(line) > 16 * self._max_string:  # many short strings: keep the record, drop its payload
            kept = {k: v for k, v in entry.items() if k in ("seq", "t", "type", "dir", "source", "decision")}
            entry = {**kept, "truncated": True, "bytes": len(line)}
            line = json.dumps(entry, separators=(",", ":"), default=str, ensure_ascii=False)
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()
            self.bytes_written += len(line) + 1
        for observer in self._observers:
            observer(entry)
        return entry

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @property
    def closed(self) -> bool:
        return self._file is None


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
