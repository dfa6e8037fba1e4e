"""The eager baseline against the reference judged as a candidate, on a GPU (issue 28/31).

Tasks at three sizes (1 MB, 64 MB, 1 GiB tensors); candidates: the reference plus a no-op own
kernel (`noop`, run with --fallback partial: the reference's own op judged through the worker
path) and an honest float4 ReLU (`relu4`). A method that times eager as candidates are timed
gives noop ~1.0x (less one extra launch) and relu4 ~1.0x at bandwidth-bound sizes.

    python -m benchmarks.eager_method_gpu --out DIR [--compile-workers 16]

writes DIR/batch.jsonl, DIR/verdicts.jsonl and prints the table (needs a CUDA device).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

TASK = '''import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x):
        return {expr}
def get_inputs():
    return [torch.randn({shape})]
def get_init_inputs():
    return []
'''
NOOP = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline
src = """
#include <torch/extension.h>
__global__ void touch(float* p) { if (threadIdx.x == 0 && p[0] == 12345.f) p[0] = 12345.f; }
torch::Tensor touch_launch(torch::Tensor x) { touch<<<1, 32>>>(x.data_ptr<float>()); return x; }
"""
ext = load_inline(name="noop_{tag}", cpp_sources="torch::Tensor touch_launch(torch::Tensor x);",
                  cuda_sources=src, functions=["touch_launch"], verbose=False)
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x):
        y = {expr}
        return ext.touch_launch(y)
'''
RELU = r'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline
src = """
#include <torch/extension.h>
__global__ void relu4(const float4* __restrict__ x, float4* __restrict__ y, long n4) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
    float4 v = x[i];
    v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
    y[i] = v;
  }
}
torch::Tensor relu_fwd(torch::Tensor x) {
  auto y = torch::empty_like(x);
  long n4 = x.numel() / 4;
  int blocks = (int)std::min<long>((n4 + 255) / 256, 132L * 16);
  relu4<<<blocks, 256>>>((const float4*)x.data_ptr<float>(), (float4*)y.data_ptr<float>(), n4);
  return y;
}
"""
ext = load_inline(name="relu4_{tag}", cpp_sources="torch::Tensor relu_fwd(torch::Tensor x);",
                  cuda_sources=src, functions=["relu_fwd"], verbose=False)
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x):
        return ext.relu_fwd(x.contiguous())
'''
CASES = [("relu", "torch.relu(x)", s) for s in ("256, 4096", "4096, 4096", "16384, 16384")]
CASES += [("softmax", "torch.softmax(x, dim=1)", s) for s in ("256, 4096", "4096, 4096")]
CASES += [("gelu_tanh", "torch.nn.functional.gelu(x, approximate='tanh') * 2.0 + 1.0", "4096, 4096")]


def batch_rows() -> list[dict[str, str]]:
    """The batch: every task with its candidates."""
    rows = []
    for name, expr, shape in CASES:
        tag = f"{name}_{shape.replace(', ', 'x')}"
        task = TASK.replace("{expr}", expr).replace("{shape}", shape)
        cands = [("noop", NOOP.replace("{tag}", tag).replace("{expr}", expr))]
        if name == "relu":
            cands.append(("relu4", RELU.replace("{tag}", tag)))
        for kind, code in cands:
            rows.append({"candidate_id": f"{tag}-{kind}", "task_id": tag, "task_source": task,
                         "code": code, "backend": "cuda"})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--compile-workers", type=int, default=16)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    batch, verdicts = os.path.join(a.out, "batch.jsonl"), os.path.join(a.out, "verdicts.jsonl")
    with open(batch, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in batch_rows())
    rc = subprocess.run([sys.executable, "-m", "verifier", "--batch", batch, "--out", verdicts,
                         "--backend", "cuda", "--fallback", "partial", "--compile-workers",
                         str(a.compile_workers)]).returncode
    print("| candidate | status | runtime us | eager us | speedup |")
    print("| --- | --- | --- | --- | --- |")
    with open(verdicts, encoding="utf-8") as f:
        for line in f:
            v = json.loads(line)
            print(f"| {v['candidate_id']} | {v['status']} | {v['runtime_us']} | "
                  f"{v['eager_us']} | {v['speedup']} |")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
