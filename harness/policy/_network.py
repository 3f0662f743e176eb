"""Hosts: the host a URL reaches, the address a host names, whether that is this machine, and the verdict.

The network rules judge a host's canonical text; this machine is allowed only by a rule naming it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from ._rules import Rules
from ._verdict import Verdict, refuse

__all__ = ["Address", "host_address", "host_of", "is_local_address", "judge_host"]

_HOST = re.compile(r"[a-z0-9.-]+|\[[0-9a-f:.]+\]")
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*:", re.IGNORECASE)
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_INET_ATON = re.compile(r"[0-9][0-9a-fx.]*")  # the characters of inet_aton's octal, hex and decimal parts
#: "This network": Linux reaches its own machine at 0.0.0.0, and no host is at the rest of 0/8.
_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")


def judge_host(rules: Rules, host: str) -> Verdict:
    """`Policy.judge_host`: the network rules on the host alone, a local one only by a rule naming it."""
    address = host_address(host)
    host = str(address) if address is not None else host.lower().rstrip(".")
    verdict = rules.judge("network", [host], frozenset())
    if not verdict.allowed or not (host == "localhost" or (address is not None and is_local_address(address))):
        return verdict
    named = [r.id for r in rules if r.kind == "network" and r.decision == "allow"
             and any(p.lower() == host for p in r.patterns)]  # fmt: skip
    if named:
        return Verdict(True, (named[0],), {"kind": "allowed"})
    why = f"{host} is this machine: only a rule naming {host} itself allows it, not a pattern"
    return refuse("unmatched", rule_kind="network", target=host, why=why)


def host_address(host: str) -> Address | None:
    """The address a host names, in any form the C resolver takes it in (None: a name). Legacy IPv4 forms
    (`0177.0.0.1`, `0x7f.1`, `127.1`, `2130706433`) as inet_aton reads them; an IPv6 address that embeds an
    IPv4 one (`::ffff:127.0.0.1`, `::ffff:7f00:1`, the old `::127.0.0.1`) as that IPv4 address."""
    text = host.lower().rstrip(".").removeprefix("[").removesuffix("]")
    try:
        address: Address = ipaddress.ip_address(text)
    except ValueError:
        if not _INET_ATON.fullmatch(text):  # inet_aton would also take `127.1 junk`; a name spares the call
            return None
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if int(address) >> 32 == 0 and int(address) > 1:  # IPv4-compatible; `::` and `::1` are IPv6's own
            return ipaddress.IPv4Address(int(address))
    return address


def is_local_address(address: Address) -> bool:
    """An address that leads back to this machine or its link: loopback, unspecified (`0.0.0.0`, `::`), 0/8,
    link-local (169.254/16 with the cloud metadata service, fe80::/10), or any address of one of this
    machine's own interfaces (its eth0, a docker bridge: a service listening on 0.0.0.0 answers there)."""
    if address.is_loopback or address.is_unspecified or address.is_link_local or address in _THIS_NETWORK:
        return True
    return address in _interface_addresses()


_INTERFACES_TTL = 5.0  # seconds an interface listing is reused: addresses change rarely, a lookup costs ~100 us
_interfaces: tuple[float, frozenset[Address]] = (-_INTERFACES_TTL, frozenset())


def _interface_addresses() -> frozenset[Address]:
    global _interfaces
    taken, addresses = _interfaces
    if time.monotonic() - taken < _INTERFACES_TTL:
        return addresses
    import psutil

    found: set[Address] = set()
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(ValueError):
                    found.add(ipaddress.ip_address(entry.address.split("%", 1)[0]))
    _interfaces = (time.monotonic(), frozenset(found))
    return _interfaces[1]


def host_of(value: Any) -> str | None:
    """The host a URL reaches, read as a WHATWG parser (Node, browsers) would read it, or refused.

    Where WHATWG and Python's urlsplit disagree (`https://evil.example\\@api.github.com/` reaches
    evil.example in Node), the URL is refused: backslashes, whitespace and control characters,
    user info, percent-encoded or non-ASCII hosts."""
    if not isinstance(value, str) or not value:
        return None
    if "\\" in value or any(ord(ch) <= 0x20 or ord(ch) == 0x7F for ch in value):
        raise ValueError(f"a URL with a backslash, space or control character: {value!r}")
    scheme = _SCHEME.match(value)
    if scheme and not value[scheme.end() :].startswith("//") and "." not in scheme.group():
        if not value[scheme.end() :].isdigit():  # `https:host` (WHATWG reads it as https://host): refuse
            raise ValueError(f"a URL without // after its scheme: {value!r}")
        scheme = None  # `localhost:8080`
    split = urlsplit(value if scheme and value[scheme.end() :].startswith("//") else f"//{value}")
    if "@" in split.netloc:
        raise ValueError(f"a URL with user info: {value!r}")
    host = split.hostname
    if not host or not _HOST.fullmatch(host):
        raise ValueError(f"a URL whose host cannot be judged: {value!r}")
    return host
