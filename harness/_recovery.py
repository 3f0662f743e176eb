"""Runs that died with their kernel: found at the next start, ended `Failed` with reason `restarted`.

While a run is active, a marker in `<transcripts>/.active/` names its transcript, the kernel process
and the agent process (pids with their start times, so a reused pid is never mistaken for them).
A kernel that is killed (SIGKILL, a crash, a reboot) leaves its marker behind. The next kernel to
start with the same transcripts directory kills what is left of that run's agent process group,
appends the terminal `Failed {"kind": "restarted"}` to its transcript, and removes the marker, so
every transcript ends in exactly one terminal even across a restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import psutil

__all__ = ["ActiveRuns"]


class ActiveRuns:
    def __init__(self, transcripts: Path) -> None:
        self.directory = transcripts / ".active"

    def begin(self, transcript: Path) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        marker = self.directory / f"{transcript.name}.json"
        self._write(marker, {"transcript": str(transcript), "kernel": _identity(os.getpid())})
        return marker

    def agent_started(self, marker: Path, pid: int) -> None:
        data = json.loads(marker.read_text())
        data["agent"] = _identity(pid)
        self._write(marker, data)

    def end(self, marker: Path) -> None:
        marker.unlink(missing_ok=True)

    def recover(self) -> list[dict[str, Any]]:
        """End every run whose kernel is gone; returns what was recovered."""
        recovered = []
        for marker in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []:
            try:
                data = json.loads(marker.read_text())
            except (OSError, ValueError):
                marker.unlink(missing_ok=True)
                continue
            if _alive(data.get("kernel")):
                continue  # another kernel is running it now
            killed = _kill_group(data.get("agent"))
            transcript = Path(data["transcript"])
            reason = {"kind": "restarted", "detail": "the kernel running this loop stopped without ending it",
                      "agent_killed": killed}  # fmt: skip
            with contextlib.suppress(OSError), transcript.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"type": "terminal", "terminal": "Failed", "reason": reason, "tasks": []}) + "\n")
            marker.unlink(missing_ok=True)
            recovered.append({"transcript": str(transcript), **reason})
        return recovered

    @staticmethod
    def _write(marker: Path, data: dict[str, Any]) -> None:
        partial = marker.with_suffix(".tmp")
        partial.write_text(json.dumps(data))
        os.replace(partial, marker)


def _identity(pid: int) -> dict[str, Any]:
    try:
        return {"pid": pid, "started": psutil.Process(pid).create_time()}
    except psutil.NoSuchProcess:
        return {"pid": pid, "started": None}


def _alive(identity: dict[str, Any] | None) -> bool:
    if not identity:
        return False
    try:
        process = psutil.Process(identity["pid"])
        return process.create_time() == identity["started"] and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill_group(identity: dict[str, Any] | None) -> bool:
    """Kill what is left of the dead run's agent process group: the agent, or the children it left.

    Members are found one by one (their group is the agent's pid, and they started after it), so
    a pid reused since by an unrelated process group is never signalled.
    """
    if not identity or identity.get("started") is None:
        return False
    killed = False
    for process in psutil.process_iter(["pid", "create_time"]):
        try:
            if os.getpgid(process.pid) != identity["pid"] or process.info["create_time"] < identity["started"]:
                continue
            process.send_signal(signal.SIGKILL)
            killed = True
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError, psutil.AccessDenied):
            continue
    return killed
