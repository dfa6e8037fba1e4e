"""The rows audit's speed checks pass on rows the builders make and fail on rows that break
them (a slow sft answer, a lost reward, a repeated analysis, a timing that did not repeat)."""

from __future__ import annotations

import copy

from benchmarks.audit_table import Audit
from benchmarks.speed_audit import check_speed
from pipeline.config import Config
from pipeline.datasets.rows import build_datasets
from pipeline.datasets.selection import select_diverse
from tests.pipeline.ks_synthetic import candidate, pool, verdict

MANIFEST = {"config": {"select": {"min_speedup": 1.0}}}


def _built() -> tuple:
    tasks, cands, verdicts = pool(n_tasks=6)
    tables = build_datasets(tasks, cands, verdicts, select_diverse(cands, verdicts, 3, 0.5),
                            Config())
    rows = {k: t.to_pylist() for k, t in tables.items() if k != "tasks"}
    return rows, tables["tasks"].to_pylist(), cands, {v.candidate_id: v for v in verdicts}


def _audit(rows: dict, tasks: list, cands: list, verdicts: dict, min_sft: int = 1) -> Audit:
    audit = Audit()
    check_speed(audit, MANIFEST, rows, tasks, cands, verdicts, min_sft=min_sft)
    return audit


def test_built_rows_pass_every_speed_check() -> None:
    audit = _audit(*_built())
    assert not audit.failed(), audit.table()
    for check in ("numbers_by_name", "sft_speed", "chosen_speed", "speed_pairs",
                  "timing_repeats", "one_analysis_per_kernel", "validation_split",
                  "input_specs_shown"):
        assert audit.counts[check]["pass"] > 0, check


def test_broken_rows_fail_their_checks() -> None:
    rows, tasks, cands, verdicts = _built()
    bad = copy.deepcopy(rows)
    bad["sft"][0]["speedup"] = 0.5
    bad["sft"][1]["reward"] = 0.0
    bad["perf_analysis"].append(dict(bad["perf_analysis"][0], row_id="copy" * 5))
    bad["rl"][0]["input_specs"] = [dict(bad["rl"][0]["input_specs"][0], shape=[64, 64, 128])]
    audit = _audit(bad, tasks, cands, verdicts, min_sft=100)
    for check in ("sft_speed", "numbers_by_name", "one_analysis_per_kernel", "sft_rows",
                  "input_specs_shown"):
        assert audit.counts[check]["fail"] >= 1, check
    # the sft answer's program timed again on the same device, three times slower
    first = next(c for c in cands if c.candidate_id == rows["sft"][0]["candidate_id"])
    again = candidate(next(t for t in _tasks(first)), "repair:fix", first.code + "\n",
                      parent=first, turn=1)
    v0 = verdicts[first.candidate_id]
    verdicts = dict(verdicts, **{again.candidate_id: verdict(
        again, "correct_slow", v0.speedup / 3, 1.0)})
    audit = _audit(rows, tasks, cands + [again], verdicts)
    assert audit.counts["timing_repeats"]["fail"] >= 1


def _tasks(c) -> list:
    return [t for t in pool(n_tasks=6)[0] if t.task_id == c.task_id]


def test_an_sft_answer_timed_again_below_the_gate_fails_timing_repeats() -> None:
    from dataclasses import replace

    from pipeline.datasets.retime import RULE
    from schemas import Finding

    rows, tasks, cands, verdicts = _built()
    cid = rows["sft"][0]["candidate_id"]
    again = Finding(rule=RULE, severity="info", message="timed again: speedup=0.8000 "
                    "runtime_us=50.0 runtime_iqr_us=1.0 eager_us=40.0 status=correct_slow")
    v = verdicts[cid]
    bad = dict(verdicts, **{cid: replace(v, findings=[*v.findings, again])})
    audit = _audit(rows, tasks, cands, bad)
    assert audit.counts["timing_repeats"]["fail"] >= 1
    assert any("0.8x" in e for e in audit.examples["timing_repeats"])
