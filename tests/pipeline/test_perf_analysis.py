"""perf_analysis rows are true to the device: the work of the sizes that ran, the backend's terms."""

from __future__ import annotations

import json

from pipeline.datasets.analysis_rows import analyse_performance, measured_work
from schemas import Candidate, Task, Verdict

GPU_WORDS = ("shared memory", "warp", "tensor core", "float4", "CUDA graph", "launch shape",
             "coalesc", "thread block")
CPU_CODE = "#pragma omp parallel for\nfor (int64_t i = 0; i < n; ++i) y[i] = x[i] * x[i];"


def _task(scaled: bool) -> Task:
    meta = {"cpu_flops": 2.0e6, "cpu_bytes": 8.0e6} if scaled else {}
    return Task(task_id="t", name="l2norm", source="rows = 4096\n",
                cpu_source="rows = 64\n" if scaled else "rows = 4096\n",
                flops=6.7e7, bytes_moved=2.7e8, op_families=["reduction", "norm"],
                meta=json.dumps(meta))


def _verdict(device: str) -> Verdict:
    return Verdict(candidate_id="c", task_id="t", status="correct_slow", stage="done",
                   backend="cpu", device=device, runtime_us=100.0, eager_us=80.0)


def test_cpu_rows_count_the_cpu_files_work_not_the_gpu_sizes() -> None:
    task = _task(scaled=True)
    assert measured_work(task, "cpu") == (2.0e6, 8.0e6)
    assert measured_work(task, "cuda") == (6.7e7, 2.7e8)
    _, intensity, text = analyse_performance(task, Candidate("c", "t", "cpu", "template:x",
                                                             CPU_CODE), _verdict("cpu"))
    assert intensity == 0.25 and "2e+06 FLOPs over 8e+06 bytes" in text
    assert "6.7e+07" not in text and "2.7e+08" not in text  # the GPU sizes never show
    # an unscaled CPU file: the task's own figures are the ones that ran
    assert measured_work(_task(scaled=False), "cpu") == (6.7e7, 2.7e8)
    # scaled but probed before the CPU figures were kept: no claim at all
    old = _task(scaled=True)
    old.meta = "{}"
    assert measured_work(old, "cpu") == (0.0, 0.0)


def test_cpu_advice_has_no_gpu_words_and_gpu_advice_keeps_them() -> None:
    code = "y[i] = x[i];"  # single-threaded, one loop
    for bottleneck_task in (_task(True), _task(False)):
        _, _, text = analyse_performance(bottleneck_task, Candidate("c", "t", "cpu", "template:x",
                                                                    code), _verdict("cpu"))
        advice = text.split("Next optimization:")[1]
        assert "OpenMP" in advice
        assert not [w for w in GPU_WORDS if w.lower() in text.lower()], text
    _, _, gpu = analyse_performance(_task(False), Candidate("c", "t", "cuda", "template:x", code),
                                    _verdict("NVIDIA H100 80GB HBM3"))
    assert "warp" in gpu


def test_a_kernel_far_behind_eager_is_not_called_bound_by_the_hardware() -> None:
    """A 0.2 GFLOP/s C++ loop nest 130x behind eager is not 'compute-bound': eager on the same
    device shows what the hardware allows."""
    task = _task(scaled=False)
    slow = Verdict(candidate_id="c", task_id="t", status="correct_slow", stage="done",
                   backend="cpu", device="cpu:Intel(R) Xeon(R) Processor",
                   runtime_us=355444.0, eager_us=2663.0)
    bottleneck, _, text = analyse_performance(task, Candidate("c", "t", "cpu", "template:x",
                                                              CPU_CODE), slow)
    assert "most likely" not in text and "-bound" not in text
    assert "eager PyTorch does the same work at 25.2 GFLOP/s" in text
    assert "133x this kernel" in text and "far from any hardware limit" in text
    assert bottleneck == "memory"  # 0.25 FLOP/byte: the label keeps the work's character
    # near eager, the intensity-based guess stands
    _, _, near = analyse_performance(task, Candidate("c", "t", "cpu", "template:x", CPU_CODE),
                                     _verdict("cpu"))
    assert "most likely memory-bound" in near
