"""`python -m scripted_agents SCENARIO`: serve ACP on stdio, playing SCENARIO."""

from __future__ import annotations

import os
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
    # stdin is closed: leave now. A turn still playing on a daemon thread may hold stdout's lock,
    # and the interpreter's shutdown would wait on it and abort (SIGABRT) instead of exiting.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
