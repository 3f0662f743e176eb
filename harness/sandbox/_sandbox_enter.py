"""Run one command inside a live sandbox: the namespaces of the agent's, its rights and no more.

A `terminal/*` command must see what the agent sees: its worktree is a copy-on-write overlay that exists only in
the agent sandbox's own mount namespace, so a second bwrap could not show it (a bind mount cannot reach into
another mount namespace). The kernel starts this program as `python -I -S _sandbox_enter.py NS_FDS SECCOMP_FD
CWD -- ARGV...`; it joins the sandbox's namespaces from descriptors the kernel took when the sandbox started
(`_overlay.WorktreeOverlay.namespace_fds`: a pid could be reused, a descriptor cannot), then gives up what
joining gave it: every capability, bounding and ambient sets included, `no_new_privs`, and the sandbox's
seccomp filter. Its child is a process of that sandbox (its pid namespace, its mounts, its network) in this
program's process group (the kernel's SIGKILL of the group reaches both) and dies with this program, which
ends as the command ended.

Self-contained on purpose: it runs with `-I -S`, and after joining the mount namespace only what the sandbox
shows can be opened, so everything it needs is loaded first.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
import sys

_SIGKILL = 9  # not the signal module: importing it costs more than the rest of this program's start
_CLONE_NEWUSER = 0x10000000
_NS_GET_USERNS = 0xB701  # _IO(0xb7, 0x1): the user namespace that owns a namespace
#: the namespaces after the two user namespaces, in the order their descriptors come (`_overlay.NAMESPACES`)
_NAMESPACES = (("mnt", 0x00020000), ("net", 0x40000000), ("ipc", 0x08000000), ("uts", 0x04000000),
               ("cgroup", 0x02000000), ("pid", 0x20000000))  # fmt: skip
_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_CAPABILITY_VERSION_3 = 0x20080522


class _Filter(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def _fail(what: str, errno: int) -> None:
    sys.stderr.write(f"loop-harness sandbox: {what}: {os.strerror(errno)}\n")
    os._exit(126)


def _join(libc: ctypes.CDLL, fds: list[int]) -> None:
    """The user namespace that owns the sandbox's mounts first (its owner, the kernel's user, has every capability
    there, which joining the others needs) and the namespaces it owns; then the process's own user namespace when
    that is a nested one (`bwrap --disable-userns` puts the agent one level further down) and the ones it owns."""
    owner, own, *rest = fds
    outer = os.fstat(owner).st_ino
    _setns(libc, owner, _CLONE_NEWUSER, "user")
    later = []
    for fd, (name, flag) in zip(rest, _NAMESPACES, strict=True):
        owning = fcntl.ioctl(fd, _NS_GET_USERNS)
        if os.fstat(owning).st_ino == outer:
            _setns(libc, fd, flag, name)
        else:
            later.append((fd, name, flag))
        os.close(owning)
    if os.fstat(own).st_ino != outer:
        _setns(libc, own, _CLONE_NEWUSER, "own user")
    for fd, name, flag in later:
        _setns(libc, fd, flag, name)
    for fd in fds:
        os.close(fd)


def _setns(libc: ctypes.CDLL, fd: int, flag: int, name: str) -> None:
    if libc.setns(fd, flag) != 0:
        _fail(f"join the sandbox's {name} namespace", ctypes.get_errno())


def _drop_rights(libc: ctypes.CDLL, program: bytes) -> None:
    """Every capability gone (bounding set first: it needs CAP_SETPCAP), then no_new_privs and the filter."""
    with open("/proc/sys/kernel/cap_last_cap") as source:  # the sandbox's /proc: readable by anyone
        last = int(source.read())
    for cap in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            _fail("drop the capability bounding set", ctypes.get_errno())
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = ctypes.create_string_buffer(struct.pack("=Ii", _CAPABILITY_VERSION_3, 0))
    data = ctypes.create_string_buffer(bytes(24))  # two __user_cap_data_struct, all zero
    if libc.capset(header, data) != 0:
        _fail("drop capabilities", ctypes.get_errno())
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail("set no_new_privs", ctypes.get_errno())
    if program:
        prog = _Filter(len(program) // 8, program)
        if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
            _fail("install the seccomp filter", ctypes.get_errno())


def main(argv: list[str]) -> int:
    namespaces, seccomp, cwd, separator, *command = argv
    if separator != "--" or not command:
        sys.stderr.write("usage: _sandbox_enter.py NS_FD,... SECCOMP_FD|- CWD -- ARGV...\n")
        return 2
    program = b""
    if seccomp != "-":
        with os.fdopen(int(seccomp), "rb") as source:
            program = source.read()
    libc = ctypes.CDLL(None, use_errno=True)
    _join(libc, [int(fd) for fd in namespaces.split(",")])
    _drop_rights(libc, program)
    child = os.fork()
    if child == 0:  # the first process of the sandbox's pid namespace this program made: the command
        try:
            libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
            os.chdir(cwd)
            os.execvp(command[0], command)
        except OSError as exc:
            sys.stderr.write(f"loop-harness sandbox: {command[0]}: {exc.strerror}\n")
            os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):  # the command's own end, as the kernel would have seen it outside
        number = os.WTERMSIG(status)
        libc.signal(number, 0)  # SIG_DFL (Python ignores SIGPIPE, and handles SIGINT itself)
        os.kill(os.getpid(), number)
        return 128 + number
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
