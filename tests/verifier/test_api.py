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
