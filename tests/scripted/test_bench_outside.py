"""`loop-harness bench kernel --outside` (issue 15) runs end to end at a tiny N: figures, never timing asserts."""

from __future__ import annotations

import re

from harness import _cli, testing
from harness.bench import _outside as _bench_outside
from harness.pytest_plugin import LOOP_SCRIPTED, LOOP_SLOW

pytestmark = LOOP_SCRIPTED


@LOOP_SLOW
def test_the_outside_bench_prints_both_rates_and_a_ratio_and_the_kernel_transcript_is_complete(
    tmp_path, monkeypatch, capsys
):
    bench = _bench_outside.bench_outside
    # Through the command line, with the workspace and the kernel's transcripts kept under tmp_path.
    monkeypatch.setattr(_bench_outside, "bench_outside", lambda **kw: bench(**kw, workdir=tmp_path))

    assert _cli.main(["bench", "kernel", "--outside", "--tasks", "25", "--rounds", "1"]) == 0

    out = capsys.readouterr().out
    number = r"\d+(\.\d+)?"
    assert re.search(rf"^kernel \(`python -m harness run`.*: +{number} tasks/s \(best of 1\)$", out, re.M), out
    assert re.search(rf"^bare SDK client .*: +{number} tasks/s \(best of 1\)$", out, re.M), out
    ratio = re.search(rf"^ratio kernel / bare: +({number}) \(best against best; the rounds' own ratios ({number}), "
                      rf"median {number}\)$", out, re.M)  # fmt: skip
    assert ratio is not None, out
    assert ratio[1] == ratio[3]  # one round: its ratio is the best against the best
    assert len(re.findall(rf"^  round 1 (kernel|bare) +t\(20\) .* t\(25\) .* {number} tasks/s$", out, re.M)) == 2
    # The kernel's run: its transcript complete and valid against the schema.
    transcripts = sorted((tmp_path / "runs").glob("*.jsonl"))
    assert len(transcripts) == 1, transcripts
    for path in transcripts:
        records = testing.assert_transcript_valid(path)
        assert records[0]["type"] == "run_start" and records[-1]["type"] == "terminal", path
        assert records[-1]["terminal"] == "Idle"
        assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
        ends = [r for r in records if r["type"] == "task_end"]
        assert len(ends) == 25 and all(r["terminal"] == "Completed" for r in ends)
        # per task: one permission and one read, each judged by the policy before it was acted on
        policy = [r["source"] for r in records if r["type"] == "policy"]
        assert policy.count("session/request_permission") == policy.count("fs/read_text_file") == len(ends)
