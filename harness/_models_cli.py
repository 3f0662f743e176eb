"""`loop-harness models fetch|verify|path [NAME]`."""

from __future__ import annotations

import sys

from .models import LockError, ModelHashMismatch, ModelUnavailable, cached_path, resolve_model, verify_model
from .models._lock import ModelLock

__all__ = ["models_command"]


def models_command(action: str, name: str | None) -> int:
    try:
        if action == "fetch":
            print(resolve_model(name))
        elif action == "verify":
            print(f"ok {verify_model(name)}")
        else:
            path = cached_path(ModelLock.load().get(name))
            print(path)
            return 0 if path.exists() else 1
    except (LockError, ModelUnavailable, ModelHashMismatch) as exc:
        print(f"loop-harness models {action}: {exc}", file=sys.stderr)
        return 1
    return 0
