"""`python -m scripted_agents SCENARIO`: serve ACP on stdio, playing SCENARIO."""

from __future__ import annotations

import sys

from ._agent import ScriptedAgent
from ._scenario import ScenarioError, load_scenario
from ._wire import Wire


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m scripted_agents SCENARIO.yaml", file=sys.stderr)
        return 2
    try:
        scenario = load_scenario(argv[0])
    except ScenarioError as exc:
        print(f"scripted agent: {exc}", file=sys.stderr)
        return 2
    ScriptedAgent(scenario, Wire(sys.stdout.buffer)).serve(sys.stdin.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
