"""What the kernel knows of an agent inside bwrap beyond bwrap's own pid: where to signal it, and its own status.

The kernel starts bwrap; bwrap's init (pid 1 of the sandbox's pid namespace) leads a process group of its own
(`--new-session`) in which the agent runs, with the network bridge (`_netbridge.py`) as its parent. So:

- a signal for the agent goes to that group, not to bwrap: SIGTERM to bwrap would end bwrap, and the pid
  namespace would then end the agent with SIGKILL before its handler ran. bwrap's `--json-status-fd` names the
  init (`child-pid`, a pid of the kernel's namespace); its pidfd says whether it still lives, so the group's
  id is never a reused one. bwrap's init, pid 1 of its namespace with no handler, takes no signal but SIGKILL;
  the bridge lets them pass it by;
- the agent's exit status is what the bridge reports (`--report`): exact, `-N` for signal N. Without its word
  (the sandbox was killed whole) it is bwrap's `exit-code` read back (`128 + N` is signal N), and an agent
  in a sandbox that was killed by a signal died of SIGKILL with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal

__all__ = ["SandboxStatus", "from_shell_status"]

_SIGNALS = 64  # `128 + N` is signal N for N up to SIGRTMAX


def from_shell_status(code: int) -> int:
    """A status as bwrap (or a shell) reports it, as Python's returncode says it: `128 + N` is `-N`."""
    return -(code - 128) if 128 < code <= 128 + _SIGNALS else code


class SandboxStatus:
    """The read ends of bwrap's `--json-status-fd` and of the bridge's `--report`, read without blocking."""

    def __init__(self, status_fd: int, report_fd: int) -> None:
        for fd in (status_fd, report_fd):
            os.set_blocking(fd, False)
        self._fds: dict[str, int] = {"status": status_fd, "report": report_fd}
        self._read: dict[str, bytes] = {"status": b"", "report": b""}
        self.init_pid: int | None = None  # bwrap's init: the agent's process group
        self._init: int | None = None  # its pidfd
        self._gone = False  # it had ended when bwrap named it
        self.exit_code: int | None = None  # bwrap's word on its init's child (the bridge), `128 + N` for signal N
        self.reported: int | None = None  # the bridge's word on the agent

    def poll(self) -> None:
        """Take in what bwrap and the bridge wrote since the last call."""
        for name, fd in list(self._fds.items()):
            while True:
                try:
                    chunk = os.read(fd, 4096)
                except BlockingIOError:
                    break
                except OSError:
                    chunk = b""
                if not chunk:  # EOF: nothing more will come
                    os.close(self._fds.pop(name))
                    break
                self._read[name] += chunk
        self._parse()

    def _parse(self) -> None:
        # bwrap writes one JSON object a line: the sandbox's pids and namespaces, then `exit-code` at its end
        for line in self._read["status"].splitlines():
            with contextlib.suppress(ValueError, TypeError):
                said = json.loads(line)
                if "child-pid" in said and self.init_pid is None:
                    self.init_pid = int(said["child-pid"])
                    self._open_init()
                if "exit-code" in said:
                    self.exit_code = int(said["exit-code"])
        report = self._read["report"]
        if report.endswith(b"\n"):
            with contextlib.suppress(ValueError):
                self.reported = int(report)

    def _open_init(self) -> None:
        assert self.init_pid is not None
        try:
            self._init = os.pidfd_open(self.init_pid)
        except ProcessLookupError:  # gone already: there is no group left to signal
            self._gone = True
        except OSError:  # no pidfds (Linux < 5.3): the caller's word that bwrap runs is all there is
            pass

    @property
    def init_alive(self) -> bool:
        if self._init is None:
            return not self._gone
        poller = select.poll()
        poller.register(self._init, select.POLLIN)  # a pidfd is readable once its process has exited
        return not poller.poll(0)

    def signal(self, number: int) -> bool:
        """Send `number` to the agent's process group inside the sandbox; False while there is none (bwrap not
        yet set up, or already ended). The caller asks only while bwrap runs."""
        self.poll()
        if self.init_pid is None or not self.init_alive:
            return False
        try:
            os.killpg(self.init_pid, number)
        except (ProcessLookupError, PermissionError):
            return False  # the init has not made its group yet
        return True

    def agent_status(self, sandbox_status: int | None) -> int | None:
        """The agent's own exit status (or -N, signal N), once bwrap has ended with `sandbox_status`."""
        self.poll()
        if self.reported is not None:
            return self.reported
        if self.exit_code is not None:
            return from_shell_status(self.exit_code)
        if sandbox_status is not None and sandbox_status < 0:
            return -signal.SIGKILL  # bwrap killed: its init, and every process of its namespace, died of SIGKILL
        return sandbox_status  # bwrap ended before it ran anything (it failed to set the sandbox up)

    def close(self) -> None:
        for fd in (*self._fds.values(), self._init):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fds, self._init = {}, None
