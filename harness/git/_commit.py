"""The kernel's commit after a completed task (`workspace.commit`).

Under the sandbox `.git` is read-only to the agent: the trusted kernel owns git. After a task ends
Completed with changes, it commits them and pushes to the upstream, so the next task starts on a clean
tree. Two promises (docs/kernel-git.md lists every way git could run a program, and the test of each):

* Git runs here outside the sandbox, with the kernel's environment, so nothing the agent could have
  written runs with it: no hooks, no fsmonitor, no pager, no signing or credential prompt; no recursion
  into submodules or nested repositories (their config, hooks and filters are the agent's to write); no
  filter driver at all (the attributes that select one are worktree files the agent writes); no command
  that produces a diff or patch (textconv, external diff). The repository is the one the run started on
  (`--git-dir`, `--work-tree`): a `.git` the agent makes where git would otherwise look is never found,
  and a `commondir` planted in a main repository's git dir (`git_writable`) stops the commit.
* The commit follows the policy, not ignore files the agent wrote: it stages exactly the paths the task
  changed (`git status`, minus what was ignored when the task started) that the write rules allow and no
  read-deny rule covers; a nested repository (it would be a gitlink) and a submodule are never staged.
  Whatever the agent staged itself is unstaged first. What is not committed is named, with why. The
  judgement is the task boundary's (`_change_set.judge_change`): the boundary has refused the task already
  when a change of its own is refused; one the commit finds that the boundary did not (written since)
  commits and pushes nothing (`refused` in the record, and the task ends BlockedPolicy).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import pygit2

from ..config._config import CommitConfig
from ..link._transport import pin_git
from ..policy._change_set import Change, judge_change_set, refusal_reason
from ..policy._policy import Policy
from ._preconditions import repository_dirs

__all__ = ["commit_task"]

#: On every git the kernel runs. Each `-c` is a command-line setting: it wins over every config file.
_SAFE = (
    "--no-pager",
    "--literal-pathspecs",  # a path the agent named `:(glob)*` or `*` is that path, never a pattern
    *("-c", "core.hooksPath=/dev/null"),  # no hook: pre-commit, reference-transaction, pre-push, ...
    *("-c", "core.fsmonitor=false"),
    *("-c", "core.pager=cat"),
    *("-c", "commit.gpgsign=false"),
    *("-c", "commit.verbose=false"),
    # never into a submodule or a nested repository: git would run `git status` there, with its config
    *("-c", "submodule.recurse=false"),
    *("-c", "diff.ignoreSubmodules=all"),
    *("-c", "status.submoduleSummary=false"),
    *("-c", "push.recurseSubmodules=no"),
)
#: What a filter driver's settings are overridden with (`--config-env` reads the value from these).
_EMPTY, _FALSE = "LOOP_HARNESS_GIT_EMPTY", "LOOP_HARNESS_GIT_FALSE"
MAX_NAMED = 100  # paths named in the record as not committed (the rest are counted)


async def commit_task(
    workspace: Path,
    settings: CommitConfig,
    task_id: str,
    title: str,
    *,
    policy: Policy,
    ignored: AbstractSet[str] = frozenset(),
    git_dir: Path | None = None,
) -> dict[str, Any]:
    """Commit the task's changes that the policy allows, then push: what the transcript records of it.

    `ignored` is what git reported ignored when the task started (a path there is not the task's change,
    whatever an ignore file written since says); `git_dir` the repository the run started on."""
    git = await _Git.open(workspace, git_dir)
    if isinstance(git, str):
        return {"committed": False, "error": git}
    # The index as HEAD: only what is judged below is staged (an agent with a writable `.git`, or none
    # around it, may have staged a denied file or a gitlink itself). Stat data of unchanged entries is kept.
    code, output = await git.run("read-tree", "-m", "HEAD")
    if code != 0:
        return {"committed": False, "error": _tail(output)}
    code, output = await git.run("status", "--porcelain=v2", "-z", "--untracked-files=all", "--ignore-submodules=all")
    if code != 0:
        return {"committed": False, "error": _tail(output)}
    judged = judge_change_set(parse_status(output), policy, ignored, git.top)  # the boundary's judgement
    refusal = refusal_reason(judged)
    if refusal is not None:  # a refused change of the task's the boundary did not see (written since): none of it
        return {"committed": False, "refused": refusal["paths"], "refused_total": refusal["total"],
                "error": "the task changed paths the policy refuses: nothing committed or pushed"}  # fmt: skip
    staged = [j.path for j in judged if j.why is None]
    refused = [{"path": j.path, "why": j.why} for j in judged if j.why is not None]
    record: dict[str, Any] = {"committed": False}
    if refused:
        record["not_committed"] = refused[:MAX_NAMED]
        if len(refused) > MAX_NAMED:
            record["not_committed_total"] = len(refused)
    if staged:
        error = await _commit(git, staged, settings, task_id, title, record)
        if error is not None:
            return {**record, "committed": False, "error": error}
    if settings.push:  # also what the agent committed itself (sandbox.git_writable): the upstream is outside
        code, output = await git.run("push", "-q", "--no-recurse-submodules")
        record["pushed"] = code == 0
        if code != 0:
            record["error"] = _tail(output)
    return record


async def _commit(
    git: _Git, paths: list[str], settings: CommitConfig, task_id: str, title: str, record: dict[str, Any]
) -> str | None:
    """Stage `paths` (deletions too) and commit them; None, or git's output when a step failed."""
    listing = b"".join(os.fsencode(p) + b"\0" for p in paths)  # no argv limit, any byte in a name
    code, output = await git.run("add", "--all", "--pathspec-from-file=-", "--pathspec-file-nul", stdin=listing)
    if code != 0:
        return _tail(output)
    strays = await _staged_beyond(git, paths)
    if strays:  # the tree changed between the judgement and `add` (a process the agent left running): none of it
        await git.run("read-tree", "-m", "HEAD")
        return f"staged other than what was judged (the worktree changed meanwhile): {', '.join(strays[:10])}"
    code, output = await git.run("diff", "--cached", "--quiet", "--no-ext-diff", "--no-textconv")
    if code == 0:  # staged as HEAD has it (the file changed back meanwhile): nothing to commit
        return None
    identity: tuple[str, ...] = ()
    if settings.author:
        name, email = re.fullmatch(r"(.+) <(.+)>", settings.author).groups()  # type: ignore[union-attr]
        identity = ("-c", f"user.name={name}", "-c", f"user.email={email}")
    message = settings.message.format(id=task_id, title=title)
    code, output = await git.run(*identity, "commit", "-q", "--no-verify", "-m", message)
    if code != 0:
        return _tail(output)
    code, sha = await git.run("rev-parse", "HEAD")
    record.update(committed=True, sha=sha.decode().strip(), message=message)
    return None


async def _staged_beyond(git: _Git, judged: list[str]) -> list[str]:
    """What the index now holds against HEAD beyond the judged paths, or as a gitlink. `add` reads the tree
    again: a file swapped for a directory (its files a pathspec then takes in) or a repository since the
    judgement would otherwise land unjudged. After this, what is committed is the index, which the agent
    cannot write (`.git` is read-only inside)."""
    code, output = await git.run("diff", "--cached", "--raw", "-z", "--no-renames", "--no-ext-diff", "--no-textconv",
                                 "--ignore-submodules=none", "HEAD")  # fmt: skip
    if code != 0:
        return [f"(the index could not be read: {_tail(output)})"]
    allowed = set(judged)
    strays: list[str] = []
    fields = output.split(b"\0")
    for header, name in zip(fields[0::2], fields[1::2], strict=False):
        if not header.startswith(b":"):
            continue
        path, new_mode = os.fsdecode(name), header[1:].split(b" ")[1]
        if path not in allowed or new_mode == b"160000":
            strays.append(path)
    return strays


def planted_links(git_dirs: Iterable[Path]) -> list[str]:
    """Symbolic links where git writes: the git dir's own files (COMMIT_EDITMSG, ORIG_HEAD, the index),
    everything under `logs/` and `refs/`, `objects/`'s directories and `objects/pack/`. With `git_writable`
    the agent can plant one, and git would write through it, as the kernel's uid, wherever it leads."""
    found: list[str] = []
    for git_dir in git_dirs:
        for place in (git_dir, git_dir / "objects", git_dir / "objects" / "pack"):
            with contextlib.suppress(OSError), os.scandir(place) as entries:
                found += [e.path for e in entries if e.is_symlink() and e.name not in ("hooks", "info")]
        for tree in ("logs", "refs"):
            for here, dirs, files in os.walk(git_dir / tree):
                found += [os.path.join(here, n) for n in (*dirs, *files) if os.path.islink(os.path.join(here, n))]
    return sorted(found)


def parse_status(output: bytes) -> Iterator[Change]:
    """The changes `git status --porcelain=v2 -z` lists: both paths of a rename, a nested repository (an
    untracked directory, `?? dir/`) as itself, a gitlink marked."""
    fields = iter(output.split(b"\0"))
    for entry in fields:
        kind = entry[:2]
        if kind in (b"1 ", b"2 ", b"u "):
            # 1 XY sub mH mI mW hH hI path | 2 XY sub mH mI mW hH hI Xscore path | u XY sub m1 m2 m3 mW h1 h2 h3 path
            parts = entry.split(b" ", {b"1 ": 8, b"2 ": 9, b"u ": 10}[kind])
            sub, modes = parts[2], parts[3 : 6 if kind != b"u " else 7]
            gitlink = sub.startswith(b"S") or b"160000" in modes
            yield Change(os.fsdecode(parts[-1]), gitlink)
            if kind == b"2 ":  # a rename or copy: the path it came from follows
                yield Change(os.fsdecode(next(fields, b"")), gitlink)
        elif kind == b"? ":
            yield Change(os.fsdecode(entry[2:]))


class _Git:
    """Git in the repository the run started on, as the kernel runs it (see `_SAFE`)."""

    def __init__(self, top: str, args: tuple[str, ...] = ()) -> None:
        self.top = top  # the worktree's root: git's paths are relative to it, and it runs there
        self._args = args  # the pinned repository, then the filter overrides

    @classmethod
    async def open(cls, workspace: Path, git_dir: Path | None) -> _Git | str:
        """Pinned to `git_dir` and its worktree (git never looks for a repository then, so a `.git` the agent
        made in the workspace is not found), or why git must not run there. Without a git dir (none was found
        when the run started): the repository git finds from the workspace, run at its root."""
        if git_dir is None:
            git = cls(str(workspace))
            code, output = await git.run("rev-parse", "--show-toplevel")
            if code != 0:
                return _tail(output)
            git = cls(os.fsdecode(output.rstrip(b"\n")))
        else:
            linked = git_dir.resolve().parent.name == "worktrees"  # `<common dir>/worktrees/<name>`
            if not linked and os.path.lexists(git_dir / "commondir"):
                # A main repository has none: one written since the run started (`git_writable`) points git at
                # another repository, its config (the push's programs) and its refs. GIT_COMMON_DIR would not do:
                # git's ref store reads the file whatever the environment says. A linked worktree's was there
                # when the sandbox started, so it is read-only.
                return f"{git_dir / 'commondir'} exists in a main repository's git dir: the kernel runs no git there"
            top = _worktree_root(git_dir, linked=linked)
            if top is None:
                return f"no worktree found for the git dir {git_dir}"
            links = planted_links(repository_dirs(git_dir))
            if links:  # git writes through them (COMMIT_EDITMSG, a reflog, an object directory): anywhere
                shown = ", ".join(os.path.relpath(link, top) for link in links[:10])
                return f"a symbolic link where git writes in the git dir ({shown}): the kernel runs no git there"
            git = cls(top, (f"--git-dir={git_dir}", f"--work-tree={top}"))
        git._args += await git._filter_overrides()
        return git

    async def _filter_overrides(self) -> tuple[str, ...]:
        """Every filter driver the configuration defines, made a no-op: an empty clean, smudge and process
        command is no filter to git (convert.c runs one only if it is non-empty), and not required, so that
        git stores the file as it is rather than stop. `--config-env` takes the key up to the last `=`: a
        driver's name may hold `=` and dots."""
        code, output = await self.run("config", "-z", "--get-regexp", r"^filter\.")
        if code != 0:  # 1: no filter defined
            return ()
        names = dict.fromkeys(_filter_names(output))
        overrides: list[str] = []
        for name in names:
            for key, value in (("clean", _EMPTY), ("smudge", _EMPTY), ("process", _EMPTY), ("required", _FALSE)):
                overrides.append(f"--config-env=filter.{name}.{key}={value}")
        return tuple(overrides)

    async def run(self, *args: str, stdin: bytes | None = None) -> tuple[int, bytes]:
        env = pin_git({**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_EDITOR": "true", _EMPTY: "", _FALSE: "false"})
        process = await asyncio.create_subprocess_exec(
            "git", *self._args, *_SAFE, *args, cwd=self.top, env=env,
            stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        output, errors = await process.communicate(stdin)
        code = process.returncode or 0
        return code, output if code == 0 else errors + output


def _worktree_root(git_dir: Path, *, linked: bool) -> str | None:
    """The worktree's root from the repository's layout, not from a configuration the agent might have
    redirected: a main repository's `.git` lies in it; a linked worktree's git dir names `<root>/.git` in its
    `gitdir` file (read-only under the sandbox). Else (a separate git dir) what libgit2 reads."""
    if git_dir.name == ".git":
        return str(git_dir.parent)
    if linked:
        try:
            return os.path.dirname((git_dir / "gitdir").read_text().strip()) or None
        except OSError:
            return None
    try:
        workdir = pygit2.Repository(str(git_dir)).workdir
    except pygit2.GitError:
        return None
    return workdir.rstrip("/") or "/" if workdir else None


def _filter_names(output: bytes) -> Iterable[str]:
    """Driver names from `git config -z --get-regexp`: `filter.<name>.<key>\\n<value>` entries, NUL-ended."""
    for entry in output.split(b"\0"):
        key = entry.split(b"\n", 1)[0]
        name, dot, _ = key[len(b"filter.") :].rpartition(b".")
        if key.startswith(b"filter.") and dot and name:
            yield os.fsdecode(name)


def _tail(output: bytes | str, keep: int = 2000) -> str:
    text = output.decode(errors="replace") if isinstance(output, bytes) else output
    return text[-keep:]
