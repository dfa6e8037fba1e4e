"""CUDA backend on a host without a GPU: flags, nvcc compile-only, inline extraction, anti-cheat
classification, timing statistics and the baseline cache. GPU-only checks skip without CUDA."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from verifier.backends import BuildUnit, get_backend, select_backend
from verifier.backends.cuda import (
    CudaBackend,
    arch_flags,
    cuda_home,
    light_header_text,
    nvcc_flags,
    torch_has_cuda_libs,
)
from verifier.backends.gpu_anticheat import (
    candidate_kernel_names,
    classify_kernel,
    fallback_findings,
    kernel_base_name,
    launched_kernels,
)
from verifier.backends.gpu_timing import coefficient_of_variation, summarize

ROOT = Path(__file__).resolve().parents[2]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"),
                                reason="nvcc (CUDA toolkit) not installed")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA device (torch.cuda.is_available() is False)")

CANDIDATE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

HEAD = "#include <torch/extension.h>\\n"
src = HEAD + """
__global__ void scale_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.f * x[i];
}
torch::Tensor scale(torch::Tensor x) {
    auto y = torch::empty_like(x);
    scale_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                                   x.numel());
    return y;
}
"""
decl = "torch::Tensor scale(torch::Tensor x);"
ext = load_inline("scale_ext", decl, cuda_sources=[src], functions=["scale"],
                  extra_cuda_cflags=["-O3"])
other = load_inline(name=f"dyn_{torch.__version__}", cpp_sources=open("x").read())


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.scale(x)
'''


def test_extension_specs_are_resolved_statically_when_literal() -> None:
    from verifier.checks.extspec import specs_from_source

    assert specs_from_source(CANDIDATE) is None  # open("x").read(): needs a collect run
    literal = CANDIDATE.replace('other = load_inline(name=f"dyn_{torch.__version__}", '
                                'cpp_sources=open("x").read())\n', "")
    (spec,) = specs_from_source(literal)
    assert spec.name == "scale_ext" and spec.functions == ["scale"] and spec.batchable
    assert spec.cuda_sources[0].startswith("#include <torch/extension.h>\n")
    assert spec.extra_cuda_cflags == ["-O3"]


def test_light_header_swaps_extension_h_only_when_safe() -> None:
    src = "#include <torch/extension.h>\n__global__ void k() {}\n"
    assert light_header_text(src) == "#include <torch/types.h>\n__global__ void k() {}\n"
    assert light_header_text("#include <cuda_runtime.h>\n") is None
    assert light_header_text(src + "PYBIND11_MODULE(m, x) {}\n") is None  # needs pybind11


def test_flags_target_one_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    assert arch_flags("8.6") == ["-gencode=arch=compute_86,code=sm_86"]
    flags = nvcc_flags("9.0")
    assert [f for f in flags if f.startswith("-gencode")] == ["-gencode=arch=compute_90,code=sm_90"]
    assert "--expt-relaxed-constexpr" in flags and "-std=c++20" in flags
    assert any(f.endswith("torch/include") for f in flags)
    from verifier.backends import cuda as cuda_mod

    cuda_mod.cuda_arch.cache_clear()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    try:
        assert cuda_mod.cuda_arch() == "8.0"
    finally:
        cuda_mod.cuda_arch.cache_clear()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_unavailable_here_is_explained() -> None:
    assert CudaBackend.is_available() is False
    assert "CPU build" in CudaBackend.unavailable_reason() or "is_available" in (
        CudaBackend.unavailable_reason())
    assert select_backend("auto") in ("cpu", "musa")


@needs_nvcc
def test_nvcc_compiles_a_device_unit_for_the_fixed_arch(tmp_path: Path) -> None:
    unit = tmp_path / "k.cu"
    unit.write_text("#include <cuda_runtime.h>\n"
                    "__global__ void add_one(float* y, int n) {\n"
                    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                    "    if (i < n) y[i] += 1.f;\n}\n")
    backend = get_backend("cuda")
    log: list[str] = []
    obj = tmp_path / "k.o"
    assert backend.compile_unit(BuildUnit(unit, "device"), obj, [], None, log, 120), log
    assert obj.stat().st_size > 0
    tool = Path(cuda_home() or "/usr/local/cuda") / "bin" / "cuobjdump"
    if tool.exists():  # exactly one cubin, for the one architecture asked for
        elfs = subprocess.run([str(tool), "--list-elf", str(obj)], capture_output=True,
                              text=True).stdout.split()
        assert len(elfs) == 1 and "sm_90" in elfs[0], elfs


@needs_nvcc
def test_nvcc_errors_name_the_unit_and_line(tmp_path: Path) -> None:
    unit = tmp_path / "bad.cu"
    unit.write_text("__global__ void k(float* y) {\n    y[0] = undefined_thing;\n}\n")
    log: list[str] = []
    ok = get_backend("cuda").compile_unit(BuildUnit(unit, "device"), tmp_path / "bad.o", [],
                                          None, log, 120)
    text = "\n".join(log)
    assert not ok
    assert "bad.cu:2:1: error" in text and "undefined_thing" in text  # gcc-style location


@needs_nvcc
@pytest.mark.skipif(torch_has_cuda_libs(), reason="this torch build can link CUDA extensions")
def test_link_on_a_cpu_torch_build_leaves_cuda_symbols_for_the_gpu_node(tmp_path: Path) -> None:
    unit = tmp_path / "k.cu"
    unit.write_text("#include <cuda_runtime.h>\n__global__ void k(float* y) { y[0] = 1.f; }\n"
                    "void launch(float* y) { k<<<1, 1>>>(y); cudaDeviceSynchronize(); }\n")
    backend = get_backend("cuda")
    log: list[str] = []
    assert backend.compile_unit(BuildUnit(unit, "device"), tmp_path / "k.o", [], None, log, 120)
    assert backend.link([tmp_path / "k.o"], tmp_path / "k.so", [], log, 60), log
    assert (tmp_path / "k.so").stat().st_size > 0
    assert any("compile-only host" in line for line in log)
    assert not any("-ltorch_cuda" in line for line in log if line.startswith("$"))


# Kernel names as torch.profiler reports them on an H100 (torch 2.11, CUDA 13).
AT_RELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)"
           "::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
           "at::native::detail::ClampLimits)::{lambda()#1}::operator()() const::{lambda()#7}"
           "::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, ...)")
FILL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)")


def test_kernel_names_classify_library_fallbacks_and_own_kernels() -> None:
    own = candidate_kernel_names([
        "__global__ void relu_kernel(const float* x) {}\n"
        "template <int B> __global__ void __launch_bounds__(256) tiled_mm(float* c) {}\n"
        "__global__ static void elementwise_kernel(float* y) {}\n"])
    assert own == {"relu_kernel", "tiled_mm", "elementwise_kernel"}
    assert kernel_base_name("void ns::tiled_mm<32>(float*)") == "tiled_mm"
    assert classify_kernel("relu_kernel(float const*, float*, int)", own) is None
    assert classify_kernel("void tiled_mm<32>(float*)", own) is None
    assert classify_kernel(FILL, own) is None  # torch::zeros: allowed
    assert classify_kernel("Memcpy DtoD (Device -> Device)", own) is None
    assert classify_kernel(AT_RELU, own) == "aten"
    # a candidate cannot whitelist ATen's kernel by naming its own kernel alike
    assert classify_kernel("void at::native::elementwise_kernel<128, 4>(int)", own) == "aten"
    assert classify_kernel("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_"
                           "warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas",
                           own) == "cublas"
    assert classify_kernel("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NNN", own) == "cublas"
    assert classify_kernel("triton_per_fused__softmax_0", own) == "triton"
    assert classify_kernel("void cudnn::cnn::conv2d_grouped_direct_kernel<float>()", own) == (
        "cudnn")
    found = fallback_findings([FILL, "relu_kernel(float const*)", AT_RELU, "mystery()"], own)
    assert [(f.category, f.as_finding()["severity"]) for f in found] == [
        ("aten", "error"), ("unknown", "warning")]


def test_profiler_on_cpu_reports_no_device_kernels() -> None:
    x = torch.randn(64)
    assert launched_kernels(torch.relu, (x,), device="cpu") == []


def test_timing_statistics() -> None:
    res = summarize([10.0, 11.0, 12.0, 13.0, 100.0])
    assert res.median_us == 12.0 and res.trials == 5
    assert res.iqr_us == pytest.approx(2.0)
    assert 0 < res.cv < 2
    assert coefficient_of_variation([100.0, 100.0, 100.0]) == 0.0
    assert coefficient_of_variation([99.0, 101.0]) == pytest.approx(0.01414, rel=1e-3)
    with pytest.raises(ValueError):
        summarize([])


# --- on a GPU -------------------------------------------------------------------------------


@needs_gpu
def test_gpu_verifies_correct_crashing_and_fallback_candidates(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu_candidates import relu_candidates
    from benchmarks.gpu_tasks import TASKS
    from verifier.api import verify_batch
    from verifier.protocol import VerifyOptions, VerifyRequest

    pick = {c.candidate_id: c for c in relu_candidates()}
    ids = ["relu_plain256", "relu_nullptr_bug", "relu_aten_in_cpp", "relu_syntax_bug",
           "relu_vec4"]
    opts = VerifyOptions(backend="cuda", compile_workers=4, run_timeout_s=60,
                         build_cache_dir=str(tmp_path / "b"),
                         baseline_cache_dir=str(tmp_path / "bl"))
    res = verify_batch([VerifyRequest(i, "relu", TASKS["relu"], pick[i].source, "cuda")
                        for i in ids], opts)
    status = {v.candidate_id: v.status for v in res}
    assert status["relu_plain256"].startswith("correct")
    assert status["relu_vec4"].startswith("correct")
    assert status["relu_nullptr_bug"] == "runtime_error"
    assert status["relu_aten_in_cpp"] == "cheat"
    assert status["relu_syntax_bug"] == "compile_error"


@needs_nvcc
@pytest.mark.slow
def test_compile_only_builds_real_cuda_candidates_without_a_gpu(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """`--compile-only` on this host: torch headers + nvcc, host and device units, no GPU."""
    if "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("slow (minutes of nvcc on torch headers): run with -m slow")
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu_candidates import relu_candidates
    from benchmarks.gpu_tasks import TASKS
    from verifier.api import verify_batch
    from verifier.protocol import VerifyOptions, VerifyRequest

    pick = {c.candidate_id: c for c in relu_candidates()}
    opts = VerifyOptions(backend="cuda", compile_only=True, compile_workers=2,
                         build_cache_dir=str(tmp_path / "b"))
    res = verify_batch([VerifyRequest(i, "relu", TASKS["relu"], pick[i].source, "cuda")
                        for i in ("relu_plain256", "relu_syntax_bug")], opts)
    assert [v.status for v in res] == ["compiled", "compile_error"]
    assert "candidate.py:" in res[1].compile_log and "error" in res[1].compile_log


@needs_nvcc
@pytest.mark.skipif(torch_has_cuda_libs(), reason="a CUDA torch build has its generated headers")
def test_cpu_torch_build_gets_the_generated_c10_cuda_header(tmp_path: Path) -> None:
    """c10/cuda headers preprocess on a CPU wheel (it lacks cuda_cmake_macros.h) via the shim."""
    from verifier.backends.cuda import cpu_torch_shim_dir, nvcc_flags, nvcc_path

    shim = cpu_torch_shim_dir()
    assert shim and (Path(shim) / "c10/cuda/impl/cuda_cmake_macros.h").is_file()
    flags = nvcc_flags("9.0")
    assert flags[-2:] == ["-I", shim]
    unit = tmp_path / "s.cu"
    unit.write_text("#include <c10/cuda/CUDAStream.h>\n")
    without = flags[:-2]
    cmd = [nvcc_path(), "-E", str(unit), "-o", str(tmp_path / "s.ii")]
    bad = subprocess.run([*cmd, *without], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "cuda_cmake_macros.h" in bad.stderr
    good = subprocess.run([*cmd, *flags], capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stderr[-2000:]
    assert "getCurrentCUDAStream" in (tmp_path / "s.ii").read_text()


class _FakeGpu:
    """A simulated device and host: the host queues work, one stream runs it in order.

    Times are microseconds on one clock. The host clock advances by what the host does (a
    Python forward's dispatch time, enqueue costs, waiting in synchronize); the stream starts
    queued work when it is free and the work has been queued. `time` stands in for the timing
    module's clock, so `perf_counter` reads the simulated host time.
    """

    def __init__(self, latency_us: float, clock_mhz: float = 2000.0) -> None:
        self.host = 0.0  # host clock
        self.stream = 0.0  # when the stream's queued work is done
        self.side = 0.0  # when work queued on a side stream is done
        self.latency = latency_us  # synchronize wake-up latency
        self.clock = clock_mhz  # spin cycles per microsecond
        gpu = self

        class _Clock:
            @staticmethod
            def perf_counter() -> float:
                return gpu.host / 1e6

            monotonic = perf_counter

        self.time = _Clock

    def _queue(self, duration_us: float) -> float:
        start = max(self.stream, self.host + 1.0)  # launch latency 1 us
        self.stream = start + duration_us
        self.host += 1.0
        return start

    def launch(self, host_us: float, body_us: float, hidden_us: float = 0.0) -> None:
        """A forward: `host_us` of Python, then a kernel; `hidden_us` more on a side stream."""
        self.host += host_us
        self._queue(body_us)
        if hidden_us:
            self.side = self.stream + hidden_us

    def _sleep(self, cycles: int) -> None:  # torch.cuda._sleep
        self._queue(cycles / self.clock)

    def synchronize(self) -> None:
        self.host = max(self.host, self.stream, self.side) + self.latency

    def Event(self, enable_timing: bool = True) -> Any:  # noqa: N802 (torch.cuda.Event)
        gpu = self

        class _Ev:
            t = 0.0

            def record(self) -> None:
                self.t = gpu._queue(0.0)

            def synchronize(self) -> None:
                gpu.host = max(gpu.host, self.t)

            def elapsed_time(self, other: Any) -> float:
                return (other.t - self.t) / 1000.0

        return _Ev()


class _NoFlush:
    def flush(self) -> None:
        return None


def _time_on_fake(monkeypatch: pytest.MonkeyPatch, body_us: float, hidden_us: float = 0.0,
                  host_us: Callable[[int], float] = lambda n: 5.0, **kw: Any):
    from verifier.backends import gpu_timing

    gpu = _FakeGpu(latency_us=20.0)
    monkeypatch.setattr(gpu_timing, "device_api", lambda device: gpu)
    monkeypatch.setattr(gpu_timing, "time", gpu.time)
    step = [0]

    def call() -> None:
        step[0] += 1
        # a little spread, like a real kernel
        gpu.launch(host_us(step[0]), body_us + (step[0] % 3) * 0.5, hidden_us)

    opts = {"warmup": 4, "warmup_min_s": 0.0, "min_trials": 10, "max_trials": 40, **kw}
    return gpu_timing.time_device_fn(call, lambda i: (), device="cpu", flusher=_NoFlush(), **opts)


def test_timing_excludes_host_latency_but_charges_hidden_side_stream_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    honest = _time_on_fake(monkeypatch, body_us=150.0, hidden_us=0.0)
    assert honest.method == "events" and honest.hidden_us == 0.0
    assert 150.0 <= honest.median_us <= 151.0  # the 20 us synchronize latency is not in it
    assert honest.sync_latency_us == pytest.approx(21.0)  # latency + the end event's launch
    assert honest.clock_mhz == pytest.approx(2000.0, rel=0.03) and honest.uncovered_trials == 0
    # forward returns after 5 us of work on its stream and leaves 300 us on a side stream
    hider = _time_on_fake(monkeypatch, body_us=5.0, hidden_us=300.0)
    assert hider.method == "device_sync" and hider.hidden_us == pytest.approx(300.0)
    assert 305.0 <= hider.median_us <= 306.0  # the hidden work is paid for, the latency is not
    # below the threshold (max(10 us, 5%)) a tail is host noise, not hidden work
    small = _time_on_fake(monkeypatch, body_us=400.0, hidden_us=8.0)
    assert small.method == "events" and 400.0 <= small.median_us <= 401.0


def test_spin_outlasts_the_host_launch_so_python_overhead_is_not_timed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # warmup calls dispatch in 5 us; from the 10th call on, forward spends 400 us in Python
    # before its kernel launches (a slow path, a GC pause): longer than the initial 50 us spin
    slow_later = _time_on_fake(monkeypatch, body_us=150.0,
                               host_us=lambda n: 5.0 if n < 10 else 400.0)
    assert 150.0 <= slow_later.median_us <= 151.0
    assert slow_later.discarded_trials >= 1 and slow_later.uncovered_trials == 0
    assert slow_later.spin_us > 400.0  # grown past the launch time
    # the same forward timed without a spin that can grow: the GPU idles inside the interval
    # waiting for the launch, and the median is mostly Python
    no_spin = _time_on_fake(monkeypatch, body_us=150.0, host_us=lambda n: 400.0,
                            spin_cycles=0)
    assert no_spin.median_us > 500.0 and no_spin.uncovered_trials == no_spin.trials


def test_a_forward_that_synchronizes_is_host_bound_and_still_gets_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from verifier.backends import gpu_timing

    gpu = _FakeGpu(latency_us=20.0)
    monkeypatch.setattr(gpu_timing, "device_api", lambda device: gpu)
    monkeypatch.setattr(gpu_timing, "time", gpu.time)

    def call() -> None:  # launches, then waits for its own kernel (.item(), a sync inside)
        gpu.launch(5.0, 150.0)
        gpu.synchronize()

    res = gpu_timing.time_device_fn(call, lambda i: (), device="cpu", flusher=_NoFlush(),
                                    warmup=4, warmup_min_s=0.0, min_trials=10, max_trials=20,
                                    max_spin_us=1000.0)
    # the spin stops growing at its cap, the discards are bounded, every kept trial says so
    assert res.discarded_trials <= 16 and res.uncovered_trials == res.trials >= 10
    assert res.spin_us <= 1000.0 + 1.0
    # the kernel plus the 20 us its own synchronize costs before the end event can be queued
    assert 170.0 <= res.median_us <= 172.0


class Cumsum(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1)


def _sequential_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Left-to-right fp32 running sums, the order a one-thread-per-row scan kernel uses."""
    out, acc = torch.empty_like(x), torch.zeros(x.shape[0])
    for j in range(x.shape[1]):
        acc = acc + x[:, j]
        out[:, j] = acc
    return out


def test_fp32_mismatch_gets_an_fp64_second_opinion() -> None:
    """Other fp32 summation orders pass; a real error or fp16/bf16 precision does not."""
    from verifier.judge.device_compare import against_fp64, compare, round_mantissa

    class MatMul(torch.nn.Module):
        def forward(self, a, b):
            return a @ b

    torch.manual_seed(0)
    a, b = torch.randn(64, 8192), torch.randn(8192, 48)
    model = MatMul()
    ref = model(a, b)
    # the same product summed in 8 chunks of K: another fp32 order, not a bug
    reordered = sum(a[:, i:i + 1024] @ b[i:i + 1024] for i in range(0, 8192, 1024))
    atol = 1e-6  # strict enough that the orders disagree
    assert compare(ref, reordered, atol, 1e-6, 1e-2, 1e-2)[0] == "values"
    second = against_fp64(model, [a, b], ref, reordered, atol)
    assert second["ok"] and second["max_abs_diff"] * 8 <= second["low_precision_max_abs_err"]
    # a sequential fp32 scan: 25x torch's (double-accumulating) CPU error, still fp32-accurate
    x = torch.randn(4, 16384)
    cum = Cumsum()
    assert against_fp64(cum, [x], cum(x), _sequential_cumsum(x), atol)["ok"]
    wrong = reordered.clone()
    wrong[3, 5] += 0.05
    assert not against_fp64(model, [a, b], ref, wrong, atol)["ok"]
    for low in ((a.half().float() @ b.half().float()),  # fp16 inputs
                (a.bfloat16() @ b.bfloat16()).float(),  # bf16 arithmetic
                round_mantissa(a) @ round_mantissa(b)):  # TF32-like inputs
        verdict = against_fp64(model, [a, b], ref, low, atol)
        assert not verdict["ok"] and verdict["mismatch_frac"] > 0.5
    assert against_fp64(model, [a, b], ref.half(), ref.half(), atol) is None  # fp32 only
    q = round_mantissa(torch.tensor([1.0 + 2**-12, float("inf"), -3.0]))
    assert q[0] == 1.0 and q[1] == float("inf") and q[2] == -3.0
