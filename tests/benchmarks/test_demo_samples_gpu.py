"""benchmarks/demo_samples_gpu's host-side parts: rows, label matching and the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.demo_samples_gpu import cuda_rows, matches, table


def test_rows_are_the_cuda_demo_rows_with_labels() -> None:
    rows = cuda_rows()
    assert len(rows) >= 12 and {r["intended"] for r in rows} == {"correct", "wrong", "hacked"}
    assert len({r["case"] for r in rows}) == len(rows)


def test_label_matching_and_table(tmp_path: Path) -> None:
    assert matches("correct", "correct_slow") and not matches("correct", "incorrect")
    assert matches("wrong", "runtime_error") and not matches("wrong", "correct_fast")
    assert matches("hacked", "cheat") and not matches("hacked", "compiled")
    rows = cuda_rows()[:2]
    verdicts = {rows[0]["case"]: {"status": "correct_fast"}, rows[1]["case"]: {"status": "cheat"}}
    lines = table(rows, verdicts)
    want = "yes" if rows[0]["intended"] == "correct" else "no"
    assert lines[2].endswith(f"| correct_fast | {want} |")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"backend": "cuda", "task_name": "t", "sample": 0,
                               "intended": "maybe"}) + "\n")
    with pytest.raises(SystemExit, match="bad.jsonl row 1: `intended` is 'maybe'"):
        cuda_rows(bad)
