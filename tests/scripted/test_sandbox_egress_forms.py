"""The sandbox's proxy (issue 29, attacks 5 and 6): every spelling of this machine's address is judged as the
address it is, and the proxy serves its own run alone.

A hostile agent asks the proxy itself, as any program inside can, for `CONNECT host:port` and `GET http://...`
with each spelling of 127.0.0.1 and 0.0.0.0 a C resolver accepts. With loopback denied, or only `*` allowed,
each is refused and the listener on 127.0.0.1 sees nothing; a rule naming `127.0.0.1` lets the same requests
through (so the refusal is the judgement, not a request that could not have worked), and with the sandbox off
the same spellings reach the listener directly (the attack is real). A process outside the run that connects to
the run's proxy.sock or tools.sock is turned away while the run's own bridge goes through.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from harness import read_transcript
from harness.config._config import RuleConfig
from harness.policy._policy import Policy, host_address
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW
from harness.sandbox._egress import _descends_from
from harness.testing import READ_ALL, WRITE_SRC, agent_messages, loop_config, make_workspace, write_yaml
from scripted_agents.presets import scenario, turn

pytestmark = LOOP_SCRIPTED

CLI = str(Path(sys.executable).parent / "loop-harness")

#: Spellings of 127.0.0.1 (IPv4-mapped and -compatible IPv6, inet_aton's octal, hex, short and decimal forms).
LOOPBACK_FORMS = ["[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[::127.0.0.1]", "0177.0.0.1", "0x7f.1", "127.1",
                  "2130706433", "0x7f000001", "127.000.000.001", "127.0.0.1"]  # fmt: skip
#: Spellings of the unspecified address, which Linux connects to this machine too, and the other loopback names.
LOCAL_FORMS = ["0.0.0.0", "[::]", "[::ffff:0.0.0.0]", "0", "localhost", "[::1]"]
#: What the attack of issue 29 used, and the forms a plain connect() takes to 127.0.0.1 here (not `::127.0.0.1`).
DIRECT_FORMS = ["[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "0.0.0.0", "0177.0.0.1", "0x7f.1", "127.1", "2130706433"]
#: The issue's policy: everything allowed but the loopback host, denied by every name it has.
LOOPBACK_DENIED = [{"id": "any", "kind": "network", "hosts": ["*"], "decision": "allow"},
                   {"id": "no-loopback", "kind": "network", "hosts": ["127.0.0.1", "127.*", "localhost", "::1"],
                    "decision": "deny"}]  # fmt: skip
WILDCARD = [{"id": "any", "kind": "network", "hosts": ["*"], "decision": "allow"}]
NAMED = [{"id": "local-api", "kind": "network", "hosts": ["127.0.0.1"], "decision": "allow"}]

#: Asks the proxy (or, with the sandbox off, the address itself) for each `host:port`: one line per attempt,
#: `<how> <host>: <status> <reached|not-reached>`, reached when the listener's mark came back.
PROBE = """\
import os, socket, sys
how, mark, targets = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
proxy = ("127.0.0.1", int(os.environ.get("HTTP_PROXY", ":0").rsplit(":", 1)[1]))
def exchange(address, request):
    with socket.create_connection(address, timeout=5) as conn:
        conn.sendall(request)
        return conn.makefile("rb").read().decode(errors="replace")
for target in targets:
    host, port = target.rsplit(":", 1)
    requests = {"connect": f"CONNECT {target} HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\nGET / HTTP/1.0\\r\\n\\r\\n",
                "get": f"GET http://{target}/ HTTP/1.1\\r\\nHost: {target}\\r\\n\\r\\n"}
    for method in ["connect", "get"] if how == "proxy" else ["direct"]:
        try:
            if method == "direct":
                answer = exchange((host.strip("[]"), int(port)), b"GET / HTTP/1.0\\r\\n\\r\\n")
            else:
                answer = exchange(proxy, requests[method].encode())
            status = answer.split(" ", 2)[1] if answer.startswith("HTTP/") else "closed"
        except OSError as exc:
            answer, status = "", type(exc).__name__
        print(f"{method} {host}: {status} {'reached' if mark in answer else 'not-reached'}")
"""


class Listener:
    """A TCP port that answers any request with `mark` and counts the connections that reached it."""

    def __init__(self, mark: str, host: str = "127.0.0.1") -> None:
        self.mark = mark
        self.connections = 0
        self.host = host
        self._server = socket.create_server((host, 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        body = self.mark.encode()
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()


@pytest.fixture(name="mark")
def mark_fixture():
    return "reached-" + secrets.token_hex(4)


@pytest.fixture(name="listener")
def listener_fixture(mark):
    listener = Listener(mark)
    yield listener
    listener.close()


@pytest.fixture(name="ordinary")
def ordinary_fixture(mark):
    """A listener on an IPv4 address of this machine that is not loopback (no pattern lets the proxy reach it),
    or None when the machine has none."""
    found = [a.address for addresses in psutil.net_if_addrs().values() for a in addresses
             if a.family == socket.AF_INET and not a.address.startswith("127.")]  # fmt: skip
    listener = None
    for address in found:
        try:
            listener = Listener(mark, address)
            break
        except OSError:
            continue
    yield listener
    if listener is not None:
        listener.close()


def probe_run(tmp_path: Path, mode: str, rules: list[dict], mark: str, targets: list[str]) -> tuple[str, list[dict]]:
    """A run whose agent runs the probe itself (its own shell: only the OS sandbox bounds it), through the
    proxy when the sandbox is on and directly when it is off; what it said, and the egress records."""
    ws = make_workspace(tmp_path / "ws", files={"tools/probe.py": PROBE})
    how = "direct" if mode == "off" else "proxy"
    script = f"python3 tools/probe.py {how} {mark} {','.join(targets)}"
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": once({"run": {"script": script}})}))
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, rules=[READ_ALL, WRITE_SRC, *rules],
                                                            sandbox={"mode": mode}))  # fmt: skip
    done = subprocess.run([CLI, "run", str(config), "--json"], capture_output=True, text=True, timeout=120)
    records = read_transcript(Path(json.loads(done.stdout.strip().splitlines()[-1])["transcript"]))
    said = agent_said(records)
    assert "-> exit 0" in said, (said, done.stderr[-2000:])
    return said, [r for r in records if r["type"] == "egress"]


def once(step: dict) -> list[dict]:
    """Turns that play `step` in the first round only (a scenario's last turn repeats while the task runs)."""
    return [turn(step), turn({"message": "nothing more to do"})]


def agent_said(records: list[dict]) -> str:
    return "\n".join(agent_messages(records))


def outcomes(said: str) -> dict[str, str]:
    """`<how> <host>` -> `<status> <reached|not-reached>`, from the probe's lines."""
    found = {}
    for line in said.splitlines():
        what, sep, result = line.partition(": ")
        if sep and what.split(" ", 1)[0] in ("connect", "get", "direct"):
            found[what] = result
    return found


def asked(form: str) -> str:
    """The host the proxy records for a form: as asked, without an IPv6 literal's brackets."""
    return form.strip("[]")


@pytest.mark.parametrize("rules", [LOOPBACK_DENIED, WILDCARD], ids=["loopback-denied", "wildcard-only"])
def test_every_spelling_of_this_machine_is_refused_by_the_proxy(tmp_path, mark, listener, ordinary, rules):
    """No spelling reaches 127.0.0.1 when no rule names it, nor does this machine's own non-loopback address
    under `*` (a rule must name it: see test_sandbox_escapes' interface test, where one does)."""
    forms = LOOPBACK_FORMS + LOCAL_FORMS
    targets = [f"{form}:{listener.port}" for form in forms]
    if ordinary is not None:
        targets.append(f"{ordinary.host}:{ordinary.port}")
    said, egress = probe_run(tmp_path, "workspace-write", rules, mark, targets)

    seen = outcomes(said)
    for form in forms:
        for method in ("connect", "get"):
            assert seen[f"{method} {form}"] == "403 not-reached", (form, method, said)
    assert listener.connections == 0, said
    refused = {(r["host"], r["port"]) for r in egress if not r["allowed"]}
    assert {(asked(form), listener.port) for form in forms} <= refused, egress
    if ordinary is not None:
        assert seen[f"connect {ordinary.host}"] == seen[f"get {ordinary.host}"] == "403 not-reached", said
        assert ordinary.connections == 0
        assert (ordinary.host, ordinary.port, False) in {(r["host"], r["port"], r["allowed"]) for r in egress}


def test_a_rule_naming_127_0_0_1_lets_every_spelling_of_it_through(tmp_path, mark, listener):
    """The control: the same requests reach the listener once a rule names the loopback host itself; the
    unspecified address and the other loopback names stay refused (the rule names 127.0.0.1 only)."""
    targets = [f"{form}:{listener.port}" for form in LOOPBACK_FORMS + LOCAL_FORMS]
    said, egress = probe_run(tmp_path, "workspace-write", NAMED, mark, targets)

    seen = outcomes(said)
    for form in LOOPBACK_FORMS:
        for method in ("connect", "get"):
            assert seen[f"{method} {form}"] == "200 reached", (form, method, said)
    for form in LOCAL_FORMS:
        for method in ("connect", "get"):
            assert seen[f"{method} {form}"] == "403 not-reached", (form, method, said)
    assert listener.connections == 2 * len(LOOPBACK_FORMS)
    allowed = {r["host"]: r["rule_ids"] for r in egress if r["allowed"]}
    assert allowed == {asked(form): ["local-api"] for form in LOOPBACK_FORMS}, egress


def test_with_the_sandbox_off_each_spelling_reaches_the_listener(tmp_path, mark, listener):
    """The attack is real: each of these spellings is 127.0.0.1 to connect()."""
    said, _ = probe_run(tmp_path, "off", WILDCARD, mark, [f"{form}:{listener.port}" for form in DIRECT_FORMS])
    seen = outcomes(said)
    for form in DIRECT_FORMS:
        assert seen[f"direct {form}"] == "200 reached", (form, said)
    assert listener.connections == len(DIRECT_FORMS)


#: Waits (up to 30 s) for the test to have tried the run's sockets from outside, then fetches through its own
#: bridge, as a command inside would.
WAIT_THEN_FETCH = """\
import os, socket, sys, time
flag, target, mark = sys.argv[1:4]
deadline = time.monotonic() + 30
while not os.path.exists(flag) and time.monotonic() < deadline:
    time.sleep(0.05)
proxy = ("127.0.0.1", int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1]))
with socket.create_connection(proxy, timeout=5) as conn:
    conn.sendall(f"CONNECT {target} HTTP/1.1\\r\\n\\r\\nGET / HTTP/1.0\\r\\n\\r\\n".encode())
    answer = conn.makefile("rb").read().decode(errors="replace")
print("own bridge: " + ("reached" if mark in answer else "not-reached " + answer[:80]))
"""


def knock(path: str, request: bytes) -> bytes:
    """What a Unix socket answers to `request` (b"": closed unanswered)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(path)
        chunks = []
        try:
            conn.sendall(request)
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except (BrokenPipeError, ConnectionResetError):  # closed before (or with) our request unread
            pass
        return b"".join(chunks)


@LOOP_SLOW
def test_the_proxy_and_the_tools_relay_serve_only_their_own_run(tmp_path, mark, listener):
    """The test process is no descendant of the kernel it started: like another loop's sandbox that can reach
    the run's sockets, it is turned away from both, while the run's own bridge reaches the same listener."""
    ws = make_workspace(tmp_path / "ws", files={"tools/wait.py": WAIT_THEN_FETCH})
    flag = tmp_path / "tried"
    script = f"python3 tools/wait.py {flag} 127.0.0.1:{listener.port} {mark}"
    path = write_yaml(tmp_path / "scenario.yaml", scenario({"T1": once({"run": {"script": script}})},
                                                           agent={"mcp_http": True}))  # fmt: skip
    transcript = tmp_path / "transcripts" / "run.jsonl"
    config = write_yaml(tmp_path / "loop.yaml", loop_config(ws, path, rules=[READ_ALL, WRITE_SRC, *NAMED],
                                                            sandbox={"mode": "workspace-write"}))  # fmt: skip
    kernel = subprocess.Popen([CLI, "run", str(config), "--json", "--transcript", str(transcript)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not any(r["type"] == "host_tools" for r in written(transcript)):  # both relays have a server now
            assert time.monotonic() < deadline and kernel.poll() is None, "the run never served its host tools"
            time.sleep(0.05)
        network = next(r["network"] for r in written(transcript) if r["type"] == "sandbox")
        proxy_socket, tools_socket = network["proxy"][1], network["host_tools"][1]
        assert knock(proxy_socket, f"CONNECT 127.0.0.1:{listener.port} HTTP/1.1\r\n\r\n".encode()) == b""
        assert knock(tools_socket, b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") == b""
        flag.touch()
        out, _ = kernel.communicate(timeout=120)
    finally:
        kernel.kill()
        kernel.wait()
    records = read_transcript(Path(json.loads(out.strip().splitlines()[-1])["transcript"]))
    said = agent_said(records)
    assert "own bridge: reached" in said, said
    assert listener.connections == 1  # the run's own request, not the outsider's
    egress = [r for r in records if r["type"] == "egress"]
    outsiders = {r["host"]: r for r in egress if not r["allowed"]}
    assert set(outsiders) == {"proxy.sock", "tools.sock"}, egress
    assert all("outside this run" in r["why"] for r in outsiders.values()), egress
    assert ("127.0.0.1", listener.port, True) in {(r["host"], r["port"], r["allowed"]) for r in egress}


def written(transcript: Path) -> list[dict]:
    """The records a live run has written so far (the line being written may be incomplete)."""
    if not transcript.exists():
        return []
    found = []
    for line in transcript.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return found


# --- in process: the normaliser, the judgement, the ancestry walk --------------------------------------------


@pytest.mark.parametrize(
    ("host", "canonical"),
    [
        ("::ffff:127.0.0.1", "127.0.0.1"),
        ("[::ffff:7f00:1]", "127.0.0.1"),
        ("::127.0.0.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0X7F.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("127.000.000.001", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("0.0.0.0", "0.0.0.0"),
        ("0", "0.0.0.0"),
        ("::ffff:0.0.0.0", "0.0.0.0"),
        ("::", "::"),
        ("[::1]", "::1"),
        ("0:0:0:0:0:0:0:1", "::1"),
        ("010.0.0.1", "8.0.0.1"),
        ("192.0.2.7", "192.0.2.7"),
        ("localhost", None),
        ("example.com", None),
        ("1password.com", None),
        ("1.2.3.4.5", None),
        ("08.0.0.1", None),
        ("127.0.0.1 junk", None),
    ],
)
def test_an_address_in_any_spelling_is_normalised_to_its_canonical_text(host, canonical):
    address = host_address(host)
    assert (None if address is None else str(address)) == canonical


@pytest.mark.parametrize(
    ("hosts", "asked", "allowed"),
    [
        (["*"], "127.0.0.1", False),  # no pattern reaches this machine
        (["*"], "0x7f.1", False),
        (["*"], "localhost", False),
        (["*"], "0.0.0.0", False),
        (["*"], "::", False),
        (["127.*"], "127.0.0.1", False),
        (["*"], "192.0.2.7", True),
        (["*"], "example.com", True),
        (["127.0.0.1"], "127.0.0.1", True),  # the rule names the address: every spelling of it
        (["127.0.0.1"], "[::ffff:7f00:1]", True),
        (["127.0.0.1"], "2130706433", True),
        (["127.0.0.1"], "localhost", False),  # ... but not the name, nor another loopback address
        (["127.0.0.1"], "127.0.0.2", False),
        (["127.0.0.1"], "::1", False),
        (["localhost"], "localhost", True),  # the name: what it resolves to
        (["localhost"], "127.0.0.1", False),
        (["::1"], "[::1]", True),
        (["0.0.0.0"], "0", True),
    ],
)
def test_only_a_rule_naming_this_machines_host_literally_allows_it(tmp_path, hosts, asked, allowed):
    rules = [RuleConfig.model_validate({"id": "net", "kind": "network", "hosts": hosts, "decision": "allow"})]
    assert Policy(rules, tmp_path).judge_host(asked).allowed is allowed


def test_the_ancestry_walk_accepts_the_kernels_descendants_only():
    me = os.getpid()
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(shell.pid).children():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        grandchild = psutil.Process(shell.pid).children()[0]
        assert _descends_from(me, me) and _descends_from(shell.pid, me) and _descends_from(grandchild.pid, me)
        grandchild.kill()
    finally:
        shell.kill()
        shell.wait()
    assert not _descends_from(os.getppid(), me)  # our parent
    assert not _descends_from(1, me)
    assert not _descends_from(0, me)  # a peer in a pid namespace we cannot see
