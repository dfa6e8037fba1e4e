"""The shipped demo responses: they answer tasks of the default build, and verify as intended."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from pipeline.candidates.import_samples import DEMO_SAMPLES, import_candidates
from pipeline.candidates.verify import verify_candidates
from pipeline.config import Config, GenerateConfig, VerifyConfig
from pipeline.datasets.selection import kernel_features
from schemas import Task
from sources.seed import sample_seed_files

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
# what each hand-written response is meant to be, in file order per task
INTENDED = {
    "elementwise_scale_shift": ["correct", "correct", "correct", "incorrect", "static_reject"],
    "broadcast_sub_row_mean": ["correct", "correct", "incorrect", "static_reject"],
    "scan_cumsum": ["correct", "correct", "incorrect", "static_reject"],
    "activation_tanh": ["correct", "incorrect", "correct"],
}


def _rows() -> list[dict]:
    return [json.loads(line) for line in DEMO_SAMPLES.read_text().splitlines()]


def _seed_tasks() -> list[Task]:
    cfg = Config().sources
    files = {p.stem: p for p in sample_seed_files(cfg.seed_sample, cfg.sample_seed)}
    return [Task(task_id=f"id_{n}", name=n, source=files[n].read_text(),
                 cpu_source=files[n].read_text()) for n in INTENDED]


def test_demo_rows_answer_default_build_tasks_in_several_strategies() -> None:
    rows = _rows()
    cfg = Config().sources
    default_tasks = {p.stem for p in sample_seed_files(cfg.seed_sample, cfg.sample_seed)}
    assert {r["task_name"] for r in rows} == set(INTENDED) <= default_tasks
    assert all(r["model"] == "demo" and r["backend"] == "cpu" for r in rows)
    cands, rejected = import_candidates(_seed_tasks(), GenerateConfig(), "cpu", report=True)
    assert not rejected and len(cands) == len(rows) == sum(map(len, INTENDED.values()))
    assert {c.generator for c in cands} == {"import:demo"}
    strategies = defaultdict(set)
    for c in cands:
        assert "```python" in c.raw_response and "class ModelNew" in c.code
        strategies[c.task_id].add(kernel_features(c.code).strategy())
    assert all(len(s) >= 2 for s in strategies.values())  # distinct strategies per task
    # on another backend the CPU-only demo contributes nothing
    assert import_candidates(_seed_tasks(), GenerateConfig(), "cuda", report=True) == ([], [])


@pytest.mark.slow  # compiles and runs 20 CPU kernels: minutes on 2 cores
def test_demo_rows_verify_as_intended(tmp_path: Path) -> None:
    tasks = _seed_tasks()
    cands, _ = import_candidates(tasks, GenerateConfig(), "cpu", report=True)
    cfg = VerifyConfig(backend="cpu", build_cache_dir=str(CACHE), perf_trials=3, perf_warmup=1,
                       baseline_cache_dir=str(tmp_path / "bl"), run_timeout_s=60)
    verdicts = {v.candidate_id: v for v in verify_candidates(
        {t.task_id: t for t in tasks}, cands, cfg, tmp_path)}
    got: dict[str, list[str]] = defaultdict(list)
    for c in sorted(cands, key=lambda c: json.loads(c.meta)["sample"]):
        status = verdicts[c.candidate_id].status
        got[c.task_id[3:]].append("correct" if status.startswith("correct") else status)
    assert dict(got) == INTENDED
