"""The map cannot drift: ARCHITECTURE.md's import rules, checked on the source, and every module named there.

Each rule names a group of modules and what it may (or may not) import from harness; a forbidden import fails
with the module, the import and the rule. The imports are read from the source (ast), not by importing it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.pytest_plugin import LOOP_SCRIPTED

pytestmark = LOOP_SCRIPTED

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "scripted_agents")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The harness modules `path` imports (relative imports resolved), with `from X import name` as X.name
    when X is a package (the name may be a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {m for m in found if m == "harness" or m.startswith("harness.")}


GRAPH = {module_name(p): imports_of(p) for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}
MODULES = set(GRAPH)


def group(*names: str) -> set[str]:
    """The modules named, a trailing `.*` for every module of a package."""
    out: set[str] = set()
    for name in names:
        if name.endswith(".*"):
            out |= {m for m in MODULES if m == name[:-2] or m.startswith(name[:-1])}
        else:
            assert name in MODULES, f"{name} is not a module any more: update the rule"
            out.add(name)
    return out


KERNEL = group("harness.kernel.*")
LINK = group("harness.link.*")
SANDBOX = group("harness.sandbox.*")
POLICY = group("harness.policy.*")
COMMANDS = group("harness.policy.commands.*")
#: The policy's judges, each over what the one before decides (ARCHITECTURE.md, "The policy").
VERDICT = group("harness.policy._verdict")
RULES_ = group("harness.policy._rules")
PLACES = group("harness.policy._places")
HOST = group("harness.host.*", "harness.queues.*")
ALL = MODULES | {"harness"}
CONFIG = group("harness.config._config")

#: (the rule as ARCHITECTURE.md says it, the modules it binds, what they may import from harness)
RULES = [
    ("the policy's facade imports only its judges, commands/, _shell, _paths and _config",
     group("harness.policy._policy"), POLICY - group("harness.policy._policy", "harness.policy._change_set")
     | group("harness._paths") | CONFIG),
    ("_verdict imports nothing from harness", VERDICT, set()),
    ("_rules imports only _verdict and _config", RULES_, VERDICT | CONFIG),
    ("_places imports only _rules, _verdict and _paths", PLACES, RULES_ | VERDICT | group("harness._paths")),
    ("_network imports only _rules and _verdict", group("harness.policy._network"), RULES_ | VERDICT),
    ("_scripts and _tool_calls import no facade", group("harness.policy._scripts", "harness.policy._tool_calls"),
     POLICY - group("harness.policy._policy", "harness.policy._change_set") | CONFIG),
    ("_shell imports nothing from harness", group("harness.policy._shell"), set()),
    ("commands/ imports only itself and _shell", COMMANDS, COMMANDS | group("harness.policy._shell")),
    ("the host imports no link, sandbox, policy or kernel module", HOST, ALL - LINK - SANDBOX - POLICY - KERNEL),
    ("the link imports no host or kernel module", LINK, ALL - HOST - KERNEL),
    ("only the surface, conformance/, bench/ and server/ import the kernel",
     MODULES - KERNEL - group("harness", "harness._cli", "harness.conformance.*", "harness.testing",
                              "harness.bench.*", "harness.server.*"), ALL - KERNEL),
    ("only _cli imports bench/ and server/", MODULES - group("harness._cli", "harness.bench.*", "harness.server.*"),
     ALL - group("harness.bench.*", "harness.server.*")),
    ("inference/ imports models/ alone", group("harness.inference.*"),
     group("harness.inference.*", "harness.models.*")),
    ("models/ imports nothing else of harness", group("harness.models.*"), group("harness.models.*")),
    ("fake_model/ imports nothing else of harness", group("harness.fake_model.*"), group("harness.fake_model.*")),
    ("scripted_agents/ imports nothing of harness", {m for m in MODULES if m.startswith("scripted_agents")}, set()),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "bound", "allowed"), RULES, ids=[r[0] for r in RULES])
def test_an_import_rule_of_the_map_holds(rule, bound, allowed):
    assert bound, f"{rule}: the rule binds no module"
    broken = sorted((m, i) for m in bound for i in GRAPH[m] if i not in allowed and i != m and i in ALL)
    assert broken == [], f"{rule}: {broken}"


def test_a_forbidden_import_fails_the_rule(tmp_path):
    """The check itself can fail: a host module importing the link is caught."""
    planted = ROOT / "harness" / "queues" / "memory.py"
    imports = imports_of(planted) | {"harness.link._client"}
    _, bound, allowed = next(r for r in RULES if r[0].startswith("the host imports"))
    assert "harness.queues.memory" in bound and "harness.link._client" not in allowed
    assert [i for i in imports if i in ALL and i not in allowed] == ["harness.link._client"]


def test_every_module_is_named_in_the_map():
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    unnamed = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT / package).as_posix()
            if path.name == "__init__.py" and path.parent != ROOT / package:
                continue  # a subpackage is named by its directory
            if f"`{path.name}`" not in text and f"`{relative}`" not in text and f"`{path.stem}`" not in text:
                unnamed.append(f"{package}/{relative}")
    assert unnamed == [], f"modules ARCHITECTURE.md does not name: {unnamed}"
