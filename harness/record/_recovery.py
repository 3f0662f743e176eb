"""Runs that died with their kernel: found at the next start, ended `Failed` with reason `restarted`.

While a run is active, a marker in `<transcripts>/.active/` names the run's token, the kernel
process and (from the moment it is spawned) the agent process, with their start times. Every
process the run starts (the agent, its terminals, whatever they start) carries the token in its
environment (`LOOP_HARNESS_RUN_TOKEN`), so it is found even after it left the agent's process
group or session. A kernel that is killed (SIGKILL, a crash, a reboot) leaves its marker behind;
the next kernel to start with the same transcripts directory ends what is left of that run and
appends the terminal `Failed {"kind": "restarted"}` to its transcript, so every transcript ends
in exactly one terminal even across a restart.

A marker is untrusted input (an agent that could write into the transcripts directory could forge
one), so recovery follows nothing it names: the transcript is the marker's own name without
`.json`, in the marker's parent directory, a regular file (never a symlink) that starts with this
run's `run_start`; a process is killed only if it carries the run's token and started after the
run did. A transcript whose last line was torn by the crash is cut back to its last whole line,
and the torn bytes are kept in the recovery record.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import signal
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

__all__ = ["TOKEN_VARIABLE", "ActiveRuns", "end_processes"]

#: Carried by every process a run starts: how recovery and teardown find what outlived its group.
TOKEN_VARIABLE = "LOOP_HARNESS_RUN_TOKEN"
_MARKER = re.compile(r"([^/.][^/]*)\.json")  # <transcript file name>.json
_TORN_KEEP = 4000  # characters of a torn last line kept in the recovery record


class ActiveRuns:
    def __init__(self, transcripts: Path) -> None:
        self.transcripts = transcripts
        self.directory = transcripts / ".active"

    def begin(self, transcript: Path) -> tuple[Path, str, dict[str, Any]]:
        """Mark a run active; returns its marker, its token, and what the run's `run_start` must record
        for recovery to trust the marker (the kernel's identity and the token's hash)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        marker = self.directory / f"{transcript.name}.json"
        token = secrets.token_hex(16)
        kernel = _identity(os.getpid())
        self._write(marker, {"transcript": transcript.name, "token": token, "started": time.time(), "kernel": kernel})
        return marker, token, {"kernel": kernel, "token_sha256": hashlib.sha256(token.encode()).hexdigest()}

    def agent_started(self, marker: Path, pid: int) -> None:
        data = json.loads(marker.read_text())
        data["agent"] = _identity(pid)
        self._write(marker, data)

    def end(self, marker: Path) -> None:
        marker.unlink(missing_ok=True)

    def recover(self) -> list[dict[str, Any]]:
        """End every run whose kernel is gone; returns what was recovered (or refused). Never raises for
        what it finds: a stray entry is reported and left alone, so no entry can stop later runs."""
        try:
            if not stat.S_ISDIR(os.lstat(self.directory).st_mode):  # a symlink is followed nowhere
                return [{"marker": str(self.directory), "refused": "not a directory of this kernel's"}]
            entries = sorted(self.directory.iterdir())
        except OSError:
            return []
        recovered = []
        for marker in entries:
            if marker.suffix == ".tmp":
                continue
            try:
                outcome = self._recover_one(marker)
            except OSError as exc:
                outcome = {"marker": marker.name, "refused": f"{type(exc).__name__}: {exc.strerror or exc}"}
            if outcome is not None:
                recovered.append(outcome)
        return recovered

    def _recover_one(self, marker: Path) -> dict[str, Any] | None:
        mode = os.lstat(marker).st_mode
        if stat.S_ISLNK(mode):
            marker.unlink()  # the link itself, never what it points to
            return {"marker": marker.name, "refused": "a symlink: removed, nothing followed"}
        if not stat.S_ISREG(mode):
            return {"marker": marker.name, "refused": "not a regular file: left alone"}
        data = _read_marker(marker)
        name = _MARKER.fullmatch(marker.name)
        if data is None or name is None or data.get("transcript") != name[1] or not isinstance(data.get("token"), str):
            marker.unlink(missing_ok=True)
            return {"marker": marker.name, "refused": "not a marker this kernel wrote: nothing followed"}
        transcript = self.transcripts / name[1]
        if not _matches_run_start(transcript, data):
            marker.unlink(missing_ok=True)
            return {"marker": marker.name, "refused": "it does not match its transcript's run_start: nothing followed"}
        if _alive(data.get("kernel")):
            return None  # another kernel is running it now
        ended = end_processes(data["token"], since=float(data.get("started") or 0.0))
        detail = "the kernel running this loop stopped without ending it"
        reason: dict[str, Any] = {"kind": "restarted", "detail": detail, "agent_killed": bool(ended),
                                  "processes_ended": ended}  # fmt: skip
        written = _append_terminal(transcript, reason)
        marker.unlink(missing_ok=True)
        return {"transcript": str(transcript), **reason, **written}

    @staticmethod
    def _write(marker: Path, data: dict[str, Any]) -> None:
        partial = marker.with_suffix(".tmp")
        partial.write_text(json.dumps(data))
        os.replace(partial, marker)


def end_processes(token: str, *, since: float, exclude: Iterable[int] = ()) -> list[dict[str, Any]]:
    """SIGKILL every process that carries the run's token and started after the run: the agent, its
    terminals, and what they started, even in a session of their own. Returns what was ended."""
    skip = {os.getpid(), *exclude}
    with contextlib.suppress(psutil.Error):
        skip.update(p.pid for p in psutil.Process().parents())
    wanted = f"{TOKEN_VARIABLE}={token}".encode()
    ended = []
    for pid in psutil.pids():
        if pid in skip or not _carries(pid, wanted):
            continue
        try:
            process = psutil.Process(pid)
            if process.create_time() + 1.0 < since:  # pid reuse is impossible for a younger process
                continue
            name = process.name()
            process.send_signal(signal.SIGKILL)
            ended.append({"pid": pid, "name": name})
        except (psutil.Error, PermissionError):
            continue
    return ended


def _carries(pid: int, wanted: bytes) -> bool:
    """The process's environment holds `wanted` (read raw: decoding every environment costs more)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return wanted in f.read().split(b"\0")
    except OSError:
        return False


def _read_json(path: Path, *, first_line: bool = False) -> Any:
    """The JSON in a regular file (never through a symlink): all of it, or its first line; None if not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = f.readline(1 << 20) if first_line else f.read(64 << 10)
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _read_marker(marker: Path) -> dict[str, Any] | None:
    data = _read_json(marker)
    return data if isinstance(data, dict) else None


def _matches_run_start(transcript: Path, marker: dict[str, Any]) -> bool:
    """The marker is the one the transcript's own kernel wrote: same kernel, same token (by its hash)."""
    first = _read_json(transcript, first_line=True)
    token_hash = hashlib.sha256(str(marker.get("token")).encode()).hexdigest()
    return (
        isinstance(first, dict)
        and first.get("type") == "run_start"
        and first.get("kernel") == marker.get("kernel")
        and first.get("token_sha256") == token_hash
    )


def _append_terminal(transcript: Path, reason: dict[str, Any]) -> dict[str, Any]:
    """Append the terminal to a dead run's transcript, after cutting a torn last line. Never follows a
    symlink; refuses a file that is not this run's transcript (its first record is its run_start)."""
    try:
        fd = os.open(transcript, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return {"transcript_error": exc.strerror or str(exc)}
    with os.fdopen(fd, "r+b") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {"transcript_error": "not a regular file"}
        head = f.readline(1 << 20)
        with contextlib.suppress(ValueError):
            if json.loads(head).get("type") == "run_start":
                return _repair_and_end(f, reason)
        return {"transcript_error": "not a transcript (its first record is no run_start)"}


def _repair_and_end(f: Any, reason: dict[str, Any]) -> dict[str, Any]:
    size = f.seek(0, os.SEEK_END)
    cut = _line_start(f, size)  # where the last line starts: the end of the last whole line
    extra: dict[str, Any] = {}
    if cut < size:
        f.seek(cut)
        torn = f.read(_TORN_KEEP * 4)
        extra["torn_tail"] = {"bytes": size - cut, "text": torn.decode("utf-8", errors="ignore")[:_TORN_KEEP]}
        f.truncate(cut)
    previous = _line_start(f, cut - 1) if cut else 0
    f.seek(previous)
    last = _last_record(f.read(cut - previous))
    if last.get("type") == "terminal":
        return {"already_ended": True, **extra}
    t = last.get("t") if isinstance(last.get("t"), (int, float)) else 0.0  # the transcript schema's number
    record: dict[str, Any] = {"seq": int(last.get("seq") or 0) + 1, "t": t, "type": "terminal", "terminal": "Failed",
              "reason": {**reason, **extra}, "tasks": []}  # fmt: skip
    f.seek(0, os.SEEK_END)
    f.write((json.dumps(record, separators=(",", ":")) + "\n").encode())
    return extra


def _line_start(f: Any, end: int, block: int = 1 << 20) -> int:
    """The offset just past the last newline before `end` (0 if none): read backwards, a block at a time,
    so a torn line of any length is found whole."""
    position = end
    while position > 0:
        start = max(0, position - block)
        f.seek(start)
        found: int = f.read(position - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        position = start
    return 0


def _last_record(data: bytes) -> dict[str, Any]:
    for line in reversed(data.splitlines()):
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                return record
    return {}


def _identity(pid: int) -> dict[str, Any]:
    try:
        return {"pid": pid, "started": psutil.Process(pid).create_time()}
    except psutil.NoSuchProcess:
        return {"pid": pid, "started": None}


def _alive(identity: Any) -> bool:
    if not isinstance(identity, dict):
        return False
    try:
        process = psutil.Process(int(identity["pid"]))
        return process.create_time() == identity["started"] and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False
