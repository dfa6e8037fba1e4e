"""Preloaded by the probe's fork server (`verifier.run.forkserver`): importing this module runs one
small probe job in the server, so the lazily loaded parts of torch a probe needs (flop counter,
dispatch modes, meta kernels) are loaded once and every forked child starts with them.
"""

from __future__ import annotations

import torch

from pipeline.tasks.probe.probe import analyze

torch.set_num_threads(1)  # no OpenMP pool in a process that forks

_WARMUP = """import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.conv = torch.nn.Conv2d(2, 2, 3)
    def forward(self, x, y):
        return self.fc(x).softmax(-1), self.conv(y).relu()
def get_inputs():
    return [torch.randn(16, 8), torch.randn(1, 2, 5, 5)]
def get_init_inputs():
    return []
"""

analyze({"kind": "complete", "source": _WARMUP, "cpu_max_numel": 64, "gpu_min_ms": 0.0,
         "gpu": {"flops": 1e12, "bandwidth": 1e12}})
