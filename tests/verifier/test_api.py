"""verify_batch options: compile-only runs, timings, backend errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from verifier.api import verify_batch
from verifier.backends import BackendUnavailable
from verifier.protocol import VerifyOptions, VerifyRequest

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_TASK, relu_candidate, relu_ok  # noqa: E402

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


@pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)
def test_a_cached_compile_error_names_each_candidate_s_own_line(tmp_path: Path) -> None:
    """Two candidates with the same kernel at different places in their files share one cache
    entry; each verdict's log names the failing line in its own file, the cached one too."""
    body = ("torch::Tensor relu_fwd(torch::Tensor x) {\n  auto out = torch::empty_like(x);\n"
            "  return out * undeclared_scale;\n}")
    first = relu_candidate(body)
    second = "# the same kernel, six lines further down\n" * 6 + first
    opts = VerifyOptions(backend="cpu", compile_only=True, build_cache_dir=str(tmp_path / "b"))
    seen = []
    for name, code in (("first", first), ("second", second)):
        (v,) = verify_batch([VerifyRequest(name, "t", RELU_TASK, code, "cpu")], opts)
        bad = next(i for i, ln in enumerate(code.splitlines(), 1) if "undeclared_scale" in ln)
        assert v.status == "compile_error", (v.status, v.error)
        assert f"candidate.py:{bad}:" in v.compile_log, (bad, v.compile_log[-2000:])
        assert "undeclared_scale" in v.compile_log and "cpp_sources[" not in v.compile_log
        seen.append((bad, v.compile_s))
    assert seen[1][0] == seen[0][0] + 6
    assert seen[0][1] > 0 and seen[1][1] == 0.0  # the second verdict's build came from the cache
