"""A CPU baseline timed while compilers of this process ran is marked, kept out of the cache,
timed again once the batch's compiles are over, and the verdicts that used it are re-judged from
the quiet figure before they are written (verifier.run.baselines, verifier.api). The compile
load is a real compiler run through `run_tool` during the timing; no assertion compares speeds."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from verifier.api import verify_batch
from verifier.backends import get_backend, run_tool
from verifier.backends.tool_load import TOOL_LOAD
from verifier.judge.reward import reward_of, speedup_of
from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest
from verifier.run.baselines import BESIDE_COMPILES, Baselines, baseline_path
from verifier.run.runners import SandboxRunner

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_TASK, relu_ok  # noqa: E402

BUILDS = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"


def _compile(where: Path) -> None:
    """A real compiler run (the load a slow candidate's build puts on the host)."""
    src = where / "load.cpp"
    src.write_text("#include <vector>\nint main() { std::vector<int> v(3); return v[0]; }\n")
    log: list[str] = []
    assert run_tool(["g++", "-fsyntax-only", str(src)], log, 300.0), log


class _Reference:
    """The slot's trusted process, as `Baselines` sees it: answers the figures it is given,
    running a real compiler during the timing for the first `loaded` calls."""

    def __init__(self, eagers: list[float], loaded: int, where: Path) -> None:
        self.eagers, self.loaded, self.where, self.calls = eagers, loaded, where, 0

    def baseline(self, task_source: str, job_options: dict[str, Any]) -> dict[str, Any]:
        if self.calls < self.loaded:
            _compile(self.where)
        self.calls += 1
        return {"eager_us": self.eagers[self.calls - 1], "eager_iqr_us": 1.0}


def test_a_baseline_timed_beside_a_compile_is_kept_out_of_the_cache_until_timed_quiet(
        tmp_path: Path) -> None:
    opts = VerifyOptions(backend="cpu", baseline_cache_dir=str(tmp_path / "baselines"))
    backend = get_backend("cpu")
    cached = baseline_path(opts, backend, RELU_TASK, backend.baseline_key())
    ref = _Reference([200.0, 190.0, 100.0, 110.0], loaded=2, where=tmp_path)
    baselines = Baselines(opts, backend)
    first = baselines.ensure(RELU_TASK, ref, {})
    assert first[BESIDE_COMPILES] and first["eager_us"] == 190.0  # the faster of two timings
    assert not cached.exists()
    assert baselines.ensure(RELU_TASK, ref, {}) == first and ref.calls == 2  # not timed again
    quiet = baselines.retime(RELU_TASK, ref, {})
    assert ref.calls == 4 and quiet["eager_us"] == 100.0 and BESIDE_COMPILES not in quiet
    on_disk = json.loads(cached.read_text())
    assert on_disk["eager_us"] == 100.0 and BESIDE_COMPILES not in on_disk
    assert baselines.ensure(RELU_TASK, ref, {})["eager_us"] == 100.0 and ref.calls == 4


def test_one_quiet_timing_is_enough_and_a_loaded_retiming_caches_nothing(tmp_path: Path
                                                                        ) -> None:
    opts = VerifyOptions(backend="cpu", baseline_cache_dir=str(tmp_path / "baselines"))
    backend = get_backend("cpu")
    cached = baseline_path(opts, backend, RELU_TASK, backend.baseline_key())
    ref = _Reference([300.0, 250.0, 280.0, 260.0], loaded=4, where=tmp_path)
    baselines = Baselines(opts, backend)
    assert baselines.ensure(RELU_TASK, ref, {})[BESIDE_COMPILES]
    again = baselines.retime(RELU_TASK, ref, {}, quiet_wait_s=0.0)  # compilers ran again
    assert again[BESIDE_COMPILES] and again["eager_us"] == 250.0 and not cached.exists()
    other = Baselines(opts, backend)  # the first timing loaded, the second quiet
    mixed = _Reference([400.0, 120.0], loaded=1, where=tmp_path)
    figures = other.ensure(RELU_TASK, mixed, {})
    assert BESIDE_COMPILES not in figures and figures["eager_us"] == 120.0
    assert json.loads(cached.read_text())["eager_us"] == 120.0


def test_tool_load_sees_a_compiler_that_ran_at_any_time_during_a_span(tmp_path: Path) -> None:
    quiet = TOOL_LOAD.mark()
    assert not TOOL_LOAD.ran_since(quiet)
    during = threading.Thread(target=_compile, args=(tmp_path,))
    during.start()
    during.join()
    assert TOOL_LOAD.ran_since(quiet)  # started and ended inside the span
    assert not TOOL_LOAD.ran_since(TOOL_LOAD.mark())
    assert TOOL_LOAD.wait_quiet(0.0)


def test_a_batch_re_judges_a_verdict_whose_baseline_was_timed_beside_a_compile(
        tmp_path: Path, monkeypatch) -> None:
    """A real batch: the slot's trusted process times the reference while a real compiler runs
    (the first timing's two runs); the verdict is written only after the quiet re-timing, with
    its eager, speedup and reward from that figure, which alone is cached."""
    opts = VerifyOptions(backend="cpu", workers=1, build_cache_dir=str(BUILDS),
                         baseline_cache_dir=str(tmp_path / "baselines"))
    backend = get_backend("cpu")
    cached = baseline_path(opts, backend, RELU_TASK, backend.baseline_key())
    real = SandboxRunner.baseline
    calls: list[dict[str, Any]] = []

    def timed(self: SandboxRunner, task_source: str, job_options: dict[str, Any]) -> Any:
        loaded = len(calls) < 2
        load = threading.Thread(target=_compile, args=(tmp_path,))
        if loaded:
            load.start()
        figures = real(self, task_source, job_options)
        if loaded:
            load.join()
        calls.append({"eager_us": figures["eager_us"], "cached": cached.exists()})
        return figures

    monkeypatch.setattr(SandboxRunner, "baseline", timed)
    written: list[int] = []
    (v,) = verify_batch([VerifyRequest("c", "t", RELU_TASK, relu_ok(), "cpu")], opts,
                        progress=lambda _: written.append(len(calls)))
    assert v.status in CORRECT_STATUSES, (v.status, v.error)
    assert len(calls) == 4 and written == [4]  # timed twice beside the compile, twice quiet
    assert not any(c["cached"] for c in calls)  # the loaded figure never reached the cache
    quiet = min(c["eager_us"] for c in calls[2:])
    assert v.eager_us == quiet
    assert v.speedup == speedup_of(quiet, v.runtime_us)
    assert v.reward == reward_of(v)[0]
    assert not any(f["rule"] == "baseline_beside_compiles" for f in v.findings)
    assert v.status == ("correct_fast" if v.speedup > opts.fast_threshold else "correct_slow")
    on_disk = json.loads(cached.read_text())
    assert on_disk["eager_us"] == quiet and BESIDE_COMPILES not in on_disk


def test_a_held_verdict_is_written_even_when_its_baseline_cannot_be_timed_again(
        tmp_path: Path, monkeypatch) -> None:
    """The re-timing fails (the reference's process dies): the verdict keeps the figure timed
    beside the compile, says so in an info finding, and nothing is cached."""
    opts = VerifyOptions(backend="cpu", workers=1, build_cache_dir=str(BUILDS),
                         baseline_cache_dir=str(tmp_path / "baselines"))
    backend = get_backend("cpu")
    real = SandboxRunner.baseline
    calls: list[float] = []

    def timed(self: SandboxRunner, task_source: str, job_options: dict[str, Any]) -> Any:
        if len(calls) >= 2:
            raise RuntimeError("the reference's process died")
        load = threading.Thread(target=_compile, args=(tmp_path,))
        load.start()
        figures = real(self, task_source, job_options)
        load.join()
        calls.append(figures["eager_us"])
        return figures

    monkeypatch.setattr(SandboxRunner, "baseline", timed)
    (v,) = verify_batch([VerifyRequest("c", "t", RELU_TASK, relu_ok(), "cpu")], opts)
    assert v.status in CORRECT_STATUSES, (v.status, v.error)
    assert v.eager_us == min(calls) and v.speedup == speedup_of(min(calls), v.runtime_us)
    assert any(f["rule"] == "baseline_beside_compiles" for f in v.findings)
    assert not baseline_path(opts, backend, RELU_TASK, backend.baseline_key()).exists()
