"""The shipped demo responses: they answer tasks of the default build, and verify as intended."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from pipeline.candidates.import_samples import DEMO_SAMPLES, import_candidates
from pipeline.config import Config, GenerateConfig, VerifyConfig
from pipeline.datasets.selection import kernel_features
from pipeline.stages.verify import verify_candidates
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


def _rows(backend: str = "cpu") -> list[dict]:
    rows = [json.loads(line) for line in DEMO_SAMPLES.read_text().splitlines()]
    return [r for r in rows if r["backend"] == backend]


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
    # a GPU build imports the CUDA responses only, a musa build nothing
    cuda, rejected = import_candidates(_seed_tasks(), GenerateConfig(), "cuda", report=True)
    assert not rejected and len(cuda) == len(_rows("cuda")) and {c.backend for c in cuda} == {
        "cuda"}
    assert import_candidates(_seed_tasks(), GenerateConfig(), "musa", report=True) == ([], [])


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


LABELS = ("correct", "wrong", "hacked")


def test_cuda_rows_cover_every_task_with_correct_wrong_and_hacked_forms() -> None:
    rows = _rows("cuda")
    assert {r["task_name"] for r in rows} == set(INTENDED) and all(r["model"] == "demo"
                                                                   for r in rows)
    for task in INTENDED:
        labels = [r["intended"] for r in rows if r["task_name"] == task]
        assert labels.count("correct") >= 2 and set(labels) == set(LABELS), (task, labels)
    texts = [r["response"] for r in rows]
    assert all("cuda_sources=" in t and "functions=[" in t and "load_inline(" in t for t in texts)
    assert sum('extra_cflags=[""]' in t and 'extra_ldflags=[""]' in t for t in texts) >= 6
    assert sum("__shared__" in t for t in texts) >= 2  # shared-memory reductions and scans
    assert all(r["intended_why"] for r in rows)


def _cuda_verdict(cand, status: str, reward: float):
    from schemas import Finding, Verdict

    return Verdict(candidate_id=cand.candidate_id, task_id=cand.task_id, verifier_version="t",
                   device="cuda", backend="cuda",
                   stage="performance" if status.startswith("correct") else "correctness",
                   status=status, reward=reward,
                   findings=[Finding("generalised", "also correct at batch_size 3072", None,
                                     "info")] if status.startswith("correct") else [])


def test_cuda_import_feeds_selection_distinct_strategies_per_task() -> None:
    from pipeline.datasets.selection import select_diverse

    tasks = _seed_tasks()
    cands, _ = import_candidates(tasks, GenerateConfig(), "cuda", report=True)
    intended = {(r["task_name"], r["response"]): r["intended"] for r in _rows("cuda")}
    status = {"correct": "correct_slow", "wrong": "incorrect", "hacked": "static_reject"}
    verdicts = []
    for i, c in enumerate(sorted(cands, key=lambda c: c.candidate_id)):
        label = intended[(c.task_id[3:], c.raw_response)]
        verdicts.append(_cuda_verdict(c, status[label], 0.5 + 0.01 * i if label == "correct"
                                      else 0.0))
    picked = select_diverse(cands, verdicts, k=3, weight=0.5)
    by_id = {c.candidate_id: c for c in cands}
    per_task: dict[str, set] = defaultdict(set)
    for cid in picked:
        c = by_id[cid]
        assert intended[(c.task_id[3:], c.raw_response)] == "correct"
        assert c.generator == "import:demo" and c.backend == "cuda"
        per_task[c.task_id].add(kernel_features(c.code).strategy())
    assert set(per_task) == {t.task_id for t in tasks}
    assert all(len(s) >= 2 for s in per_task.values()), per_task


@pytest.mark.slow  # nvcc on torch headers for 17 extensions: ~10 minutes on 2 cores
def test_cuda_rows_build_with_nvcc_or_stop_at_static(tmp_path: Path) -> None:
    """Build-only (`--compile-only`, no GPU): every response that is not a hack compiles; the
    hacks stop at the static checks before a build."""
    import shutil

    from verifier.api import verify_batch
    from verifier.protocol import VerifyOptions, VerifyRequest

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc (CUDA toolkit) not installed")
    rows = _rows("cuda")
    sources = {t.name: t.source for t in _seed_tasks()}
    reqs = [VerifyRequest(f"{r['task_name']}#{i}", r["task_name"], sources[r["task_name"]],
                          r["response"], "cuda") for i, r in enumerate(rows)]
    opts = VerifyOptions(backend="cuda", compile_only=True, compile_workers=2,
                         build_cache_dir=str(CACHE.parent / "verifier-builds-cuda"))
    got = {q.candidate_id: v for q, v in zip(reqs, verify_batch(reqs, opts), strict=True)}
    for q, r in zip(reqs, rows, strict=True):
        want = "static_reject" if r["intended"] == "hacked" else "compiled"
        assert got[q.candidate_id].status == want, (q.candidate_id, got[q.candidate_id].status,
                                                    (got[q.candidate_id].compile_log or "")[-400:])
