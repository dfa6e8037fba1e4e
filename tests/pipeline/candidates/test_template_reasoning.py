"""Template reasoning states what the emitted kernels do, in the backend's own terms."""

from __future__ import annotations

import re

import pytest

from pipeline.candidates.templates import NoTemplate, TaskView, template_kernels
from pipeline.candidates.templates.analysis import trace_sources
from sources.seed import seed_files
from verifier.judge.variants import rewrite_literals, shrink

# words only a GPU kernel's account has ("thread" and "block" are CPU words too: OpenMP threads,
# a per-thread buffer, cache blocking)
GPU_WORDS = re.compile(r"\b(warps?|coalesc\w*|shared memory|thread ?blocks?|threads? per block|"
                       r"threadIdx|blockIdx|grid|launch\w*|__syncthreads|__shfl\w*|CUDA)\b", re.I)


def _build(names: set[str] | None = None) -> dict[str, dict[str, object]]:
    """backend -> seed task -> first template kernel, built at small sizes."""
    views = {}
    for path in seed_files():
        if names is not None and path.stem not in names:
            continue
        src = rewrite_literals(path.read_text(encoding="utf-8"), lambda v: shrink(v, 16),
                               lambda f: f)
        views[path.stem] = TaskView(path.stem, path.stem, src, src)
    trace_sources([v.source for v in views.values()], timeout_s=900)
    out: dict[str, dict[str, object]] = {"cpu": {}, "cuda": {}}
    for backend, found in out.items():
        for name, view in views.items():
            try:
                found[name] = template_kernels(view, backend, 1)[0]
            except NoTemplate:
                continue
    return out


@pytest.fixture(scope="module")
def kernels() -> dict[str, dict[str, object]]:
    return _build()


@pytest.mark.slow
def test_cpu_reasoning_uses_no_gpu_words(kernels) -> None:
    assert len(kernels["cpu"]) >= 110
    bad = {n: GPU_WORDS.findall(k.reasoning) for n, k in kernels["cpu"].items()
           if GPU_WORDS.search(k.reasoning)}
    assert not bad, bad
    for k in kernels["cpu"].values():
        assert "OpenMP" in k.reasoning and "#pragma omp" in k.code


@pytest.mark.slow
def test_one_step_per_kernel_and_thread_counts_match_the_launches(kernels) -> None:
    for backend, tasks in kernels.items():
        for name, k in tasks.items():
            funcs = re.search(r"functions=\[([^\]]*)\]", k.code).group(1).split(",")
            steps = re.findall(r"^\d+\. ", k.reasoning, re.M)
            assert len(steps) == len(funcs), (backend, name)
            if backend != "cuda":
                continue
            launched = {int(t) for t in re.findall(r",\s*(\d+)\s*,\s*[^,<>]+,\s*KS_STREAM>>>",
                                                   k.code)}
            claimed = {int(t) for t in re.findall(r"(\d+)[- ]thread", k.reasoning)}
            assert claimed <= launched, (name, claimed, launched)


@pytest.mark.slow
def test_sizes_claim_matches_code(kernels) -> None:
    for backend, tasks in kernels.items():
        for name, k in tasks.items():
            if "serves any size" in k.reasoning:
                forward = k.code[k.code.index("def forward"):]
                assert ".size(" in forward, (backend, name)


def test_flops_in_reasoning_are_the_hand_count() -> None:
    kernels = _build({"reduction_l2_norm_rows", "softmax_softmax_temperature"})
    rows, cols = 256, 512  # reduction_l2_norm_rows (4096 x 8192) shrunk by 16
    l2 = kernels["cpu"]["reduction_l2_norm_rows"].reasoning
    assert f"{2 * rows * cols:,} FLOPs" in l2  # square and add per element
    sm = kernels["cuda"]["softmax_softmax_temperature"].reasoning
    assert f"{rows * cols + 5 * rows * cols:,} FLOPs" in sm  # divide, then softmax's 5
    assert "`self.temperature`" in sm
