"""Fused templates: a GEMM's or convolution's elementwise epilogue is applied before its store
(CUDA and CPU), a softmax applies the elementwise chain before it as it reads (CPU simd), and the
fused kernels compute what the reference does (CPU: built and run; CUDA: compiled with nvcc)."""

from __future__ import annotations

import shutil
import types

import pytest
import torch

from pipeline.candidates.templates import TaskView, template_kernels
from pipeline.candidates.templates.analysis import trace_sources
from pipeline.candidates.templates.selfcheck import nvcc_compile

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
TASKS = {
    "gemm_gelu_scale": HEAD + """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 48)
    def forward(self, x):
        return F.gelu(self.fc(x)) * 2.0
def get_inputs():
    return [torch.randn(64, 32)]
def get_init_inputs():
    return []
""",
    "conv_relu_sigmoid": HEAD + """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
    def forward(self, x):
        return torch.sigmoid(torch.relu(self.conv(x)))
def get_inputs():
    return [torch.randn(2, 3, 16, 16)]
def get_init_inputs():
    return []
""",
    "softmin_temperature": HEAD + """
class Model(nn.Module):
    def forward(self, x):
        return F.softmin(x / 0.5, dim=-1)
def get_inputs():
    return [torch.randn(16, 64)]
def get_init_inputs():
    return []
""",
    "gemm_residual": HEAD + """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
    def forward(self, x):
        y = self.fc(x)
        return torch.relu(y) + y.sum()
def get_inputs():
    return [torch.randn(8, 32)]
def get_init_inputs():
    return []
""",
}


@pytest.fixture(scope="module")
def views() -> dict[str, TaskView]:
    out = {n: TaskView(n, n, s, s) for n, s in TASKS.items()}
    trace_sources([v.source for v in out.values()])
    return out


def _kernels(code: str) -> str:
    return code.split('KERNELS = r"""')[1].split('"""')[0]


@pytest.mark.parametrize("name", ["gemm_gelu_scale", "conv_relu_sigmoid"])
def test_epilogue_is_fused_into_the_producer_store(views, name) -> None:
    for backend in ("cuda", "cpu"):
        for k in template_kernels(views[name], backend, 3):
            text = _kernels(k.code)
            assert "_epi(v);" in text, (backend, k.variant)
            assert "ew" not in text.split("_epi(")[0].split("\n")[-1]
            # no elementwise kernel of its own: the producer's host function is the only one
            assert text.count("\nvoid ") == 1, (backend, k.variant)
            assert "epilogue" in k.reasoning


def test_a_chain_whose_input_is_read_elsewhere_is_not_fused(views) -> None:
    """relu(y) + y.sum(): y is also reduced, so the store must keep y itself."""
    for k in template_kernels(views["gemm_residual"], "cpu", 2):
        assert "_epi(v);" not in _kernels(k.code)


def test_softmax_applies_the_chain_before_it_on_cpu_simd_only(views) -> None:
    ks = {k.variant: _kernels(k.code) for k in template_kernels(views["softmin_temperature"],
                                                                 "cpu", 3)}
    assert all("_pro(" in t and t.count("\nvoid ") == 1 for v, t in ks.items() if "simd" in v)
    assert all("_pro(" not in t for v, t in ks.items() if "simd" not in v)


def _run(code: str, source: str) -> tuple[torch.Tensor, torch.Tensor]:
    ref, cand = types.ModuleType("ref"), types.ModuleType("cand")
    exec(source, ref.__dict__)  # noqa: S102 - the test's own reference
    exec(code, cand.__dict__)  # noqa: S102 - a template this test generated
    torch.manual_seed(0)
    inputs = ref.get_inputs()
    torch.manual_seed(1)
    m1 = ref.Model(*ref.get_init_inputs())
    torch.manual_seed(1)
    m2 = cand.ModelNew(*ref.get_init_inputs())
    return m1(*inputs), m2(*inputs)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
def test_fused_cpu_kernels_match_the_reference(views) -> None:
    """The simd_fastmath variant carries every fusion plus the inline exp and wide vectors."""
    for name in ("gemm_gelu_scale", "conv_relu_sigmoid", "softmin_temperature"):
        k = template_kernels(views[name], "cpu", 3)[2]
        assert k.variant.startswith("cpu-simd_fastmath"), k.variant
        want, got = _run(k.code, views[name].source)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_fused_cuda_kernels_compile_with_nvcc(views, tmp_path) -> None:
    codes = [k.code for n in ("gemm_gelu_scale", "conv_relu_sigmoid")
             for k in template_kernels(views[n], "cuda", 3)]
    ok, log = nvcc_compile(codes, tmp_path)
    assert ok, log
