"""Judge-seconds of a slow-but-correct and of a hanging candidate (issue 29), on the persistent
worker's loop with the cpu backend (the loop a GPU runs, `verifier.run.gpu_runner`):

    PYTHONPATH=<checkout> python benchmarks/judge_seconds.py [--sleep 0.3] [--timeout 30]

Run it with PYTHONPATH at two checkouts for a before/after: it imports whichever `verifier` the
path names. Prints one JSON line per candidate: status, the run's seconds (`exec_s`, from the
job to its verdict), the judge's timed windows and calls per window, an early stop."""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from verifier.api import verify_batch
from verifier.backends.cpu import CpuBackend
from verifier.protocol import VerifyOptions, VerifyRequest

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16, 1024)]


def get_init_inputs():
    return []
'''
CANDIDATE = '''import time
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
torch::Tensor relu_fwd(torch::Tensor x) {
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) o[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""
ext = load_inline(name="ext", cpp_sources=src, functions=["relu_fwd"], extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def forward(self, x):
        FORWARD
'''
SLOW = "time.sleep(SLEEP)\n        return ext.relu_fwd(x)"  # an honest kernel, SLEEP s a call
HANG = "y = ext.relu_fwd(x)\n        while y is not None:\n            y = y\n        return y"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sleep", type=float, default=0.3)
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args()
    CpuBackend.persistent_worker = True  # the GPU's loop, on this host's cpu
    opts = VerifyOptions(backend="cpu", workers=1, compile_workers=1, trials=5,
                         run_timeout_s=args.timeout, baseline_cache_dir=tempfile.mkdtemp())
    for name, forward in (("slow", SLOW.replace("SLEEP", str(args.sleep))), ("hang", HANG)):
        timings: dict = {}
        t0 = time.monotonic()
        v = verify_batch([VerifyRequest(name, "relu", TASK, CANDIDATE.replace(
            "FORWARD", forward), "cpu")], opts, timings=timings)[0]
        clock = timings[name].get("judge_clock") or {}
        print(json.dumps({"candidate": name, "status": v.status, "error": v.error[:160],
                          "exec_s": round(timings[name].get("exec_s", 0.0), 2),
                          "batch_s": round(time.monotonic() - t0, 2), "trials": v.trials,
                          "windows": len(clock.get("windows_us") or []),
                          "calls_per_window": clock.get("calls"),
                          "early_stop": bool(clock.get("early_stop")),
                          "speedup": v.speedup}), flush=True)


if __name__ == "__main__":
    main()
