"""The CUDA normalisation template's statistics and apply kernels (pipeline/candidates/templates/
norm.py), as generated for layer, batch and group norm tasks, run on the CPU (fake_cuda.py)
against torch: the chunk walk (no division per element) and the division walk for short chunks.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipeline.candidates.templates import TaskView, template_kernels
from tests.pipeline.candidates.fake_cuda import build

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

HEAD = "import torch\nimport torch.nn as nn\n\n"
# name: (module, input shape, groups, L, S, T, gdiv, gmod, cdiv, cmod) of the kernels' view
CASES = {
    "layer": ("nn.LayerNorm(300)", (7, 300), 7, 300, 300, 300, 300, 7, 1, 300),
    "batch2d": ("nn.BatchNorm2d(6)", (3, 6, 5, 9), 6, 3 * 45, 45, 6 * 45, 45, 6, 45, 6),
    "batch1d_nc": ("nn.BatchNorm1d(40)", (50, 40), 40, 50, 1, 40, 1, 40, 1, 40),
    "group": ("nn.GroupNorm(4, 8)", (2, 8, 6, 7), 8, 2 * 42, 84, 8 * 42, 84, 8, 42, 8),
}


def _source(name: str) -> str:
    module, shape = CASES[name][:2]
    return HEAD + f"""
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = {module}
    def forward(self, x):
        return self.norm(x)
def get_inputs():
    return [torch.randn{shape!r}]
def get_init_inputs():
    return []
"""


def _device_text(name: str) -> str:
    src = _source(name)
    code = template_kernels(TaskView(name, name, src, src), "cuda", 1)[0].code
    m = re.search(r"(typedef float (nrm\d+)_acc;.*?)\nvoid \2_\d+\(", code, re.S)
    assert m, code
    assert "_visit(" in m.group(1)
    return m.group(1).replace(m.group(2) + "_", f"{name}_")


def _main() -> str:
    cases = "\n".join(f"""    if (name == "{n}") {{
        ks_launch(dim3{{(unsigned)groups, 1, 1}}, 256, [&] {{
            {n}_stats(x.data(), mean.data(), rstd.data(), groups, L, S, T, 1e-5); }});
        ks_launch(dim3{{3, 1, 1}}, 64, [&] {{
            {n}_apply(x.data(), nullptr, nullptr, mean.data(), rstd.data(), out.data(), n,
                      v[4], v[5], v[6], v[7]); }});
    }}""" for n in CASES)
    return r"""
#include <string>
int main(int argc, char** argv) {
    // name groups L S T gdiv gmod cdiv cmod n in out
    if (argc != 13) return 2;
    const std::string name = argv[1];
    int64_t v[8];
    for (int i = 0; i < 8; ++i) v[i] = std::atoll(argv[2 + i]);
    const int64_t groups = v[0], L = v[1], S = v[2], T = v[3], n = std::atoll(argv[10]);
    std::vector<float> x = ks_slurp(argv[11], n), out(n, -12345.f), mean(groups), rstd(groups);
""" + cases + """
    ks_spill(argv[12], out);
    return 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    body = "\n".join(_device_text(n) for n in CASES) + _main()
    return build(tmp_path_factory.mktemp("norm"), body)


@pytest.mark.parametrize("name", list(CASES))
def test_norm_kernels_match_torch_on_cpu(harness, tmp_path, name) -> None:
    module, shape, *view = CASES[name]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2)) * 2 + 0.5
    want = {"layer": lambda: F.layer_norm(x, (300,)),
            "batch2d": lambda: F.batch_norm(x, None, None, training=True),
            "batch1d_nc": lambda: F.batch_norm(x, None, None, training=True),
            "group": lambda: F.group_norm(x, 4)}[name]()
    (tmp_path / "x.bin").write_bytes(x.numpy().tobytes())
    out = tmp_path / "out.bin"
    proc = subprocess.run([str(harness), name, *map(str, view), str(x.numel()),
                           str(tmp_path / "x.bin"), str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = torch.frombuffer(bytearray(out.read_bytes()), dtype=torch.float32).view(shape)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max().item()
