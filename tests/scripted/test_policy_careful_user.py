"""A careful user's policy against the attacks reviews found (issue 8), and the ordinary work it must still allow.

The policy (policy_corpus.CAREFUL_WITH_PYTEST, the `policy` fixture): `read **`, `write src/**`, a denied
`src/secret/**`, and execute `git status`, `git log *`, `git diff *`, `ls *`, `cat *`, `python -m pytest *`, over
a small worktree of its own (`src/a.txt`, `src/secret/key`, `docs/`, `.git/config`, `outside.txt` beside it).
These tests build policies over that worktree or plant files in it, so they stay together, apart from the subject
files' shared worktree: arguments that hide a read, a write or a program (git, sed, programs without a record),
nested repositories, hard links, `cd`, the turn gate, permission answers, terminals and the search path. Each
class is a table of variants judged by the policy as a pure function; the worst of each goes through the kernel in
test_policy_enforced.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import Policy
from harness.config._config import RuleConfig
from harness.policy._policy import Turn
from harness.pytest_plugin import LOOP_SCRIPTED
from tests.helpers.policy_corpus import CAREFUL_WITH_PYTEST as CAREFUL
from tests.helpers.policy_corpus import git_all as _git_all
from tests.helpers.policy_corpus import refused

pytestmark = LOOP_SCRIPTED


@pytest.fixture(name="worktree")
def worktree_fixture(review_worktree):
    """The worktree `policy` judges against (conftest.py): these tests plant files in it and build policies over it."""
    return review_worktree


def _reads():
    return [RuleConfig.model_validate(CAREFUL[0]), RuleConfig.model_validate(CAREFUL[1])]


# --- git: what creates repositories, rewrites config, prints every file or runs programs ----------


@pytest.mark.parametrize(
    "command",
    ["git init src/sub", "git clone ../x src/sub", "git submodule add ../x src/sub", "git worktree add src/w",
     "git -c core.fsmonitor=touch status", "git --exec-path=src status", "git --git-dir=src/sub status",
     "git config core.fsmonitor 'touch pwned'", "git remote add evil ../x"],
)  # fmt: skip
def test_git_that_creates_repositories_or_rewrites_config_is_refused(worktree, command):
    everything = Policy([RuleConfig.model_validate({"id": "git", "kind": "execute", "commands": ["git *"],
                                                    "decision": "allow"}), *_reads()], worktree)  # fmt: skip
    refused(everything.judge_execute(command), "unsafe_argument")


@pytest.mark.parametrize(
    "command",
    ["git log -U1", "git log --unified=0", "git log --binary", "git log --remerge-diff", "git whatchanged -1",
     "git log -1 --stat -p", "git log --oneline -p"],
)  # fmt: skip
def test_git_log_that_prints_diffs_reads_the_whole_worktree(worktree, command):
    everything = Policy([RuleConfig.model_validate(r) for r in [*CAREFUL, _git_all()]], worktree)
    refused(everything.judge_execute(command), "denied")


@pytest.mark.parametrize(
    "command",
    ["git merge-tree a b c", "git request-pull -p HEAD~1 origin HEAD", "git checkout-index -a --prefix=src/leak/",
     "git ls-remote --upload-pac=touch origin", "git fetch --upload-pa=touch origin", "git rebase --exe=touch HEAD~1",
     "git rebase -fx touch HEAD~1", "git grep -iO x"],
)  # fmt: skip
def test_more_git_that_reads_everything_or_runs_programs(worktree, command):
    everything = Policy([RuleConfig.model_validate(r) for r in [*CAREFUL, _git_all()]], worktree)
    refused(everything.judge_execute(command), "denied", "unsafe_argument")


# --- reads and writes hidden in scripts, clusters and options -------------------------------------


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("sed --i s/a/b/ docs/t.txt", "unmatched"),  # --i is --in-place
        ("sed -ni 1p docs/t.txt", "unmatched"),
        ("sed -n 'w docs/w.txt' src/a.txt", "unsafe_argument"),
        ("sed '1e touch pwned' src/a.txt", "unsafe_argument"),
        ("sed 's/a/b/w docs/w.txt' src/a.txt", "unsafe_argument"),
        ("sed 1r/etc/passwd src/a.txt", "unsafe_argument"),
        ("sed -f script.sed src/a.txt", "unsafe_argument"),
        ("sort -uo docs/sorted src/a.txt", "unmatched"),  # -o inside a cluster
        ("cp -vt docs src/a.txt", "unmatched"),
        ("ls -R src", "denied"),  # lists what src/secret holds
    ],
)
def test_writes_hidden_in_scripts_and_clusters(worktree, command, why):
    rules = [*CAREFUL, {"id": "tools", "kind": "execute", "commands": ["sed *", "sort *", "cp *"], "decision": "allow"}]
    refused(Policy([RuleConfig.model_validate(r) for r in rules], worktree).judge_execute(command), why)


@pytest.mark.parametrize(
    "command", ["sed -n 1,10p src/a.txt", "sed -i 's/a/b/g' src/a.txt", "sed '/x/d;$a end' src/a.txt"]
)
def test_ordinary_sed_still_works(worktree, command):
    rules = [*CAREFUL, {"id": "sed", "kind": "execute", "commands": ["sed *"], "decision": "allow"}]
    assert Policy([RuleConfig.model_validate(r) for r in rules], worktree).judge_execute(command).allowed


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("sed '-nee touch pwned'", "unsafe_argument"),  # -n -e 'e touch pwned'
        ("sed -n 't;e touch pwned'", "unsafe_argument"),  # a label ends at `;`
        ("sed '-new ../pwned'", "unsafe_argument"),
        ("sed -n ':a;w ../pwned'", "unsafe_argument"),
        ("sed -nep src/secret/../../src/secret/key", "denied"),  # the file operand, not a script
        ("sed --expr=p src/secret/key", "denied"),
        ("sed -i --expr=s/x/P/ src/../../outside.txt", "outside_worktree"),
        ("sed -i -Ees/x/P/ docs/x.txt", "unmatched"),
        ("grep -r TOP", "denied"),  # reads where it runs, src/secret too
        ("grep -d recurse TOP", "denied"),
        ("ls -R", "denied"),
        ("git add -A && git commit --dry-run -v", "denied"),  # prints the staged diff
        ("git add ':(top)src/secret'", "denied"),  # pathspec magic
        ("git add 'src/secre?/*'", "denied"),  # a pathspec glob
        ("git commit --allow-empty -qFsrc/secret/key", "denied"),  # -q -F src/secret/key
        ("grep -hfsrc/secret/key src/a.txt", "denied"),
    ],
)
def test_hidden_reads_and_writes_found_in_the_third_review(worktree, command, why):
    rules = [*CAREFUL, _git_all(), {"id": "tools", "kind": "execute", "commands": ["sed *", "grep *"],
                                    "decision": "allow"}]  # fmt: skip
    refused(Policy([RuleConfig.model_validate(r) for r in rules], worktree).judge_execute(["bash", "-c", command]), why)


@pytest.mark.parametrize(
    "command",
    ["git log -n5 --oneline", "git log --oneline -- src", "sed -n '1,+3p' src/a.txt", "cd src && ls && cd .. && ls",
     "grep -rn TODO src/a.txt", "git commit -qam 'fix: a/b?'"],
)  # fmt: skip
def test_ordinary_work_the_third_review_found_refused(worktree, command):
    rules = [*CAREFUL, _git_all(), {"id": "tools", "kind": "execute", "commands": ["sed *", "grep *", "cd *"],
                                    "decision": "allow"}]  # fmt: skip
    verdict = Policy([RuleConfig.model_validate(r) for r in rules], worktree).judge_execute(["bash", "-c", command])
    assert verdict.allowed, verdict


# --- programs without a record, and a program known by its name wherever it lives ----------------

TOOLS = [*CAREFUL, {"id": "tools", "kind": "execute", "decision": "allow", "commands": [
    f"{p} *" for p in ("head", "tail", "wc", "diff", "tar", "tee", "touch", "mkdir", "mv", "cp", "ln", "uniq", "shuf",
                       "split", "cut", "echo", "zip", "unzip", "install", "patch", "rm", "chmod", "gcc")]}]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("split --filter='touch pwned' src/a.txt", "unsafe_argument"),
        ("zip src/z.zip src/a.txt -T --unzip-command='cat src/secret/key'", "unsafe_argument"),
        ("zip -q src/z.zip src/a.txt -T -TT 'touch pwned'", "unsafe_argument"),
        ("install -s --strip-program=sh src/evil src/out", "unsafe_argument"),
        ("tar -cf x:y --rsh-command=src/evil src/a.txt", "unsafe_argument"),
        ("tar -vCsrc/secret -cf - key", "unsafe_argument"),  # -C moves where names resolve
        ("tar -vC/etc -cf - hostname", "unsafe_argument"),
        ("tar -cf/tmp/out.tar src/a.txt", "outside_worktree"),
        ("tar -xf src/h.tar", "unsafe_argument"),  # extracting writes the names the archive holds
        ("tar xf src/h.tar", "unsafe_argument"),
        ("tar -cf - -T src/list", "unsafe_argument"),
        ("tar -cf src/h.tar --transform=s,^src/pc,.git/hooks/pre-commit, src/pc", "unsafe_argument"),
        ("unzip -qd/tmp/uz src/z.zip", "unsafe_argument"),
        ("patch -p1 src/a.txt src/p.diff", "unsafe_argument"),
        ("shuf -eo/tmp/shuf.out hi", "outside_worktree"),
        ("cat - 0<>src/secret/key", "denied"),  # `<>` reads as well as writes
        ("mv src/secret/key src/k", "denied"),  # what is moved is read
        ("uniq src/a.txt docs/uniq", "unmatched"),  # the second operand is the output
        ("shuf -o docs/x src/a.txt", "unmatched"),
        ("split src/a.txt docs/pre", "unmatched"),
        ("tar -cf docs/x.tar src/a.txt", "unmatched"),
        ("tar czf docs/x.tgz src/a.txt", "unmatched"),
        ("wc --files0-from=src/list", "unsafe_argument"),
        ("rm /dev/null", "outside_worktree"),  # a device is no argument to write
        ("mv src/a.txt /dev/stdout", ("proc", "outside_worktree")),  # where the test's stdout really is
        ("touch /dev/stdout", ("proc", "outside_worktree")),
        ("ln src/a.txt", "unmatched"),  # makes ./a.txt at the root
    ],
)
def test_programs_without_a_table_still_name_their_files(worktree, command, why):
    kinds = why if isinstance(why, tuple) else (why,)
    policy = Policy([RuleConfig.model_validate(r) for r in TOOLS], worktree)
    refused(policy.judge_execute(["bash", "-c", command]), *kinds)


@pytest.mark.parametrize(
    "command",
    ["cut -d/ -f2 src/a.txt", "cut -d / -f1 src/a.txt", "echo done: /", "head -c 100 /dev/urandom",
     "tar czf src/x.tgz src/a.txt", "tar -tf src/x.tgz", "gcc -osrc/app -Wall -O2 src/a.c", "unzip -l src/z.zip",
     "diff src/a.txt /dev/null"],
)  # fmt: skip
def test_ordinary_work_with_those_programs(worktree, command):
    verdict = Policy([RuleConfig.model_validate(r) for r in TOOLS], worktree).judge_execute(["bash", "-c", command])
    assert verdict.allowed, verdict


@pytest.mark.parametrize("command", ["/bin/rm -rf src", "./rm src", "rm -rf src", "/usr/bin/git push origin main"])
def test_a_deny_sees_the_program_by_its_name_wherever_it_lives(worktree, command):
    rules = [{"id": "all", "kind": "execute", "commands": ["*"], "decision": "allow"},
             {"id": "no-rm", "kind": "execute", "commands": ["rm *"], "decision": "deny"},
             {"id": "no-push", "kind": "execute", "commands": ["git push*"], "decision": "deny"},
             *CAREFUL[:2]]  # fmt: skip
    verdict = refused(Policy([RuleConfig.model_validate(r) for r in rules], worktree).judge_execute(command), "denied")
    assert verdict.rule_ids[0] in ("no-rm", "no-push")


# --- nested repositories and hard links -----------------------------------------------------------


@pytest.mark.parametrize(
    ("plant", "command", "cwd"),
    [
        ("src/sub/.git/config", "git status", "src/sub"),
        ("src/sub/.git/config", "git status", "src/sub/deeper"),
        ("src/sub/.git", "git diff HEAD", "src/sub"),  # a gitfile
        ("src/bare/HEAD", "git log -1", "src/bare"),  # a bare repository: HEAD, objects/, refs/
        ("src/sub/.git/config", "ls", "src/sub"),  # any program may run git (pytest plugins, make)
    ],
)
def test_commands_inside_a_nested_repository_are_refused(policy, worktree, plant, command, cwd):
    (worktree / plant).parent.mkdir(parents=True, exist_ok=True)
    (worktree / plant).write_text("[core]\n\tfsmonitor = touch pwned\n")
    (worktree / "src" / "bare" / "objects").mkdir(parents=True, exist_ok=True)
    (worktree / "src" / "bare" / "refs").mkdir(exist_ok=True)
    (worktree / cwd).mkdir(parents=True, exist_ok=True)
    refused(policy.judge_execute(command, cwd=str(worktree / cwd)), "nested_repository")
    with_cd = Policy(
        [*policy.rules, RuleConfig(id="cd", kind="execute", commands=["cd *"], decision="allow")], worktree
    )
    refused(with_cd.judge_execute(f"cd {cwd} && {command}"), "nested_repository")


@pytest.mark.parametrize("target", ["../outside.txt", ".git/config", "src/secret/key"])
@pytest.mark.parametrize("how", ["read", "write", "cat", "redirect"])
def test_a_hard_link_never_reaches_its_other_name(policy, worktree, target, how):
    os.link(worktree / target, worktree / "src" / "link.txt")
    verdict = {
        "read": lambda: policy.judge_read("src/link.txt"),
        "write": lambda: policy.judge_write("src/link.txt"),
        "cat": lambda: policy.judge_execute("cat src/link.txt"),
        "redirect": lambda: policy.judge_execute("ls > src/link.txt"),
    }[how]()
    refused(verdict, "hard_link")


# --- where a cd cannot have moved the shell -------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "why"),
    [
        ("ls || cd src/x/y && echo pwned > ../../../../pwn", "outside_worktree"),  # `ls` ran: the cd never did
        ("ls | cd src && echo pwned > README.md", "unmatched"),  # a pipeline's cd moves nothing
        ("ls || cd src && cat src/secret/key", "denied"),
        ("cd nope || (ls) && cat src/secret/key", "denied"),
        ("cd nope || bash -c ls && cat src/secret/key", "denied"),
        ("pushd src && popd && cat src/secret/key", "denied"),
        ("cd src & cat src/secret/key", "denied"),
    ],
)
def test_where_a_cd_cannot_have_moved_the_shell(worktree, script, why):
    rules = [*CAREFUL, {"id": "moves", "kind": "execute", "commands": ["cd *", "pushd *", "popd", "echo *"],
                        "decision": "allow"}]  # fmt: skip
    refused(Policy([RuleConfig.model_validate(r) for r in rules], worktree).judge_execute(["bash", "-c", script]), why)


# --- the turn gate, permission answers, terminals and the search path -----------------------------


@pytest.mark.parametrize(
    ("turn_", "session", "why"),
    [
        (Turn(None, frozenset({"s1"})), "s1", "outside_turn"),  # after the turn's answer
        (Turn("s2", frozenset({"s1", "s2"})), "s1", "outside_turn"),  # an earlier task's session
        (Turn("s1", frozenset({"s1"})), "s9", "unknown_session"),
        (Turn(None, frozenset()), "s1", "unknown_session"),  # before any turn
    ],
)
def test_only_the_running_turns_session_may_act(policy, turn_, session, why):
    refused(policy.write(session, "src/ok.txt", turn_), why)
    refused(policy.read(session, "src/a.txt", turn_), why)
    refused(policy.terminal(session, "ls", [], {}, None, turn_), why)
    verdict = refused(policy.permission(session, {"kind": "read", "locations": [{"path": "src/a.txt"}]},
                                        [("ok", "allow_once"), ("no", "reject_once")], turn_), why)  # fmt: skip
    assert verdict.option_id == "no"
    assert policy.write("s1", "src/ok.txt", Turn("s1", frozenset({"s1"}))).allowed


OPTIONS = [("ok", "allow_once"), ("always", "allow_always"), ("no", "reject_once")]
HOST_TOOL = {"title": "mcp__loop-harness-host__open_proposal", "kind": "other", "rawInput": {}}
IN_TURN = Turn("s1", frozenset({"s1"}), frozenset({"get_issue"}))


@pytest.mark.parametrize(
    ("tool_call", "options", "turn_", "allowed", "option", "why"),
    [
        ({"kind": "read", "locations": [{"path": "src/a.txt"}]}, OPTIONS, IN_TURN, True, "ok", "allowed"),
        ({"kind": "read", "locations": [{"path": "src/a.txt"}]}, OPTIONS[1:], IN_TURN, False, "no",
         "no_allow_once_option"),  # never allow_always: the agent could keep it past the policy
        ({"kind": "read", "locations": [{"path": "src/a.txt"}]}, OPTIONS[1:2], IN_TURN, False, None,
         "no_allow_once_option"),  # nothing to reject with: answered `cancelled`
        ({"kind": "edit", "locations": [{"path": "docs/a.md"}]}, OPTIONS, IN_TURN, False, "no", "unmatched"),
        ({**HOST_TOOL, "title": "mcp__loop-harness-host__get_issue"}, OPTIONS, IN_TURN, True, "ok", "host_tool"),
        (HOST_TOOL, OPTIONS, IN_TURN, False, "no", "unmatched"),  # not in the role's allowlist
        ({**HOST_TOOL, "title": "mcp__other__get_issue"}, OPTIONS, IN_TURN, False, "no", "unmatched"),
        ({**HOST_TOOL, "kind": "execute", "title": "mcp__loop-harness-host__get_issue"}, OPTIONS, IN_TURN, False,
         "no", "no_target"),  # a host tool's title on another kind is that kind's request
    ],
)  # fmt: skip
def test_permission_answers(policy, tool_call, options, turn_, allowed, option, why):
    verdict = policy.permission("s1", tool_call, options, turn_)
    assert (verdict.allowed, verdict.option_id, verdict.reason["kind"]) == (allowed, option, why)


@pytest.mark.parametrize(
    ("command", "args", "env", "cwd", "argv", "why"),
    [
        ("git", ["status"], {}, None, ("git", "status"), "allowed"),
        ("git status && ls src", None, {}, None, ("bash", "-c", "git status && ls src"), "allowed"),
        ("git status && touch x", None, {}, None, None, "unmatched"),
        ("ls", [], {"LANG": "C", "CLAUDECODE": "1"}, "src", ("ls",), "allowed"),
        ("ls", [], {"GIT_DIR": "x"}, None, None, "unsafe_env"),
        ("ls", [], {"PATH": "src"}, None, None, "unsafe_env"),
        ("ls", [], {}, "/tmp", None, "outside_worktree"),
    ],
)
def test_terminals(policy, worktree, command, args, env, cwd, argv, why):
    verdict = policy.terminal("s1", command, args, env, cwd and str(worktree / cwd), IN_TURN)
    assert verdict.reason["kind"] == why
    if argv is not None:
        assert (Path(verdict.argv[0]).name, *verdict.argv[1:]) == argv
        assert verdict.workdir == str(worktree / (cwd or "") if cwd else worktree)


def test_path_keeps_no_directory_the_agent_can_write(policy, worktree):
    outside = "/usr/local/bin:/usr/bin"
    value = f"{worktree}/src/bin:bin:.:{worktree}/docs/bin::{outside}"
    assert policy.search_path(value) == f"{worktree}/docs/bin:{outside}"  # docs/ is not writable
