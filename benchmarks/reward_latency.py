"""Warm latency of the reward service: one small CPU relu candidate, POSTed twice, second timed.

    python benchmarks/reward_latency.py [--cache-dir DIR]

Starts `python -m verifier serve --backend cpu` on a free loopback port, waits for /health,
POSTs the same candidate twice (the first builds the extension and warms the slot's process)
and prints both wall times; the second is the warm figure the README states.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

TASK = '''import torch
import torch.nn as nn

batch_size = 16
dim = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''

CANDIDATE = '''```python
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
torch::Tensor relu_fwd(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""

ext = load_inline(name="relu_ext", cpp_sources=cpp_source, functions=["relu_fwd"],
                  extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.relu_fwd(x)
```'''


def post(url: str, body: dict) -> tuple[float, dict]:
    """Wall seconds of one POST and its JSON answer."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        data = json.loads(resp.read())
    return time.perf_counter() - t0, data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", default=tempfile.mkdtemp(prefix="ks-reward-latency-"))
    a = ap.parse_args()
    argv = [sys.executable, "-m", "verifier", "serve", "--port", "0", "--backend", "cpu",
            "--max-concurrency", "1", "--cache-dir", a.cache_dir]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        line = proc.stderr.readline()
        if " on http://" not in line:
            raise SystemExit(f"the service did not start: {line!r}")
        url = line.split(" on ", 1)[1].split()[0]
        body = {"items": [{"task_source": TASK, "response": CANDIDATE, "task_id": "relu"}]}
        for label in ("first (cold build)", "second (warm)"):
            wall, data = post(url + "/verify", body)
            v = data["verdicts"][0]
            print(f"{label}: {wall:.2f} s  status {v['status']}  reward {v['reward']}")
        return 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
