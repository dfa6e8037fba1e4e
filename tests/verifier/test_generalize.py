"""The generalisation check: a kernel must be correct at other sizes and constructor arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from verifier.api import verify_batch
from verifier.judge.variants import apply_changes, derive, describe, first_of_each, single_change
from verifier.protocol import VerifyOptions, VerifyRequest

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"

TASK = '''import torch
import torch.nn as nn

batch_size = 16
dim = 256


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale + 1.0


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [1.5]
'''

GENERIC = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
torch::Tensor scale_add(torch::Tensor x, double s) {
    auto y = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] * (float)s + 1.0f;
    return y;
}
"""
ext = load_inline("gen_EXT", cpp_sources=src, functions=["scale_add"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return ext.scale_add(x.contiguous(), self.scale)
'''

# the sizes it was checked at, baked in (the defect issue 18 found in every SFT answer)
HARD_SIZE = (GENERIC.replace("gen_EXT", "gen_size")
             .replace("torch::empty_like(x)", "torch::empty({16, 256}, x.options())")
             .replace("int64_t n = x.numel();", "int64_t n = 16 * 256;"))
# only the row length baked in: the batch may change, the feature size may not
# (rows of 256 mapped onto rows of x.size(1): right for any batch, wrong for any other row
# length, never out of bounds)
HARD_DIM = (GENERIC.replace("gen_EXT", "gen_dim")
            .replace("torch::empty_like(x)", "torch::zeros_like(x)")
            .replace("for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] * (float)s + 1.0f;",
                     "for (int64_t i = 0; i < n; ++i) {\n"
                     "        int64_t j = (i / 256) * x.size(1) + i % 256;\n"
                     "        if (j < n) yp[j] = xp[j] * (float)s + 1.0f;\n    }"))
HARD_SCALE = GENERIC.replace("gen_EXT", "gen_scale").replace("(float)s", "1.5f")


def test_variants_change_sizes_and_constructor_values_and_say_what() -> None:
    groups = derive(TASK)
    assert [g[0]["label"] for g in groups] == ["sizes", "init"]
    sizes, init = groups[0][0], groups[1][0]
    assert sizes["changes"] == {"batch_size": [16, 12], "dim": [256, 192]}
    assert "batch_size = 12" in sizes["source"] and "dim = 192" in sizes["source"]
    assert init["changes"] == {"scale": [1.5, 1.875]}  # named by its parameter
    assert "return [1.875]" in init["source"]
    assert describe(sizes) == "batch_size 16 -> 12, dim 256 -> 192"
    # a variant is rebuilt from its changes alone (what a Task stores)
    assert apply_changes(TASK, sizes["changes"]) == sizes["source"]
    assert "dim = 192" in single_change(TASK, "dim", 192)
    assert "batch_size = 16" in single_change(TASK, "dim", 192)
    with pytest.raises(ValueError, match="no such literal"):
        apply_changes(TASK, {"dim": [999, 3]})
    # nothing to change: no variants (small structural values stay)
    assert first_of_each(TASK.replace("16", "4").replace("256", "2").replace("1.5", "2")) == []


@pytest.fixture(scope="module")
def verdicts() -> dict:
    opts = VerifyOptions(backend="cpu", generalize=True, build_cache_dir=str(CACHE),
                         perf_trials=3, perf_max_trials=3, perf_budget_s=0.2)
    cands = {"generic": GENERIC, "size": HARD_SIZE, "dim": HARD_DIM, "scale": HARD_SCALE}
    reqs = [VerifyRequest(k, "t", TASK, code, "cpu") for k, code in cands.items()]
    # a request's own variants are the ones checked (none; only the constructor value moves)
    only_init = [v for v in first_of_each(TASK) if v["label"] == "init"]
    reqs += [VerifyRequest("none", "t", TASK, HARD_SIZE, "cpu", []),
             VerifyRequest("given", "t", TASK, HARD_SIZE, "cpu", only_init)]
    return {v.candidate_id: v for v in verify_batch(reqs, opts)}


def test_kernel_that_reads_sizes_from_tensors_passes(verdicts) -> None:
    v = verdicts["generic"]
    assert v.status in ("correct_slow", "correct_fast"), v.error


def test_hard_coded_sizes_fail_with_feedback_naming_them(verdicts) -> None:
    v = verdicts["size"]
    assert v.status == "incorrect" and v.stage == "correctness"
    assert "another size set (batch_size 16 -> 12, dim 256 -> 192)" in v.feedback
    assert "hard-codes batch_size (16), dim (256)" in v.feedback
    assert any(f["rule"] == "generalisation" for f in v.findings)


def test_only_the_hard_coded_size_is_named(verdicts) -> None:
    v = verdicts["dim"]
    assert v.status == "incorrect"
    assert "hard-codes dim (256)" in v.feedback and "batch_size (16)" not in v.feedback


def test_hard_coded_constructor_value_fails_naming_it(verdicts) -> None:
    v = verdicts["scale"]
    assert v.status == "incorrect"
    assert "other constructor arguments (scale 1.5 -> 1.875)" in v.feedback
    assert "hard-codes scale (1.5)" in v.feedback


def test_the_requests_own_variants_are_the_ones_checked(verdicts) -> None:
    assert verdicts["none"].status in ("correct_slow", "correct_fast")
    assert verdicts["given"].status in ("correct_slow", "correct_fast"), verdicts["given"].feedback


def test_check_is_off_unless_asked() -> None:
    assert VerifyOptions().generalize is False  # python -m verifier: --generalize


def test_sizes_written_inline_in_get_inputs_move_too() -> None:
    inline = TASK.replace("torch.randn(batch_size, dim)", "torch.randn((37, 1)), torch.randn(51)")
    sizes = derive(inline)[0][0]
    assert sizes["changes"]["get_inputs()#0"] == [37, 28]
    assert sizes["changes"]["get_inputs()#2"] == [51, 39]
    assert "get_inputs()#1" not in sizes["changes"]  # 1 is structural, kept
    assert "torch.randn((28, 1)), torch.randn(39)" in apply_changes(inline, sizes["changes"])


def test_constructor_literals_are_named_by_their_parameter() -> None:
    two = TASK.replace("def __init__(self, scale: float):", "def __init__(self, dim, scale):") \
              .replace("return [1.5]", "return [dim, 1.5]")
    assert first_of_each(two)[-1]["changes"] == {"scale": [1.5, 1.875]}
    # nested in a list, or the parameter's name already a module constant: its position
    nested = TASK.replace("return [1.5]", "return [[1.5]]")
    assert first_of_each(nested)[-1]["changes"] == {"get_init_inputs()[0]": [1.5, 1.875]}
    clash = TASK.replace("dim = 256", "dim = 256\nscale = 2")
    assert "get_init_inputs()[0]" in first_of_each(clash)[-1]["changes"]
