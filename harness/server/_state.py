"""The server's state in SQLite (WAL): the autonomy switch and the registered workspaces.

Everything a restart must keep lives here, written in one transaction per change, so a server killed at any
moment comes back to the last change it acknowledged. The bearer token is a file beside the database (0600),
made on first start unless `LOOP_HARNESS_SERVER_TOKEN` gives one.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

__all__ = ["TOKEN_VARIABLE", "State", "StateError", "Workspace"]

TOKEN_VARIABLE = "LOOP_HARNESS_SERVER_TOKEN"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workspaces (
    id TEXT PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    queue TEXT,            -- the host connection, as a run config's queue: section (JSON); NULL: none
    policy TEXT NOT NULL,  -- the policy: section (JSON)
    created REAL NOT NULL,
    binding TEXT,          -- the bound agent module's request (JSON); NULL: unbound
    active INTEGER NOT NULL DEFAULT 0,  -- activated: a loop drains its queue (or did, when the server died)
    sandbox TEXT           -- the sandbox: section (JSON); NULL: the run default (workspace-write)
);
CREATE TABLE IF NOT EXISTS runs (  -- the session history, keyed by workspace
    id TEXT PRIMARY KEY,
    workspace TEXT NOT NULL REFERENCES workspaces(id),
    module TEXT NOT NULL,
    transcript TEXT NOT NULL,
    started REAL NOT NULL,
    ended REAL,            -- NULL while it runs (or when the server died under it)
    terminal TEXT,
    reason TEXT,           -- JSON
    tasks TEXT             -- JSON: each task's id, terminal and reason
);
CREATE TABLE IF NOT EXISTS versions (  -- every config a workspace has had: a session names the one it ran
    workspace TEXT NOT NULL,
    version INTEGER NOT NULL,
    config TEXT NOT NULL,  -- JSON: the sections, as written
    at REAL NOT NULL,
    PRIMARY KEY (workspace, version)
);
"""
#: Columns later versions added to the first tables: a state directory from before gains them at open.
_ADDED = {"workspaces": {"config": "TEXT", "version": "INTEGER NOT NULL DEFAULT 1"},
          "runs": {"version": "INTEGER", "options": "TEXT"}}  # fmt: skip


class StateError(Exception):
    """A change the state refuses: `kind` is the typed reason an API answer carries."""

    def __init__(self, kind: str, message: str, status: int = 409, **detail: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.detail = detail


@dataclass(frozen=True)
class Workspace:
    id: str
    path: str
    config: dict[str, Any]  # the run config's sections, as written (harness/server/_workspace_config.py)
    created: float
    binding: dict[str, Any] | None = None
    active: bool = False
    version: int = 1  # the config's version: each edit adds one

    @property
    def queue(self) -> dict[str, Any] | None:
        return self.config.get("queue")

    @property
    def policy(self) -> dict[str, Any]:
        return self.config.get("policy") or {}

    @property
    def sandbox(self) -> dict[str, Any] | None:
        return self.config.get("sandbox")

    def as_json(self) -> dict[str, Any]:
        workspace: dict[str, Any] = {"path": self.path}
        if "commit" in self.config:
            workspace["commit"] = self.config["commit"]
        config = {"workspace": workspace, **{k: v for k, v in self.config.items() if k != "commit"}}
        return {"id": self.id, "path": self.path, "host": self.queue, "policy": self.policy,
                "has_host_connection": self.queue is not None, "binding": self.binding,
                "active": self.active, "sandbox": self.sandbox, "config": config,
                "version": self.version}  # fmt: skip


class State:
    def __init__(self, directory: Path, connection: sqlite3.Connection, token: str) -> None:
        self.directory = directory
        self.token = token
        self._db = connection
        self._server_lock: FileLock | None = None
        self._lock = threading.Lock()  # one writer at a time inside this process; SQLite serialises processes

    @classmethod
    def open(cls, directory: Path) -> State:
        """Open (or make) the state directory, owner-only, for this server alone: a second server on the same
        directory would end the first one's loops as restarted, so it is refused (StateError)."""
        directory = directory.expanduser().resolve()  # agents' configs name it: hide takes absolute paths
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)  # the database holds bindings' env (API keys) and the token sits beside it
        lock = FileLock(directory / "server.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise StateError("state_in_use", f"another server uses {directory}: give each server its own --state",
                             status=409) from None  # fmt: skip
        connection = sqlite3.connect(directory / "state.db", check_same_thread=False, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")  # an acknowledged change survives a power cut
        connection.executescript(_SCHEMA)
        _add_columns(connection)
        state = cls(directory, connection, _token(directory))
        state._first_versions()
        state._server_lock = lock
        return state

    def _first_versions(self) -> None:
        """Workspaces registered before configs were versioned: their config as it stands is version 1."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            for workspace in self.workspaces():
                if not self._db.execute("SELECT 1 FROM versions WHERE workspace = ?", (workspace.id,)).fetchone():
                    self._db.execute("INSERT INTO versions VALUES (?, ?, ?, ?)", (workspace.id, workspace.version,
                                     json.dumps(workspace.config), workspace.created))  # fmt: skip

    def close(self) -> None:
        self._db.close()
        if self._server_lock is not None:
            self._server_lock.release()

    # --- the autonomy switch -------------------------------------------------------------------

    @property
    def autonomy_enabled(self) -> bool:
        row = self._db.execute("SELECT value FROM settings WHERE key = 'autonomy'").fetchone()
        return bool(row and json.loads(row[0]))

    def set_autonomy(self, enabled: bool, *, at_start: bool = False) -> None:
        """The autonomy switch: enabling needs a host connection on at least one workspace (a typed 409 otherwise). At
        start (the environment's switch) it is set anyway: each activation then says what it lacks."""
        with self._lock:
            if enabled and not at_start and not any(w.queue is not None for w in self.workspaces()):
                raise StateError("no_host_connection", "autonomy needs a host connection on at least one workspace: "
                                 "register one with a queue (memory or github) first")  # fmt: skip
            self._db.execute("INSERT INTO settings VALUES ('autonomy', ?) ON CONFLICT(key) DO UPDATE SET "
                             "value = excluded.value", (json.dumps(enabled),))  # fmt: skip

    # --- workspaces ----------------------------------------------------------------------------

    def add_workspace(self, path: str, config: dict[str, Any]) -> Workspace:
        workspace = Workspace(uuid.uuid4().hex[:12], path, config, time.time())
        with self._lock, self._db:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("INSERT INTO workspaces (id, path, queue, policy, created, sandbox, config, version) "
                                 "VALUES (?, ?, ?, ?, ?, ?, ?, 1)", (workspace.id, path, _json(workspace.queue),
                                 json.dumps(workspace.policy), workspace.created, _json(workspace.sandbox),
                                 json.dumps(config)))  # fmt: skip
            except sqlite3.IntegrityError:
                self._db.execute("ROLLBACK")
                existing = self._db.execute("SELECT id FROM workspaces WHERE path = ?", (path,)).fetchone()
                raise StateError("workspace_exists", f"{path} is already registered as {existing[0]}: edit it "
                                 "with PUT or PATCH", workspace=existing[0]) from None  # fmt: skip
            self._db.execute("INSERT INTO versions VALUES (?, 1, ?, ?)", (workspace.id, json.dumps(config),
                                                                          workspace.created))  # fmt: skip
        return workspace

    def edit_workspace(self, workspace_id: str, config: dict[str, Any]) -> Workspace:
        """A new version of the workspace's config (the caller has checked no session is live)."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            current = self.workspace(workspace_id)
            if config == current.config:
                self._db.execute("ROLLBACK")
                return current  # the same config again: no new version
            version = current.version + 1
            self._db.execute("UPDATE workspaces SET queue = ?, policy = ?, sandbox = ?, config = ?, version = ? "
                             "WHERE id = ?", (_json(config.get("queue")), json.dumps(config.get("policy") or {}),
                             _json(config.get("sandbox")), json.dumps(config), version, workspace_id))  # fmt: skip
            self._db.execute("INSERT INTO versions VALUES (?, ?, ?, ?)", (workspace_id, version, json.dumps(config),
                                                                          time.time()))  # fmt: skip
        return self.workspace(workspace_id)

    def delete_workspace(self, workspace_id: str) -> None:
        """The workspace, its config versions and its session history (its transcripts stay on disk)."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self.workspace(workspace_id)
            for table, column in (("runs", "workspace"), ("versions", "workspace"), ("workspaces", "id")):
                self._db.execute(f"DELETE FROM {table} WHERE {column} = ?", (workspace_id,))

    def versions(self, workspace_id: str) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT version, config, at FROM versions WHERE workspace = ? ORDER BY version",
                                (workspace_id,)).fetchall()  # fmt: skip
        return [{"version": v, "config": json.loads(c), "at": at} for v, c, at in rows]

    def workspaces(self) -> list[Workspace]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM workspaces ORDER BY created, id")
        return [_workspace(row) for row in rows.fetchall()]

    def workspace(self, workspace_id: str) -> Workspace:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM workspaces WHERE id = ?", (workspace_id,)).fetchone()
        if row is None:
            raise StateError("no_such_workspace", f"no workspace {workspace_id!r}", status=404)
        return _workspace(row)

    def set_binding(self, workspace_id: str, binding: dict[str, Any] | None) -> None:
        self.workspace(workspace_id)
        self._db.execute("UPDATE workspaces SET binding = ? WHERE id = ?", (_json(binding), workspace_id))

    def set_active(self, workspace_id: str, active: bool) -> None:
        self._db.execute("UPDATE workspaces SET active = ? WHERE id = ?", (int(active), workspace_id))

    # --- the session history -------------------------------------------------------------------

    def begin_run(self, run_id: str, workspace_id: str, module: str, transcript: str, *, version: int,
                  options: dict[str, Any] | None = None) -> None:  # fmt: skip
        self._db.execute("INSERT INTO runs (id, workspace, module, transcript, started, version, options) VALUES "
                         "(?, ?, ?, ?, ?, ?, ?)", (run_id, workspace_id, module, transcript, time.time(), version,
                                                   _json(options)))  # fmt: skip

    def end_run(self, run_id: str, terminal: str, reason: dict[str, Any], tasks: list[dict[str, Any]]) -> None:
        self._db.execute("UPDATE runs SET ended = ?, terminal = ?, reason = ?, tasks = ? WHERE id = ?",
                         (time.time(), terminal, json.dumps(reason), json.dumps(tasks), run_id))  # fmt: skip

    def add_ended_run(self, workspace_id: str, module: str, terminal: str, reason: dict[str, Any], *, version: int,
                      options: dict[str, Any] | None) -> None:  # fmt: skip
        """A history row for a loop that ended between sessions: no session ran, so it has no transcript."""
        now = time.time()
        self._db.execute("INSERT INTO runs (id, workspace, module, transcript, started, ended, terminal, reason, "
                         "tasks, version, options) VALUES (?, ?, ?, '', ?, ?, ?, ?, '[]', ?, ?)",
                         (uuid.uuid4().hex[:12], workspace_id, module, now, now, terminal, json.dumps(reason),
                          version, _json(options)))  # fmt: skip

    def runs(self, workspace_id: str) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT id, module, transcript, started, ended, terminal, reason, tasks, version, "
                                "options FROM runs WHERE workspace = ? ORDER BY started, id",
                                (workspace_id,)).fetchall()  # fmt: skip
        keys = ("id", "module", "transcript", "started", "ended", "terminal", "reason", "tasks", "version", "options")
        return [{k: json.loads(v) if k in ("reason", "tasks", "options") and v is not None else v for k, v in
                 zip(keys, row, strict=True)} for row in rows]  # fmt: skip

    def restarted(self, completed: Callable[[str, str], list[dict[str, Any]]]) -> list[str]:
        """At start: every loop persisted active, and every session not ended (a prompt session too), ended
        `Failed {kind: restarted}` with the tasks it completed (`completed(workspace, transcript)`, from the
        completion record the kernel wrote before acting on each), its workspace inactive; the workspaces whose
        loop that was (their leftover agents are the caller's to end)."""
        with self._lock:
            active = [row[0] for row in self._db.execute("SELECT id FROM workspaces WHERE active = 1 UNION "
                                                         "SELECT workspace FROM runs WHERE ended IS NULL")]  # fmt: skip
            cut = self._db.execute("SELECT id, workspace, transcript FROM runs WHERE ended IS NULL").fetchall()
            for run_id, workspace_id, transcript in cut:
                tasks = completed(workspace_id, transcript)
                self._db.execute("UPDATE runs SET ended = ?, terminal = 'Failed', reason = ?, tasks = ? WHERE id = ?",
                                 (time.time(), _RESTARTED, json.dumps(tasks), run_id))  # fmt: skip
            # a loop kept draining that died between sessions has no session open: the history still says it ended
            for workspace_id in set(active) - {row[1] for row in cut}:
                last = self._db.execute("SELECT module, version, options FROM runs WHERE workspace = ? ORDER BY "
                                        "started DESC LIMIT 1", (workspace_id,)).fetchone()  # fmt: skip
                options = json.loads(last[2] or "{}") if last is not None else {}
                if last is not None and "keep_draining" in options:
                    reason = {"kind": "restarted", "waiting": True}
                    self.add_ended_run(workspace_id, last[0], "Failed", reason, version=last[1], options=options)
            self._db.execute("UPDATE workspaces SET active = 0 WHERE active = 1")
        return active


_RESTARTED = json.dumps({"kind": "restarted"})
_COLUMNS = "id, path, queue, policy, created, binding, active, sandbox, config, version"


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _workspace(row: tuple[Any, ...]) -> Workspace:
    queue, binding, sandbox, config = (None if v is None else json.loads(v) for v in (row[2], row[5], row[7], row[8]))
    if config is None:  # registered before workspaces held a whole config: its three sections then
        config = {k: v for k, v in (("queue", queue), ("policy", json.loads(row[3])), ("sandbox", sandbox)) if v}
    return Workspace(row[0], row[1], config, row[4], binding, bool(row[6]), row[9])


def _add_columns(connection: sqlite3.Connection) -> None:
    for table, columns in _ADDED.items():
        have = {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}
        for name, kind in columns.items():
            if name not in have:
                connection.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")


def _token(directory: Path) -> str:
    """The bearer token: the environment's, else the state directory's (made on first start, owner-only)."""
    given = os.environ.pop(TOKEN_VARIABLE, None)  # read once: nothing this process starts inherits it
    if given:
        return given
    path = directory / "token"
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise StateError("token_unsafe", f"{path} must be the server user's own, mode 0600 (it is "
                             f"{oct(info.st_mode & 0o777)}, owner {info.st_uid})")  # fmt: skip
        token = path.read_text().strip()
        if not token:
            raise StateError("token_unsafe", f"{path} is empty: delete it to have a new one made")
        return token
    except FileNotFoundError:
        token = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token
