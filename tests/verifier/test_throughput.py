"""The streaming pipeline's throughput parts: the batch profile (build units:
tests/verifier/test_compile_plan.py), task baselines measured ahead of candidates and cached,
`gpus`, and the standby worker that replaces one a candidate killed (run here with the cpu backend as a persistent
worker, as tests/verifier/test_gpu_worker.py does)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import verifier.run.gpu_runner as gpu_runner
from verifier.api import verify_batch
from verifier.backends.cpu import CpuBackend
from verifier.protocol import VerifyOptions, VerifyRequest
from verifier.run.batch_stats import BatchStats, _union, profile_table
from verifier.run.worker import run_job

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_TASK, relu_candidate, relu_ok  # noqa: E402

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
SEGFAULT = relu_candidate(
    "torch::Tensor relu_fwd(torch::Tensor x) {\n  volatile float* p = nullptr;\n"
    "  *p = 1.f;\n  return x;\n}")


def test_union_counts_overlaps_once() -> None:
    assert _union([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4.0)
    assert _union([(0, 10), (2, 3)]) == pytest.approx(10.0)
    assert _union([]) == 0.0


def test_summary_lanes_busy_and_idle_while_compiling() -> None:
    st = BatchStats()
    t0 = st.t0
    st.add("compile", t0 + 0, t0 + 10, "compile_0")
    st.add("compile", t0 + 0, t0 + 8, "compile_1")
    st.add("worker_start", t0 + 0, t0 + 2, "cuda:0")
    st.add("baseline", t0 + 2, t0 + 4, "cuda:0")
    st.add("exec", t0 + 8, t0 + 9, "cuda:0")
    st.add("exec", t0 + 10, t0 + 12, "cuda:0")
    s = st.summary(wall_s=12.0)
    assert s["phases"]["compile"] == {"n": 2, "sum_s": 18.0, "covered_s": 10.0, "first_s": 0.0,
                                      "last_s": 10.0}
    lane = s["lanes"]["cuda:0"]
    # busy 2 + 1 + 2 = 5 s; before compile ended (10 s) it was ready from 2 s and busy 3 s
    assert lane["busy_s"] == 5.0 and lane["jobs"] == 3
    assert lane["idle_while_compiling_s"] == 5.0
    table = profile_table(s)
    assert "compile" in table and "idle while candidates compiled 5.0s" in table


def test_a_baseline_only_job_times_the_reference_and_stops() -> None:
    job = {"nonce": "n1", "backend": "cpu", "extensions": {}, "baseline_only": True,
           "options": {"trials": 1, "perf_trials": 3, "perf_max_trials": 3, "perf_warmup": 1}}
    res = run_job(job, RELU_TASK, "")
    assert res["outcome"] == "baseline" and res["nonce"] == "n1"
    assert res["eager_us"] > 0 and res["eager_windows"]["calls"] >= 3
    assert set(res["phase_s"]) == {"reference_load", "baseline"}


def _opts(tmp_path: Path, **kw: object) -> VerifyOptions:
    return VerifyOptions(backend="cpu", workers=3, compile_workers=1, compile_batch=16,
                         run_timeout_s=15.0, trials=3, perf_trials=3, perf_warmup=1,
                         build_cache_dir=str(CACHE), baseline_cache_dir=str(tmp_path / "bl"),
                         **kw)


@pytest.mark.slow
def test_persistent_workers_prefetch_baselines_and_a_standby_takes_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CpuBackend, "persistent_worker", True)
    order = [("ok1", relu_ok()), ("crash", SEGFAULT), ("ok2", relu_ok("relu_b"))]
    reqs = [VerifyRequest(n, "relu", RELU_TASK, c, "cpu") for n, c in order]
    stats: dict = {}
    timings: dict = {}
    verdicts = {v.candidate_id: v for v in verify_batch(reqs, _opts(tmp_path, gpus=1),
                                                        timings=timings, stats=stats)}
    assert verdicts["crash"].status == "runtime_error"
    for name in ("ok1", "ok2"):
        assert verdicts[name].status in ("correct_slow", "correct_fast"), verdicts[name].error
    assert len(stats["lanes"]) == 1  # gpus=1: one execution worker although workers=3
    assert stats["phases"]["exec"]["n"] == 3
    assert stats["counters"]["worker replaced by its standby"] >= 1
    assert timings["ok1"]["worker_pid"] != timings["ok2"]["worker_pid"]  # after the crash
    cached = [json.loads(p.read_text()) for p in (tmp_path / "bl").glob("*.json")]
    assert len(cached) == 1 and cached[0]["eager_us"] > 0
    # the same batch again: the task's baseline comes from the disk cache, not a job
    again: dict = {}
    verdicts2 = verify_batch(reqs[:1], _opts(tmp_path, gpus=1, standby_worker=False),
                             stats=again)
    assert again["counters"].get("baseline_cache_hits") == 1
    assert "baseline" not in again["phases"]
    assert verdicts2[0].eager_us == cached[0]["eager_us"]


class _FakeWorker:
    """Stands in for a GpuWorkerProcess: starting takes `START_S`, a test kills it."""

    START_S = 0.5
    started: list[int] = []

    def __init__(self, *args: object, **kw: object) -> None:
        self.up = False

    def start(self) -> bool:
        time.sleep(self.START_S)
        self.up = True
        _FakeWorker.started.append(id(self))
        return True

    def alive(self) -> bool:
        return self.up

    def stop(self) -> None:
        self.up = False


def test_a_second_killed_worker_is_replaced_by_the_second_spare_without_waiting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two spares: two candidates in a row that kill their worker each get a warm one at once
    (with one spare the second waits for the first swap's refill to start)."""
    monkeypatch.setattr(gpu_runner, "GpuWorkerProcess", _FakeWorker)
    runner = gpu_runner.GpuRunner(VerifyOptions(backend="cpu"), {}, "cpu", standbys=2)
    runner.warm()
    for t in runner.threads.values():
        t.join()
    first = runner.worker
    waits = []
    for _ in range(2):
        runner.worker.stop()  # a candidate killed it
        began = time.monotonic()
        with runner.lock:
            runner._swap_in_standby(wait=True)
        waits.append(time.monotonic() - began)
        assert runner.worker.alive() and runner.worker is not first
    assert runner.swaps == 2 and max(waits) < _FakeWorker.START_S / 2, waits
    runner.worker.stop()  # a third in a row: both spares are still starting, the job waits
    began = time.monotonic()
    with runner.lock:
        runner._swap_in_standby(wait=True)
    assert runner.worker.alive() and time.monotonic() - began > _FakeWorker.START_S / 4
    runner.close()
    for t in runner.threads.values():
        t.join()
    assert not any(s.alive() for s in runner.spares) and not runner.worker.alive()


def test_a_gpu_slot_keeps_more_spares_than_the_cpu_loop() -> None:
    """A GPU worker starts in ~12 s: an H100 batch with three spares waited 34 s for them in
    runs of runtime fallbacks (each a cheat and its confirmation); the cpu loop's start in ~3 s
    and the 2-core CI host keeps three."""
    from verifier.api import CPU_STANDBYS, _standbys

    opts = VerifyOptions(backend="cuda")
    assert _standbys(opts, "cuda") == opts.standby_workers == 5
    assert _standbys(opts, "cpu") == CPU_STANDBYS == 3
    assert _standbys(VerifyOptions(standby_worker=False), "cuda") == 0
