"""The progress display: the same lines on a terminal (styled) and off one (plain writes), and a task's
title never read as markup."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from harness._display import RunDisplay
from harness.pytest_plugin import LOOP_SCRIPTED

pytestmark = LOOP_SCRIPTED

RECORDS = [
    {"type": "task_start", "task": {"id": "T1", "title": "Fix [red]the[/red] bug"}},
    {"type": "policy", "decision": "refuse", "source": "fs/write_text_file", "reason": {"kind": "no_rule"}},
    {"type": "task_end", "id": "T1", "terminal": "Completed", "iterations": 2, "rule_ids": ["read-all"]},
    {"type": "terminal"},
]
LINES = [
    "→ T1: Fix [red]the[/red] bug",
    "  refused fs/write_text_file: no_rule",
    "  ✓ T1 Completed after 2 turn(s); rules: read-all",
]


@pytest.mark.parametrize("terminal", [False, True], ids=["plain", "terminal"])
def test_progress_lines_say_the_same_on_and_off_a_terminal(terminal):
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, highlight=False, width=200)
    display = RunDisplay(console, stream=out)
    assert display.live is terminal
    for record in RECORDS:
        display(record)
    text = out.getvalue()
    assert ("\x1b[" in text) is terminal  # styled on a terminal only
    lines = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "\n").splitlines()
    assert [line for line in lines if line in LINES] == LINES  # (a terminal also shows the spinner's lines)
