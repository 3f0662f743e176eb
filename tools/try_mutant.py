"""Judge requests with the original policy code and with one mutant of it, side by side (issue 9).

After `make mutation`, to read a surviving mutant (`mutmut show NAME`) and test a guess of a request it
judges differently:

    python tools/try_mutant.py NAME CASES.jsonl

Each line of CASES is {"policy": "careful"|"open"|"tools", "how": "bash"|"exec"|"exec@src"|"argv"|"read"|
"write"|"tool", "request": ...}; "policy_rules": [...] instead of "policy" judges with a policy of your own (rule
dicts as in policy.yaml) against the same worktree (tests/helpers/policy_corpus.py builds it). Prints both
verdicts per case and marks REFUSAL->ALLOW where the original refuses and the mutant allows. With
`--record FILE`, appends each case the mutant judges differently as a row of policy_verdicts.jsonl, with the
original's verdict (read it before committing).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "mutants"))
sys.path.insert(1, str(ROOT))
sys.path.insert(2, str(ROOT / "tools"))
os.environ["MUTANT_UNDER_TEST"] = ""

from hunt_mutants import _hung, verdict_key  # noqa: E402

import harness  # noqa: E402
from tests.helpers import policy_corpus  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("cases", type=Path)
    parser.add_argument("--record", type=Path)
    options = parser.parse_args()
    name, cases = options.name, options.cases
    assert "mutants" in harness.__file__, "run `mutmut run` first: this reads its mutated copy"
    signal.signal(signal.SIGALRM, _hung)
    worse = 0
    with tempfile.TemporaryDirectory() as tmp:
        policies = policy_corpus.policies(Path(tmp))
        root = Path(tmp) / "wt"
        for case in policy_corpus.load_rows(cases):
            if "policy_rules" in case:
                policies["own"] = policy_corpus.policy_of(root, case["policy_rules"])
            judge = policy_corpus.judge(policies, case.get("policy", "own"), case["how"], case["request"])
            os.environ["MUTANT_UNDER_TEST"] = ""
            before = verdict_key(judge)
            os.environ["MUTANT_UNDER_TEST"] = name
            after = verdict_key(judge)
            os.environ["MUTANT_UNDER_TEST"] = ""
            mark = "REFUSAL->ALLOW " if before[0] is False and after[0] is True else ""
            mark = mark or ("SAME " if before == after else "DIFFERENT ")
            worse += mark.startswith("REFUSAL")
            if options.record and before != after:
                row = policy_corpus.row(case.get("policy", "own"), case["how"], case["request"], before)
                row.update({"policy_rules": case["policy_rules"]} if "policy_rules" in case else {})
                with options.record.open("a") as out:
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
            print(f"{mark}{case['how']} {case['request']!r}\n  original: {before}\n  mutant:   {after}")
    sys.exit(1 if worse else 0)


if __name__ == "__main__":
    main()
