"""`benchmarks.worker_start`: a real worker's start split by the marks in its ready line (the
cpu loop here; the same worker and marks on a GPU node)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import worker_start


def test_a_real_workers_start_splits_into_steps_that_sum_to_its_wall(tmp_path: Path) -> None:
    got = worker_start.start_one("cpu", {})
    assert list(got) == [*worker_start.NAMES, "total"], got
    assert all(v >= 0 for v in got.values()), got
    # the steps partition the parent's wall from the spawn to the ready line
    assert abs(sum(got[k] for k in worker_start.NAMES) - got["total"]) < 0.01, got
    assert got["torch"] > 0.1 and got["harness"] > 0.05, got  # torch's import, a real job


def test_the_table_has_the_baseline_and_each_row(tmp_path: Path) -> None:
    out = tmp_path / "start.md"
    assert worker_start.main(["--backend", "cpu", "--together", "2", "--repeat", "1",
                              "--out", str(out)]) == 0
    rows = [ln for ln in out.read_text().splitlines() if ln.startswith("| ")]
    labels = [r.split(" | ")[0][2:] for r in rows[2:]]
    assert labels == ["baseline: bare `import torch` + first tensor", "one worker alone",
                      "2 at once"], rows
    assert all(len(r.split("|")) == len(rows[0].split("|")) for r in rows), rows
