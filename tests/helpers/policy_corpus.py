"""The worktree, policies and requests the policy tests are judged against (tests and tools/hunt_mutants.py),
and the helpers the policy test files share.

`policy_verdicts.jsonl` beside this file holds requests with the verdict a user relies on; most were found
by hunting surviving mutants with the generators below (each one a request some broken policy judged
differently), then read and checked by hand.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness import Policy
from harness.config._config import RuleConfig

# Literal rules (not harness.testing's): tools/try_mutant.py imports this module beside mutmut's copy of the
# package, which is as old as the mutation run.
READ_ALL = {"id": "read-all", "kind": "read", "paths": ["**"], "decision": "allow"}
WRITE_ALL = {"id": "write-all", "kind": "write", "paths": ["**"], "decision": "allow"}
WRITE_SRC = {"id": "write-src", "kind": "write", "paths": ["src/**"], "decision": "allow"}

#: The careful user's policy of the review: read everything but the secret, write src/, a few commands.
CAREFUL_CORE = [
    READ_ALL,
    WRITE_SRC,
    {"id": "no-secret", "kind": "write", "paths": ["src/secret/**"], "decision": "deny"},
    {"id": "no-secret-read", "kind": "read", "paths": ["src/secret/**"], "decision": "deny"},
    {"id": "status", "kind": "execute", "commands": ["git status"], "decision": "allow"},
    {"id": "log", "kind": "execute", "commands": ["git log *"], "decision": "allow"},
]
CAREFUL = [
    *CAREFUL_CORE,
    {"id": "ls", "kind": "execute", "commands": ["ls", "ls *"], "decision": "allow"},
    {"id": "cat", "kind": "execute", "commands": ["cat", "cat *"], "decision": "allow"},
    {"id": "echo", "kind": "execute", "commands": ["echo *"], "decision": "allow"},
    {"id": "moves", "kind": "execute", "commands": ["cd *", "pushd *", "popd"], "decision": "allow"},
    {"id": "no-push", "kind": "execute", "commands": ["git push*"], "decision": "deny"},
    {"id": "api", "kind": "network", "hosts": ["api.github.com"], "decision": "allow"},
]

#: Everything allowed but what deny rules and protection hold back: a refusal here is the deny's alone.
OPEN = [
    {"id": "run-all", "kind": "execute", "commands": ["*"], "decision": "allow"},
    {"id": "write-all", "kind": "write", "paths": ["**"], "decision": "allow"},
    READ_ALL,
    {"id": "no-secrets", "kind": "write", "paths": ["**/secrets/**"], "decision": "deny"},
    {"id": "no-secrets-read", "kind": "read", "paths": ["**/secrets/**", "**/.env"], "decision": "deny"},
    {"id": "no-rm", "kind": "execute", "commands": ["rm *"], "decision": "deny"},
]

PROGRAMS = ["head", "tail", "wc", "diff", "tar", "tee", "touch", "mkdir", "mv", "cp", "ln", "uniq", "shuf", "split",
            "cut", "echo", "zip", "unzip", "install", "patch", "rm", "chmod", "gcc", "sed", "grep", "sort", "find",
            "git", "rg", "dd", "rsync", "chown", "cpio", "7z", "bsdtar", "printf", "test", "python", "pytest", "cc",
            "curl", "rmdir", "truncate", "stat", "du", "egrep", "csplit", "ls", "cat"]  # fmt: skip

#: The careful policy, and every program above allowed with any arguments: what the program's own table decides.
TOOLS = [*CAREFUL, {"id": "tools", "kind": "execute", "decision": "allow",
                    "commands": [f"{p} *" for p in PROGRAMS] + PROGRAMS}]  # fmt: skip

POLICIES = {"careful": CAREFUL, "open": OPEN, "tools": TOOLS}

#: The careful policy as issue 8's review attacked it: CAREFUL_CORE with git diff, ls, cat and pytest, no cd and no
#: echo. The `policy` fixture (tests/scripted/conftest.py), test_policy_careful_user.py and test_policy_enforced.py
#: judge under it (the test files bind it as CAREFUL).
CAREFUL_WITH_PYTEST = [
    *CAREFUL_CORE,
    {"id": "diff", "kind": "execute", "commands": ["git diff *"], "decision": "allow"},
    {"id": "ls", "kind": "execute", "commands": ["ls", "ls *"], "decision": "allow"},
    {"id": "cat", "kind": "execute", "commands": ["cat", "cat *"], "decision": "allow"},
    {"id": "pytest", "kind": "execute", "commands": ["python -m pytest *"], "decision": "allow"},
    {"id": "api", "kind": "network", "hosts": ["api.github.com"], "decision": "allow"},
]
WITH_CD = [*CAREFUL_WITH_PYTEST, {"id": "cd", "kind": "execute", "commands": ["cd *", "echo *"], "decision": "allow"}]

#: Nearly everything allowed, git push and src/secrets/ denied: a refusal under it is the shell's reading or a
#: protected path, not a missing rule.
EVERYTHING = [
    READ_ALL,
    {"id": "write-all", "kind": "write", "paths": ["**"], "decision": "allow"},
    {"id": "git", "kind": "execute", "commands": ["git *"], "decision": "allow"},
    {"id": "cd", "kind": "execute", "commands": ["cd *"], "decision": "allow"},
    {"id": "echo", "kind": "execute", "commands": ["echo *"], "decision": "allow"},
    {"id": "no-push", "kind": "execute", "commands": ["git push*"], "decision": "deny"},
    {"id": "no-secrets", "kind": "write", "paths": ["src/secrets/**"], "decision": "deny"},
]


def build_worktree(base: Path) -> Path:
    root = base / "wt"
    for directory in ("src/secret", "src/pkg/secrets", ".git/hooks", "docs", "lib/vendor"):
        (root / directory).mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n")
    for name, text in {"src/a.txt": "a\n", "src/secret/key": "key\n", "src/pkg/secrets/k": "k\n",
                       "src/.env": "E=1\n", "docs/r.md": "r\n", "lib/vendor/v.py": "v\n"}.items():  # fmt: skip
        (root / name).write_text(text)
    os.symlink("secret/key", root / "src" / "keylink")
    os.symlink("../.git", root / "src" / "gitlink")
    os.symlink(str(base), root / "src" / "out")
    (base / "wt2").mkdir()
    (base / "wt2" / "x").write_text("x\n")
    (base / "outside.txt").write_text("outside\n")
    return root


def expect(verdict: Any, outcome: str) -> Any:
    """`outcome` is "allowed" or the reason kind of the refusal. An allow names the rules that allowed it (the
    transcript records them); every verdict keeps the shape the client and the transcript read."""
    assert isinstance(verdict.rule_ids, tuple) and isinstance(verdict.paths, tuple), verdict
    assert all(isinstance(r, str) and r for r in verdict.rule_ids), verdict
    if outcome == "allowed":
        assert verdict.allowed is True and verdict.rule_ids, verdict
    else:
        assert verdict.allowed is False, verdict
        assert verdict.reason["kind"] == outcome, verdict.reason
    return verdict


def policy_of(worktree: Path, rules: Sequence[Mapping[str, Any]], **options: Any) -> Policy:
    return Policy([RuleConfig.model_validate(r) for r in rules], worktree, **options)


def refused(verdict, *kinds):
    assert not verdict.allowed, verdict
    assert verdict.reason["kind"] in kinds, verdict.reason
    return verdict


def git_all():
    return {"id": "git-all", "kind": "execute", "commands": ["git *"], "decision": "allow"}


def bash(policy: Policy, script: str):
    return policy.judge_execute(["bash", "-c", script])


def make_tree(root: Path, dirs=(), files=(), links=None) -> Path:
    """A worktree: `.git/config`, the directories, the files (each holding a line), the symlinks {path: target}."""
    for directory in (".git", *dirs):
        (root / directory).mkdir(parents=True, exist_ok=True)
    for name in (".git/config", *files):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x\n")
    for link, target in (links or {}).items():
        os.symlink(target, root / link)
    return root


def policies(base: Path) -> dict[str, Policy]:
    root = build_worktree(base)
    return {name: policy_of(root, rules) for name, rules in POLICIES.items()}


def judge(policies: Mapping[str, Policy], policy: str, how: str, request: Any) -> Callable[[], Any]:
    """The call that judges `request` the way `how` names."""
    p = policies[policy]
    calls: dict[str, Callable[[], Any]] = {
        "bash": lambda: p.judge_execute(["bash", "-c", request]),
        "exec": lambda: p.judge_execute(request),
        "exec@src": lambda: p.judge_execute(request, cwd="src"),
        "argv": lambda: p.judge_execute(request),
        "read": lambda: p.judge_read(request),
        "write": lambda: p.judge_write(request),
        "tool": lambda: p.judge_tool_call(request),
    }
    return calls[how]


def row(policy: str, how: str, request: Any, verdict: tuple) -> dict[str, Any]:
    """A table row: the request, and the outcome ("allowed" or the reason kind) with the reason's `why`."""
    allowed, kind, why, rules = verdict[0], verdict[1], verdict[2], verdict[3]
    out: dict[str, Any] = {"policy": policy, "how": how, "request": request,
                           "outcome": "allowed" if allowed is True else kind}  # fmt: skip
    if why and allowed is not True:
        out["why"] = why
    if allowed is True:
        out["rules"] = list(rules)
    return out


def load_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- generators for the hunt ---------------------------------------------------------------------

OPTION_WORDS = ["-o", "-f", "-C", "-t", "-i", "-r", "-R", "-p", "-x", "-e", "-n", "-v", "-c", "-T", "-d", "-F", "--",
                "--output", "--output=docs/x", "-osrc/x", "-vo", "-qF", "--exec=x", "-P", "-u", "-s", "-l", "-a",
                "--recursive", "--in-place", "--file", "--expression=p", "-I", "-O", "-S", "--verbose"]  # fmt: skip

SEED_COMMANDS = [
    "export PATH=docs", "X=1 export A=1", "PATH=docs export LANG=C", "TZ=UTC date",  # what assignments set
    "git status", "git log -1", "git diff HEAD", "git show HEAD", "git add src/a.txt", "git commit -m x",
    "git -C src status", "git config --get user.name", "git config --list", "git remote -v", "git bisect run x",
    "git log --oneline -- src", "git grep x", "git stash", "git bundle create docs/b HEAD", "git format-patch -o docs",
    "git archive -o docs/a.tar HEAD", "git rebase -x ls HEAD", "git fetch --upload-pack=x", "git push origin main",
    "sed -n 1p src/a.txt", "sed -i s/a/b/ src/a.txt", "sed -e p -e d src/a.txt", "sed --expression=p src/a.txt",
    "grep -r x src", "grep -e x -f src/a.txt docs", "rg x", "rg x src", "ls -R", "ls -la src",
    "tar -cf src/x.tar src/a.txt", "tar -tf src/x.tar", "tar cf src/x.tar src", "unzip -l src/z.zip",
    "cp src/a.txt docs/a", "mv src/a.txt src/b.txt", "ln -s src/a.txt docs/l", "install -t docs src/a.txt",
    "sort -o docs/s src/a.txt", "shuf -o docs/s src/a.txt", "uniq src/a.txt docs/u", "split src/a.txt docs/p",
    "cut -d/ -f1 src/a.txt", "head -n 1 src/a.txt", "tail -c 5 src/a.txt", "find src -name x", "find src -delete",
    "find src -fprint docs/x", "dd if=src/a.txt of=docs/x", "chmod 644 src/a.txt", "chown x src/a.txt",
    "touch docs/x", "rm src/a.txt", "rmdir src/pkg", "mkdir docs/d", "tee docs/x", "python -m pytest -q",
    "pytest -p no:cacheprovider", "pytest --basetemp=docs/t", "pytest -o cache_dir=docs/c", "pytest --pastebin=all",
    "pytest --cov-report=html:docs/c", "gcc -o docs/a src/a.c", "cc -osrc/a src/a.c", "curl -o docs/x https://x",
    "zip -T src/z.zip src/a.txt", "rsync -e ssh src docs", "patch --dry-run -i src/p", "cpio -t", "7z l x",
    "echo x > docs/x", "printf x >> src/x", "cd src && ls", "pushd src && popd", "wc --files0-from=src/a.txt",
    "diff src/a.txt docs/r.md", "stat src/a.txt", "du -a src", "test -f src/a.txt", "csplit src/a.txt 1",
]  # fmt: skip


def generated(rng: random.Random) -> list[str]:
    """Commands built from parts: sed scripts, git subcommands and options, option clusters of each program."""
    out: list[str] = []
    sed_parts = ["p", "d", "w docs/w", "r docs/r.md", "e ls", "s/a/b/", "s/a/b/w docs/w", "s/a/b/e", "s|a|b|g",
                 "y/ab/cd/", "1,3p", "/x/d", "\\,x,d", "$a end", "i\\x", "c x", ":a;ba", "ta;w x", "1!G;h;$!d",
                 "W docs/w", "R docs/r.md", "F", "q", "=", "l", "v", "z", "{p}", "s/a/b/gw x", "s/a\\/b/c/",
                 "s/a/b", "/x", "s", "k", "0~2p", "1~3w x", "s/x/y/3p", "bend;:end"]  # fmt: skip
    for part in sed_parts:
        out += [f"sed '{part}' src/a.txt", f"sed -n '{part}' src/a.txt", f"sed -e '{part}' src/a.txt"]
    sed_options = ["-n", "-i", "-ibak", "-E", "-r", "-s", "-u", "-z", "-l 5", "-f x", "--in-place=.b", "--quiet",
                   "--posix", "--null-data", "--file=x", "--line-length=3", "--expr=p", "--e=p", "--in", "--s",
                   "-ni", "-in", "-nE", "-ne p", "-e", "--expression", "-x", "--nonsense"]  # fmt: skip
    out += [f"sed {o} p src/a.txt" for o in sed_options] + [f"sed {o}" for o in sed_options]
    subs = ["status", "log", "diff", "show", "add", "commit", "config", "remote", "bisect", "rebase", "fetch",
            "grep", "ls-remote", "init", "clone", "submodule", "worktree", "stash", "checkout", "restore",
            "whatchanged", "reflog", "shortlog", "blame", "format-patch", "archive", "bundle", "rm", "mv", "clean",
            "cat-file", "merge", "push", "pull", "tag", "branch"]  # fmt: skip
    git_options = ["", "-p", "-v", "--verbose", "--patch", "-n5", "-5", "--oneline", "--stat", "--format=%H",
                   "--output=docs/x", "-o docs", "-- src", "-- 'src/*'", "-- :/src", "HEAD:src/secret/key",
                   "--get x", "--list", "-l", "--unset x", "x y", "get x", "add x y", "show", "get-url o", "-e",
                   "--dry-run", "-x ls", "-u x", "-O", "--exec=ls", "run ls", "--upload-pack=x", "--no-index a b",
                   "--name-only", "-s", "-U1", "--binary", "-z", "--author=x", "--since=1.day", "-q", "--count",
                   "--edit", "--interactive", "--get-regexp x y", "--local --get x", "--show-origin --list",
                   "--bool x", "-C src", "--no-pager"]  # fmt: skip
    for sub in subs:
        for option in rng.sample(git_options, 14):
            out.append(f"git {sub} {option}".strip())
    globals_ = ["--no-pager", "-C src", "-C docs -C ..", "-c x=y", "--git-dir=src", "-p", "--paginate", "--bare",
                "-C", "--literal-pathspecs", "--version", "-h", "--exec-path"]  # fmt: skip
    out += [f"git {g} status" for g in globals_] + [f"git {g}" for g in globals_]
    clusters = ["-o docs/x", "-odocs/x", "-vodocs/x", "-vo docs/x", "-t docs", "-vt docs", "-tdocs", "-f docs/x",
                "-cf docs/x", "-cvf docs/x", "-T docs/x", "-C /etc", "-vC/etc", "-I x", "-F x", "-P", "-x", "-r",
                "-d recurse", "-drecurse", "-e x", "-f src/secret/key", "-S 3", "-k2", "-n 2", "-c 3",
                "--target-directory=docs", "--output docs/x", "--outp=docs/x", "--files-from=x", "--exclude-from=x",
                "--rsh-command=x", "--to-command=x", "--use-compress-program=x", "--filter=x", "--strip-program=x",
                "--unzip-command=x", "-TT x", "-exec ls ;", "-execdir ls", "-ok ls", "-fprint docs/x", "-fls docs/x",
                "-delete", "--compress-program=x", "--rsync-path=x", "--transform=s,a,b,", "-K x", "-g x",
                "--absolute-names", "--directory=src", "--extract", "--create", "--append", "--list", "-l", "-t",
                "--dry-run", "-Z", "-z", "-v", "@src/secret/key", "x=src/secret/key", "of=docs/x", "if=src/a.txt",
                "file:src/secret/key", "file:///etc/passwd", "https://x/y", "-Isrc/secret", "-Ldocs", "-Dx=docs/x",
                "-xc", "-W docs/x", "-Bsrc/secret", "-m docs/x", "-ksrc/x", "-Tdocs/x", "-S docs/x"]  # fmt: skip
    for program in PROGRAMS:
        for cluster in rng.sample(clusters, 22):
            tail = rng.choice(["src/a.txt", "src/a.txt docs/y", "docs", ""])
            out.append(f"{program} {cluster} {tail}".strip())
    pytest_options = ["-p x", "-px", "-p no:x", "-vp x", "-o addopts=-x", "-o cache_dir=docs/c", "-ocache_dir=../c",
                      "--override-ini=cache_dir=docs/c", "--override-ini cache_dir=docs/c", "--basetemp docs/t",
                      "--rootdir=/tmp", "--junitxml=docs/j", "--junit-xml docs/j", "--debug=docs/d", "-k x",
                      "-kx", "-m slow", "-c docs/c", "--pastebin=all", "--pastebin", "--cov-report=xml:docs/c",
                      "--cov-report=term", "-W error", "-n 2", "-r a", "-vk x", "-q src", "--log-file=docs/l",
                      "--html=docs/h", "--report-log=docs/r", "--result-log=docs/r",
                      "-qo cache_dir=docs/c"]  # fmt: skip
    for option in pytest_options:
        out += [f"pytest {option}", f"python -m pytest {option}", f"python3 -m pytest {option} src"]
    scripts = ["ls > docs/x", "ls >docs/x", "ls>docs/x", "ls 1>docs/x", "ls 2>>docs/x", "ls &>docs/x", "ls <src/a.txt",
               "ls <>src/a.txt", "cat <src/secret/key", "ls >&docs/x", "ls >|docs/x", "ls 9>docs/x", "ls 10>docs/x",
               "ls >& 2", "ls 2>&-", "ls <&-", "ls <& 0", ">docs/x", "> docs/x ls", "(ls) > docs/x", "(ls; ls) &",
               "(cd src && ls) && cat secret/key", "cd src; cd ..; cat src/secret/key", "cd src || cat secret/key",
               "cd docs && cd ../src && cat secret/key", "cd src & cat secret/key",
               "bash -c 'cd src' && cat secret/key",
               "cd src && bash -c 'cat secret/key'", "cd src\ncat secret/key", "cd src | ls && cat secret/key",
               "ls && (cd src; cat secret/key)", "cd src && pushd .. && popd && cat secret/key",
               "cd lib && cd vendor && cd .. && cd .. && cat src/secret/key", "cd src/out", "cd src/keylink",
               "cd src/gitlink && ls", "cd .git && ls", "cd 'src' && cat 'secret/key'"]  # fmt: skip
    return out + scripts


def tool_calls(rng: random.Random) -> list[dict[str, Any]]:
    """Tool calls naming places under every key the policy reads, with good and bad values."""
    values = ["src/a.txt", "docs/x", "src/secret/key", ".git/config", "../outside.txt", "src", "src/pkg", ".", "/etc",
              "src/keylink", "src/gitlink/config", "lib", 3, None, ""]  # fmt: skip
    keys = ["file_path", "path", "notebook_path", "source", "destination", "target", "old_path", "new_path", "paths",
            "dir_path", "directory", "folder", "file", "filename", "location", "to", "dest", "dst", "src", "from",
            "dest_dir", "root", "cwd", "output_file", "pattern", "content"]  # fmt: skip
    kinds = ["read", "search", "edit", "delete", "move", "execute", "fetch", "think", "other", None]
    calls: list[dict[str, Any]] = []
    for _ in range(900):
        kind = rng.choice(kinds)
        raw: dict[str, Any] = {}
        for key in rng.sample(keys, rng.randint(0, 3)):
            value = rng.choice(values)
            raw[key] = [value, rng.choice(values)] if key == "paths" else value
        call: dict[str, Any] = {"kind": kind, "rawInput": raw}
        if rng.random() < 0.3:
            call["locations"] = [{"path": rng.choice(values)}]
        if rng.random() < 0.2:
            call["content"] = [
                rng.choice([{"type": "diff", "path": rng.choice(values)}, {"type": "text", "text": "x"}])
            ]
        if kind == "execute" and rng.random() < 0.7:
            raw[rng.choice(["command", "cmd"])] = rng.choice(
                ["ls src", "git push o", ["git", "status"], "cat src/.env"]
            )
            if rng.random() < 0.3:
                raw[rng.choice(["cwd", "workdir"])] = rng.choice(values)
            if rng.random() < 0.2:
                raw["args"] = ["src"]
        if kind == "fetch":
            urls = ["https://api.github.com/x", "evil.example", "x@y.z", "https:api.github.com", "http://[::1]:80/", 3]
            raw[rng.choice(["url", "uri", "host"])] = rng.choice(urls)
        if rng.random() < 0.1:
            call["rawInput"] = {"changes": {rng.choice(values[:5]): {"move_path": rng.choice(values[:5])}}}
        calls.append(call)
    return calls
