"""Split CUDA reductions (pipeline/candidates/templates/reduction_split.py): chosen for few outputs
over a long range (a loss's mean over every element), and the generated kernels' text run on the
CPU (fake_cuda.py) against torch for several split counts S, chunk ends not dividing R included.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from pipeline.candidates.templates import TaskView, reduction_split, template_kernels
from tests.pipeline.candidates.fake_cuda import build
from tests.pipeline.candidates.nvcc_once import assert_nvcc_compiles

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

HEAD = "import torch\nimport torch.nn as nn\n\n"
TASKS = {
    "sum_rows": ("torch.sum(x, dim=1)", (4, 40000)),
    "mean_all": ("torch.mean(x)", (300, 200)),
    "amax_cols": ("torch.amax(x, dim=0)", (33000, 3)),
    "l2_all": ("torch.linalg.vector_norm(x)", (40000,)),
}


def _task(expr: str, shape: tuple[int, ...]) -> str:
    return HEAD + f"""
class Model(nn.Module):
    def forward(self, x):
        return {expr}
def get_inputs():
    return [torch.randn{shape!r}]
def get_init_inputs():
    return []
"""


def _device_text(name: str) -> str:
    """The split reduction's device part from the task's generated CUDA candidate."""
    expr, shape = TASKS[name]
    src = _task(expr, shape)
    k = template_kernels(TaskView(name, name, src, src), "cuda", 1)[0]
    assert "split" in k.variant, k.variant
    m = re.search(r"(typedef \w+ (red\d+)_acc;.*?)\nvoid \2_\d+\(", k.code, re.S)
    assert m, k.code
    return m.group(1).replace(m.group(2) + "_", f"{name}_")


def _main() -> str:
    cases = "\n".join(
        f'    if (name == "{n}") {{ launch_{n}(x, out, outer, R, inner, S); }}' for n in TASKS)
    launchers = "\n".join(f"""
static void launch_{n}(const std::vector<float>& x, std::vector<float>& out, int64_t outer,
                       int64_t R, int64_t inner, int64_t S) {{
    const int64_t nout = outer * inner, chunk = (R + S - 1) / S;
    std::vector<{n}_acc> part(nout * S);
    ks_launch(dim3{{(unsigned)nout, (unsigned)S, 1}}, 256, [&] {{
        {n}_part(x.data(), part.data(), outer, R, inner, chunk); }});
    ks_launch(dim3{{(unsigned)nout, 1, 1}}, 256, [&] {{
        {n}_kernel(part.data(), out.data(), S, R); }});
}}""" for n in TASKS)
    return launchers + r"""
#include <string>
int main(int argc, char** argv) {
    // name outer R inner S in out
    if (argc != 8) return 2;
    const std::string name = argv[1];
    const int64_t outer = std::atoll(argv[2]), R = std::atoll(argv[3]), inner = std::atoll(argv[4]);
    const int64_t S = std::atoll(argv[5]);
    std::vector<float> x = ks_slurp(argv[6], outer * R * inner), out(outer * inner, -12345.f);
""" + cases + """
    ks_spill(argv[7], out);
    return 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    body = "\n".join(_device_text(n) for n in TASKS) + _main()
    return build(tmp_path_factory.mktemp("split"), body)


@pytest.mark.parametrize("name", list(TASKS))
def test_split_reduction_text_matches_torch_on_cpu(harness, tmp_path, name) -> None:
    expr, shape = TASKS[name]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5))
    want = eval(expr, {"torch": torch, "x": x})  # noqa: S307 - the test's own literal
    outer, r, inner = {"sum_rows": (4, 40000, 1), "mean_all": (1, 60000, 1),
                       "amax_cols": (1, 33000, 3), "l2_all": (1, 40000, 1)}[name]
    (tmp_path / "x.bin").write_bytes(x.numpy().tobytes())
    for s in (1, 7, 10):
        out = tmp_path / f"out{s}.bin"
        proc = subprocess.run([str(harness), name, str(outer), str(r), str(inner), str(s),
                               str(tmp_path / "x.bin"), str(out)], capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        got = torch.frombuffer(bytearray(out.read_bytes()), dtype=torch.float32)
        assert torch.allclose(got, want.reshape(-1), atol=1e-4, rtol=1e-4), (name, s, got, want)


def test_split_only_for_few_outputs_over_a_long_range() -> None:
    assert reduction_split.wanted(1, 1 << 24, False)
    assert not reduction_split.wanted(1, 1 << 24, True)  # arg-reductions keep one block
    assert not reduction_split.wanted(4096, 1 << 20, False)  # many outputs fill the GPU
    assert not reduction_split.wanted(4, 1000, False)
    src = _task("torch.sum(x, dim=1)", (4096, 64))
    k = template_kernels(TaskView("w", "wide", src, src), "cuda", 1)[0]
    assert "split" not in k.variant and "_part(" not in k.code


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_split_reductions_compile_with_nvcc(tmp_path) -> None:
    codes = []
    for name, (expr, shape) in TASKS.items():
        src = _task(expr, shape)
        codes.append(template_kernels(TaskView(name, name, src, src), "cuda", 1)[0].code)
    assert_nvcc_compiles(codes, tmp_path)
