"""How a script is read as bash reads it: words, quotes, operators and comments; shells unwrapped, with their
options, and nested; `cd` and where each command runs.

Most cases are tables judged in-process, against the shared worktree (policy_corpus.build_worktree) under the
careful policy; two differential checks run random scripts through real bash and compare.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess

import pytest

from harness import Policy
from harness.config._config import RuleConfig
from harness.policy._shell import Unparseable, parse_invocation, parse_script
from harness.pytest_plugin import LOOP_SCRIPTED
from tests.helpers.policy_corpus import CAREFUL, WITH_CD, bash, expect, policy_of, refused

pytestmark = LOOP_SCRIPTED


# --- scripts split into commands ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "commands"),
    [
        ("git status", ["git status"]),
        ("a && b || c; d | e & f", ["a", "b", "c", "d", "e", "f"]),
        ("git commit -m 'a && b'", ["git commit -m 'a && b'"]),
        ("sh -c 'git add -A; git push'", ["git add -A", "git push"]),
    ],
)
def test_scripts_split_into_simple_commands(text, commands):
    assert [c.text for c in parse_invocation(text).commands] == commands


def test_unparseable_scripts_say_why():
    with pytest.raises(Unparseable, match="cannot be judged"):
        parse_invocation("echo $(id)")
    with pytest.raises(Unparseable, match="no command"):
        parse_invocation(" ; ")


# --- operators glued to words ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("ls;(rm -rf src)", "unmatched"),
        ("ls;>.git/config", "protected_path"),
        ("ls&&>.git/config", "protected_path"),
        ("(ls)>.git/config", "protected_path"),  # a subshell's redirection is judged too
        ("echo x > src/out.txt; rm -rf src", "unmatched"),  # the target ends at `;`: rm is judged
        ("echo x > src/out.txt rm -rf src", "allowed"),  # ... but here rm, -rf and src are echo's words
        ("git status > /dev/null > .git/config", "protected_path"),  # every redirection, not the first
        ("git status 2>/dev/null >docs/x", "unmatched"),
        ("ls >> docs/x", "unmatched"),  # each way of opening a file for writing is a write
        ("ls >| docs/x", "unmatched"),
        ("ls &> docs/x", "unmatched"),
        ("ls &>> docs/x", "unmatched"),
        ("ls >& docs/x", "unmatched"),
        ("ls <> docs/x", "unmatched"),
        ("ls 2> docs/x", "unmatched"),
        ("ls > src/x", "allowed"),
        ("ls < docs/r.md", "allowed"),  # `<` only reads
        ("cat < src/secret/key", "denied"),
        ("cat 0< src/secret/key", "denied"),
        ("ls >&2", "allowed"),  # duplicates an fd: no file
        ("ls 2>&1 >&-", "allowed"),
        ("ls <&0", "allowed"),
        ("ls <&x", "unparseable"),
        ("ls >", "unparseable"),
        ("ls > ;", "unparseable"),
        ("ls|>docs/x", "unmatched"),
        ("ls|rm -rf src", "unmatched"),
        ("ls||rm -rf src", "unmatched"),
        ("ls&rm -rf src", "unmatched"),
        ("ls&&rm -rf src", "unmatched"),
        ("ls|&rm -rf src", "unmatched"),
        ("ls\nrm -rf src", "unmatched"),
        ("ls\n\nls\n", "allowed"),
        ("ls &&\nls", "allowed"),
        ("ls;", "allowed"),
        ("ls &", "allowed"),
        ("; ls", "unparseable"),
        ("&& ls", "unparseable"),
        ("ls &&", "unparseable"),
        ("ls |", "unparseable"),
        ("(ls", "unparseable"),
        ("ls)", "unparseable"),
        ("( )", "unparseable"),
        ("(ls &&)", "unparseable"),
        ("(ls) ls", "unparseable"),  # a word after `)`
        ("ls (ls)", "unparseable"),  # `(` after a word: a function definition
        ("", "unparseable"),
        ("ls;;", "unparseable"),
        ("cat <<EOF", "unparseable"),
        ("cat <<<x", "unparseable"),
        ("cat <(ls)", "unparseable"),
        ("ls >(cat)", "unparseable"),
        ("((x=1))", "unparseable"),
    ],
)
def test_operators_end_words_wherever_they_are_glued(careful, script, outcome):
    expect(careful.judge_execute(["bash", "-c", script]), outcome)


# --- the quote state machine ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("ls '$HOME'", "allowed"),  # single quotes keep `$` literal
        ("ls '`id`'", "allowed"),
        ("ls '\\'", "allowed"),  # and a backslash
        ("ls '*' '?' '[a]' '{a,b}' '~'", "allowed"),
        ("ls '\"'", "allowed"),
        ('ls "\'"', "allowed"),
        ("ls 'a\"'", "allowed"),
        ("ls \"a b\"'c d'e", "allowed"),
        ('ls "$HOME"', "unparseable"),  # double quotes expand `$`, backquotes and backslashes
        ('ls "`id`"', "unparseable"),
        ('ls "a\\"b"', "unparseable"),
        ("ls 'a'$HOME", "unparseable"),  # quotes end: the expansion after them is unquoted
        ('ls "a"`id`', "unparseable"),
        ("ls $HOME", "unparseable"),
        ("ls `id`", "unparseable"),
        ("ls \\x", "unparseable"),  # an unquoted backslash
        ("ls a\\;rm", "unparseable"),
        ("ls *", "unparseable"),  # globs
        ("ls src/?", "unparseable"),
        ("ls [ab]", "unparseable"),
        ("ls {a,b}", "unparseable"),
        ("ls a}", "unparseable"),
        ("ls 'unterminated", "unparseable"),
        ('ls "unterminated', "unparseable"),
        ("ls \"a'b", "unparseable"),
        ("ls 'it''s'", "allowed"),
    ],
)
def test_quotes_keep_what_bash_keeps_literal_and_nothing_else(careful, script, outcome):
    expect(careful.judge_execute(["bash", "-c", script]), outcome)


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("cat 'src/secret/key'", "denied"),  # quote removal before judging
        ('cat "src/secret"/key', "denied"),
        ("cat src/'secret'/\"key\"", "denied"),
        ("'rm' -rf src", "unmatched"),
        ("\"git\" 'push' origin", "denied"),
        ("'git' 'log' -1", "allowed"),  # the words are what rules match: `git log -1`
    ],
)
def test_quoted_words_are_judged_after_quote_removal(careful, script, outcome):
    expect(careful.judge_execute(["bash", "-c", script]), outcome)


# --- word starts and separators: the lexer is bash's ----------------------------------------------


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("ls >~/.bashrc", "unparseable"),  # a tilde at a word's start expands
        ("ls >&~", "unparseable"),
        ("ls ~", "unparseable"),
        ("ls a=~/x", "unparseable"),  # ... and after `=` or `:`
        ("ls a:~/x", "unparseable"),
        ("ls a~b", "allowed"),  # elsewhere it is a letter
        ("ls\t#x", "unparseable"),  # a comment after a tab
        ("ls #x", "unparseable"),
        ("#x", "unparseable"),
        ("ls a#b", "allowed"),  # `#` inside a word is a letter
        ("ls a#b;rm -rf src", "unmatched"),
        ("git push\torigin main", "denied"),  # a tab separates words as a space does
        ("git\tpush origin x", "denied"),
        ("git  log  -1", "allowed"),
        ("ls\x0bsrc", "unmatched"),  # a vertical tab does not: `ls\vsrc` is one word
        ("ls\u00a0src", "unmatched"),
    ],
)
def test_words_start_and_end_where_bash_says(careful, script, outcome):
    expect(careful.judge_execute(["bash", "-c", script]), outcome)


@pytest.mark.parametrize(
    "script",
    [
        "ls\r/../../../../../../usr/bin/touch pwned",  # bash runs a program named `ls\r/../..`
        "ls\x0b/../../usr/bin/touch pwned",
        "ls\x0c/../../usr/bin/touch pwned",
        "ls\r;touch pwned",  # `ls\r` is one word for bash: the allowed `ls` never runs
        "cat src/a.txt\r> .git/config",  # `src/a.txt\r` is the argument, `.git/config` the target
        "ls > src/ok\r/../../.git/config",  # the target is one word: it resolves into .git
        "ls src/a.txt\x00; touch pwned",
        "ls \ud800",
        "bash \u0662>/dev/null -c ls",  # an Arabic-Indic digit is a word for bash: it runs the file
        "bash 2147483648>/dev/null -c ls",  # past INT_MAX bash takes it for a word too
        "bash 12>/dev/null -c ls",  # dash reads `12` as a word, bash as an fd
        "ls >&\u0662",  # not a digit for bash: a file named so, outside src/
        "compgen -W 'x' x",
    ],
    ids=[
        "cr-path",
        "vt-path",
        "ff-path",
        "cr-semicolon",
        "cr-redirect",
        "cr-target",
        "nul",
        "surrogate",
        "unicode-fd",
        "huge-fd",
        "two-digit-fd",
        "unicode-dup",
        "compgen",
    ],
)
def test_bytes_bash_keeps_inside_a_word_stay_inside_it(policy, script):
    refused(
        policy.judge_execute(["bash", "-lc", script]), "unmatched", "unparseable", "protected_path", "outside_worktree"
    )


@pytest.mark.parametrize(
    ("script", "words"),
    [
        ("ls\ra b", [["ls\ra", "b"]]),
        ("ls\x0b\x0cx", [["ls\x0b\x0cx"]]),
        ("ls\u00a0src", [["ls\u00a0src"]]),  # a no-break space is no blank for bash either
        ("git status 2>&1 | cat", [["git", "status"], ["cat"]]),
        ("ls 'a b' \"c d\" e'f'g", [["ls", "a b", "c d", "efg"]]),
    ],
)
def test_words_are_split_where_bash_splits_them(script, words):
    assert [list(c.words) for c in parse_script(script).commands if c.words] == words


_FUZZ_PIECES = ["aa", "bb", "cc", "dd", "x=y", "'q r'", '"s t"', "'", '"', " ", " ", "\t", "\r", "\x0b", "\x0c",
                "\u00a0", "é", ";", "&", "&&", "|", "||", "|&", "\n", "(", ")", "#", "-e", "=", "2"]  # fmt: skip
BASH = shutil.which("bash") or "/bin/bash"
_BASH_BUILTINS = frozenset(subprocess.run([BASH, "-c", "compgen -b -k"], capture_output=True, text=True).stdout.split())


@pytest.mark.skipif(shutil.which("bash") is None, reason="the differential check needs bash")
def test_every_command_bash_runs_is_one_the_policy_judged(tmp_path):
    """Differential: random scripts from the bytes that matter run through real bash, whose
    command_not_found_handle logs each argv it would run; every one must be among the commands the
    parser returned (pipes and `&` reorder them, `||` may skip some: a multiset inclusion)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    logs = tmp_path / "argv"
    prelude = tmp_path / "prelude.sh"  # one file per command run: pipelines run them concurrently
    prelude.write_text(f"command_not_found_handle() {{ n=$((n+1)); printf '%s\\037' \"$@\" > {logs}/$BASHPID.$n; }}\n")
    rng = random.Random(8)
    judged = compared = 0
    for _ in range(400):
        script = "".join(rng.choice(_FUZZ_PIECES) for _ in range(rng.randint(1, 10)))
        try:
            commands = [c.words for c in parse_script(script).commands if c.words]
        except Unparseable:
            continue
        judged += 1
        if any(c[0] in _BASH_BUILTINS for c in commands):
            continue
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir()
        env = {"PATH": str(empty), "BASH_ENV": str(prelude), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
        subprocess.run([BASH, "-c", script], cwd=tmp_path, env=env, capture_output=True, timeout=10,
                       stdin=subprocess.DEVNULL, check=False)  # fmt: skip
        # bytes, not text: universal newlines would turn \r into \n
        ran = [tuple(f.read_bytes().decode().split("\x1f")[:-1]) for f in logs.iterdir()]
        remaining = list(commands)
        for argv in ran:
            assert argv in remaining, f"bash ran {argv!r} for {script!r}; the policy judged {commands!r}"
            remaining.remove(argv)
        compared += 1
    assert judged > 100 and compared > 80, (judged, compared)


# --- unwrapping shells: options and nesting as bash reads them ------------------------------------


@pytest.mark.parametrize(
    ("argv", "outcome"),
    [
        (["bash", "check.sh", "git status"], "unmatched"),  # bash runs the script file check.sh
        (["bash", "-c", "git status"], "allowed"),
        (["/bin/bash", "-c", "git status"], "allowed"),
        (["/usr/bin/sh", "-c", "git status"], "allowed"),
        (["/usr/local/bin/dash", "-c", "git status"], "allowed"),
        (["/opt/bin/bash", "-c", "git status"], "unmatched"),
        (["bash", "-c", "bash -c 'sh -c \"git push origin x\"'"], "denied"),
        (["bash", "+c", "ls"], "unparseable"),
        (["bash", "-x", "-c", "ls"], "allowed"),
        (["bash", "-o", "pipefail", "-o", "errexit", "-c", "ls"], "allowed"),
        (["bash", "-oo", "pipefail", "nounset", "-c", "ls"], "allowed"),
        (["bash", "-o", "posix", "-c", "ls"], "unparseable"),
        (["bash", "-o"], "unparseable"),
        (["bash", "-c"], "unparseable"),
        (["bash", "--login", "-c", "ls"], "allowed"),
        (["bash", "--posix", "-c", "ls"], "unparseable"),
        (["bash", "-"], "unparseable"),
        (["bash", "x"], "unmatched"),
        (["bash", "-c", "ls", "$0"], "allowed"),
        (["bash", "-c", "bash -c " + "'bash -c \"ls\"'"], "allowed"),
    ],
)
def test_shells_are_unwrapped_only_where_bash_runs_the_script(careful, argv, outcome):
    expect(careful.judge_execute(argv), outcome)


def test_shells_nested_too_deep_are_refused(careful):
    verdict = expect(careful.judge_execute(_nest(10)), "unparseable")
    assert "nested" in verdict.reason["why"]
    expect(careful.judge_execute(_nest(7)), "allowed")


def _nest(depth: int) -> list[str]:
    """`bash -c` nested `depth` times around `ls`, each level quoted for the one around it."""
    import shlex

    script = "ls"
    for _ in range(depth):
        script = shlex.join(["bash", "-c", script])
    return ["bash", "-c", script]


@pytest.mark.parametrize(
    "argv",
    [
        ["bash", "-", "-c", "ls src"],  # `-` ends the options: bash runs a file named -c
        ["sh", "-", "-c", "ls src"],
        ["bash", "--", "-c", "ls src"],
        ["bash", "-s", "-c", "ls src"],  # reads its commands from stdin
        ["bash", "-i", "-c", "ls src"],  # interactive: aliases, history, ~/.bashrc
        ["bash", "-O", "extglob", "-c", "ls src"],  # changes how the script is parsed
        ["bash", "-o", "history", "-c", "ls src"],
        ["bash", "+O", "extglob", "-c", "ls src"],
        ["bash", "--rcfile", "src/rc", "-c", "ls src"],
        ["bash", "-k", "-c", "ls src"],  # -k: assignments anywhere reach the environment
        ["bash", "-c"],
        ["bash"],  # reads stdin
        ["bash", "check.sh", "ls src"],  # runs the script file check.sh
        ["dash", "-c", "bash -s"],
        ["src/sh", "-c", "ls src"],  # a program named like a shell is not one
        ["/tmp/x/bash", "-c", "ls src"],
        ["src/git", "log", "-1"],  # nor is one named like git
    ],
)
def test_shell_options_are_parsed_as_bash_parses_them(policy, argv):
    refused(policy.judge_execute(argv), "unparseable", "unmatched")


@pytest.mark.parametrize(
    "argv",
    [["bash", "-lc", "ls src"], ["bash", "-c", "-l", "ls src"], ["bash", "-euo", "pipefail", "-c", "ls src"],
     ["sh", "-c", "ls src", "arg0"], ["bash", "--noprofile", "--norc", "-ec", "ls src"],
     ["bash", "-c", "--", "ls src"]],
)  # fmt: skip
def test_the_usual_wrappers_are_unwrapped(policy, argv):
    assert policy.judge_execute(argv).allowed


@pytest.mark.parametrize(
    ("argv", "outcome"),
    [
        (["bash", "-c", "printf '$(id)'"], "unparseable"),  # builtins that evaluate `$(...)` in their arguments
        (["bash", "-c", "printf '%s' '$(id)'"], "unparseable"),
        (["bash", "-c", "test '`id`'"], "unparseable"),
        (["bash", "-c", "/usr/bin/printf '$(id)'"], "unparseable"),
        (["bash", "-c", "echo '$(id)'"], "allowed"),  # echo prints it as it is
        (["bash", "-c", "ls >&123456789"], "allowed"),  # duplicates an fd
        (["bash", "-c", "ls >&1234567890"], "unmatched"),  # a file of that name, at the root
        (["bash", "-c", "ls 2>&1"], "allowed"),
        (["bash", "-c", "ls 1>&-"], "allowed"),
        (["bash", "+x", "-c", "ls"], "allowed"),
        (["bash", "+o", "pipefail", "-c", "ls"], "allowed"),
        (["bash", "-oc", "pipefail", "ls"], "allowed"),  # -o takes the next word, -c the one after
        (["bash", "-co", "pipefail", "ls"], "allowed"),
        (["bash", "-oc", "posix", "ls"], "unparseable"),
        (["bash", "-c", "ls", "-x"], "allowed"),  # words after the script are $0, $1
        (["bash", "-lc"], "unparseable"),
        (["bash", "-", "x"], "unmatched"),  # runs the file x
        (["bash", "-e"], "unparseable"),  # reads stdin
        (["bash", "x", "-c", "ls"], "unmatched"),
        (["sh", "-c", "ls", "sh"], "allowed"),
        (["dash", "-c", "cd src && cat secret/key"], "denied"),
        (["bash", "-c", "sh -c 'cd src' && cat secret/key"], "allowed"),  # a nested shell's cd stays in it
        (["bash", "-c", "sh -c 'cd src && cat secret/key'"], "denied"),
        (["bash", "-c", "bash -c 'ls' > docs/x"], "unmatched"),  # the wrapper's own redirection
        (["bash", "-c", "bash -c 'ls' > src/x"], "allowed"),
    ],
)
def test_shells_builtins_and_descriptors(careful, argv, outcome):
    expect(careful.judge_execute(argv), outcome)


# --- cd, and where each command runs --------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("pushd src && cat secret/key", "denied"),  # pushd moves the shell as cd does
        ("pushd src && popd && cat src/secret/key", "denied"),
        ("pushd docs && popd && cat secret/key", "allowed"),  # popd: back to where the script was
        ("cd src && cat secret/key", "denied"),
        ("cd src; cat secret/key", "denied"),  # the cd may have worked: judged from both places
        ("cd nope; cat src/secret/key", "denied"),
        ("cd src && (cd secret && cat key)", "denied"),
        ("(cd src) && cat secret/key", "allowed"),  # a subshell's cd stays in it
        ("cd src/out", "outside_worktree"),
        ("cd /tmp && ls", "outside_worktree"),
        ("cd ..", "outside_worktree"),
        ("cd", "unsafe_argument"),  # $HOME
        ("cd -", "unsafe_argument"),  # $OLDPWD
        ("pushd +1", "unsafe_argument"),
        ("cd src docs", "unsafe_argument"),
        ("cd -P src && cat secret/key", "denied"),
        ("cd -- src && cat secret/key", "denied"),
    ],
)
def test_where_commands_run_after_a_directory_change(careful, script, outcome):
    expect(careful.judge_execute(["bash", "-c", script]), outcome)


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("cd -P src && cat secret/key", "denied"),
        ("cd -L src && cat secret/key", "denied"),
        ("cd -e src && cat secret/key", "denied"),
        ("cd -@ src && cat secret/key", "denied"),
        ("cd -- src && cat secret/key", "denied"),
        ("cd -x src", "unsafe_argument"),
        ("cd -", "unsafe_argument"),
        ("cd +1", "unsafe_argument"),
        ("cd -1", "unsafe_argument"),
        ("cd docs && ls", "allowed"),
    ],
)
def test_cd_options_never_hide_where_it_goes(careful, command, outcome):
    expect(careful.judge_execute(["bash", "-c", command]), outcome)


@pytest.fixture(name="linked")
def linked_fixture(review_worktree):
    """`up` -> src/a/b: bash's cd reads `up/..` as `.`, the kernel as src/a."""
    (review_worktree / "src" / "a" / "b").mkdir(parents=True)
    os.symlink("src/a/b", review_worktree / "up")
    return Policy([RuleConfig.model_validate(r) for r in WITH_CD], review_worktree)


@pytest.mark.parametrize(
    ("script", "why"),
    [
        ("(cd up/../src/secret && cat key)", "denied"),  # bash is in src/secret; the kernel's reading, src/a/...
        ("cd up/../.. && cat outside.txt", "outside_worktree"),
        ("cd up/.. && echo x > docs.txt", "unmatched"),  # bash writes ./docs.txt, not src/a/docs.txt
        ("cd src; echo x > y.txt", "unmatched"),  # if the cd fails, y.txt is written where the script began
        ("(cd src) && echo x > y.txt", "unmatched"),  # a subshell's cd ends with it
        ("bash -c 'cd src' && echo x > y.txt", "unmatched"),  # so does a nested shell's
        ("cd src | echo x > y.txt", "unmatched"),
    ],
)
def test_cd_is_judged_as_bash_moves(linked, script, why):
    refused(linked.judge_execute(["bash", "-c", script]), why)


@pytest.mark.parametrize(
    "script", ["cd src && echo x > y.txt", "cd src && (echo x > y.txt)", "cd up/.. && cd src && echo x > y.txt"]
)
def test_cd_then_and_writes_where_the_cd_led(linked, script):
    assert linked.judge_execute(["bash", "-c", script]).allowed


class _Spy(Policy):
    """A policy that remembers where it judged each command to run (for the differential check below)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.places: dict[str, list[str]] = {}

    def _judge_step(self, step, cwds, approvals):
        if step.words:
            self.places[step.words[0]] = list(cwds)
        return super()._judge_step(step, cwds, approvals)


def test_every_command_runs_where_the_policy_judged_it(tmp_path):
    """Differential: random scripts of `cd`s, probes and operators run through real bash; each probe logs
    the directory it really ran in, which must be one of the places the policy judged it in."""
    root = tmp_path / "wt"
    for directory in ("src/a/b", "docs", "src/pkg"):
        (root / directory).mkdir(parents=True)
    os.symlink("src/a/b", root / "up")
    rules = [{"id": "all", "kind": "execute", "commands": ["*"], "decision": "allow"}, *CAREFUL[:2]]
    empty = tmp_path / "bin"
    empty.mkdir()
    os.symlink(BASH, empty / "bash")  # the only program there: nested shells run, every probe is "not found"
    logs = tmp_path / "where"
    prelude = tmp_path / "prelude.sh"
    prelude.write_text(f'command_not_found_handle() {{ pwd -P > {logs}/"$1"; return ${{2:-0}}; }}\n')
    places = ["src", "src/a", "docs", "nope", "up", "up/..", "up/../docs", "src/pkg", "."]
    operators = [" && ", " || ", "; ", " | ", "\n", " & "]
    rng = random.Random(80)
    compared = 0
    for _ in range(300):
        parts = []
        for index in range(rng.randint(2, 7)):
            part = f"cd {rng.choice(places)}" if rng.random() < 0.5 else f"probe{index} {rng.choice([0, 1])}"
            if rng.random() < 0.15:
                part = f"( {part} )" if rng.random() < 0.5 else f"bash -c '{part}'"
            parts.append(part)
        script = parts[0] + "".join(rng.choice(operators) + p for p in parts[1:])
        spy = _Spy([RuleConfig.model_validate(r) for r in rules], root)
        if not spy.judge_execute(["bash", "-c", script]).allowed:
            continue
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir()
        env = {"PATH": str(empty), "BASH_ENV": str(prelude), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
        subprocess.run([BASH, "-c", f"{script}\nwait"], cwd=root, env=env, capture_output=True, timeout=10, check=False)
        for log in logs.iterdir():
            judged = {os.path.realpath(root / p) for p in spy.places[log.name]}
            assert log.read_text().strip() in judged, f"{log.name} ran elsewhere in {script!r}: judged {judged}"
            compared += 1
    assert compared > 300, compared


def test_cd_to_an_absolute_place_inside_is_judged_where_it_leads(careful, worktree):
    expect(careful.judge_execute(["bash", "-c", f"cd {worktree}/src && cat secret/key"]), "denied")
    expect(careful.judge_execute(["bash", "-c", f"cd {worktree}/docs && cat ../src/a.txt"]), "allowed")
    expect(careful.judge_execute(["bash", "-c", f"cd {worktree}/../wt2 && ls"]), "outside_worktree")


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("cd {root}/src/gitlink/../secret && cat key", "denied"),  # bash drops gitlink/.. as text: src/secret
        ("cd /proc/self/root{root}/src/gitlink/../secret && cat key", "outside_worktree"),
        ("cd /proc/self/root{root}/src", "outside_worktree"),  # not the worktree's own spelling: refused
        ("cd {root}/src && cat a.txt", "allowed"),
    ],
)
def test_cd_to_the_worktrees_absolute_path_is_judged_where_bash_lands(own_worktree, script, outcome):
    """`cd` is logical: an absolute path under the worktree's own is judged as the relative place bash lands
    in; an absolute path that does not start with it is refused, even where the kernel would take it inside
    (bash's later `cd ..` would climb that spelling, not the worktree)."""
    careful = policy_of(own_worktree, CAREFUL)
    verdict = expect(bash(careful, script.format(root=own_worktree)), outcome)
    if outcome == "denied":
        assert verdict.rule_ids == ("no-secret-read",)


@pytest.mark.parametrize(
    ("script", "path"),
    [("cd src/keylink/../../..", "src/keylink/../../.."), ("cd src && cd keylink/../../..", "keylink/../../..")],
)
def test_a_cd_bash_reads_as_leaving_the_worktree_names_its_path(careful, script, path):
    """bash drops `link/..` as text (src/keylink/../../.. is above the worktree), the kernel's reading follows
    the link (it stays inside): the refusal names the path as written."""
    verdict = expect(careful.judge_execute(script), "outside_worktree")
    assert verdict.reason == {"kind": "outside_worktree", "path": path, "why": "cd leaves the worktree"}


def test_a_script_that_moves_between_too_many_directories_is_refused_naming_it(tmp_path):
    """Past 16 places a `cd` may have led to (the first place counts), the script is too tangled to judge:
    refused, the refusal quoting the request as the agent sent it (a script, a command with args, or an argv)."""
    (tmp_path / ".git").mkdir()
    root = tmp_path.resolve()
    for n in range(17):
        (tmp_path / f"d{n}").mkdir()
    policy = policy_of(
        tmp_path, [*CAREFUL, {"id": "sh", "kind": "execute", "commands": ["sh -c *"], "decision": "allow"}]
    )
    script = " || ".join(f"cd {root}/d{n}" for n in range(17))
    why = "too many directory changes"
    for request, quoted in [
        ((script,), script),
        (("sh", ["-c", script]), f"sh -c {script}"),
        ((["sh", "-c", script],), f"sh -c {script}"),
    ]:
        verdict = expect(policy.judge_execute(*request), "unparseable")
        assert verdict.reason == {"kind": "unparseable", "command": quoted, "why": why}, request
    expect(policy.judge_execute(" || ".join(f"cd {root}/d{n}" for n in range(15))), "allowed")  # 16 with the root


@pytest.mark.parametrize(
    ("request_", "quoted", "why"),
    [
        (("ls $(x)",), "ls $(x)", "parameter expansion ($) cannot be judged before the shell expands it"),
        (("ls", ["a\0"]), "ls a\0", "a NUL character cannot be passed to a program"),
        ((["ls", "a\0"],), "ls a\0", "a NUL character cannot be passed to a program"),
        ((["", "x"],), " x", "not a command: ['', 'x']"),
        (("ls", "src"), "ls s r c", "args is not a list: 'src'"),  # as the agent's letters would be spread
    ],
    ids=["script", "command-and-args", "argv", "no-program", "args-a-string"],
)
def test_a_request_the_parser_cannot_read_is_refused_quoting_it_whole(careful, request_, quoted, why):
    verdict = expect(careful.judge_execute(*request_), "unparseable")
    assert verdict.reason == {"kind": "unparseable", "command": quoted, "why": why}


# --- what a careful user runs still works ---------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    ["git status", "git log --oneline -5", "ls src", "ls", "cat src/a.txt", "ls src > src/listing.txt",
     "git status 2>&1 | cat", "git log --format='%h %s' -- docs", "cat src/a.txt >> src/b.txt",
     "git status > /dev/null 2>&1", "python -m pytest -q docs", "python -m pytest -p no:cacheprovider",
     "git log --output=src/log.txt", "ls && git status\ncat src/a.txt", "cat src/a.txt >/dev/stderr",
     "ls 1>/dev/stdout 2>/dev/null"],
)  # fmt: skip
def test_what_a_careful_user_allows_still_works(policy, command):
    assert policy.judge_execute(["/bin/bash", "-lc", command]).allowed, policy.judge_execute(command)
