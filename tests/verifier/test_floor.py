"""The physics floor: measured peaks bound what honest torch ops achieve here, are cached once per
device, and a runtime below the floor is a finding that names it."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from verifier.judge import floor

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
GPU = {"device": "Test GPU", "bandwidth_Bps": 1e12,
       "flops": {"fp32": 1e12, "tf32": 4e12, "bf16": 8e12, "fp16": 6e12}, "torch": "x"}


@pytest.fixture(scope="module", params=DEVICES)
def measured(request: pytest.FixtureRequest) -> tuple[str, dict, float]:
    t0 = time.perf_counter()
    peaks = floor.measure_peaks(request.param)
    return request.param, peaks, time.perf_counter() - t0


def _fastest_us(fn, device: str, reps: int = 30) -> float:
    """Fastest single call in us (CUDA events on cuda: stricter than any host window)."""
    fn()
    best = math.inf
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            best = min(best, (time.perf_counter() - t0) * 1e6)
    return best


def test_measured_peaks_are_sane_and_quick(measured: tuple[str, dict, float]) -> None:
    device, peaks, seconds = measured
    assert seconds < (6.0 if device == "cpu" else 8.0), seconds  # loaded hosts: some margin
    assert peaks["torch"] == torch.__version__
    assert peaks["device"].startswith("cpu:") if device == "cpu" else peaks["device"]
    values = [peaks["bandwidth_Bps"], *peaks["flops"].values()]
    values += [v for point in peaks["bandwidth_curve"] for v in point]
    assert all(math.isfinite(v) and v > 0 for v in values), peaks
    assert set(peaks["flops"]) == ({"fp32"} if device == "cpu"
                                   else {"fp32", "tf32", "bf16", "fp16"})
    assert 1e8 < peaks["bandwidth_Bps"] < 1e14 and 1e8 < peaks["flops"]["fp32"] < 1e16


def test_cpu_measurement_restores_threads() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        floor.measure_peaks("cpu")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_measurement_restores_tf32_and_current_device() -> None:
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        device = torch.cuda.current_device()
        peaks = floor.measure_peaks(f"cuda:{torch.cuda.device_count() - 1}")
        assert torch.backends.cuda.matmul.allow_tf32 is True
        assert torch.cuda.current_device() == device
        assert peaks["flops"]["tf32"] > peaks["flops"]["fp32"]  # tf32 really was on for it
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("n", [256, 512, 1024])
def test_honest_matmul_is_never_below_the_floor(measured: tuple[str, dict, float], n: int) -> None:
    device, peaks, _ = measured
    for dtype, tdtype in (("fp32", torch.float32),) + (
            (("bf16", torch.bfloat16),) if device == "cuda" else ()):
        a = torch.randn(n * 4 if device == "cuda" else n, n, dtype=tdtype, device=device)
        b = torch.randn(n, n, dtype=tdtype, device=device)
        m = a.shape[0]
        bytes_moved = (m * n * 2 + n * n) * a.element_size()
        took = _fastest_us(lambda a=a, b=b: torch.mm(a, b), device)
        low = floor.floor_us(peaks, bytes_moved, 2.0 * m * n * n, dtype)
        assert low > 0 and took >= low, (dtype, n, took, low)
        assert floor.below_floor(took, peaks, bytes_moved, 2.0 * m * n * n, dtype) == ""


@pytest.mark.parametrize("numel", [1 << 14, 1 << 18, 1 << 21, 1 << 23])
def test_honest_elementwise_is_never_below_the_floor(measured: tuple[str, dict, float],
                                                     numel: int) -> None:
    """From L1/L2-resident to memory-sized (8M floats): caches never make an honest op a cheat."""
    device, peaks, _ = measured
    x, y = torch.randn(numel, device=device), torch.randn(numel, device=device)
    out = torch.empty_like(x)
    for fn, nbytes, flops in ((lambda: torch.add(x, y, out=out), 12 * numel, numel),
                              (lambda: torch.relu(x), 8 * numel, numel)):
        took = _fastest_us(fn, device)
        low = floor.floor_us(peaks, nbytes, flops)
        assert low > 0 and took >= low, (numel, took, low)


def test_a_cached_result_is_below_the_floor(measured: tuple[str, dict, float]) -> None:
    """The cheat the floor exists for: handing back an output computed earlier."""
    device, peaks, _ = measured
    numel = 1 << 23
    x, y = torch.randn(numel, device=device), torch.randn(numel, device=device)
    cached = x + y
    took = _fastest_us(lambda: cached, "cpu")
    finding = floor.below_floor(took, peaks, 12 * numel, numel)
    assert finding.startswith(f"runtime {took:.1f} us is below the physical floor of "), finding
    assert peaks["device"] in finding and "100.7 MB moved" in finding


def _fake_measure(calls: list[str]):
    def measure(device: str) -> dict:
        calls.append(device)
        return {**GPU, "device": f"fake {len(calls)}"}
    return measure


def test_device_peaks_measures_once_and_caches(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(floor, "measure_peaks", _fake_measure(calls))
    first = floor.device_peaks("cpu", tmp_path)
    second = floor.device_peaks("cpu", tmp_path)
    assert calls == ["cpu"] and first == second and first["device"] == "fake 1"
    files = list((tmp_path / "peaks").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text()) == first
    assert not list((tmp_path / "peaks").glob("*.tmp*"))  # the atomic write left no temp file


@pytest.mark.parametrize("corrupt", ["{not json", "[]", json.dumps({**GPU, "bandwidth_Bps": -1}),
                                     json.dumps({**GPU, "flops": {"fp32": float("nan")}}),
                                     json.dumps({**GPU, "bandwidth_curve": [[1, "x"]]})])
def test_a_corrupt_cache_file_is_measured_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                corrupt: str) -> None:
    calls: list[str] = []
    monkeypatch.setattr(floor, "measure_peaks", _fake_measure(calls))
    floor.device_peaks("cpu", tmp_path)
    (path,) = (tmp_path / "peaks").glob("*.json")
    path.write_text(corrupt)
    again = floor.device_peaks("cpu", tmp_path)
    assert calls == ["cpu", "cpu"] and again["device"] == "fake 2"
    assert json.loads(path.read_text()) == again
    assert floor.device_peaks("cpu", tmp_path) == again and len(calls) == 2


def test_floor_takes_the_binding_bound_over_slack() -> None:
    assert floor.SLACK == 2.0
    # 1 GB at 1 TB/s is 1000 us; no FLOPs: the bytes bound, halved
    assert floor.floor_us(GPU, 1e9, 0.0) == pytest.approx(500.0)
    # 16 TFLOP of fp32 work may run on bf16 tensor cores (8 TFLOP/s, the highest): 2 s, halved
    assert floor.floor_us(GPU, 1e3, 16e12) == pytest.approx(1e6)
    assert floor.floor_us(GPU, 1e3, 16e12, "float32") == pytest.approx(1e6)
    # the larger of the two bounds wins either way round
    assert floor.floor_us(GPU, 4e9, 8e9) == pytest.approx(2000.0)
    assert floor.floor_us(GPU, 1e6, 8e12) == pytest.approx(5e5)
    # fp16 work may use fp16 or bf16, never fp32's slower peak
    assert floor.floor_us(GPU, 0.0, 8e12, "fp16") == pytest.approx(5e5)
    # a dtype with no measured usable peak (bf16 on a cpu) has no compute bound, only bytes
    cpu = {**GPU, "flops": {"fp32": 1e11}}
    assert floor.floor_us(cpu, 1e9, 1e15, "bf16") == pytest.approx(500.0)
    assert floor.floor_us(cpu, 1e9, 1e15, "int8") == pytest.approx(500.0)


def test_cache_sized_tasks_get_the_cache_bandwidth() -> None:
    peaks = {**GPU, "bandwidth_curve": [[2e6, 1e13], [1e9, 1e12]]}
    assert floor.floor_us(peaks, 1e6, 0.0) == pytest.approx(1e6 / 1e13 * 1e6 / 2)
    assert floor.floor_us(peaks, 5e8, 0.0) == pytest.approx(5e8 / 1e13 * 1e6 / 2)
    assert floor.floor_us(peaks, 4e9, 0.0) == pytest.approx(4e9 / 1e12 * 1e6 / 2)
    # a small copy that read slow (a preempted window) never tightens the floor
    noisy = {**GPU, "bandwidth_curve": [[2e6, 1e11], [1e9, 1e12]]}
    assert floor.floor_us(noisy, 5e8, 0.0) == pytest.approx(5e8 / 1e12 * 1e6 / 2)


def test_below_floor_names_the_floor_and_device() -> None:
    assert floor.below_floor(None, GPU, 1e9, 0.0) == ""
    assert floor.below_floor(3.1, None, 1e9, 0.0) == ""
    assert floor.below_floor(500.0, GPU, 1e9, 0.0) == ""  # at the floor: honest
    assert floor.below_floor(float("nan"), GPU, 1e9, 0.0) == ""
    finding = floor.below_floor(3.1, GPU, 1e9, 2e9)
    assert finding == ("runtime 3.1 us is below the physical floor of 500.0 us for this task on "
                       "Test GPU (1.0 GB moved at 1.0 TB/s peak, 2.0 GFLOP at 8.0 TFLOP/s for "
                       "fp32; floor = max/2)")
    assert "\n" not in finding
