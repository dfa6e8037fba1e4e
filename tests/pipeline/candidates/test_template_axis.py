"""An axis constructor argument (`dim`) is part of the generalisation check: the task probe finds
another axis the reference accepts, a kernel that reduces over the traced axis whatever `self.dim`
says fails with feedback naming `dim`, and the reduction template (which reads `self.dim` in
forward) passes, all through the real CPU verifier."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.candidates.templates import TaskView, template_kernels
from pipeline.candidates.templates.analysis import trace_sources
from pipeline.tasks.probe.variants import validate
from sources.seed import SEED_DIR
from verifier.api import verify_batch
from verifier.judge.variants import apply_changes, derive, rewrite_literals, shrink
from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"

# the seed task at the sizes test_templates_clean checks seeds at (each size / 16, at least 8)
SEED = SEED_DIR / "reduction_argmin_dim.py"
TASK = rewrite_literals(SEED.read_text(encoding="utf-8"), lambda v: shrink(v, 16), lambda f: f)

# sizes read from the tensor, but always the last axis: what a template traced at dim=2 did
HARD_AXIS = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
#include <cmath>
torch::Tensor argmin_last(torch::Tensor x) {
    const int64_t outer = x.size(0) * x.size(1), R = x.size(2);
    auto out = torch::empty({x.size(0), x.size(1)}, x.options().dtype(torch::kInt64));
    const float* xp = x.data_ptr<float>();
    int64_t* op = out.data_ptr<int64_t>();
    for (int64_t o = 0; o < outer; ++o) {
        float v = INFINITY;
        int64_t vi = 0;
        for (int64_t r = 0; r < R; ++r) {
            if (xp[o * R + r] < v) { v = xp[o * R + r]; vi = r; }
        }
        op[o] = vi;
    }
    return out;
}
"""
ext = load_inline("axis_hard", cpp_sources=src, functions=["argmin_last"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return ext.argmin_last(x.contiguous())
'''


def test_axis_argument_gets_proposals_and_the_probe_keeps_a_valid_one() -> None:
    groups = derive(TASK)
    axis = [g for g in groups if g[0]["label"] == "args"]
    assert [v["changes"] for v in axis[0]] == [{"dim": [2, 3]}, {"dim": [2, 1]},
                                              {"dim": [2, 4]}, {"dim": [2, 0]}]
    result = validate({"cpu": TASK})
    kept = [v for v in result["variants"]["cpu"] if v["label"] == "args"]
    assert kept == [{"label": "args", "changes": {"dim": [2, 1]}}]  # dim 3 is out of range
    assert any(r.startswith("args:") for r in result["dropped"]["cpu"])
    assert "return [1]" in apply_changes(TASK, kept[0]["changes"])


@pytest.fixture(scope="module")
def verdicts() -> dict:
    kept = validate({"cpu": TASK})["variants"]["cpu"]
    variants = [{**v, "source": apply_changes(TASK, v["changes"])} for v in kept]
    trace_sources([TASK], timeout_s=600)
    template = template_kernels(TaskView("argmin", "argmin", TASK, TASK), "cpu", 1)[0].code
    opts = VerifyOptions(backend="cpu", generalize=True, build_cache_dir=str(CACHE),
                         perf_trials=3, perf_max_trials=3, perf_budget_s=0.2)
    reqs = [VerifyRequest(k, "t", TASK, code, "cpu", variants)
            for k, code in {"hard": HARD_AXIS, "template": template}.items()]
    return {v.candidate_id: v for v in verify_batch(reqs, opts)}


@pytest.mark.slow
def test_kernel_that_ignores_dim_fails_naming_it(verdicts) -> None:
    v = verdicts["hard"]
    assert v.status == "incorrect", (v.status, v.error)
    assert "another axis argument (dim 2 -> 1)" in v.feedback
    assert "hard-codes dim (2)" in v.feedback and "self.dim" in v.feedback


@pytest.mark.slow
def test_reduction_template_reads_dim_from_the_module(verdicts) -> None:
    v = verdicts["template"]
    assert v.status in CORRECT_STATUSES, (v.status, v.error, v.feedback)
    passed = [f["message"] for f in v.findings if f["rule"] == "generalised"]
    assert passed and "dim 2 -> 1" in passed[0], v.findings


def test_template_code_and_reasoning_take_the_axis_from_the_module() -> None:
    trace_sources([TASK], timeout_s=600)
    k = template_kernels(TaskView("argmin", "argmin", TASK, TASK), "cpu", 1)[0]
    assert "self.dim % x.dim()" in k.code and "x.size(2)" not in k.code
    sizes = next(ln for ln in k.reasoning.splitlines() if ln.startswith("Sizes:"))
    assert "reduced axis from the module (`self.dim`)" in sizes and "traced at" not in sizes
