"""What each program's arguments read, write and run: tar, sed, pytest, git, the recursive readers, every other
program the policy has a record of, and programs it has none for.

The tables judge against the shared worktree (policy_corpus.build_worktree) under TOOLS: the careful policy with
each program of policy_corpus.PROGRAMS allowed with any arguments, so what the program's record decides is what
the verdict says. The recorded rows (policy_verdicts.jsonl) are test_policy_verdict_rows.py's.
"""

from __future__ import annotations

import os

import pytest

from harness.pytest_plugin import LOOP_SCRIPTED
from tests.helpers.policy_corpus import TOOLS, expect, policy_of, refused

pytestmark = LOOP_SCRIPTED


# --- tar ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("tar -cf docs/x.tar src/a.txt", "unmatched"),  # every way of making or changing an archive writes it
        ("tar -rf docs/x.tar src/a.txt", "unmatched"),
        ("tar -uf docs/x.tar src/a.txt", "unmatched"),
        ("tar -Af docs/x.tar src/y.tar", "unmatched"),
        ("tar --create -f docs/x.tar src/a.txt", "unmatched"),
        ("tar --append -f docs/x.tar src/a.txt", "unmatched"),
        ("tar --update -f docs/x.tar src/a.txt", "unmatched"),
        ("tar --cre -f docs/x.tar src/a.txt", "unmatched"),  # abbreviated
        ("tar rf docs/x.tar src/a.txt", "unmatched"),  # old style: no dash
        ("tar uf docs/x.tar src/a.txt", "unmatched"),
        ("tar cf docs/x.tar src/a.txt", "unmatched"),
        ("tar -tf docs/r.md", "allowed"),  # listing reads the archive
        ("tar tf docs/r.md", "allowed"),
        ("tar -cf src/x.tar src/a.txt", "allowed"),
        ("tar -cf src/x.tar src/secret", "denied"),
        ("tar -cvf src/x.tar src/a.txt", "allowed"),
        ("tar -xf src/x.tar", "unsafe_argument"),
        ("tar xvf src/x.tar", "unsafe_argument"),
        ("tar -cf src/x.tar -C docs r.md", "unsafe_argument"),
    ],
)
def test_tar_writes_the_archive_it_makes_and_only_lists_others(worktree, command, outcome):
    expect(policy_of(worktree, TOOLS).judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("tar -cf h:x src/a.txt", "unsafe_argument"),  # HOST:FILE: a remote archive through rsh
        ("tar -c -f h:x src/a.txt", "unsafe_argument"),
        ("tar cf h:x src/a.txt", "unsafe_argument"),
        ("tar -tf h:x", "unsafe_argument"),
        ("tar --create --file h:x src/a.txt", "unsafe_argument"),
        ("tar -cf src/h:x src/a.txt", "allowed"),  # a colon after a slash is a local name
        ("tar -cf src/h:x --force-local src/a.txt", "allowed"),
        ("tar --delete -f docs/x.tar m", "unmatched"),  # deleting members rewrites the archive
        ("tar --delete -f src/x.tar m", "allowed"),
        ("tar --catenate -f docs/x.tar src/y.tar", "unmatched"),
        ("tar --concatenate -f docs/x.tar src/y.tar", "unmatched"),
        ("tar -tf src/secret/key", "denied"),  # listing reads the archive: a read deny applies
        ("tar -t -f src/secret/key", "denied"),
        ("tar tf src/secret/key", "denied"),
        ("tar -tf src/a.txt", "allowed"),
    ],
)
def test_tar_reads_the_archive_it_lists_and_never_reaches_a_remote_one(tools, command, outcome):
    expect(tools.judge_execute(["bash", "-c", command]), outcome)


# --- sed ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("sed -n p -- src/secret/key", "denied"),  # after `--` every word is a file
        ("sed -n -- p src/secret/key", "denied"),
        ("sed -- p src/a.txt docs/r.md src/secret/key", "denied"),
        ("sed -i -- s/a/b/ docs/r.md", "unmatched"),  # in place: a write
        ("sed --in-place s/a/b/ docs/r.md", "unmatched"),
        ("sed --in s/a/b/ docs/r.md", "unmatched"),
        ("sed -s -i s/a/b/ docs/r.md", "unmatched"),
        ("sed -l 5 p src/secret/key", "denied"),  # -l takes a value: p is the script
        ("sed --line-length 5 p src/secret/key", "denied"),
        ("sed --line-length=5 p src/secret/key", "denied"),
        ("sed --l=5 p src/a.txt", "allowed"),
        ("sed --e p src/secret/key", "denied"),
        ("sed --expression=p src/secret/key", "denied"),
        ("sed --expression p src/secret/key", "denied"),
        ("sed -e p -e 'w docs/x' src/a.txt", "unsafe_argument"),
        ("sed --quiet p src/a.txt", "allowed"),
        ("sed --posix p src/a.txt", "allowed"),
        ("sed --s p src/a.txt", "unsafe_argument"),  # ambiguous: --separate, --sandbox, --silent
        ("sed --x p src/a.txt", "unsafe_argument"),
        ("sed -y p src/a.txt", "unsafe_argument"),
        ("sed", "unsafe_argument"),
        ("sed -n", "unsafe_argument"),
        ("sed '\\' src/a.txt", "unsafe_argument"),  # a backslash ending the script
        ("sed 's/a/b' src/a.txt", "unsafe_argument"),
        ("sed 's\\a\\b\\' src/a.txt", "unsafe_argument"),
        ("sed '\\%x%d' src/secret/key", "denied"),  # a custom address delimiter, then the file
        ("sed '\\%x%Id' src/a.txt", "allowed"),
        ("sed '/a\\/b/d' src/a.txt", "allowed"),
        ("sed 's/a\\/b/c/' src/a.txt", "allowed"),
        ("sed 's/a/b/gw docs/x' src/a.txt", "unsafe_argument"),
        ("sed 's/a/b/3e' src/a.txt", "unsafe_argument"),
        ("sed 'y/ab/cd/' src/a.txt", "allowed"),
        ("sed 'y/ab/cd/w' src/a.txt", "unsafe_argument"),  # y takes no flags: w is a write command
        ("sed '1!G;h;$!d' src/a.txt", "allowed"),
        ("sed '$a end' src/a.txt", "allowed"),
        ("sed 'a w docs/x' src/a.txt", "allowed"),  # text to append, not a command
        ("sed -n '/x/{p;q}' src/a.txt", "allowed"),
        ("sed ':a;N;ba' src/a.txt", "allowed"),
        ("sed 'b end;w x' src/a.txt", "unsafe_argument"),
        ("sed 'k' src/a.txt", "unsafe_argument"),
        ("sed '0~2p;1~3d;5,+2p;$=' src/a.txt", "allowed"),
    ],
)
def test_sed_is_read_as_gnu_sed_reads_it(worktree, command, outcome):
    expect(policy_of(worktree, TOOLS).judge_execute(["bash", "-c", command]), outcome)


# --- pytest ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("pytest --cov-report=html:docs/cov", "unmatched"),  # the directory after the colon is written
        ("pytest --cov-report=xml:/tmp/c.xml", "outside_worktree"),
        ("pytest --cov-report=html:src/cov:x", "allowed"),
        ("pytest --cov-report=term", "allowed"),
        ("pytest --junitxml=docs/j.xml", "unmatched"),
        ("pytest --junit-xml docs/j.xml", "unmatched"),
        ("pytest --log-file=docs/l", "unmatched"),
        ("pytest --html=docs/h", "unmatched"),
        ("pytest --report-log docs/r", "unmatched"),
        ("pytest --debug=docs/d", "unmatched"),
        ("pytest --rootdir=docs", "unmatched"),
        ("pytest --basetemp=src/t", "allowed"),
        ("pytest -o cache_dir=src/c", "allowed"),
        ("pytest -ocache_dir=docs/c", "unmatched"),
        ("pytest --override-ini cache_dir=docs/c", "unmatched"),
        ("pytest --override-ini=addopts=-x", "unsafe_argument"),
        ("pytest -o 'addopts =-x'", "unsafe_argument"),
        ("pytest -p no:cacheprovider", "allowed"),
        ("pytest -p xdist", "unsafe_argument"),
        ("pytest -k 'a or b' -m slow docs", "allowed"),
        ("pytest -kp docs", "allowed"),  # -k takes `p`: no plugin
        ("pytest --pastebin=failed", "unsafe_argument"),
        ("python3 -m pytest -p evil", "unsafe_argument"),
        ("python -m pytest", "allowed"),
    ],
)
def test_pytest_options_that_write_or_load_code(worktree, command, outcome):
    rules = [*TOOLS, {"id": "py3", "kind": "execute", "commands": ["python3 -m pytest *"], "decision": "allow"}]
    expect(policy_of(worktree, rules).judge_execute(["bash", "-c", command]), outcome)


# --- git ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("git commit -m 'fix: a/b'", "allowed"),  # a message is not a revision
        ("git commit -m fix:a", "allowed"),
        ("git commit -qam fix:a", "allowed"),
        ("git commit -F src/a.txt", "allowed"),
        ("git log HEAD:src/secret/key", "denied"),
        ("git log -n 1 x:y", "denied"),  # any REV:PATH names contents the policy cannot place
        ("git tag v1 :src/a.txt", "denied"),  # the index form, even of an allowed file (with a read deny)
        ("git tag v1 @", "allowed"),
        ("git tag -n", "denied"),
        ("git tag -l", "allowed"),
        ("git for-each-ref", "allowed"),
        ("git for-each-ref '--form=%(raw)'", "denied"),
        ("git branch --format=x", "denied"),
        ("git branch -v", "allowed"),
        ("git bundle create -q src/b HEAD", "denied"),  # a bundle holds every file (a read deny applies)
        ("git bundle create --quiet docs/b HEAD", "unmatched"),  # and it is written: the file, not `--quiet`
        ("git mailsplit -osrc/m src/a.txt", "allowed"),
        ("git mailsplit -odocs src/a.txt", "unmatched"),
        ("git mailinfo src/m src/p", "allowed"),
        ("git mailinfo src/m docs/p", "unmatched"),
    ],
)
def test_git_operands_that_name_contents_or_files_it_writes(tools, command, outcome):
    expect(tools.judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("git update-index --add --cacheinfo 100644,0123abcd,src/k", "denied"),  # puts any blob at any path
        ("git checkout -- src/k", "denied"),  # ... which this then writes out
        ("git checkout HEAD~1 -- old/path", "denied"),  # a file from another revision, at its old path
        ("git restore src/k", "denied"),
        ("echo '100644 blob 0123abcd\tsrc/k' | git mktree", "denied"),
        ("git hash-object -w src/a.txt", "denied"),
        ("git checkout main", "allowed"),  # switching branches names no path
        ("git checkout -b feature", "allowed"),
        ("git add src/a.txt", "allowed"),
    ],
)
def test_git_commands_that_copy_stored_files_into_the_worktree_read_it_all(tools, command, outcome):
    """With a read deny in place, a stored copy of a denied file must not reach a path the deny misses."""
    expect(tools.judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("curl -odocs/x https://e.example", "unmatched"),  # -o glued: an output, for programs without a table too
        ("curl -odocs https://e.example", "unmatched"),
        ("git config --get --list user.name", "unsafe_argument"),  # two actions
        ("git config -l user.name", "unsafe_argument"),  # listing takes no name
        ("git config --list user.name", "unsafe_argument"),
        ("git config list user.name", "unsafe_argument"),
        ("git config -l", "allowed"),
        ("git config get user.name", "allowed"),
        ("git config --get-regexp user x", "allowed"),
        ("git config --get user.name x", "unsafe_argument"),
        ("git commit --verbose", "denied"),  # prints the staged diff: every file, the secret too
        ("git commit --verb", "denied"),
        ("git commit -v", "denied"),
        ("git status --verbose", "denied"),
        ("git commit -m x", "allowed"),
        ("git show-branch --sha1-name", "denied"),  # not known to print only names
        ("git show-branch", "allowed"),
        ("git log --format=a=b", "allowed"),
        ("git log --pretty=format:%H -3", "allowed"),
        ("git log -12", "allowed"),
        ("git log -n12", "allowed"),
        ("git log -U3", "denied"),
    ],
)
def test_more_options_that_write_print_or_act(worktree, command, outcome):
    expect(policy_of(worktree, TOOLS).judge_execute(["bash", "-c", command]), outcome)


# --- recursive readers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("grep -r x", "denied"),  # a recursive reader with no directory reads where it runs, .env and all
        ("egrep -r x", "denied"),
        ("fgrep -r x", "denied"),
        ("grep -R x", "outside_worktree"),  # following src/out
        ("grep -rn x", "denied"),
        ("grep -nr x", "denied"),
        ("grep --recursive x", "denied"),
        ("grep --dereference-recursive x", "outside_worktree"),
        ("grep --directories=recurse x", "denied"),
        ("grep -d recurse x", "denied"),
        ("grep -drecurse x", "denied"),
        ("grep -A 2 -r x", "denied"),
        ("grep -A2 -r x", "denied"),
        ("grep -r -e x", "denied"),  # the pattern given by -e: no operand names a place
        ("grep -re x", "denied"),
        ("grep -r --regexp=x", "denied"),
        ("grep -r --file=docs/r.md", "denied"),
        ("grep -rf docs/r.md", "denied"),
        ("grep -r -e x docs", "allowed"),
        ("grep -r x docs", "allowed"),
        ("grep -r -d skip x docs", "allowed"),
        ("grep -e x -e y", "allowed"),  # not recursive: stdin
        ("grep x", "allowed"),
        ("grep -d skip x", "allowed"),
        ("rg x", "denied"),
        ("rg -n x", "denied"),
        ("ag x", "denied"),
        ("rg x docs", "allowed"),
        ("ag x docs", "allowed"),
        ("ls -R", "denied"),
        ("ls -lR", "denied"),
        ("ls --recursive", "denied"),
        ("ls --recur", "denied"),
        ("ls -R docs", "allowed"),
        ("ls -l", "allowed"),
    ],
)
def test_a_recursive_reader_given_no_place_reads_where_it_runs(open_policy, command, outcome):
    expect(open_policy.judge_execute(["bash", "-c", command]), outcome)


# --- every program: the files its arguments name, and programs without a record ------------------


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("cat file:src/secret/key", "denied"),  # a file: URL names a local path
        ("cat file://src/secret/key", "denied"),
        ("cat FILE:src/secret/key", "denied"),
        ("cat File://src/secret/key", "denied"),
        ("cat file:", "outside_worktree"),  # the root
        ("cat file://", "outside_worktree"),
        ("cat file:docs/r.md", "allowed"),
        ("cat https://e.example/src/secret/key", "allowed"),  # another scheme names no local path
        ("touch file:docs/x", "unmatched"),  # a write stays a write
        ("wc --output=docs/x src/a.txt", "unmatched"),  # options that name an output, for any program
        ("wc --output docs/x src/a.txt", "unmatched"),
        ("wc --outp docs/x src/a.txt", "unmatched"),
        ("wc --o docs/x src/a.txt", "unmatched"),
        ("wc --log-file=docs/x src/a.txt", "unmatched"),
        ("wc --outfile=docs/x", "unmatched"),
        ("wc --output=src/x src/a.txt", "allowed"),
        ("wc --lines=docs/r.md", "allowed"),  # any other option's value is read
        ("wc --lines=src/secret/key", "denied"),
        ("du --files0-from=x", "unsafe_argument"),
        ("du --exclude-from=x docs", "unsafe_argument"),
        ("du --exclude-fr=x docs", "unsafe_argument"),
        ("du --include-from x docs", "unsafe_argument"),
        ("wc --files-from=x", "unsafe_argument"),
        ("find docs -delete", "unmatched"),  # find -delete removes what it finds
        ("find docs -name x", "allowed"),
        ("find docs -fprint src/x", "allowed"),
        ("find docs -fprint docs/x", "unmatched"),  # find's actions that write a file
        ("find docs -fprint .git/hooks/pre-commit", "protected_path"),
        ("find docs -fprint0 docs/x", "unmatched"),
        ("find docs -fprintf docs/x %p", "unmatched"),
        ("find docs -fls docs/x", "unmatched"),
        ("find docs -exec ls ;", "unsafe_argument"),
        ("find docs -execdir ls ;", "unsafe_argument"),
        ("find docs -ok ls ;", "unsafe_argument"),
        ("touch -- docs/x", "unmatched"),
        ("cp -- src/a.txt docs/y", "unmatched"),
        ("cp src/a.txt -- docs/y", "unmatched"),
        ("cp src/a.txt src/b.txt", "allowed"),
        ("cp src/secret/key src/b.txt", "denied"),
        ("cp -t docs src/a.txt", "unmatched"),
        ("cp --target-directory=docs src/a.txt", "unmatched"),
        ("cp --target-directory docs src/a.txt", "unmatched"),
        ("cp --target docs src/a.txt", "unmatched"),
        ("sort -o docs/x src/a.txt", "unmatched"),
        ("sort -uodocs/x src/a.txt", "unmatched"),
        ("sort -u -o docs/x src/a.txt", "unmatched"),
        ("sort -o src/x src/a.txt", "allowed"),
        ("sort -k 2 -t / src/a.txt", "allowed"),
        ("grep -f src/secret/key docs", "denied"),  # a file of patterns is read
        ("grep -e x -f src/secret/key docs", "denied"),
        ("grep -hf src/secret/key docs", "denied"),
        ("grep -e src/secret/key docs", "allowed"),  # a pattern names no file
        ("head -n 1 src/secret/key", "denied"),
        ("head -c5 src/a.txt", "allowed"),
        ("gcc -o docs/a src/a.c", "unmatched"),
        ("gcc -Isrc/secret -c src/a.c", "denied"),  # an include directory is read
        ("gcc -Wall -odocs/a src/a.c", "unmatched"),
        ("chmod 644 docs/r.md", "unmatched"),
        ("chmod 644 src/a.txt", "allowed"),
        ("chmod docs/r.md src/a.txt", "allowed"),  # the first operand is a mode
        ("chown x docs/r.md", "unmatched"),
        ("dd if=src/secret/key of=src/x", "denied"),
        ("dd if=src/a.txt of=docs/x", "unmatched"),
        ("cut -f1 @src/secret/key", "denied"),  # @file reads the file
        ("install -m 644 src/a.txt docs/a", "unmatched"),
        ("ln -s src/a.txt docs/l", "unmatched"),
        ("mv src/a.txt docs/a", "unmatched"),
        ("mv src/secret/key src/k", "denied"),
        ("uniq src/a.txt src/u", "allowed"),
        ("tee docs/x", "unmatched"),
        ("rmdir docs", "unmatched"),
        ("truncate -s 0 docs/r.md", "unmatched"),
    ],
)
def test_what_each_program_reads_and_writes(worktree, command, outcome):
    expect(policy_of(worktree, TOOLS).judge_execute(["bash", "-c", command]), outcome)


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("git log --output=.git/config", "protected_path"),
        ("git log --output=/tmp/x", "outside_worktree"),
        ("git log --output docs/x", "unmatched"),  # a write no write rule allows
        ("git diff --output=../x HEAD", "outside_worktree"),
        ("git diff --no-index /etc/passwd src/a.txt", "outside_worktree"),
        ("git diff --no-index ../outside.txt src/a.txt", "outside_worktree"),
        # The id is fixed: mutmut re-runs tests by id, and a pid changes from run to run.
        pytest.param(f"cat /proc/{os.getppid()}/environ", "proc", id="cat /proc/PARENT/environ-proc"),
        ("cat /proc/self/environ", "proc"),
        ("cat src/secret/key", "denied"),  # a read deny holds for what a command reads
        ("cat ../outside.txt", "outside_worktree"),
        ("ls -la /", "outside_worktree"),
        ("cat src/../src/secret/key", "denied"),
        ("git log -p -- src", "denied"),  # src is read whole, src/secret with it
        ("python -m pytest -p src.evil", "unsafe_argument"),
        ("python -m pytest -psrc.evil", "unsafe_argument"),
        ("python -m pytest --rootdir=/tmp", "outside_worktree"),
        ("python -m pytest -o cache_dir=/tmp/cache", "outside_worktree"),
        ("python -m pytest --override-ini=cache_dir=../c", "outside_worktree"),
        ("python -m pytest -o addopts=-pevil", "unsafe_argument"),
        ("python -m pytest --basetemp=/tmp/t", "outside_worktree"),
        ("python -m pytest --basetemp docs/t", "unmatched"),
        ("python -m pytest --junitxml=.git/hooks/pre-commit", "protected_path"),
        ("git log --format=%H file:///etc/passwd", "outside_worktree"),
        ("git log --outp=.git/config", "protected_path"),  # git's parse-options take abbreviations
        ("git diff --out docs/x HEAD", "unmatched"),
        ("git log --no-index -- .git/config", "protected_path"),  # git might write what it is given
        ("git log -p", "denied"),  # prints what every file held: src/secret too
        ("git diff HEAD~1", "denied"),
        ("git log -p -- 'src/secre?/key'", "denied"),  # a pathspec glob
        ("git log -p -- ':(icase)SRC/SECRET/KEY'", "denied"),  # pathspec magic
        ("git diff HEAD:src/secret/key src/a.txt", "denied"),
        ("git log --format=%H HEAD:src/secret/key", "denied"),
        ("python -m pytest -q -vo addopts=-psrc.evil", "unsafe_argument"),  # -v -o addopts=...
        ("python -m pytest -vp src.evil", "unsafe_argument"),
        ("python -m pytest -vo cache_dir=junk", "unmatched"),  # a write outside src/
    ],
)
def test_every_path_an_argument_names_is_judged(policy, command, why):
    refused(policy.judge_execute(command), why)


def test_a_program_that_might_write_what_it_names_never_names_a_protected_path(open_policy):
    verdict = expect(open_policy.judge_execute("myprog .git/config"), "protected_path")
    assert (verdict.rule_ids, dict(verdict.reason)) == (
        ("protected",),
        {"kind": "protected_path", "path": ".git/config", "command": "myprog .git/config"},
    )
    expect(open_policy.judge_execute("cat .git/config"), "allowed")  # a program known only to read it


def test_commands_match_case_sensitively_and_hosts_do_not(worktree, careful):
    expect(careful.judge_execute("LS src"), "unmatched")  # another program
    expect(careful.judge_execute("Git status"), "unmatched")
    upper = policy_of(worktree, [{"id": "api", "kind": "network", "hosts": ["API.GitHub.com"], "decision": "allow"}])
    expect(upper.judge_tool_call({"kind": "fetch", "rawInput": {"url": "https://api.github.com/x"}}), "allowed")
