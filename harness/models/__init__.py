"""Pinned GGUF models: `models.lock`, and resolution to a verified local file."""

from __future__ import annotations

from ._lock import EndpointEntry, LockError, ModelEntry, ModelLock, WheelMirror, find_lock_file
from ._resolve import (
    ModelHashMismatch,
    ModelUnavailable,
    cached_path,
    model_cache_dir,
    resolve_model,
    verify_model,
)
from ._sources import SourceUnavailable

__all__ = [
    "EndpointEntry",
    "LockError",
    "ModelEntry",
    "ModelHashMismatch",
    "ModelLock",
    "ModelUnavailable",
    "SourceUnavailable",
    "WheelMirror",
    "cached_path",
    "find_lock_file",
    "model_cache_dir",
    "resolve_model",
    "verify_model",
]
