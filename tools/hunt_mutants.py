"""Hunt surviving mutants of the policy with a corpus of requests (issue 9).

`make mutation` runs mutmut; this reads its survivors and, for each, runs a generated corpus of requests
through the original code and through the mutant (in one process: mutmut's trampolines pick the mutant
from MUTANT_UNDER_TEST). A request whose verdict differs shows the mutant is not equivalent; one refused
by the original and allowed by the mutant shows a surviving refusal-to-allow mutant. Prints the counts,
and with --record FILE appends the first distinguishing request of each mutant, with the original's
verdict, as rows of tests/helpers/policy_verdicts.jsonl (to be read and checked before committing).

Usage: python tools/hunt_mutants.py [--record FILE] [--limit N]   (after `mutmut run`, from the root)
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "mutants"))
sys.path.insert(1, str(ROOT))
os.environ["MUTANT_UNDER_TEST"] = ""

import harness  # noqa: E402
from tests.helpers import policy_corpus  # noqa: E402

Request = tuple[str, str, object]  # (policy, how, request)


def survivors() -> list[str]:
    out = subprocess.run([sys.executable, "-m", "mutmut", "results"], capture_output=True, text=True, cwd=ROOT)
    return [line.split(":")[0].strip() for line in out.stdout.splitlines() if line.strip().endswith("survived")]


def strings_in_tests() -> list[str]:
    found: list[str] = []
    for path in [
        *sorted((ROOT / "tests" / "scripted").glob("test_policy*.py")),
        ROOT / "tests" / "scripted" / "conftest.py",
    ]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and 0 < len(node.value) < 160:
                found.append(node.value)
    return found


_PATHS = ["src/a.txt", "src/secret/key", ".git/config", "../outside.txt", "docs/x", "/dev/null", "src/keylink",
          "src/out/x", ".", "src", "src/pkg", "/etc/passwd", "-", "src/new"]  # fmt: skip
_OPS = [" ; ", " && ", " || ", " | ", " & ", "\n", " > ", " >> ", " < ", " 2> ", " <> ", " &> "]


def variants(command: str, rng: random.Random) -> Iterator[str]:
    """Commands near a known one: a word swapped for a path, dropped, doubled, glued; operators between."""
    words = command.split(" ")
    for _ in range(2):
        w = list(words)
        choice = rng.random()
        index = rng.randrange(len(w))
        if choice < 0.4:
            w[index] = rng.choice(_PATHS)
        elif choice < 0.55 and len(w) > 1:
            del w[index]
        elif choice < 0.7:
            w.insert(index, w[index])
        elif choice < 0.85 and index + 1 < len(w):
            w[index : index + 2] = [w[index] + w[index + 1]]
        else:
            w.insert(index, rng.choice(policy_corpus.OPTION_WORDS))
        yield " ".join(w)
    yield command + rng.choice(_OPS) + rng.choice(policy_corpus.SEED_COMMANDS)


def corpus(seed: int = 9) -> list[Request]:
    rng = random.Random(seed)
    texts = list(dict.fromkeys(strings_in_tests() + policy_corpus.SEED_COMMANDS + policy_corpus.generated(rng)))
    commands = [t for t in texts if " " in t or t in policy_corpus.PROGRAMS]
    more = [v for c in commands for v in variants(c, rng)]
    requests: list[Request] = []
    for text in dict.fromkeys(commands + more):
        for policy in ("careful", "tools", "open"):
            requests.append((policy, "bash", text))
    for text in commands:
        requests.append(("open", "exec@src", text))
        requests.append(("tools", "argv", text.split(" ")))
    for text in texts:
        if " " not in text:
            for how in ("read", "write"):
                requests += [("careful", how, text), ("open", how, text)]
    for call in policy_corpus.tool_calls(rng):
        requests += [("careful", "tool", call), ("open", "tool", call)]
    rng.shuffle(requests)
    return requests


class _Hung(Exception):
    pass


def _hung(signum: int, frame: object) -> None:
    raise _Hung


def verdict_key(judge: Callable[[], object]) -> tuple:
    """The verdict's parts a user sees; an exception or a hang (a mutant's endless loop) is a verdict too."""
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        v = judge()
    except _Hung:
        return ("hung",)
    except Exception as exc:  # a mutant may raise anything: that is a difference too
        return ("raised", type(exc).__name__)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    reason = dict(v.reason)  # type: ignore[attr-defined]
    return (
        v.allowed,
        reason.get("kind"),
        str(reason.get("why", "")),
        v.rule_ids,
        v.option_id,
        v.argv,  # type: ignore[attr-defined]
        v.workdir,
        v.paths,
    )  # type: ignore[attr-defined]


def functions_reached(judges: list[Callable[[], object]]) -> dict[str, list[int]]:
    """Which requests reach each mutated function: mutmut's trampolines report every call in "stats" mode."""
    from mutmut.mutation import trampoline

    reached: dict[str, list[int]] = {}
    current = [0]

    def record(name: str, caller: object = None) -> None:
        found = reached.setdefault(name, [])
        if not found or found[-1] != current[0]:
            found.append(current[0])

    trampoline.record_trampoline_hit = record  # a development tool reading mutmut's own call reports
    os.environ["MUTANT_UNDER_TEST"] = "stats"
    for index, judge in enumerate(judges):
        current[0] = index
        verdict_key(judge)
    os.environ["MUTANT_UNDER_TEST"] = ""
    return reached


_KILLED = {1, 3}  # a test failed
_TIMEOUT = {36, 24, -24, 152, 255}  # the mutant hung the tests: noticed too


def score() -> str:
    """mutmut's outcome per module, from its own records (mutants/**/*.meta)."""
    lines = [f"{'module':<22} {'mutants':>7} {'killed':>7} {'timeout':>7} {'survived':>8} {'score':>6}"]
    totals = [0, 0, 0, 0]
    for meta in sorted((ROOT / "mutants" / "harness").rglob("*.py.meta")):  # the policy modules, at any depth
        # a module with no mutant, or none run (`mutmut run NAMES` on part of the policy), has no score
        codes = [c for c in json.loads(meta.read_text())["exit_code_by_key"].values() if c is not None]
        if not codes:
            continue
        counts = [len(codes), sum(c in _KILLED for c in codes), sum(c in _TIMEOUT for c in codes), codes.count(0)]
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
        lines.append(_score_line(meta.name.removesuffix(".meta"), counts))
    lines.append(_score_line("all", totals))
    return "\n".join(lines)


def _score_line(name: str, counts: list[int]) -> str:
    total, killed, timeout, survived = counts
    return f"{name:<22} {total:>7} {killed:>7} {timeout:>7} {survived:>8} {100 * (killed + timeout) / total:>5.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", type=Path)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of requests per mutant")
    parser.add_argument("--names", type=Path, help="mutant names, one per line (default: mutmut's survivors)")
    parser.add_argument("--score", action="store_true", help="print mutmut's score per module first")
    options = parser.parse_args()
    signal.signal(signal.SIGALRM, _hung)
    if options.score:
        print(score())
    assert "mutants" in harness.__file__, "run `mutmut run` first: the hunter reads its mutated copy"
    names = options.names.read_text().split() if options.names else survivors()
    names = names[: options.limit] if options.limit else names
    if not names:
        print("no surviving mutants")
        return
    with tempfile.TemporaryDirectory() as tmp:
        policies = policy_corpus.policies(Path(tmp))
        requests = corpus()
        judges = [policy_corpus.judge(policies, *r) for r in requests]
        os.environ["MUTANT_UNDER_TEST"] = ""
        original = [verdict_key(j) for j in judges]
        reaches = functions_reached(judges)
        print(f"{len(names)} surviving mutants, {len(requests)} requests", file=sys.stderr)
        distinguished = refusal_to_allow = 0
        rows: dict[str, dict] = {}
        silent: list[str] = []
        for name in names:
            os.environ["MUTANT_UNDER_TEST"] = name
            hit = None
            deadline = time.monotonic() + options.budget
            for index in reaches.get(name.rsplit("__mutmut_", 1)[0], ()):
                if time.monotonic() > deadline:
                    break
                request, judge, before = requests[index], judges[index], original[index]
                after = verdict_key(judge)
                if after != before:
                    worse = before[0] is False and after[0] is True
                    if hit is None or worse:
                        hit = (request, before, worse)
                    if worse:
                        break
            os.environ["MUTANT_UNDER_TEST"] = ""
            if hit is None:
                silent.append(name)
                continue
            distinguished += 1
            refusal_to_allow += hit[2]
            request, before, worse = hit
            row = policy_corpus.row(*request, before)
            if options.record and json.dumps(row, sort_keys=True) not in rows:
                with options.record.open("a") as out:
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
            rows.setdefault(json.dumps(row, sort_keys=True), row)
            print(f"{name}: {'REFUSAL->ALLOW ' if worse else ''}{request!r}", file=sys.stderr)
    print(f"distinguished {distinguished}/{len(names)}; refusal-to-allow {refusal_to_allow}; silent {len(silent)}")
    (ROOT / "mutants" / "silent-mutants.txt").write_text("\n".join(silent) + "\n")  # to read with `mutmut show`
    sys.exit(1 if refusal_to_allow else 0)


if __name__ == "__main__":
    main()
