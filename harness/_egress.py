"""The sandbox's only way out: an HTTP proxy outside it that lets through the hosts network rules allow.

Inside, the agent and its commands have no network (a namespace of their own); `_netbridge.py` relays a
loopback port there to this proxy's Unix socket, and HTTP_PROXY / HTTPS_PROXY / ALL_PROXY point at that
port. The proxy speaks both forms clients use: `CONNECT host:port` (a tunnel, for https) and an absolute URL
(`GET http://host:port/path`, plain http). Each connection is judged by the policy's network rules on the
host name and recorded in the transcript. Loopback is reached through here too: a name that resolves to a
loopback address is only let through when the rule named it literally (`127.0.0.1`, `localhost`, `::1`), so
an allowed domain cannot be pointed at the kernel's machine. The kernel's own host-tools server is one more
destination, allowed without a rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import socket
from collections.abc import Callable
from pathlib import Path

from ._policy import Verdict
from ._records import RecordType

__all__ = ["Egress"]

_HOST = re.compile(r"[a-z0-9.-]+|\[[0-9a-f:.]+\]")
_MAX_HEAD = 64 << 10  # a request line and headers beyond this are not a proxy request


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
        self._servers = [await asyncio.start_unix_server(self._proxy, path=self.proxy_socket),
                         await asyncio.start_unix_server(self._tools, path=self.tools_socket)]  # fmt: skip

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for writer in list(self._streams):
            writer.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()

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
            refusal = await self._refusal(host, port)
            if refusal is not None:
                writer.write(f"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
                             f"loop-harness sandbox: {refusal}\n".encode())  # fmt: skip
                await writer.drain()
                return
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
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

    async def _refusal(self, host: str, port: int) -> str | None:
        """Why a connection to host:port is refused (None: allowed), recorded either way."""
        if self.tools_port is not None and host in ("127.0.0.1", "localhost") and port == self.tools_port:
            self._record(RecordType.EGRESS, host=host, port=port, allowed=True, rule_ids=["host-tools"])
            return None
        verdict = self._judge(host)
        why = None if verdict.allowed else f"no network rule allows {host}"
        if why is None and not _is_address(host) and host != "localhost" and await _resolves_to_loopback(host):
            why = f"{host} resolves to a loopback address: a rule must name the loopback host itself"
        self._record(RecordType.EGRESS, host=host, port=port, allowed=why is None, rule_ids=list(verdict.rule_ids),
                     **({"why": why} if why else {}))  # fmt: skip
        return why

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
    if not _HOST.fullmatch(host) or not 0 < port < 65536:
        raise ValueError(f"not a host and port: {authority[:200]!r}")
    return host.strip("[]") if host.startswith("[") else host, port, path


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _resolves_to_loopback(host: str) -> bool:
    """A name that leads to this machine (`0.0.0.0` does too, on Linux)."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False  # the connection fails on its own
    addresses = [ipaddress.ip_address(info[4][0]) for info in found]
    return any(a.is_loopback or a.is_unspecified for a in addresses)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()
