"""FLOPs and bytes of a task equal the hand count (the probe run in-process, at GPU sizes)."""

from __future__ import annotations

from pipeline.tasks.annotate.flops import op_flops
from pipeline.tasks.probe.probe import analyze

GPU = {"flops": 1e12, "bandwidth": 1e12}

L2_NORM = """import torch
import torch.nn as nn
rows = 4096
cols = 8192
class Model(nn.Module):
    def forward(self, x):
        return x / torch.linalg.vector_norm(x, dim=1, keepdim=True)
def get_inputs():
    return [torch.randn(rows, cols)]
def get_init_inputs():
    return []
"""

LINEAR_SUM = """import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 128)
    def forward(self, x):
        return torch.relu(self.fc(x)).sum(dim=1)
def get_inputs():
    return [torch.randn(64, 256)]
def get_init_inputs():
    return []
"""


def _probe(src: str) -> dict:
    out = analyze({"kind": "complete", "source": src, "cpu_max_numel": 1 << 16,
                   "gpu_min_ms": 0.0, "gpu": GPU})
    assert out.get("ok"), out
    return out


def test_row_l2_norm_counts_every_element_it_reads() -> None:
    r, c = 4096, 8192
    out = _probe(L2_NORM)
    # square + add per element for the norm, one divide per element for the scaling
    assert out["gpu"]["flops"] == 2 * r * c + r * c
    assert out["gpu"]["bytes"] == 2 * r * c * 4  # read x, write the result
    # the CPU copy is counted at its own sizes
    cr, cc = out["scaled_constants"]["rows"], out["scaled_constants"]["cols"]
    assert out["cpu"]["flops"] == 3 * cr * cc


def test_linear_relu_sum_hand_count() -> None:
    b, i, o = 64, 256, 128
    out = _probe(LINEAR_SUM)
    # addmm: 2*b*i*o (torch's counter) + bias add is inside addmm; relu b*o; sum b*o reads
    assert out["gpu"]["flops"] == 2 * b * i * o + b * o + b * o


def test_reduction_cost_uses_the_input_not_the_output() -> None:
    assert op_flops("aten.sum", 1000, 10) == 1000
    assert op_flops("aten._softmax", 1000, 1000) == 5000
    assert op_flops("aten.mul", 1000, 1000) == 1000
