"""The workspace rules and their patterns: what a glob matches, and whether targets of one kind are allowed.

Each target must be matched by an allow rule and by no deny rule, whatever the rule order; with no rules
(the interactive path) only what a person approved in the turn is. Nothing here looks at the filesystem.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterator, Sequence

from ..config._config import RuleConfig
from ._verdict import Verdict, refuse

__all__ = ["Rules", "glob_matches", "holds", "may_hold", "may_name_a_child", "rule_matches"]


class Rules:
    """The rules of one policy, in their order (which no verdict depends on); iterating gives each rule."""

    def __init__(self, rules: Sequence[RuleConfig]) -> None:
        self.rules = tuple(rules)

    def __iter__(self) -> Iterator[RuleConfig]:
        return iter(self.rules)

    @property
    def interactive(self) -> bool:
        """No rules: permission requests go to the interactive handler, not the policy."""
        return not self.rules

    def judge(
        self,
        kind: str,
        targets: Sequence[str],
        approvals: frozenset[tuple[str, str]],
        *,
        whole: bool = True,
        also_denied: Sequence[str] = (),
    ) -> Verdict:
        """Every target needs an allow rule and no deny rule (deny wins, order ignored). A `whole` target
        is reached with all it holds, so a deny of anything below it applies too; `also_denied` are other
        spellings of the targets that deny rules see too."""
        if self.interactive:  # only what a person approved in this turn (confinement already checked)
            for target in targets:
                if (kind, target) not in approvals:
                    return refuse("not_approved", rule_kind=kind, target=target)
            return Verdict(True, ("interactive",), {"kind": "interactive"})
        rules = [r for r in self.rules if r.kind == kind]
        allowed_by: list[str] = []
        for target in (*targets, *also_denied):
            for rule in rules:
                if rule.decision == "deny" and rule_matches(rule, target, whole=whole):
                    return Verdict(False, (rule.id,), {"kind": "denied", "rule_id": rule.id, "target": target})
        for target in targets:
            allow = next((r for r in rules if r.decision == "allow" and rule_matches(r, target)), None)
            if allow is None:
                return refuse("unmatched", rule_kind=kind, target=target)
            allowed_by.append(allow.id)
        return Verdict(True, tuple(dict.fromkeys(allowed_by)), {"kind": "allowed"})


def glob_matches(pattern: str, path: str) -> bool:
    """Match a worktree-relative path against a glob: `*` stays in one segment, `**` spans them."""
    return _compile_glob(pattern).fullmatch(path) is not None


@functools.lru_cache(maxsize=1024)
def _compile_glob(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("(?:/.*)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def rule_matches(rule: RuleConfig, target: str, *, whole: bool = True) -> bool:
    if rule.kind in ("read", "write"):
        # A deny also covers the directories that hold what it denies: deleting `.` reaches `secrets/`.
        above = whole and rule.decision == "deny"
        return any(glob_matches(p, target) or (above and holds(target, p)) for p in rule.patterns)
    if rule.kind == "network":
        return any(fnmatch.fnmatchcase(target.lower(), p.lower()) for p in rule.patterns)
    return any(fnmatch.fnmatchcase(target, p) for p in rule.patterns)


def holds(directory: str, pattern: str) -> bool:
    """`directory` is an ancestor of everything `pattern` can match (its literal leading part)."""
    # `src/pkg/*.py` holds `src/pkg` itself; `[` is no glob character here (`app/[id]/x.ts` holds `app/[id]`)
    literal = re.split(r"[*?]", pattern, maxsplit=1)[0]
    return directory == "." or (bool(literal) and literal.startswith(directory + "/"))


def may_hold(directory: str, pattern: str) -> bool:
    """Whether `pattern` may match something below `directory`, judged by its literal leading segments: False
    only when they name a different place (`docs/**` never matches below `src`)."""
    for want, have in zip(pattern.split("/"), directory.split("/"), strict=False):
        if any(ch in want for ch in "*?["):
            return True
        if want != have:
            return False
    return True


def may_name_a_child(directory: str, pattern: str) -> bool:
    """Whether `pattern` can match a name directly inside `directory` (`src/git`, `src/*` and `**` can for
    `src`; `docs/*` cannot)."""
    want = pattern.split("/")
    have = [] if directory == "." else directory.split("/")
    for index, segment in enumerate(have):
        if index >= len(want):
            return False
        if "**" in want[index]:
            return True
        if not glob_matches(want[index], segment):
            return False
    rest = want[len(have) :]
    return len(rest) == 1 or any("**" in w for w in rest)
