"""Permission requests and the answers to them: tool kinds to rule kinds and the keys a tool call names a place
under, URLs and hosts, the turn and session gate, allow_once and reject options, host tools, the interactive path,
and terminals (their env, the argv they run, the search path).

The tables judge against the shared worktree (policy_corpus.build_worktree) under the careful policy.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket

import psutil
import pytest

from harness import Policy
from harness.config._config import HOST_SERVER_NAME as HOST
from harness.policy._policy import Turn
from harness.pytest_plugin import LOOP_SCRIPTED
from tests.helpers.policy_corpus import CAREFUL, expect, make_tree, policy_of, refused

pytestmark = LOOP_SCRIPTED

TURN = Turn("s1", frozenset({"s1"}))


# --- tool calls: the kind, and every key that names a place ---------------------------------------


@pytest.mark.parametrize(
    ("tool_call", "outcome"),
    [
        ({"kind": "execute", "rawInput": {"command": "ls", "workdir": "/etc"}}, "outside_worktree"),
        ({"kind": "execute", "rawInput": {"command": "ls", "cwd": "src/out"}}, "outside_worktree"),
        ({"kind": "execute", "rawInput": {"command": "ls", "workdir": "src"}}, "allowed"),
        ({"kind": "execute", "rawInput": {"command": "git", "args": ["push", "origin", "x"]}}, "denied"),
        ({"kind": "execute", "rawInput": {"command": "git", "args": ["status"]}}, "allowed"),
        ({"kind": "execute", "rawInput": {"command": ["git", "push", "origin", "x"]}}, "denied"),
        ({"kind": "execute", "rawInput": {"cmd": "rm -rf src"}}, "unmatched"),
        ({"kind": "execute", "rawInput": {"cmd": ["bash", "-lc", "git push origin x"]}}, "denied"),
        ({"kind": "execute", "rawInput": {}}, "no_target"),
        ({"kind": "execute"}, "no_target"),
        ({"kind": "move", "rawInput": {"source": "src/a.txt", "destination": "docs/a.txt"}}, "unmatched"),
        ({"kind": "move", "rawInput": {"source": "src/a.txt", "target": "docs/a.txt"}}, "unmatched"),
        ({"kind": "move", "rawInput": {"old_path": "docs/r.md", "new_path": "src/r.md"}}, "unmatched"),
        ({"kind": "move", "rawInput": {"old_path": "src/a.txt", "new_path": "docs/a.md"}}, "unmatched"),
        ({"kind": "move", "rawInput": {"from": "src/a.txt", "to": ".git/config"}}, "protected_path"),
        ({"kind": "move", "rawInput": {"src": "src/a.txt", "dst": "docs/a"}}, "unmatched"),
        ({"kind": "move", "rawInput": {"source": "src/a.txt", "dest_dir": "docs"}}, "unmatched"),
        ({"kind": "move", "rawInput": {"source": "src/a.txt", "destination": "src/b.txt"}}, "allowed"),
        ({"kind": "edit", "rawInput": {"notebook_path": "docs/n.ipynb"}}, "unmatched"),
        ({"kind": "edit", "rawInput": {"file_path": "docs/n.md"}}, "unmatched"),
        ({"kind": "edit", "rawInput": {"path": "src/../docs/n.md"}}, "unmatched"),
        ({"kind": "edit", "rawInput": {"paths": ["src/a.txt", "docs/n.md"]}}, "unmatched"),
        ({"kind": "edit", "rawInput": {"output_file": "docs/n.md"}}, "unmatched"),
        ({"kind": "edit", "rawInput": {"filename": "docs/n.md"}}, "unmatched"),
        ({"kind": "edit", "rawInput": {"changes": {"src/a.txt": {}, "docs/n.md": {}}}}, "unmatched"),
        (
            {"kind": "edit", "rawInput": {"changes": {"src/a.txt": {"type": "update", "move_path": "docs/a"}}}},
            "unmatched",
        ),
        (
            {
                "kind": "edit",
                "rawInput": {"changes": {"src/a.txt": {"update": {"unified_diff": "", "move_path": None}}}},
            },
            "allowed",
        ),
        ({"kind": "edit", "content": [{"type": "diff", "path": "docs/n.md", "newText": "x"}]}, "unmatched"),
        (
            {"kind": "edit", "content": [{"type": "text", "text": "docs/n.md"}], "locations": [{"path": "src/a.txt"}]},
            "allowed",
        ),  # text content names nothing
        ({"kind": "edit", "content": [{"type": "text"}], "locations": [{"line": 3}]}, "no_target"),
        ({"kind": "edit", "locations": [{"path": "src/a.txt"}, {"path": "docs/r.md"}]}, "unmatched"),
        ({"kind": "edit", "rawInput": {}}, "no_target"),
        ({"kind": "delete", "locations": [{"path": "src/secret/key"}]}, "denied"),
        ({"kind": "read", "rawInput": {"file_path": "src/secret/key"}}, "denied"),
        ({"kind": "read", "rawInput": {"path": "src/keylink"}}, "denied"),  # a symlink to the secret
        ({"kind": "read", "locations": [{"path": "src/a.txt"}]}, "allowed"),
        ({"kind": "search", "rawInput": {"pattern": "x", "file": "src/secret/key"}}, "denied"),
        ({"kind": "search", "rawInput": {"pattern": "x", "folder": "src/secret"}}, "denied"),
        ({"kind": "search", "rawInput": {"pattern": "x", "location": "src/secret"}}, "denied"),
        ({"kind": "search", "rawInput": {"pattern": "x", "dir_path": "src/secret"}}, "denied"),
        ({"kind": "search", "rawInput": {"pattern": "x", "directory": "/etc"}}, "outside_worktree"),
        ({"kind": "search", "rawInput": {"pattern": "x"}}, "denied"),  # no place: the worktree, secret and all
        ({"kind": "search", "rawInput": {"pattern": "x", "root_dir": 3}}, "no_target"),  # a place it cannot read
        ({"kind": "search", "rawInput": {"pattern": "x", "path": "docs"}}, "allowed"),
        ({"kind": "fetch", "rawInput": {"url": "https://api.github.com/repos"}}, "allowed"),
        ({"kind": "fetch", "rawInput": {"uri": "https://evil.example/x"}}, "unmatched"),
        ({"kind": "fetch", "rawInput": {"host": "evil.example"}}, "unmatched"),
        ({"kind": "fetch", "rawInput": {"url": "https://evil.example\\@api.github.com/"}}, "unparseable"),
        ({"kind": "fetch", "rawInput": {"url": "https://x@api.github.com/"}}, "unparseable"),
        ({"kind": "fetch", "rawInput": {"url": "https:api.github.com"}}, "unparseable"),
        ({"kind": "fetch", "rawInput": {"url": "api.github.com:443"}}, "allowed"),
        ({"kind": "fetch", "rawInput": {"url": "https://api.github.com%2e.evil/"}}, "unparseable"),
        ({"kind": "fetch", "rawInput": {"url": "https://API.GITHUB.COM/"}}, "allowed"),
        ({"kind": "fetch", "rawInput": {"url": "https://api.github.com.evil.example/"}}, "unmatched"),
        ({"kind": "fetch", "rawInput": {"url": "https://api.github.com /"}}, "unparseable"),
        ({"kind": "fetch", "rawInput": {}}, "no_target"),
        ({"kind": "think"}, "no_permission_needed"),
        ({"kind": "other", "title": "anything"}, "unmatched"),
        ({"title": "no kind"}, "unmatched"),
    ],
)
def test_every_key_a_tool_call_names_a_place_under_is_judged(careful, tool_call, outcome):
    verdict = careful.judge_tool_call(tool_call)
    if outcome == "no_permission_needed":
        assert verdict.allowed and verdict.reason["kind"] == outcome
    else:
        expect(verdict, outcome)


@pytest.mark.parametrize(
    ("change", "outcome"),
    [
        ({"move_path": ".git/hooks/pre-commit"}, "protected_path"),
        ({"update": {"move_path": ".git/hooks/pre-commit"}}, "protected_path"),
        ({"update": {"nested": {"move_path": ".git/hooks/pre-commit"}}}, "protected_path"),
        ({"update": {"move_path": "src/b.txt"}}, "allowed"),
    ],
)
def test_a_patch_that_moves_a_file_is_judged_where_it_moves_it(careful, change, outcome):
    expect(careful.judge_tool_call({"kind": "edit", "rawInput": {"changes": {"src/a.txt": change}}}), outcome)


def _node_id(value: object) -> str:
    """The repr, without the "::" pytest reads as a node-id separator and without backslashes, which
    pytest escapes once more each time one process collects again (mutmut collects, then re-runs by id)."""
    return repr(value).replace("::", ":_:").replace("\\", "~")


@pytest.mark.parametrize(
    "request_",
    [
        ["ls"],
        ["cd"],
        ["git"],
        ["bash"],
        ["sed"],
        ["tar"],
        ["python"],
        [""],
        [],
        ["ls", 3],
        ["ls", None],
        [None],
        "",
        "   ",
        "\n",
    ],
    ids=_node_id,
)
def test_any_argv_gets_a_verdict_never_an_exception(careful, request_):
    verdict = careful.judge_execute(request_)
    assert verdict.allowed is (request_ == ["ls"]), verdict


@pytest.mark.parametrize(
    "tool_call",
    [
        {"kind": "edit", "content": [{"type": "text", "text": "x"}]},
        {"kind": "edit", "content": ["x", None, 3]},
        {"kind": "edit", "locations": ["src/a.txt", None]},
        {"kind": "edit", "locations": [{"path": None}]},
        {"kind": "edit", "rawInput": "src/a.txt"},
        {"kind": "edit", "rawInput": {"path": 3}},
        {"kind": "edit", "rawInput": {"paths": [3, None]}},
        {"kind": "edit", "rawInput": {"changes": ["src/a.txt"]}},
        {"kind": "edit", "rawInput": {"path": "\0"}},
        {"kind": "execute", "rawInput": {"command": 3}},
        {"kind": "execute", "rawInput": {"command": ["ls", {"x": 1}]}},
        {"kind": "execute", "rawInput": {"command": "ls", "cwd": 3}},
        {"kind": "execute", "rawInput": {"command": "ls", "args": "src"}},
        {"kind": "fetch", "rawInput": {"url": 3}},
        {"kind": "fetch", "rawInput": {"url": "http://[::1"}},
        {"kind": ["edit"]},
        {"kind": None},
    ],
    ids=_node_id,
)
def test_any_tool_call_gets_a_verdict_never_an_exception(careful, tool_call):
    assert not careful.judge_tool_call(tool_call).allowed


@pytest.mark.parametrize(
    ("tool_call", "reason"),
    [
        ({"kind": "other"}, {"kind": "unmatched", "why": "no rule kind governs this tool kind", "tool_kind": "other"}),
        ({"kind": "switch_mode"},
         {"kind": "unmatched", "why": "no rule kind governs this tool kind", "tool_kind": "switch_mode"}),
        ({"kind": "read"}, {"kind": "no_target", "why": "the request names no path", "tool_kind": "read"}),
        ({"kind": "edit", "rawInput": {"pattern": "x"}},
         {"kind": "no_target", "why": "the request names no path", "tool_kind": "edit"}),
        ({"kind": "execute", "rawInput": {"cmd": ""}},
         {"kind": "no_target", "why": "the request names no command", "tool_kind": "execute"}),
        ({"kind": "fetch", "rawInput": {"query": "x"}},
         {"kind": "no_target", "why": "the request names no host", "tool_kind": "fetch"}),
    ],
    ids=_node_id,
)  # fmt: skip
def test_a_tool_call_that_names_nothing_a_rule_judges_is_refused_saying_so(careful, tool_call, reason):
    """The transcript's refusal says what was missing, and of which tool kind."""
    assert careful.judge_tool_call(tool_call).reason == reason


@pytest.mark.parametrize(
    ("tool_call", "target"),
    [
        ({"kind": "read", "locations": [{"path": "src/a.txt"}]}, ("read", "src/a.txt")),
        ({"kind": "execute", "rawInput": {"command": "ls"}}, ("execute", "ls")),
        ({"kind": "fetch", "rawInput": {"url": "https://api.github.com/x"}}, ("network", "api.github.com")),
    ],
    ids=_node_id,
)
def test_with_no_rules_a_tool_call_needs_a_persons_allow(worktree, tool_call, target):
    """No rules: the interactive path, where a tool call is what a person is asked about; judged alone it is
    not yet approved (and never an exception)."""
    verdict = expect(policy_of(worktree, []).judge_tool_call(tool_call), "not_approved")
    assert verdict.reason == {"kind": "not_approved", "rule_kind": target[0], "target": target[1]}


def test_text_content_beside_a_path_is_no_obstacle(careful):
    call = {"kind": "edit", "content": [{"type": "text", "text": "x"}], "locations": [{"path": "src/a.txt"}]}
    expect(careful.judge_tool_call(call), "allowed")


def test_a_request_the_policy_trips_over_is_refused_with_the_cause(careful):
    verdict = expect(careful.judge_execute("ls", cwd="\0"), "unparseable")
    assert "ValueError" in verdict.reason["why"]
    verdict = expect(careful.judge_tool_call({"kind": "execute", "rawInput": {"command": "ls", "cwd": 3}}),
                     "unparseable")  # fmt: skip
    assert "could not be judged" in verdict.reason["why"]


# --- URLs and hosts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["https://evil.example\\@api.github.com/", "https://evil.example\\.api.github.com/",
     "https://api.github.com@evil.example/", "https://user:pw@api.github.com/", "https:api.github.com",
     "https://api.github.com%2f@evil.example/", "https://%61pi.github.com/", "https://api.github.com\t.evil/",
     "https://\uff41pi.github.com/", "https://api.github.com\n/", "api.github.com@evil.example"],
)  # fmt: skip
def test_urls_a_whatwg_parser_reads_otherwise_are_refused(policy, url):
    refused(policy.judge_tool_call({"kind": "fetch", "rawInput": {"url": url}}), "unparseable", "unmatched")


@pytest.mark.parametrize("url", ["https://api.github.com/repos/x", "https://API.github.com:443/x", "api.github.com"])
def test_plain_urls_reach_their_host(policy, url):
    assert policy.judge_tool_call({"kind": "fetch", "rawInput": {"url": url}}).allowed


@pytest.mark.parametrize(
    ("url", "outcome"),
    [
        ("https://api.github.com/a b", "unparseable"),  # a space anywhere
        ("https://api.github.com/\x7f", "unparseable"),
        ("https://api.github.com/\x1f", "unparseable"),
        ("https://api.github.com/a\\b", "unparseable"),  # a backslash anywhere
        ("https://api.github.com/a!b", "allowed"),
        ("https://api.github.com/\x80", "allowed"),
        ("api.github.com:x", "allowed"),
        ("localhost:8080", "unmatched"),
    ],
)
def test_a_url_is_refused_where_parsers_may_disagree(careful, url, outcome):
    expect(careful.judge_tool_call({"kind": "fetch", "rawInput": {"url": url}}), outcome)


PROXY_RULES = [
    {"id": "api", "kind": "network", "hosts": ["api.github.com"], "decision": "allow"},
    {"id": "examples", "kind": "network", "hosts": ["*.example.org"], "decision": "allow"},
    {"id": "no-evil", "kind": "network", "hosts": ["evil.example.org"], "decision": "deny"},
]


@pytest.mark.parametrize(
    ("host", "outcome", "rules"),
    [
        ("api.github.com", "allowed", ("api",)),
        ("API.GitHub.COM", "allowed", ("api",)),  # host names are case-blind
        ("api.github.com.", "allowed", ("api",)),  # the root label's dot names the same host
        (".api.github.com", "unmatched", ()),  # a leading dot is no spelling of it
        ("api.github.com.evil.example", "unmatched", ()),
        ("docs.example.org", "allowed", ("examples",)),
        ("evil.example.org", "denied", ("no-evil",)),  # deny wins over the allow that matches too
        ("EVIL.example.org.", "denied", ("no-evil",)),
        ("example.org", "unmatched", ()),
        ("", "unmatched", ()),
    ],
)
def test_the_sandbox_proxy_judges_a_host_by_the_network_rules(worktree, host, outcome, rules):
    verdict = expect(policy_of(worktree, PROXY_RULES).judge_host(host), outcome)
    assert verdict.rule_ids == rules
    named = host.lower().removesuffix(".")  # what the rules were matched against, as the refusal says
    if outcome == "unmatched":
        assert verdict.reason == {"kind": "unmatched", "rule_kind": "network", "target": named}
    elif outcome == "denied":
        assert verdict.reason == {"kind": "denied", "rule_id": rules[0], "target": named}


EVERY_HOST = [{"id": "any-host", "kind": "network", "hosts": ["*"], "decision": "allow"}]


def _this_machines_own_addresses() -> list[str]:
    """Its interfaces' addresses beyond loopback and link-local (eth0's, a bridge's): a service listening on
    0.0.0.0 answers there too."""
    found = {a.address.split("%", 1)[0] for entries in psutil.net_if_addrs().values() for a in entries
             if a.family in (socket.AF_INET, socket.AF_INET6)}  # fmt: skip
    return sorted(
        a for a in found if not (ipaddress.ip_address(a).is_loopback or ipaddress.ip_address(a).is_link_local)
    )


@pytest.mark.parametrize(
    ("host", "named"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("localhost", "localhost"),
        ("0.0.0.0", "0.0.0.0"),  # Linux reaches its own machine there
        ("0.1.2.3", "0.1.2.3"),  # "this network": no host is there but this one
        ("169.254.169.254", "169.254.169.254"),  # link-local, with the cloud's metadata service
        ("::1", "::1"),
        ("::", "::"),
        ("fe80::1", "fe80::1"),
        ("::ffff:127.0.0.1", "127.0.0.1"),
        ("::127.0.0.1", "127.0.0.1"),  # IPv4-compatible, the old form
        ("::2", "0.0.0.2"),  # the same form, read as 0/8
        ("[::1]", "::1"),  # as a URL writes it
        ("127.0.0.1.", "127.0.0.1"),  # with the root's dot
        ("0X7F.1", "127.0.0.1"),  # inet_aton's hex, in capitals
    ],
)
def test_this_machine_is_reached_only_by_a_rule_naming_it(worktree, host, named):
    """A pattern (`*`) lets the proxy reach hosts elsewhere, never this machine or its link: only a rule that
    names the address itself does."""
    verdict = expect(policy_of(worktree, EVERY_HOST).judge_host(host), "unmatched")
    why = f"{named} is this machine: only a rule naming {named} itself allows it, not a pattern"
    assert verdict.reason == {"kind": "unmatched", "rule_kind": "network", "target": named, "why": why}
    naming = [{"id": "me", "kind": "network", "hosts": [named], "decision": "allow"}]
    allowed = expect(policy_of(worktree, naming).judge_host(host), "allowed")
    assert allowed.rule_ids == ("me",) and allowed.reason == {"kind": "allowed"}


def test_this_machines_own_interface_addresses_are_this_machine(worktree):
    own = _this_machines_own_addresses()
    if not own:
        pytest.skip("this machine has no address beyond loopback and link-local")
    policy = policy_of(worktree, EVERY_HOST)
    for address in own:
        verdict = expect(policy.judge_host(address), "unmatched")
        assert "is this machine" in verdict.reason["why"], (address, verdict.reason)


@pytest.mark.parametrize(
    "host",
    ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "api.github.com", "::1:7f00:1"],  # past the IPv4 forms
)
def test_a_pattern_lets_the_proxy_reach_a_host_elsewhere(worktree, host):
    assert expect(policy_of(worktree, EVERY_HOST).judge_host(host), "allowed").rule_ids == ("any-host",)


def test_with_no_rules_the_proxy_lets_no_host_through(worktree):
    """The interactive path approves what a person allowed in a turn; a connection is in no turn."""
    verdict = expect(policy_of(worktree, []).judge_host("api.github.com"), "not_approved")
    assert verdict.reason == {"kind": "not_approved", "rule_kind": "network", "target": "api.github.com"}


# --- the turn, and the answer to a permission request ---------------------------------------------

OPTIONS = [("a1", "allow_once"), ("a2", "allow_always"), ("r1", "reject_once"), ("r2", "reject_always")]


@pytest.mark.parametrize(
    ("session", "turn", "outcome"),
    [
        ("s1", Turn("s1", frozenset({"s1"})), "allowed"),
        ("s1", Turn(None, frozenset({"s1"})), "outside_turn"),
        ("s2", Turn("s1", frozenset({"s1", "s2"})), "outside_turn"),
        ("s3", Turn("s1", frozenset({"s1"})), "unknown_session"),
        ("s1", Turn(None, frozenset()), "unknown_session"),
    ],
)
def test_only_the_running_turns_session_may_act(careful, session, turn, outcome):
    expect(careful.read(session, "src/a.txt", turn), outcome)
    expect(careful.write(session, "src/a.txt", turn), outcome)
    expect(careful.terminal(session, "ls", [], {}, None, turn), outcome)
    for owner in (session, None):  # a gate only: no rule decides it; a released terminal's id is no way past it
        use = careful.terminal_use(session, owner, turn)
        assert (use.allowed, use.reason["kind"]) == ((True, "allowed") if outcome == "allowed" else (False, outcome))
    verdict = careful.permission(session, {"kind": "read", "locations": [{"path": "src/a.txt"}]}, OPTIONS, turn)
    expect(verdict, outcome)
    assert verdict.option_id == ("a1" if outcome == "allowed" else "r1")


def test_a_terminal_belongs_to_the_session_that_made_it(careful):
    turn = Turn("s1", frozenset({"s1", "s2"}))
    assert careful.terminal_use("s1", "s2", turn).reason == {"kind": "not_its_terminal", "session": "s1", "owner": "s2"}
    assert careful.terminal_use("s1", "s2", turn).allowed is False
    assert careful.terminal_use("s1", "s1", turn).allowed is True


@pytest.mark.parametrize(
    ("options", "option_id", "outcome"),
    [
        (OPTIONS, "a1", "allowed"),
        ([("a2", "allow_always"), ("r1", "reject_once")], "r1", "no_allow_once_option"),  # never allow_always
        ([("a2", "allow_always"), ("r2", "reject_always")], "r2", "no_allow_once_option"),
        ([("a2", "allow_always")], None, "no_allow_once_option"),  # answered `cancelled`
        ([("r2", "reject_always"), ("a1", "allow_once")], "a1", "allowed"),
    ],
)
def test_an_allow_is_answered_once_and_never_always(careful, options, option_id, outcome):
    turn = Turn("s1", frozenset({"s1"}))
    verdict = expect(careful.permission("s1", {"kind": "read", "locations": [{"path": "src/a.txt"}]}, options, turn),
                     outcome)  # fmt: skip
    assert verdict.option_id == option_id


@pytest.mark.parametrize(
    ("options", "option_id"),
    [(OPTIONS, "r1"), ([("r2", "reject_always"), ("r1", "reject_once")], "r1"), ([("r2", "reject_always")], "r2"),
     ([("a1", "allow_once")], None)],
)  # fmt: skip
def test_a_refusal_is_answered_with_a_reject_option(careful, options, option_id):
    turn = Turn("s1", frozenset({"s1"}))
    verdict = expect(careful.permission("s1", {"kind": "read", "locations": [{"path": "src/secret/key"}]}, options,
                                        turn), "denied")  # fmt: skip
    assert verdict.option_id == option_id


@pytest.mark.parametrize(
    ("options", "option_id"),
    [
        ([("aa", "allow_always"), ("r", "reject_once")], "r"),
        ([("aa", "allow_always")], None),  # nothing to reject with: the client answers `cancelled`
    ],
)
def test_an_allow_with_no_allow_once_option_is_refused_naming_the_rules_that_would_allow_it(
    own_worktree, options, option_id
):
    """`allow_always` could become the agent's own standing rule: the request is refused, and the reason
    (the transcript records it) names the rules that allowed it, so a person sees why it was asked."""
    verdict = policy_of(own_worktree, CAREFUL).permission("s1", READ_A, options, TURN)
    assert verdict.allowed is False
    assert verdict.option_id == option_id
    assert dict(verdict.reason) == {"kind": "no_allow_once_option", "allowed_by": ["read-all"]}


@pytest.mark.parametrize(
    ("title", "kind", "tools", "outcome"),
    [
        (f"mcp__{HOST}__open_proposal", "other", {"open_proposal"}, "host_tool"),
        (f"mcp__{HOST}__open_proposal", None, {"open_proposal"}, "host_tool"),
        (f"mcp__{HOST}__open_proposal", "other", {"comment"}, "unmatched"),  # not the role's tool
        (f"mcp__{HOST}__open_proposal", "execute", {"open_proposal"}, "no_target"),  # a kind of its own
        ("mcp__other__open_proposal", "other", {"open_proposal"}, "unmatched"),
        (f"xmcp__{HOST}__open_proposal", "other", {"open_proposal"}, "unmatched"),
        (f"mcp__{HOST}__open_proposal!", "other", {"open_proposal"}, "unmatched"),
        (f"mcp__{HOST}x__open_proposal", "other", {"open_proposal"}, "unmatched"),
    ],
)
def test_host_tools_are_what_the_role_allows(careful, title, kind, tools, outcome):
    turn = Turn("s1", frozenset({"s1"}), frozenset(tools))
    verdict = careful.permission("s1", {"title": title, "kind": kind}, OPTIONS, turn)
    if outcome == "host_tool":
        assert verdict.allowed and verdict.reason["kind"] == "host_tool" and verdict.option_id == "a1"
    else:
        expect(verdict, outcome)


def test_the_reasons_a_client_records(careful):
    turn = Turn("s1", frozenset({"s1", "s2"}), frozenset({"open_proposal"}))
    assert careful.read("s2", "src/a.txt", turn).reason == {"kind": "outside_turn", "session": "s2"}
    assert careful.read("s9", "src/a.txt", turn).reason == {"kind": "unknown_session", "session": "s9"}
    host = careful.permission("s1", {"title": f"mcp__{HOST}__open_proposal", "kind": "other"}, OPTIONS, turn)
    assert (host.rule_ids, dict(host.reason)) == (
        ("builtin:host-tool",),
        {"kind": "host_tool", "tool": "open_proposal"},
    )
    think = careful.judge_tool_call({"kind": "think"})
    assert (think.rule_ids, dict(think.reason)) == (("builtin:think",), {"kind": "no_permission_needed"})
    use = careful.terminal_use("s1", "s1", turn)
    assert (use.allowed, use.rule_ids, dict(use.reason)) == (True, (), {"kind": "allowed"})
    null = careful.judge_execute("ls > /dev/null")
    assert null.rule_ids == ("ls", "builtin:dev-null")


@pytest.mark.parametrize(
    ("command", "rule_ids", "reason"),
    [
        ("git -C ../x status", (), {"kind": "outside_worktree", "path": "../x", "why": "git -C names a place outside"}),
        ("git -c x=y status", (), {"kind": "unsafe_argument", "command": "git -c x=y status",
                                   "why": "git -c changes git's configuration, repository or programs"}),
        ("cat src/secret/key", ("no-secret-read",), {"kind": "denied", "rule_id": "no-secret-read",
                                                     "target": "src/secret/key", "command": "cat src/secret/key"}),
        ("cd src && cat secret/key", ("no-secret-read",), {"kind": "denied", "rule_id": "no-secret-read",
                                                           "target": "src/secret/key", "command": "cat secret/key"}),
        ("ls > docs/x", (), {"kind": "unmatched", "rule_kind": "write", "target": "docs/x"}),
        ("ls > .git/config", ("protected",), {"kind": "protected_path", "path": ".git/config"}),
        ("rm x", (), {"kind": "unmatched", "rule_kind": "execute", "target": "rm x"}),
        ("git -C src status", ("status", "read-all"), {"kind": "allowed"}),
        ("git status && ls docs > src/x && cat src/a.txt", ("status", "ls", "read-all", "write-src", "cat"),
         {"kind": "allowed"}),
        ("ls docs; cat docs/r.md < src/a.txt", ("ls", "read-all", "cat"), {"kind": "allowed"}),
        ("cd docs && ls", ("moves", "read-all", "ls"), {"kind": "allowed"}),
    ],
)  # fmt: skip
def test_the_rule_ids_and_reason_a_transcript_records(careful, command, rule_ids, reason):
    """Every rule that allowed some part of a script is named, in order; a refusal names what it refused and why."""
    verdict = careful.judge_execute(["bash", "-c", command])
    assert (verdict.rule_ids, dict(verdict.reason)) == (rule_ids, reason)


# --- the interactive path -------------------------------------------------------------------------

READ_A = {"kind": "read", "locations": [{"path": "src/a.txt"}]}


def test_the_interactive_path_asks_a_person_and_grants_nothing_itself(own_worktree):
    """With no rules the policy does not decide: it asks, and its own verdict is a refusal naming no rule."""
    verdict = Policy([], own_worktree).permission("s1", READ_A, [("a", "allow_once"), ("r", "reject_once")], TURN)
    assert verdict.ask is True
    assert verdict.allowed is False
    assert verdict.rule_ids == ()
    assert dict(verdict.reason) == {"kind": "interactive"}
    assert verdict.option_id is None


def test_the_interactive_path_reaches_only_what_a_person_approved(worktree):
    policy = Policy([], worktree)
    turn = Turn("s1", frozenset({"s1"}))
    ask = policy.permission("s1", {"kind": "edit", "locations": [{"path": "docs/r.md"}]}, OPTIONS, turn)
    assert ask.ask and not ask.allowed and ask.reason["kind"] == "interactive"
    approved = policy.approvals({"kind": "edit", "locations": [{"path": "docs/r.md"}]})
    assert approved == {("write", "docs/r.md")}
    with_approval = Turn("s1", frozenset({"s1"}), approvals=approved)
    assert expect(policy.write("s1", "docs/r.md", with_approval), "allowed").reason["kind"] == "interactive"
    expect(policy.write("s1", "docs/other.md", with_approval), "not_approved")
    expect(policy.read("s1", "docs/r.md", with_approval), "not_approved")  # a write approval is no read
    expect(policy.write("s1", ".git/config", Turn("s1", frozenset({"s1"}), approvals={("write", ".git/config")})),
           "protected_path")  # fmt: skip
    expect(policy.write("s1", "../outside.txt", with_approval), "outside_worktree")


@pytest.mark.parametrize(
    ("tool_call", "approved"),
    [
        ({"kind": "read", "rawInput": {"file_path": "src/../docs/r.md"}}, {("read", "docs/r.md")}),
        ({"kind": "read", "rawInput": {"file_path": "../outside.txt"}}, set()),
        ({"kind": "execute", "rawInput": {"command": "ls src && git status"}},
         {("execute", "ls src"), ("execute", "git status")}),
        ({"kind": "execute", "rawInput": {"command": "git", "args": ["-C", "src", "status"]}},
         {("execute", "git status")}),
        ({"kind": "execute", "rawInput": {"command": ["bash", "-c", "ls $HOME"]}}, set()),
        ({"kind": "execute", "rawInput": {"command": "git -c x=y status"}}, set()),
        ({"kind": "fetch", "rawInput": {"url": "https://api.github.com"}}, set()),
        ({"kind": "think"}, set()),
    ],
)  # fmt: skip
def test_what_a_persons_allow_lets_the_agent_reach(worktree, tool_call, approved):
    assert Policy([], worktree).approvals(tool_call) == approved


@pytest.mark.parametrize(
    ("tool_call", "approved"),
    [
        ({"kind": "fetch", "rawInput": {"command": "rm -rf src", "url": "https://x"}}, set()),
        ({"kind": "execute", "rawInput": "ls"}, set()),
        (
            {"kind": "execute", "rawInput": {"command": ["git", "status"], "args": ["push"]}},
            {("execute", "git status")},
        ),
        ({"kind": "search", "rawInput": {"path": "docs"}}, {("read", "docs")}),
        ({"kind": "delete", "locations": [{"path": "docs/r.md"}]}, {("write", "docs/r.md")}),
    ],
)
def test_what_an_allow_approves_and_nothing_more(worktree, tool_call, approved):
    assert Policy([], worktree).approvals(tool_call) == approved


def test_a_persons_allow_of_an_argv_approves_that_argv_whatever_args_say(own_worktree):
    """A command given as a list is the whole command: an `args` beside it is not part of it."""
    tool_call = {"kind": "execute", "rawInput": {"command": ["ls", "src"], "args": "x"}}
    assert Policy([], own_worktree).approvals(tool_call) == {("execute", "ls src")}


def test_an_approved_read_is_readable_once_approved(worktree):
    policy = Policy([], worktree)
    approved = policy.approvals({"kind": "read", "locations": [{"path": "docs/r.md"}]})
    turn = Turn("s1", frozenset({"s1"}), approvals=approved)
    assert expect(policy.read("s1", "docs/r.md", turn), "allowed").reason["kind"] == "interactive"
    expect(policy.read("s1", "src/a.txt", turn), "not_approved")


def test_an_interactive_terminal_runs_only_the_approved_command(worktree):
    policy = Policy([], worktree)
    approved = policy.approvals({"kind": "execute", "rawInput": {"command": "ls src"}})
    turn = Turn("s1", frozenset({"s1"}), approvals=approved)
    assert expect(policy.terminal("s1", "ls", ["src"], {}, None, turn), "allowed").argv == ("ls", "src")
    expect(policy.terminal("s1", "ls", ["docs"], {}, None, turn), "not_approved")
    expect(policy.terminal("s1", "ls src > ../x", None, {}, None, turn), "outside_worktree")


def test_an_approved_script_is_recorded_as_the_persons_allow(worktree):
    """On the interactive path what allowed a command is the person's approval: the one rule id the transcript
    records, for the command and the paths and redirections it names alike."""
    policy = Policy([], worktree)
    approved = policy.approvals({"kind": "execute", "rawInput": {"command": "ls src > src/o"}})
    turn = Turn("s1", frozenset({"s1"}), approvals=approved)
    verdict = expect(policy.terminal("s1", "ls src > src/o", None, {}, None, turn), "allowed")
    assert verdict.rule_ids == ("interactive",) and verdict.reason == {"kind": "allowed"}


# --- terminals: env, the argv run, output ---------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "outcome"),
    [
        ({}, "allowed"),
        ({"LANG": "C", "LC_ALL": "C", "TERM": "dumb", "NO_COLOR": "1", "TZ": "UTC", "CLAUDECODE": "1"}, "allowed"),
        ({"LD_PRELOAD": "x"}, "unsafe_env"),
        ({"PATH": "/tmp"}, "unsafe_env"),
        ({"HOME": "/tmp"}, "unsafe_env"),
        ({"BASH_ENV": "x"}, "unsafe_env"),
        ({"LANGX": "x"}, "unsafe_env"),
        ({"XLANG": "x"}, "unsafe_env"),
        ({"lc_all": "C"}, "unsafe_env"),
        ({"LC_": "C"}, "unsafe_env"),
    ],
)
def test_a_terminal_sets_only_harmless_variables(careful, env, outcome):
    verdict = expect(careful.terminal("s1", "ls", ["src"], env, None, Turn("s1", frozenset({"s1"}))), outcome)
    if outcome == "unsafe_env":
        assert verdict.reason["names"] == sorted(env)


@pytest.mark.parametrize(
    ("script", "names", "step"),
    [
        ("LD_PRELOAD=x.so ls src", ["LD_PRELOAD"], "LD_PRELOAD=x.so ls src"),
        ("ls && PATH=docs HOME=/ ls src", ["HOME", "PATH"], "PATH=docs HOME=/ ls src"),
        ("LANG=C GIT_DIR=x git status", ["GIT_DIR"], "LANG=C GIT_DIR=x git status"),
    ],
)
def test_a_script_that_sets_a_variable_that_changes_what_runs_is_refused_naming_it(careful, script, names, step):
    """The refusal names the variables (not the harmless ones beside them) and the command that set them."""
    verdict = expect(careful.judge_execute(script), "unsafe_env")
    why = "a variable that can change what a program runs, loads or opens"
    assert verdict.reason == {"kind": "unsafe_env", "names": names, "command": step, "why": why}


@pytest.mark.parametrize(
    ("command", "args", "cwd", "argv", "workdir"),
    [
        ("ls", ["src"], None, ("ls", "src"), "."),
        ("ls", None, "src", ("ls",), "src"),
        ("ls src && git status", None, None, ("SHELL", "-c", "ls src && git status"), "."),
        ("ls src", [], "docs", ("SHELL", "-c", "ls src"), "docs"),
        ("ls", ["src && git push origin x"], None, ("ls", "src && git push origin x"), "."),  # one argument
        ("ls", ["-la"], "src/..", ("ls", "-la"), "."),
        ("ls", ["-la"], "src/gitlink/../docs", ("ls", "-la"), "docs"),  # where the link really leads
    ],
)
def test_a_terminal_runs_exactly_what_was_judged(careful, worktree, command, args, cwd, argv, workdir):
    from harness.policy._policy import SHELL

    verdict = expect(careful.terminal("s1", command, args, {}, cwd, Turn("s1", frozenset({"s1"}))), "allowed")
    assert verdict.argv == tuple(SHELL if w == "SHELL" else w for w in argv)
    assert verdict.workdir == os.path.normpath(os.path.join(str(worktree), workdir))


@pytest.mark.parametrize(
    ("command", "args", "outcome"),
    [
        ("ls src; git push origin x", None, "denied"),  # a string with shell characters is a script
        ("ls\tsrc", None, "unmatched"),  # `ls\tsrc` with no args is a program of that name... judged as a script
        ("git push origin x", [], "denied"),
        ("ls > docs/x", None, "unmatched"),
        ("ls", ["-la"], "allowed"),
    ],
)
def test_a_terminal_command_string_is_judged_as_the_shell_reads_it(careful, command, args, outcome):
    if command == "ls\tsrc":
        outcome = "allowed"  # a tab separates: `ls src`
    expect(careful.terminal("s1", command, args, {}, None, Turn("s1", frozenset({"s1"}))), outcome)


def test_an_agent_cannot_ask_the_kernel_to_keep_unbounded_output(tmp_path):
    from harness.sandbox._exec import MAX_OUTPUT_LIMIT, ExecHost

    async def run() -> dict:
        host = ExecHost(dict(os.environ))
        terminal = await host.create("s1", ["head", "-c", str(MAX_OUTPUT_LIMIT + (1 << 20)), "/dev/zero"],
                                     cwd=str(tmp_path), output_byte_limit=10**11)  # fmt: skip
        await host.wait_for_exit(terminal)
        await asyncio.sleep(0.2)
        out = host.output(terminal)
        await host.release_all()
        return out

    out = asyncio.run(run())
    assert out["truncated"] and len(out["output"]) <= MAX_OUTPUT_LIMIT


# --- the search path: no directory a program could be planted in ---------------------------------


def test_the_search_path_loses_every_directory_an_agent_could_plant_a_program_in(careful, worktree):
    entries = ["/usr/bin", "bin", str(worktree / "src" / "bin"), str(worktree / "docs"), "/bin", ""]
    assert careful.search_path(os.pathsep.join(entries)).split(os.pathsep) == ["/usr/bin", str(worktree / "docs"),
                                                                               "/bin"]  # fmt: skip


def test_a_worktree_directory_on_path_is_dropped_when_a_write_rule_can_name_a_program_in_it(worktree):
    """`write src/git` lets the agent plant the `git` an allowed `git status` runs: `src` leaves PATH. A write
    rule that names nothing directly inside a directory keeps it."""
    planted = policy_of(worktree, [{"id": "git-file", "kind": "write", "paths": ["src/git"], "decision": "allow"}])
    elsewhere = policy_of(worktree, [{"id": "docs", "kind": "write", "paths": ["docs/*"], "decision": "allow"}])
    path = os.pathsep.join([str(worktree / "src"), "/usr/bin"])
    assert planted.search_path(path) == "/usr/bin"
    assert elsewhere.search_path(path) == path


@pytest.mark.parametrize(
    ("pattern", "directory", "kept"),
    [
        ("src/git", "src", False),
        ("src/*", "src", False),
        ("src/g?t", "src", False),
        ("s*/x", "src", False),
        ("**", "src", False),
        ("src/**", "src/pkg", False),
        ("*/pkg/*", "src/pkg", False),
        ("docs/*", "src", True),
        ("src", "src", True),  # the directory itself, nothing in it
        ("src/pkg/x", "src", True),  # two levels down: no program directly in src
        ("src/**/x", "src", False),  # `**` may be nothing: src/x
        ("lib/*/x", "src/pkg", True),
    ],
)
def test_path_keeps_a_worktree_directory_only_when_no_write_rule_names_something_in_it(
    worktree, pattern, directory, kept
):
    policy = policy_of(worktree, [{"id": "w", "kind": "write", "paths": [pattern], "decision": "allow"}])
    entry = str(worktree / directory)
    assert (policy.search_path(f"{entry}:/usr/bin") == f"{entry}:/usr/bin") is kept


def test_path_loses_a_directory_outside_holding_a_link_to_a_path_the_agent_may_write(tmp_path):
    """`npm link` or `ln -s ~/proj/bin/tool ~/.local/bin` leave such a link outside the worktree: an allowed
    `tool` would run what the agent wrote."""
    base = tmp_path.resolve()
    root = make_tree(base / "wt", dirs=["docs"])
    (base / "outbin").mkdir()
    (base / "outbin" / "tool").symlink_to(root / "docs" / "tool")
    (base / "plainbin").mkdir()
    (base / "plainbin" / "ls").symlink_to("/usr/bin/ls")
    policy = policy_of(root, [write_rule("docs/**")])
    path = os.pathsep.join([str(base / "outbin"), str(base / "plainbin"), "/usr/bin"])
    assert policy.search_path(path) == os.pathsep.join([str(base / "plainbin"), "/usr/bin"])


def test_path_loses_a_directory_it_cannot_list(tmp_path):
    """What a directory holds that cannot be listed (a link loop here; a mode-0311 directory for a user
    other than root) cannot be checked for a planted link: it is dropped."""
    base = tmp_path.resolve()
    root = make_tree(base / "wt", dirs=["docs"])
    (base / "loop").symlink_to(base / "loop")
    policy = policy_of(root, [write_rule("docs/**")])
    assert policy.search_path(os.pathsep.join([str(base / "loop"), "/usr/bin"])) == "/usr/bin"


def write_rule(pattern: str) -> dict:
    return {"id": "w", "kind": "write", "paths": [pattern], "decision": "allow"}


@pytest.mark.parametrize(
    ("pattern", "directory", "kept"),
    [
        ("docs/**", "tools", False),  # tools/planted -> ../docs/p: the agent writes docs/p, PATH runs it
        ("docs/**", "bin", False),  # a committed bin/git -> ../docs/g: `git status` would run docs/g
        ("docs/**", "src", True),  # no link in src, and docs/** names nothing in it
        ("planted", "docs", True),  # a file at the top names nothing in docs
        ("git", ".", False),  # the worktree itself on PATH: the agent may write ./git
        ("src/pkg/git", "src/pkg", False),  # a directory two levels down
        ("**/*.py", "src/pkg", False),  # `**` reaches into any directory
        ("**/*.py", "src", False),
        ("src", "src/pkg", True),  # the directory above names nothing in it
        ("docs/**", "missing", True),  # not there, and no rule lets the agent make it
    ],
)
def test_path_loses_a_worktree_directory_where_a_program_could_be_planted(tmp_path, pattern, directory, kept):
    """A worktree directory on PATH stays only if no write rule lets the agent put a program there, directly
    or through a symlink the directory already holds."""
    root = make_tree(
        tmp_path.resolve() / "wt",
        dirs=["src/pkg", "docs", "tools", "bin"],
        links={"tools/planted": "../docs/p", "bin/git": "../docs/g"},
    )
    policy = policy_of(root, [write_rule(pattern)])
    entry = str(root) if directory == "." else str(root / directory)
    path = os.pathsep.join([entry, "/usr/bin"])
    assert policy.search_path(path) == (path if kept else "/usr/bin")
