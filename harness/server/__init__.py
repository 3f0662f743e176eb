"""`loop-harness serve`: the control server (the autonomy switch, workspaces, and their loops; docs/server.md).

    from harness.server import create_app, State
    app = create_app(State.open(Path("state")))     # an ASGI app (Starlette); `serve` runs it on uvicorn

Exports load on first use, so the CLI's other commands never import Starlette.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["State", "StateError", "create_app"]
_MODULE_OF = {"State": "._state", "StateError": "._state", "create_app": "._app"}


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name], __name__), name)
