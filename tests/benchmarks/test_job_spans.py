"""`benchmarks.job_spans`: the spans' table of a `--profile` batch, read as a trainer's ops
engineer would (which span costs most, how long first calls take by status)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_sums_spans_and_splits_first_calls_by_status(tmp_path: Path) -> None:
    timings = [{"candidate_id": "a", "exec_s": 2.0, "phase_s": {"correctness": 0.5},
                "spans": {"settle": 0.25, "first_call": 0.4, "call_max": 0.01}},
               {"candidate_id": "b", "exec_s": 22.0,
                "spans": {"settle": 0.75, "first_call": 10.9}},
               {"candidate_id": "c", "exec_s": 1.0, "spans": {"settle": 0.5}}]
    verdicts = [{"candidate_id": "a", "status": "correct_fast"},
                {"candidate_id": "b", "status": "timeout"}]
    t, v = tmp_path / "out.timings.jsonl", tmp_path / "out"
    t.write_text("".join(json.dumps(r) + "\n" for r in timings))
    v.write_text("".join(json.dumps(r) + "\n" for r in verdicts))
    text = subprocess.run([sys.executable, "-m", "benchmarks.job_spans", str(t), str(v),
                           "--top", "1"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout
    assert "| settle | 3 | 1.5 | 0.500 | 0.750 | 0.750 |" in text, text
    assert "| worker correctness | 1 | 0.5 |" in text, text
    assert "| exec | 3 | 25.0 | 2.000 | 22.000 | 22.000 |" in text, text
    assert "| timeout | 1 | 10.900 | 10.900 | 10.900 | 0.000 |" in text, text
    assert "| correct_fast | 1 | 0.400 | 0.400 | 0.400 | 0.010 |" in text, text
    assert text.rstrip().endswith("- b: 22.0 s, timeout"), text
