"""verify_batch options: compile-only runs, timings, backend errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from verifier.api import verify_batch
from verifier.backends import BackendUnavailable
from verifier.protocol import VerifyOptions, VerifyRequest

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_TASK, relu_ok  # noqa: E402

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"


def test_compile_only_stops_at_compiled(tmp_path: Path) -> None:
    opts = VerifyOptions(backend="cpu", compile_only=True, build_cache_dir=str(CACHE))
    timings: dict = {}
    (v,) = verify_batch([VerifyRequest("c", "t", RELU_TASK, relu_ok(), "cpu")], opts,
                        timings=timings)
    assert v.status == "compiled" and v.stage == "compile" and v.reward == 0.1
    assert "exec_s" not in timings["c"]


def test_explicit_unavailable_backend_raises() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(BackendUnavailable):
        verify_batch([VerifyRequest("c", "t", RELU_TASK, relu_ok(), "cpu")],
                     VerifyOptions(backend="cuda"))


def test_cuda_sources_on_cpu_are_a_compile_error(tmp_path: Path) -> None:
    code = relu_ok().replace('cpp_sources=cpp_source,',
                             'cpp_sources=cpp_source, cuda_sources="__global__ void k() {}",')
    opts = VerifyOptions(backend="cpu", build_cache_dir=str(tmp_path / "b"))
    (v,) = verify_batch([VerifyRequest("c", "t", RELU_TASK, code, "cpu")], opts)
    assert v.status == "compile_error" and "cuda_sources" in v.compile_log


CUDA_RELU = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = """
#include <torch/extension.h>
__global__ void relu_k(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    relu_k<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""
ext = load_inline("relu_ext", "torch::Tensor relu(torch::Tensor x);", cuda_sources=[src],
                  functions=["relu"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu(x)
'''


def test_cuda_batches_go_to_the_persistent_gpu_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU host, candidates that pass the static stage run in the GPU service's workers."""
    from verifier import gpu_service
    from verifier.backends.cuda import CudaBackend

    seen: dict = {}

    class FakeService:
        def __init__(self, cache_dir, options=None, gpus=None) -> None:
            seen["options"] = options

        def run(self, jobs):
            seen["jobs"] = jobs
            return [{"status": "correct_fast", "stage": "done", "runtime_us": 50.0,
                     "eager_us": 100.0, "speedup": 2.0, "compile_s": 3.25, "gpu": "0",
                     "findings": [{"rule": "hidden_work", "severity": "warning", "line": None,
                                   "message": "m"}], "kernel_names": ["relu_k"]},
                    {"status": "compile_error", "stage": "compile", "compile_s": 1.0,
                     "compile_log": "cuda.cu(3): error: identifier \"q\" is undefined"}]

    monkeypatch.setattr(CudaBackend, "is_available", classmethod(lambda cls: True))
    monkeypatch.setattr(gpu_service, "GpuService", FakeService)
    cheat = CUDA_RELU.replace("return ext.relu(x)", "return torch.relu(x)")
    reqs = [VerifyRequest("a", "t", RELU_TASK, CUDA_RELU, "cuda"),
            VerifyRequest("b", "t", RELU_TASK, cheat, "cuda"),
            VerifyRequest("a", "t", RELU_TASK, CUDA_RELU.replace("? x[i]", "? q"), "cuda")]
    opts = VerifyOptions(backend="cuda", atol_fp32=3e-4, seed=7, compile_workers=3)
    ok, cheated, broken = verify_batch(reqs, opts)
    # the static stage still runs first: the torch fallback never reaches the GPU
    assert cheated.status == "static_reject" and "torch" in cheated.error
    jobs = seen["jobs"]
    assert len(jobs) == 2 and len({j.candidate_id for j in jobs}) == 2  # repeated ids kept apart
    assert "ext.relu(x)" in jobs[0].candidate_source and jobs[0].task_source == RELU_TASK
    sopts = seen["options"]
    assert sopts.compile_workers == 3 and sopts.job_extra["atol"] == 3e-4
    assert sopts.job_extra["seed"] == 7
    assert (ok.status, ok.speedup, ok.runtime_us, ok.device, ok.compile_s) == (
        "correct_fast", 2.0, 50.0, "cuda:0", 3.25)
    assert ok.kernel_names == ["relu_k"] and ok.findings[-1]["rule"] == "hidden_work"
    assert ok.reward > broken.reward > 0 and ok.faster
    assert broken.status == "compile_error" and "undefined" in broken.error
