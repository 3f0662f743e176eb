"""A seccomp filter for the sandbox: the few system calls whose effect outlives it, refused inside.

A user namespace with every capability dropped stops mounts, device nodes and `chattr`, but three things
need no capability at all, so bubblewrap alone lets them through:

    set-user-ID / set-group-ID bits   the owner may set them on its own files. When the kernel runs as root,
                                      the agent's files belong to root outside: a copy of a shell made
                                      `chmod 4755` in the worktree is a root shell for anyone on the host
                                      (and for an ordinary user, a shell of theirs for anyone else). Refused
                                      where a mode is given: chmod, fchmod, fchmodat(2), open, openat, creat,
                                      mkdir(at), mknod(at) with S_ISUID or S_ISGID; openat2 and io_uring
                                      (whose open takes its mode where a filter cannot see) are not there
    keyrings                          a process keeps the session keyring it was started with: keyctl,
                                      add_key and request_key could read or fill the kernel's
    terminal input                    ioctl TIOCSTI / TIOCLINUX push characters into a terminal's input
                                      queue (the operator's shell), whatever the session
    whiteouts                         renameat2(RENAME_WHITEOUT) leaves a character device 0:0 behind, a
                                      device node made with no capability

A system call of another architecture (32-bit `int 0x80` on x86-64) ends the process: its numbers differ,
so the filter could not judge it. The program is classic BPF, as bubblewrap's `--seccomp FD` takes it.
"""

from __future__ import annotations

import os
import platform
import struct

__all__ = ["REFUSED", "seccomp_fd", "seccomp_program"]

#: What the filter refuses, as the transcript's `sandbox` record names it.
REFUSED = ["setuid/setgid modes", "keyctl", "add_key", "request_key", "TIOCSTI", "TIOCLINUX", "openat2",
           "io_uring_setup", "RENAME_WHITEOUT", "foreign-architecture system calls"]  # fmt: skip

_LD_W_ABS, _JEQ, _JSET, _JGE, _RET = 0x20, 0x15, 0x45, 0x35, 0x06
_ALLOW, _KILL_PROCESS = 0x7FFF0000, 0x80000000
_EPERM, _ENOSYS = 0x00050000 | 1, 0x00050000 | 38
_SPECIAL_MODES = 0o6000  # S_ISUID | S_ISGID
_RENAME_WHITEOUT = 4
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_X32_BIT = 0x40000000

# per architecture: (AUDIT_ARCH, {syscall: (index of the argument, the bits refused in it)}, {syscall refused:
# errno action}, the ioctl number)
_M, _W = _SPECIAL_MODES, _RENAME_WHITEOUT
_TABLES: dict[str, tuple[int, dict[int, tuple[int, int]], dict[int, int], int]] = {
    "x86_64": (
        0xC000003E,
        {
            90: (1, _M),
            91: (1, _M),
            268: (2, _M),
            452: (2, _M),
            2: (2, _M),
            257: (3, _M),
            85: (1, _M),
            83: (1, _M),
            258: (2, _M),
            133: (1, _M),
            259: (2, _M),
            316: (4, _W),
        },
        {250: _EPERM, 248: _EPERM, 249: _EPERM, 437: _ENOSYS, 425: _ENOSYS},
        16,
    ),
    "aarch64": (
        0xC00000B7,
        {52: (1, _M), 53: (2, _M), 452: (2, _M), 56: (3, _M), 34: (2, _M), 33: (2, _M), 276: (4, _W)},
        {219: _EPERM, 217: _EPERM, 218: _EPERM, 437: _ENOSYS, 425: _ENOSYS},
        29,
    ),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI" if _LITTLE else ">HBBI", code, jt, jf, k)


_LITTLE = struct.pack("=H", 1) == struct.pack("<H", 1)


def _argument(index: int) -> int:
    """Where the low 32 bits of argument `index` sit in `struct seccomp_data`."""
    return 16 + 8 * index + (0 if _LITTLE else 4)


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The filter for this machine's architecture, or None where there is no table for it."""
    table = _TABLES.get(machine or platform.machine())
    if table is None:
        return None
    arch, modes, refused, ioctl = table
    program = [_op(_LD_W_ABS, 4), _op(_JEQ, arch, 1, 0), _op(_RET, _KILL_PROCESS), _op(_LD_W_ABS, 0)]
    if arch == 0xC000003E:  # the x32 ABI shares the architecture: its numbers carry a bit of their own
        program += [_op(_JGE, _X32_BIT, 0, 1), _op(_RET, _ENOSYS)]
    for number, action in refused.items():
        program += [_op(_JEQ, number, 0, 1), _op(_RET, action)]
    for number, (index, bits) in modes.items():  # matched: the argument decides, the number is not needed again
        program += [_op(_JEQ, number, 0, 4), _op(_LD_W_ABS, _argument(index)), _op(_JSET, bits, 0, 1),
                    _op(_RET, _EPERM), _op(_RET, _ALLOW)]  # fmt: skip
    program += [_op(_JEQ, ioctl, 0, 5), _op(_LD_W_ABS, _argument(1)), _op(_JEQ, _TIOCSTI, 2, 0),
                _op(_JEQ, _TIOCLINUX, 1, 0), _op(_RET, _ALLOW), _op(_RET, _EPERM)]  # fmt: skip
    program.append(_op(_RET, _ALLOW))
    return b"".join(program)


def seccomp_fd(program: bytes) -> int:
    """A fresh descriptor holding the program, at its start, for one bwrap to read (each reads to the end)."""
    fd = os.memfd_create("loop-harness-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
