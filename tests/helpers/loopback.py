"""A threaded HTTP server on 127.0.0.1 and an ephemeral port, for the fake hosts the tests talk to: the one the
fake model APIs serve on (`harness/fake_model/_loopback.py`), so there is one."""

from __future__ import annotations

from harness.fake_model._loopback import LoopbackServer

__all__ = ["LoopbackServer"]
