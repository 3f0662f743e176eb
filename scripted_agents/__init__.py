"""The scripted declared-turn ACP agent: `python -m scripted_agents SCENARIO`.

Standard library plus pyyaml only, so spawn + initialize stays in tens of
milliseconds. See `_scenario.py` for the scenario format.
"""

from __future__ import annotations

from ._scenario import Scenario, ScenarioError, load_scenario, parse_scenario

__all__ = ["Scenario", "ScenarioError", "load_scenario", "parse_scenario"]
