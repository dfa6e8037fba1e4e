"""Signed trials: KernelBench draws every input with torch.rand (on [0, 1)), so a kernel right
only for non-negative inputs passes its trials; the verifier draws odd seeds on [-0.5, 1)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from verifier.api import verify_batch
from verifier.judge.decide import make_inputs
from verifier.judge.inputs import draw_inputs, signed_seed, trial_input_seed
from verifier.protocol import VerifyOptions, VerifyRequest

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import relu_candidate  # noqa: E402

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"

# KernelBench's main-branch ReLU problem, at a smaller size: inputs from torch.rand
KB_RELU = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 16
dim = 4096


def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
'''

COPY = """
torch::Tensor relu_fwd(torch::Tensor x) {
    return x.contiguous().clone();  // "relu" of inputs that are never negative
}
"""

RELU = """
torch::Tensor relu_fwd(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""


def _get_inputs():
    ns: dict = {}
    exec(KB_RELU, ns)
    return ns["get_inputs"]


def test_odd_seeds_draw_signed_inputs_and_even_seeds_the_tasks_own() -> None:
    get_inputs = _get_inputs()
    (plain,) = draw_inputs(get_inputs, 1000, "cpu")
    (signed,) = draw_inputs(get_inputs, 1001, "cpu")
    assert plain.min() >= 0 and plain.max() < 1
    assert signed.min() >= -0.5 and signed.max() < 1 and 0.3 < (signed < 0).float().mean() < 0.37
    assert 0.2 < signed.mean() < 0.3  # a positive mean: dot products of inputs stay off zero
    assert torch.rand(3).min() >= 0  # torch.rand itself is restored after the draw
    assert not signed.requires_grad


def test_every_drawer_sees_the_same_tensors() -> None:
    get_inputs = _get_inputs()
    for seed in (7, 8):
        (a,) = make_inputs(get_inputs, seed)  # the parent's recheck and the judges
        (b,) = draw_inputs(get_inputs, seed, "cpu")  # the worker
        assert torch.equal(a, b) and signed_seed(seed) == (seed % 2 == 1)


def test_the_first_trial_of_every_run_is_signed() -> None:
    assert all(signed_seed(trial_input_seed() + 1000) for _ in range(50))


def test_rand_like_and_requires_grad_keep_their_meaning() -> None:
    def get_inputs():
        base = torch.zeros(4, 8)
        return [torch.rand_like(base), torch.rand(4, 8, requires_grad=True), torch.randn(4)]

    x, y, z = draw_inputs(get_inputs, 3, "cpu")
    assert x.min() < 0 and y.requires_grad and y.is_leaf and y.min() < 0
    (x0, y0, z0) = draw_inputs(get_inputs, 2, "cpu")
    assert x0.min() >= 0 and y0.min() >= 0


def test_a_relu_that_copies_its_non_negative_inputs_is_incorrect() -> None:
    opts = VerifyOptions(backend="cpu", trials=2, build_cache_dir=str(CACHE), perf_budget_s=0.5)
    copy, honest = verify_batch([
        VerifyRequest("copy", "kb_relu", KB_RELU, relu_candidate(COPY, cflags='["-O2"]'), "cpu"),
        VerifyRequest("honest", "kb_relu", KB_RELU, relu_candidate(RELU, cflags='["-O2"]'),
                      "cpu")], opts)
    assert copy.status == "incorrect", (copy.status, copy.feedback)
    assert "trial 1" in copy.feedback and copy.reward < 0.5
    assert honest.status.startswith("correct"), (honest.status, honest.feedback)
