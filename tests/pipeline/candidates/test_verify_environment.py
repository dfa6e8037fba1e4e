"""A stage whose every item fails alike for an environmental reason stops the run with that
reason (issue 28, item 6): the verify stage and the task probes, with the verifier's own
failure shapes (the worker that cannot start), not a stand-in exception."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipeline.stages.verify as verify_mod
from pipeline.config import VerifyConfig
from pipeline.tasks.probe.pool import ProbePool
from schemas import Candidate, Task
from verifier.isolation.sandbox import EnvironmentFailure
from verifier.protocol import VerdictData

BROKEN = ("worker exited with code 1: FileNotFoundError: [Errno 2] No such file or directory: "
          "'/tmp/venv/bin/python'")


def _items(n: int) -> tuple[dict[str, Task], list[Candidate]]:
    tasks = {f"t{i}": Task(task_id=f"t{i}", name=f"t{i}", source="x",
                                cpu_source="x") for i in range(n)}
    cands = [Candidate(f"c{i}", f"t{i}", "cpu", "test", f"code {i}") for i in range(n)]
    return tasks, cands


def _fake_batch(errors: list[str]):
    def verify_batch(reqs, opts, progress=None):
        return [VerdictData(r.candidate_id, r.task_id, "runtime_error", "correctness", "cpu",
                            error=e) for r, e in zip(reqs, errors, strict=True)]
    return verify_batch


def test_verify_stops_when_every_candidate_fails_alike(tmp_path: Path, monkeypatch) -> None:
    tasks, cands = _items(4)
    monkeypatch.setattr(verify_mod, "verify_batch", _fake_batch([BROKEN] * 4))
    with pytest.raises(EnvironmentFailure, match="FileNotFoundError"):
        verify_mod.verify_with_rejections(tasks, cands, VerifyConfig(backend="cpu"), tmp_path)


def test_verify_keeps_verdicts_of_candidates_that_fail_on_their_own(tmp_path: Path,
                                                                    monkeypatch) -> None:
    tasks, cands = _items(4)
    own = ["worker died with SIGSEGV (segmentation fault)"] * 4
    monkeypatch.setattr(verify_mod, "verify_batch", _fake_batch(own))
    verdicts, _ = verify_mod.verify_with_rejections(tasks, cands, VerifyConfig(backend="cpu"),
                                                    tmp_path)
    assert [v.status for v in verdicts] == ["runtime_error"] * 4


def test_probes_stop_when_every_probe_fails_alike(monkeypatch) -> None:
    pool = ProbePool(workers=2)
    try:
        monkeypatch.setattr(pool, "analyze", lambda job: {"ok": False, "valid": False,
                                                          "reason": "crash", "detail": BROKEN})
        with pytest.raises(EnvironmentFailure, match="task probes"):
            pool.map([{"id": i} for i in range(5)])
        monkeypatch.setattr(pool, "analyze", lambda job: {"ok": False, "valid": False,
                                                          "reason": "crash",
                                                          "detail": f"error {job['id']}"})
        assert len(pool.map([{"id": i} for i in range(5)])) == 5
    finally:
        pool.close()
