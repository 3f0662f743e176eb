"""An `asyncio.Event` that can also be waited on as a future, beside others in one `asyncio.wait`.

Waiting on an Event beside a request means a task for `event.wait()`, started and cancelled for every
request; a future costs nothing until the flag is set (the kernel waits this way four times a task).
"""

from __future__ import annotations

import asyncio

__all__ = ["Flag"]


class Flag(asyncio.Event):
    def __init__(self) -> None:
        super().__init__()
        self._future: asyncio.Future[None] | None = None

    def future(self) -> asyncio.Future[None]:
        """Done once the flag is set (now, if it is already); the same future until `clear()`."""
        if self._future is None:
            self._future = asyncio.get_running_loop().create_future()
            if self.is_set():
                self._future.set_result(None)
        return self._future

    def set(self) -> None:
        super().set()
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    def clear(self) -> None:
        super().clear()
        if self._future is not None and self._future.done():
            self._future = None
