"""The sandbox's only way out: an HTTP proxy outside it that lets through the hosts network rules allow.

Inside, the agent and its commands have no network (a namespace of their own); `_netbridge.py` relays a
loopback port there to this proxy's Unix socket, and HTTP_PROXY / HTTPS_PROXY / ALL_PROXY point at that
port. The proxy speaks both forms clients use: `CONNECT host:port` (a tunnel, for https) and an absolute URL
(`GET http://host:port/path`, plain http). Each connection is judged by the policy's network rules on the
host and recorded in the transcript. An address is judged in its canonical form, whatever spelling asked for
it (`0x7f.1`, `2130706433`, `[::ffff:127.0.0.1]` are `127.0.0.1`), and that very address is what the proxy
connects to; a name is resolved once, and connected to at the addresses that were checked. This machine is
reached through here too, but only by a rule naming the host literally (`127.0.0.1`, `localhost`, `::1`): no
pattern allows a loopback or unspecified address, and a name other than `localhost` that resolves to one is
refused, so an allowed domain cannot be pointed at the kernel's machine. The kernel's own host-tools server
is one more destination, allowed without a rule.

Both sockets serve this run alone: a connection whose peer (SO_PEERCRED) is not a descendant of the kernel
(another loop's sandbox that can reach the socket file) is closed unanswered, and recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..policy._policy import Verdict, host_address, is_local_address
from ..record._records import RecordType

__all__ = ["Egress"]

_HOST = re.compile(r"[a-z0-9.-]+|\[[0-9a-f:.]+\]")
_MAX_HEAD = 64 << 10  # a request line and headers beyond this are not a proxy request
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Egress:
    """Unix sockets the sandbox's bridge reaches: the filtering proxy, and a relay to the host-tools server."""

    def __init__(self, run_dir: Path, judge: Callable[[str], Verdict], record: Callable[..., object]) -> None:
        self.proxy_socket = str(run_dir / "proxy.sock")
        self.tools_socket = str(run_dir / "tools.sock")
        self.tools_port: int | None = None  # the host-tools server's loopback port, once it serves
        self._judge = judge
        self._record = record
        self._servers: list[asyncio.AbstractServer] = []
        self._streams: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        routes = ((self._proxy, self.proxy_socket), (self._tools, self.tools_socket))
        self._servers = [await asyncio.start_unix_server(self._own_run_only(serve, path), path=path)
                         for serve, path in routes]  # fmt: skip

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for writer in list(self._streams):
            writer.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    def _own_run_only(self, serve: _Handler, path: str) -> _Handler:
        """`serve` for a peer this kernel started (its agent's bridge, a terminal's), nobody else: a sandbox
        in a pid namespace of its own shows here as a descendant of the bwrap we ran."""

        async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            pid = _peer_pid(writer)
            if _descends_from(pid, os.getpid()):
                await serve(reader, writer)
                return
            name = os.path.basename(path)
            self._record(RecordType.EGRESS, host=name, port=0, allowed=False, rule_ids=[],
                         why=f"a process outside this run (pid {pid}) connected to the run's {name}")  # fmt: skip
            writer.close()

        return guarded

    # --- the proxy -----------------------------------------------------------------------------

    async def _proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened = [writer]
        self._streams.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > _MAX_HEAD:
                raise ValueError("request head too large")
            method, target, version, headers = _parse_head(head)
            tunnel = method == "CONNECT"
            host, port, path = _target(target, tunnel=tunnel)
            addresses, refusal = await self._route(host, port)
            if refusal is not None:
                writer.write(f"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
                             f"loop-harness sandbox: {refusal}\n".encode())  # fmt: skip
                await writer.drain()
                return
            upstream_reader, upstream_writer = await _connect(addresses, port)
            opened.append(upstream_writer)
            self._streams.add(upstream_writer)
            if tunnel:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:  # forward the request in origin form; one request per connection
                kept = [h for h in headers if not h.lower().startswith((b"proxy-", b"connection:"))]
                upstream_writer.write(b"\r\n".join([f"{method} {path} {version}".encode(), *kept,
                                                    b"Connection: close", b"", b""]))  # fmt: skip
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError) as exc:
            with contextlib.suppress(OSError):
                writer.write(f"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n{exc}\n".encode())
        finally:
            for stream in opened:
                self._streams.discard(stream)
                stream.close()

    async def _route(self, host: str, port: int) -> tuple[list[str], str | None]:
        """The addresses host:port is reached at, each one judged, or why it is refused; recorded either way."""
        address = host_address(host)
        name = str(address) if address is not None else host  # what is judged, in its one canonical spelling
        if self.tools_port is not None and port == self.tools_port and name in ("127.0.0.1", "localhost"):
            self._record(RecordType.EGRESS, host=host, port=port, allowed=True, rule_ids=["host-tools"])
            return ["127.0.0.1"], None
        verdict = self._judge(name)
        addresses, why = [name], None
        if not verdict.allowed:
            why = str(verdict.reason.get("why") or f"no network rule allows {name}")
        elif address is None:
            addresses, why = await _resolve(name)
        if why is not None and name != host:
            why += f" ({host} is {name})"
        self._record(RecordType.EGRESS, host=host, port=port, allowed=why is None, rule_ids=list(verdict.rule_ids),
                     **({"why": why} if why else {}))  # fmt: skip
        return addresses, why

    # --- the host-tools relay ------------------------------------------------------------------

    async def _tools(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened = [writer]
        self._streams.add(writer)
        try:
            if self.tools_port is None:
                return
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.tools_port)
            opened.append(upstream_writer)
            self._streams.add(upstream_writer)
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        except OSError:
            pass
        finally:
            for stream in opened:
                self._streams.discard(stream)
                stream.close()


def _parse_head(head: bytes) -> tuple[str, str, str, list[bytes]]:
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError(f"not a proxy request line: {lines[0][:200]!r}")
    return parts[0], parts[1], parts[2], lines[1:]


def _target(target: str, *, tunnel: bool) -> tuple[str, int, str]:
    """(host, port, origin-form path) of a CONNECT authority or an absolute http URL."""
    path = "/"
    if not tunnel:
        if not target.lower().startswith("http://"):
            raise ValueError(f"only http:// URLs or CONNECT go through the proxy (got {target[:200]!r})")
        authority, _, rest = target[len("http://") :].partition("/")
        path = "/" + rest
    else:
        authority = target
    if "@" in authority:
        raise ValueError("user info in the proxy target")
    if authority.startswith("["):  # [v6 address]:port
        host, _, port_text = authority.partition("]")
        host, port_text = host + "]", port_text.removeprefix(":")
    else:
        host, _, port_text = authority.partition(":")
    default = 443 if tunnel else 80
    port = int(port_text) if port_text.isascii() and port_text.isdigit() else -1 if port_text else default
    host = host.lower().rstrip(".")
    if not _HOST.fullmatch(host) or not 0 < port < 65536 or (host.startswith("[") and host_address(host) is None):
        raise ValueError(f"not a host and port: {authority[:200]!r}")
    return host.strip("[]") if host.startswith("[") else host, port, path


async def _resolve(name: str) -> tuple[list[str], str | None]:
    """The addresses an allowed name leads to, or why it may not be reached: none may be this machine's
    (`0.0.0.0` leads there too) unless the name is `localhost`, which only a rule naming it allows."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        return [], f"{name} could not be resolved ({exc})"
    canonical = (host_address(str(info[4][0])) for info in found)  # `::ffff:127.0.0.1` from DNS is 127.0.0.1
    addresses = [a for a in dict.fromkeys(canonical) if a is not None]
    if name != "localhost" and any(is_local_address(a) for a in addresses):
        return [], f"{name} resolves to a loopback address: a rule must name the loopback host itself"
    return [str(a) for a in addresses], None


async def _connect(addresses: list[str], port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first of `addresses` that answers: numeric only, so nothing is looked up again."""
    error = OSError(f"no address to connect to on port {port}")
    for address in addresses:
        try:
            return await asyncio.open_connection(address, port, flags=socket.AI_NUMERICHOST)
        except OSError as exc:
            error = exc
    raise error


def _peer_pid(writer: asyncio.StreamWriter) -> int:
    """The pid of the process at the other end of a Unix socket, as it connected (0: in a pid namespace that
    ours cannot see)."""
    try:
        sock = writer.get_extra_info("socket")
        pid, _uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except (OSError, AttributeError):  # no socket (closed already), or its credentials cannot be read
        return 0
    return int(pid)


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether `pid` is `ancestor` or below it, by the parent links in /proc (a few reads: the depth of the
    sandbox's process tree)."""
    while pid != ancestor:
        if pid <= 1:
            return False
        try:
            fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        except OSError:
            return False  # gone already
        try:
            stat = os.read(fd, 512)
        finally:
            os.close(fd)
        # `pid (comm) state ppid ...`: comm may hold spaces and parentheses, the fields after it cannot
        fields = stat[stat.rfind(b")") + 2 :].split(b" ", 2)
        pid = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
    return True


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()
