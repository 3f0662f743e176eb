"""Containment between resolved paths (strings from `os.path.realpath`): what holds what."""

from __future__ import annotations

__all__ = ["overlaps", "within"]


def within(path: str, directory: str) -> bool:
    """`path` is `directory` or lies beneath it."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def overlaps(a: str, b: str) -> bool:
    """One holds the other (or they are the same)."""
    return within(a, b) or within(b, a)
