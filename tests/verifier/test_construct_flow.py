"""The construction rule end to end (`verifier.judge.construct`), through `verify_batch` on the cpu:
the sandboxed child with the parent's recheck, and the persistent worker's loop with the judge's
arena (the GPU path's processes, run with the cpu backend). A candidate whose parameters have
other names than the reference's gets no state dict copied: it is correct only when the worker
built it with the judge's weights. One that cannot be built under a device context is judged
with both models built the KernelBench way, and its verdict says so; so is a task whose own
Model cannot."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from verifier.api import verify_batch
from verifier.backends.cpu import CpuBackend
from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import LINEAR_TASK, linear_candidate  # noqa: E402

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
RENAMED = linear_candidate().replace("self.fc", "self.lin")  # same draws, other names
# a draw before its layer: other weights than the reference's, from the same seed
SHIFTED = RENAMED.replace("        self.lin = nn.Linear(",
                          "        self.noise = torch.randn(1)\n        self.lin = nn.Linear(")
# what `.numpy()` of a fresh tensor does under a CUDA device context, on any device
HOST_ONLY = RENAMED.replace(
    "import torch\n", "import torch\nfrom torch.overrides import _get_current_function_mode_stack\n",
    1).replace("        self.lin = nn.Linear(",
               "        if _get_current_function_mode_stack():\n"
               "            raise RuntimeError('cannot be built under a device context')\n"
               "        self.lin = nn.Linear(")
# a task whose own Model builds only on the host
HOST_ONLY_TASK = LINEAR_TASK.replace(
    "import torch\n", "import torch\nfrom torch.overrides import _get_current_function_mode_stack\n",
    1).replace("        self.fc = nn.Linear(",
               "        if _get_current_function_mode_stack():\n"
               "            raise RuntimeError('the task refuses a device context')\n"
               "        self.fc = nn.Linear(")
BROKEN = RENAMED.replace("        self.lin = nn.Linear(",
                         "        raise RuntimeError('broken on every device')\n"
                         "        self.lin = nn.Linear(")


@pytest.mark.parametrize("persistent", [False, True], ids=["sandboxed", "persistent"])
def test_weights_match_across_processes_and_the_host_fallback_is_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, persistent: bool) -> None:
    monkeypatch.setattr(CpuBackend, "persistent_worker", persistent)
    cands = {"renamed": RENAMED, "shifted": SHIFTED, "host_only": HOST_ONLY, "broken": BROKEN}
    reqs = [VerifyRequest(k, "linear", LINEAR_TASK, code, "cpu") for k, code in cands.items()]
    reqs.append(VerifyRequest("task_host_only", "linear_host", HOST_ONLY_TASK, RENAMED, "cpu"))
    opts = VerifyOptions(backend="cpu", workers=1, compile_workers=1, run_timeout_s=60.0,
                         trials=2, perf_trials=3, perf_warmup=1, perf_budget_s=0.3,
                         build_cache_dir=str(CACHE), baseline_cache_dir=str(tmp_path / "bl"))
    timings: dict = {}
    stats: dict = {}
    v = {x.candidate_id: x for x in verify_batch(reqs, opts, timings=timings, stats=stats)}

    def rules(name: str) -> list[str]:
        return [f["rule"] for f in v[name].findings]

    assert v["renamed"].status in CORRECT_STATUSES, (v["renamed"].status, v["renamed"].error)
    assert v["renamed"].max_abs_diff < 1e-5  # the same weights (summed in another order)
    assert timings["renamed"]["construct"] == "device"  # built under the device context
    assert "host_construction" not in rules("renamed")
    assert v["shifted"].status == "incorrect", (v["shifted"].status, v["shifted"].error)
    assert v["host_only"].status in CORRECT_STATUSES, (v["host_only"].status,
                                                       v["host_only"].error)
    assert timings["host_only"]["construct"] == "host"
    note = next(f for f in v["host_only"].findings if f["rule"] == "host_construction")
    assert note["severity"] == "info"
    assert "cannot be built under a device context" in note["message"]
    assert "as KernelBench does" in note["message"]
    task = v["task_host_only"]
    assert task.status in CORRECT_STATUSES, (task.status, task.error)
    assert timings["task_host_only"]["construct"] == "host"
    assert any(f["rule"] == "host_construction" and "the task refuses a device context"
               in f["message"] for f in task.findings), task.findings
    assert stats["counters"]["runs built on the host"] == 2  # the profile says so too
    assert stats["counters"]["worker candidate_load s"] > 0
    if persistent:  # the slot's own steps (`verifier.run.spans`): arenas, the run, its settle
        for step in ("prepare", "worker_run", "settle", "release", "standby_wait"):
            assert stats["counters"][f"slot {step} s"] >= 0, step
        spans = timings["renamed"]["spans"]
        assert spans["worker_run"] > spans["settle"] > 0, spans
        assert spans["worker_run"] > max(v for k, v in spans.items() if k != "worker_run"), spans
    assert v["broken"].status == "runtime_error", (v["broken"].status, v["broken"].error)
    assert "broken on every device" in v["broken"].error
    assert "host_construction" not in rules("broken")
