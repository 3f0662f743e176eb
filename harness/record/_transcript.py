"""The run transcript: append-only JSONL, one record per line, flushed as written.

It holds every JSON-RPC message in both directions (`rpc`, with `dir` in/out),
each policy decision with its rule ids (`policy`), the turn and task
boundaries, framing errors, the agent's exit, and finally the run's
`terminal`. A line is written whole or not at all, so the file stays valid
JSONL whatever the agent does. Strings longer than `max_string` characters
are cut (and marked), which bounds a record's size without dropping it.

Every line is strict JSON: a number JSON cannot spell (NaN, Infinity,
-Infinity, which Python's json reads from an agent's line) is written as that
word in a string. A string keeps what the agent sent (null would read as a
value it never sent) and cannot pass for a number.

A full disk does not end the kernel untyped. The file keeps a reserve,
`RESERVE` bytes allocated past its end (fallocate FALLOC_FL_KEEP_SIZE: the
size a reader sees does not change) and topped up every `STEP` bytes written:
an append lands in blocks the file holds already, so an agent that fills the
disk cannot refuse it. A top-up refused for want of space, or a write that
fails with ENOSPC, EDQUOT or EIO, is the fault: the transcript writes a
`disk_full` record, calls `on_fault` (the run stops its turn and ends
`Failed`, kind `disk_full`), and from then on writes an ordinary record only
while `CLOSING` bytes stay free for the records that close the run; the
others are dropped and counted on the terminal (`records_dropped`). Where the
filesystem cannot allocate past a file's end, the reserve is a file beside
the transcript, deleted at the first write the disk refuses.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

__all__ = ["Transcript", "compact_json", "finite_numbers", "read_transcript"]

from ._records import RecordType

Observer = Callable[[dict[str, Any]], None]
Allocate = Callable[[int, int, int, int], None]

RESERVE = 4 << 20  # kept allocated past the end: a run's closing records, many times over
STEP = 64 << 10  # written between two top-ups: how late a full disk is seen (a fallocate per 64 KiB)
CLOSING = 2 << 20  # of the reserve, what only the closing records may use once the disk is full
#: A write's errors that come from the disk under the transcript (full, over quota, failing): the run ends typed.
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})
#: Written whatever the fault (a few per task): the others are dropped once the reserve is down to `CLOSING`.
#: Plain names: an enum member's hash is Python code, a str's is cached.
_CLOSING_TYPES = frozenset(str(t) for t in (RecordType.DISK_FULL, RecordType.TURN_CANCELLED, RecordType.TASK_END,
                                            RecordType.AGENT_EXIT, RecordType.KERNEL_ERROR, RecordType.TEARDOWN_ERROR,
                                            RecordType.TERMINAL))  # fmt: skip
_KEEP_SIZE, _PUNCH_HOLE = 0x01, 0x02  # fallocate(2) modes, linux/falloc.h


class Transcript:
    def __init__(self, path: Path, *, max_string: int = 64 * 1024, observer: Observer | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.bytes_written = 0
        # One write(2) per record on an append-only descriptor: the record has reached the OS when `record`
        # returns, before the kernel acts on what it records (no buffer of ours to lose on kill -9).
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            self._end = os.fstat(self._fd).st_size  # where the next line goes (a run appends to an old file)
            self._reserve = _reserve(self._fd, path, self._end)
            self._due = self._reserve.due  # a line that would end past this offset tops the reserve up first
        except OSError:  # no room for the reserve either: the caller says the transcript cannot be written
            os.close(self._fd)
            raise
        self.fault: dict[str, Any] | None = None  # the disk fault, as the run's `disk_full` reason
        self.records_dropped = 0  # ordinary records not written after it
        self.on_fault: Callable[[], None] | None = None  # told once, after the `disk_full` record
        self._announce = False  # a fault met by the record being written: said once it is done
        self._max_string = max_string
        self._observers: list[Observer] = [observer] if observer else []
        # `rpc` records (two thirds of a task's) go to every observer but one that says `wants_rpc = False`
        self._rpc_observers = [o for o in self._observers if getattr(o, "wants_rpc", True)]
        self._seq = 0
        self._t0 = time.monotonic_ns()

    def record(self, type: RecordType, **fields: Any) -> dict[str, Any]:
        """Append one record and return it (with its sequence number and time)."""
        if self.records_dropped and type == RecordType.TERMINAL:  # the last line says what the file lacks
            fields["records_dropped"] = self.records_dropped
        # `str(type)`: the plain name (the encoder would ask the enum for its value through Python code)
        name = str(type)
        entry = {"seq": self._seq + 1, "t": self._now(), "type": name, **fields}
        line = compact_json(entry)
        if len(line) > 2 * self._max_string:
            entry = _bounded(entry, self._max_string)
            line = compact_json(entry)
        if len(line) > 16 * self._max_string:  # many short strings: keep the record, drop its payload
            kept = {k: v for k, v in entry.items() if k in ("seq", "t", "type", "dir", "source", "decision")}
            entry = {**kept, "truncated": True, "bytes": len(line)}
            line = compact_json(entry)
        if self._write(line + b"\n", closing=name in _CLOSING_TYPES):  # a dropped record takes no number
            self._seq += 1
            for observer in self._observers:
                observer(entry)
        if self._announce:
            self._announce_fault()
        return entry

    def record_rpc(self, direction: str, message: dict[str, Any], wire: bytes) -> dict[str, Any]:
        """An `rpc` record of `message` as it crossed the pipe: `wire` is its JSON text (what the kernel sent,
        or the agent's line, valid UTF-8), embedded as is rather than encoded a second time. A line with a
        carriage return (JSON whitespace that a reader's universal newlines would split on), past the string
        bound, or from the agent with a number JSON cannot spell (`NaN`, `Infinity`: no JSON to a strict
        reader; what the kernel sends is encoded by `compact_json`, which spells none) is encoded from the
        message."""
        if len(wire) > 2 * self._max_string or b"\r" in wire or (direction == "in" and _nonfinite_numbers(message)):
            return self.record(RecordType.RPC, dir=direction, msg=message)
        t = self._now()
        entry = {"seq": self._seq + 1, "t": t, "type": "rpc", "dir": direction, "msg": message}
        if self._write(b'{"seq":%d,"t":%r,"type":"rpc","dir":"%s","msg":%s}\n'
                       % (self._seq + 1, t, direction.encode(), wire.strip()), closing=False):  # fmt: skip
            self._seq += 1
            for observer in self._rpc_observers:
                observer(entry)
        if self._announce:
            self._announce_fault()
        return entry

    def _now(self) -> float:
        """Seconds since the transcript opened, to the microsecond (whole microseconds over 1e6 print as
        `2.639299`, as `round(..., 6)` would, for a fifth of its cost)."""
        return (time.monotonic_ns() - self._t0) // 1000 / 1e6

    def _write(self, data: bytes, *, closing: bool) -> bool:
        """Append `data` whole and say so; or nothing of it, after a disk fault: an ordinary record past its share
        of the reserve, or a write the disk refused again. (A closed transcript takes nothing, as ever.)"""
        if self._fd is None:
            return True
        end, size = self._end, len(data)
        if end + size > self._due:
            self._top_up(end, size)
        if self.fault is not None and not closing and end + size > self._reserve.limit - CLOSING:
            self.records_dropped += 1
            return False
        if not self._append(data, end) and not (self._reserve.release(end) and self._append(data, end)):
            self.records_dropped += 1
            return False
        self._end = end + size
        self.bytes_written += size
        return True

    def _top_up(self, end: int, size: int) -> None:
        """The reserve kept `RESERVE` past the line about to be written; no space for it is the fault (and the
        last time it is asked for)."""
        try:
            self._due = self._reserve.keep(end, size)
        except OSError as exc:
            if exc.errno not in DISK_ERRORS:
                raise
            self._due = sys.maxsize
            self._disk_fault(exc.errno, f"the transcript's reserve could not be kept: {exc.strerror}")

    def _append(self, data: bytes, end: int) -> bool:
        """One write(2), more after a short one (a signal); False when the disk refused it, with none of it left
        in the file: a torn line would make every line after it unreadable."""
        assert self._fd is not None
        try:
            written = os.write(self._fd, data)
            if written < len(data):
                view = memoryview(data)[written:]
                while view:
                    view = view[os.write(self._fd, view) :]
        except OSError as exc:
            if exc.errno not in DISK_ERRORS:
                raise
            with contextlib.suppress(OSError):  # shrinking takes no space
                os.ftruncate(self._fd, end)
            self._disk_fault(exc.errno, exc.strerror or str(exc))
            return False
        return True

    def _disk_fault(self, code: int, detail: str) -> None:
        if self.fault is None:
            name = errno.errorcode.get(code, str(code))
            self.fault = {"kind": "disk_full", "path": str(self.path), "errno": name, "detail": detail}
            self._announce = True

    def _announce_fault(self) -> None:
        """After the record whose write met the fault: the `disk_full` record, then `on_fault`, once."""
        self._announce = False
        assert self.fault is not None
        self.record(RecordType.DISK_FULL, **{k: v for k, v in self.fault.items() if k != "kind"})
        if self.on_fault is not None:
            self.on_fault()

    def close(self) -> None:
        if self._fd is not None:
            self._reserve.close(self._end)
            os.close(self._fd)
            self._fd = None

    @property
    def closed(self) -> bool:
        return self._fd is None


class _Tail:
    """The reserve as blocks allocated past the file's end. No other process can take them: the only reserve an
    agent still filling the disk cannot race the kernel for."""

    def __init__(self, fd: int, end: int, allocate: Allocate) -> None:
        allocate(fd, _KEEP_SIZE, end, RESERVE)  # EOPNOTSUPP where the filesystem cannot
        self._fd, self._allocate = fd, allocate
        self.limit = end + RESERVE  # the file's blocks end here
        self.due = end + STEP

    def keep(self, end: int, size: int) -> int:
        """`RESERVE` allocated past the `size` bytes about to go at `end` (OSError: no space for it); returns
        where the next top-up is due."""
        start = max(self.limit, end)  # only what is new: asking again for what it holds costs a page walk on tmpfs
        self._allocate(self._fd, _KEEP_SIZE, start, end + size + RESERVE - start)
        self.limit = end + size + RESERVE
        return end + size + STEP

    def release(self, end: int) -> bool:
        return False  # its blocks are the file's: there is nothing to give back that a write could then use

    def close(self, end: int) -> None:
        """Give back the blocks past the end (a hole punched there; kill -9 leaves them until the file is cut)."""
        if self.limit > end:
            with contextlib.suppress(OSError):
                self._allocate(self._fd, _KEEP_SIZE | _PUNCH_HOLE, end, self.limit - end)


class _Spare:
    """The reserve as a file of `RESERVE` bytes beside the transcript (a filesystem that cannot allocate past a
    file's end, a libc without fallocate): deleted at the first write the disk refuses, which is then tried again.
    An agent still writing can take some of what that frees."""

    def __init__(self, transcript: Path, end: int) -> None:
        self.path: Path | None = transcript.with_name(transcript.name + ".reserve")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _fill(fd, RESERVE)
        except OSError:
            self.path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        self.limit = end + RESERVE
        self.due = sys.maxsize  # nothing to ask ahead: the first refused write is the fault

    def keep(self, end: int, size: int) -> int:
        return self.due

    def release(self, end: int) -> bool:
        """Free the space for the write that was refused, once (True: try it again)."""
        if self.path is None:
            return False
        with contextlib.suppress(OSError):
            self.path.unlink()
        self.path, self.limit = None, end + RESERVE
        return True

    def close(self, end: int) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.path = None


def _reserve(fd: int, path: Path, end: int) -> _Tail | _Spare:
    """The transcript's reserve: a tail where fallocate can keep one, else a spare file. No space for either
    raises (OSError ENOSPC): a run must not start on a disk that cannot hold its closing records."""
    allocate = _fallocate()
    if allocate is not None:
        try:
            return _Tail(fd, end, allocate)
        except OSError as exc:
            if exc.errno in DISK_ERRORS:
                raise
    return _Spare(path, end)


@functools.cache
def _fallocate() -> Allocate | None:
    """fallocate(2) from libc (`os` has only posix_fallocate, which grows the file), or None without one."""
    import ctypes  # once, and only for a transcript

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    function = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)  # 64-bit offsets first
    if function is None:
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    function.restype = ctypes.c_int

    def allocate(fd: int, mode: int, offset: int, length: int) -> None:
        if function(fd, mode, offset, length) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    return allocate


def _fill(fd: int, size: int) -> None:
    """`size` bytes of blocks the file holds: allocated, or written where the filesystem cannot allocate."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as exc:
        if exc.errno in DISK_ERRORS:
            raise
    except AttributeError:  # no posix_fallocate (macOS)
        pass
    zeros = bytes(64 << 10)
    for _ in range(size // len(zeros)):
        os.write(fd, zeros)


def compact_json(entry: dict[str, Any]) -> bytes:
    """A record or a message as compact UTF-8 JSON (pydantic-core's encoder: a quarter of `json.dumps`'s cost),
    non-finite numbers as strings ("NaN", "Infinity", "-Infinity")."""
    try:
        return to_json(entry, fallback=str, inf_nan_mode="strings")
    except PydanticSerializationError:  # a lone surrogate (an agent can send one, escaped): kept as its escape
        text = json.dumps(finite_numbers(entry), separators=(",", ":"), default=str, ensure_ascii=True, allow_nan=False)
        return text.encode()


def read_transcript(path: Path) -> list[dict[str, Any]]:
    """Parse a transcript strictly (no NaN or Infinity); raises ValueError naming the first line that is not a
    JSON object."""
    records = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            try:
                record = json.loads(line, parse_constant=_not_json)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
            if not isinstance(record, dict) or "type" not in record:
                raise ValueError(f"{path}:{number}: not a transcript record")
            records.append(record)
    return records


def _not_json(word: str) -> Any:
    raise ValueError(f"{word} is no JSON number")


def _nonfinite_numbers(value: Any) -> bool:
    """Whether a parsed message holds a float JSON cannot spell. It walks the values, not the text: a scan of
    the line for `NaN` costs about a nanosecond a byte, and a long message is long strings, not many values."""
    if type(value) is dict:
        value = value.values()
    elif type(value) is not list:
        return type(value) is float and value - value != 0.0  # inf - inf and nan - nan are nan
    for item in value:  # noqa: SIM110 (a loop: twice as fast as any() over a generator)
        if type(item) is not str and _nonfinite_numbers(item):
            return True
    return False


def finite_numbers(value: Any) -> Any:
    """`value` with every non-finite float (and key) in it spelt as a string, as pydantic-core's "strings" mode."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {finite_numbers(k): finite_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_numbers(v) for v in value]
    return value


def _bounded(value: Any, limit: int) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}…[truncated {len(value) - limit} chars]"
    if isinstance(value, dict):
        return {k: _bounded(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_bounded(v, limit) for v in value]
    return value
