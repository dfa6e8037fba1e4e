"""A corpus of real-style CUDA candidates for benchmarks/verify_gpu.py (>= 150 kernels).

Three parts, each candidate with the verdict we expect (`correct`, `incorrect`,
`compile_error`, `runtime_error`, `timeout`, `cheat`, `static_reject`):
- the 48 CUDA cases of the conformance corpus (tests/verifier/conformance, strict policy);
- the 41 hand-written candidates of benchmarks/gpu_candidates.py;
- kernels generated from a few dozen patterns in the form models write for KernelBench (the
  one-shot `load_inline` idiom: source strings, a declaration string, `functions=[...]`,
  `verbose=True`, `extra_cflags=[""]`, `extra_ldflags=[""]`), over KernelBench-like tasks of
  several sizes (activations, scale+bias, reductions over a dimension, row softmax, matmul,
  conv2d), with the wrong, non-compiling, crashing and cheating variants real samples have.
Every candidate's code is unique (its id is in a comment), as sampled responses are, so no
build is shared between candidates.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class CorpusKernel:
    candidate_id: str
    task_id: str
    task_source: str
    source: str
    expected: str
    origin: str  # conformance | handwritten | generated


def as_expected(status: str, expected: str) -> bool:
    """A verdict meets its label (a cheat may be caught statically or dynamically)."""
    if expected == "correct":
        return status in ("correct_slow", "correct_fast")
    if expected == "cheat":
        return status in ("cheat", "static_reject")
    return status == expected


# ------------------------------------------------------------------------------------ tasks
_TASK_HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
_TASK_TAIL = "\n\ndef get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n" \
             "    return [{init}]\n"


def _task(doc: str, init: str, body: str, consts: str, inputs: str, init_inputs: str = "") -> str:
    return (_TASK_HEAD + f'class Model(nn.Module):\n    """{doc}"""\n\n'
            f"    def __init__(self{init}):\n        super(Model, self).__init__()\n{body}\n\n"
            + consts + _TASK_TAIL.format(inputs=inputs, init=init_inputs))


UNARY = {  # name -> (torch expression, CUDA expression of float v)
    "sigmoid": ("torch.sigmoid(x)", "1.0f / (1.0f + expf(-v))"),
    "tanh": ("torch.tanh(x)", "tanhf(v)"),
    "gelu": ("F.gelu(x)", "0.5f * v * (1.0f + erff(v * 0.70710678118654752f))"),
    "swish": ("x * torch.sigmoid(x)", "v / (1.0f + expf(-v))"),
    "elu": ("F.elu(x, alpha=1.0)", "v > 0.0f ? v : expm1f(v)"),
    "hardtanh": ("F.hardtanh(x, min_val=-1.0, max_val=1.0)", "fminf(fmaxf(v, -1.0f), 1.0f)"),
    "softplus": ("F.softplus(x)", "v > 20.0f ? v : log1pf(expf(v))"),
    "leaky_relu": ("F.leaky_relu(x, negative_slope=0.01)", "v > 0.0f ? v : 0.01f * v"),
}
SIZES = [(16, 16384), (64, 4096)]


def unary_task(op: str, size: tuple[int, int]) -> str:
    fwd = f"    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        return {UNARY[op][0]}"
    return _task(f"Simple model that performs a {op} activation.", "", "\n" + fwd,
                 f"batch_size = {size[0]}\ndim = {size[1]}\n", "torch.randn(batch_size, dim)")


def scale_bias_task(size: tuple[int, int]) -> str:
    return _task("Scales the input and adds a bias.", ", scale: float, bias: float",
                 "        self.scale = scale\n        self.bias = bias\n\n"
                 "    def forward(self, x):\n        return x * self.scale + self.bias",
                 f"batch_size = {size[0]}\ndim = {size[1]}\n", "torch.randn(batch_size, dim)",
                 "2.5, -0.75")


REDUCE = {"sum": ("torch.sum(x, dim=self.dim, keepdim=True)", "0.0f", "acc += v", "acc"),
          "mean": ("torch.mean(x, dim=self.dim, keepdim=True)", "0.0f", "acc += v",
                   "acc / (float)r"),
          "max": ("torch.max(x, dim=self.dim, keepdim=True)[0]", "-INFINITY",
                  "acc = fmaxf(acc, v)", "acc")}
REDUCE_SIZES = [(16, 256, 256), (8, 512, 128)]


def reduce_task(op: str, size: tuple[int, int, int]) -> str:
    return _task(f"{op} reduction over dimension 1.", ", dim: int",
                 f"        self.dim = dim\n\n    def forward(self, x):\n"
                 f"        return {REDUCE[op][0]}",
                 f"batch_size, dim1, dim2 = {size}\n",
                 "torch.randn(batch_size, dim1, dim2)", "1")


def softmax_task(size: tuple[int, int]) -> str:
    return _task("Softmax over the last dimension.", "",
                 "\n    def forward(self, x):\n        return torch.softmax(x, dim=1)",
                 f"batch_size = {size[0]}\ndim = {size[1]}\n", "torch.randn(batch_size, dim)")


MM_SIZES = [(1024, 1024, 1024), (512, 1024, 768)]


def matmul_task(size: tuple[int, int, int]) -> str:
    return _task("Single matrix multiplication (C = A * B).", "",
                 "\n    def forward(self, A, B):\n        return torch.matmul(A, B)",
                 f"M, K, N = {size}\n", "torch.randn(M, K), torch.randn(K, N)")


CONV_SIZES = [(8, 3, 16, 64), (4, 8, 8, 32)]


def conv_task(size: tuple[int, int, int, int]) -> str:
    b, cin, cout, hw = size
    return _task("Standard 2D convolution, 3x3 kernel, no padding, no bias.",
                 ", in_channels: int, out_channels: int, kernel_size: int",
                 "        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, "
                 "bias=False)\n\n    def forward(self, x):\n        return self.conv2d(x)",
                 f"batch_size = {b}\nin_channels = {cin}\nout_channels = {cout}\n"
                 f"height = width = {hw}\n",
                 "torch.randn(batch_size, in_channels, height, width)",
                 "in_channels, out_channels, 3")


# ------------------------------------------------------------------------- candidate form
def kb_module(cid: str, fn: str, args: str, cuda: str, call: str, init: str = "",
              ctor: str = "", forward_args: str = "x") -> str:
    """The KernelBench one-shot idiom (its example's layout and arguments)."""
    decl = f"torch::Tensor {fn}({args});"
    return f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

{fn}_source = """
// {cid}
#include <torch/extension.h>
#include <cuda_runtime.h>
{cuda}
"""

{fn}_cpp_source = (
    "{decl}"
)

# Compile the inline CUDA code
{fn}_ext = load_inline(
    name="{fn}_{cid.replace('-', '_')}",
    cpp_sources={fn}_cpp_source,
    cuda_sources={fn}_source,
    functions=["{fn}"],
    verbose=True,
    extra_cflags=[""],
    extra_ldflags=[""],
)


class ModelNew(nn.Module):
    def __init__(self{ctor}) -> None:
        super().__init__()
{init}        self.ext = {fn}_ext

    def forward(self, {forward_args}):
        return {call}
'''


def _elementwise_host(fn: str, kernel: str, block: int, launch: str = "", extra_args: str = "",
                      extra_call: str = "") -> str:
    launch = launch or (f"{kernel}<<<(n + {block} - 1) / {block}, {block}>>>"
                        f"(x.data_ptr<float>(), out.data_ptr<float>(), n{extra_call});")
    return f'''
torch::Tensor {fn}(torch::Tensor x{extra_args}) {{
    auto out = torch::empty_like(x);
    int n = x.numel();
    {launch}
    return out;
}}'''


def unary_kernel(pattern: str, expr: str, block: int) -> str:
    """One elementwise kernel in a common form (plain, grid-stride, float4, shared-free ILP)."""
    if pattern == "plain":
        return f'''
__global__ void act_kernel(const float* __restrict__ x, float* __restrict__ out, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {{
        float v = x[i];
        out[i] = {expr};
    }}
}}''' + _elementwise_host("act_cuda", "act_kernel", block)
    if pattern == "stride":
        return f'''
__global__ void act_kernel(const float* x, float* out, int n) {{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {{
        float v = x[i];
        out[i] = {expr};
    }}
}}''' + _elementwise_host("act_cuda", "act_kernel", block, launch=(
            f"int blocks = min((n + {block} - 1) / {block}, 132 * 8);\n    act_kernel<<<blocks, "
            f"{block}>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);"))
    if pattern == "vec4":
        return f'''
__device__ __forceinline__ float act(float v) {{ return {expr}; }}
__global__ void act_kernel(const float* __restrict__ x, float* __restrict__ out, int n) {{
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n) {{
        float4 a = reinterpret_cast<const float4*>(x)[i / 4];
        a.x = act(a.x); a.y = act(a.y); a.z = act(a.z); a.w = act(a.w);
        reinterpret_cast<float4*>(out)[i / 4] = a;
    }} else {{
        for (int j = i; j < n; ++j) out[j] = act(x[j]);
    }}
}}''' + _elementwise_host("act_cuda", "act_kernel", block, launch=(
            f"act_kernel<<<((n + 3) / 4 + {block} - 1) / {block}, {block}>>>("
            "x.data_ptr<float>(), out.data_ptr<float>(), n);"))
    raise ValueError(pattern)


def reduce_kernel(op: str, block: int, bound: str = "r") -> str:
    _, init, step, final = REDUCE[op]
    return f'''
__global__ void reduce_kernel(const float* x, float* out, int b, int r, int c) {{
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= b * c) return;
    int bi = idx / c, ci = idx % c;
    const float* base = x + (long long)bi * r * c + ci;
    float acc = {init};
    for (int k = 0; k < {bound}; ++k) {{
        float v = base[(long long)k * c];
        {step};
    }}
    out[idx] = {final};
}}

torch::Tensor reduce_cuda(torch::Tensor x, int64_t dim) {{
    TORCH_CHECK(dim == 1, "only dim 1");
    int b = x.size(0), r = x.size(1), c = x.size(2);
    auto out = torch::empty({{b, 1, c}}, x.options());
    reduce_kernel<<<(b * c + {block} - 1) / {block}, {block}>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), b, r, c);
    return out;
}}'''


def softmax_kernel(block: int, denom: str = "s_sum[0]") -> str:
    return f'''
__global__ void softmax_kernel(const float* x, float* out, int cols) {{
    __shared__ float s_max[{block}];
    __shared__ float s_sum[{block}];
    const float* row = x + (long long)blockIdx.x * cols;
    float* orow = out + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, row[i]);
    s_max[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) s_max[threadIdx.x] = fmaxf(s_max[threadIdx.x], s_max[threadIdx.x + s]);
        __syncthreads();
    }}
    m = s_max[0];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) acc += expf(row[i] - m);
    s_sum[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) s_sum[threadIdx.x] += s_sum[threadIdx.x + s];
        __syncthreads();
    }}
    float total = {denom};
    for (int i = threadIdx.x; i < cols; i += blockDim.x) orow[i] = expf(row[i] - m) / total;
}}

torch::Tensor softmax_cuda(torch::Tensor x) {{
    auto out = torch::empty_like(x);
    softmax_kernel<<<x.size(0), {block}>>>(x.data_ptr<float>(), out.data_ptr<float>(),
                                           x.size(1));
    return out;
}}'''


def matmul_kernel(tile: int, kbound: str = "K") -> str:
    return f'''
#define TILE {tile}
__global__ void matmul_kernel(const float* A, const float* B, float* C, int M, int K, int N) {{
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < ({kbound} + TILE - 1) / TILE; ++t) {{
        int ak = t * TILE + threadIdx.x, bk = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[row * K + ak] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[bk * N + col] : 0.0f;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }}
    if (row < M && col < N) C[row * N + col] = acc;
}}

torch::Tensor matmul_cuda(torch::Tensor A, torch::Tensor B) {{
    int M = A.size(0), K = A.size(1), N = B.size(1);
    auto C = torch::empty({{M, N}}, A.options());
    dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_kernel<<<grid, block>>>(A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(),
                                   M, K, N);
    return C;
}}'''


def conv_kernel(block: int, wexpr: str = "w[((oc * C + ic) * 3 + kh) * 3 + kw]") -> str:
    return f'''
__global__ void conv2d_kernel(const float* x, const float* w, float* y, int B, int C, int O,
                              int H, int W) {{
    int OH = H - 2, OW = W - 2;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * O * OH * OW) return;
    int ow = idx % OW, oh = (idx / OW) % OH, oc = (idx / (OW * OH)) % O, b = idx / (OW * OH * O);
    float acc = 0.0f;
    for (int ic = 0; ic < C; ++ic)
        for (int kh = 0; kh < 3; ++kh)
            for (int kw = 0; kw < 3; ++kw)
                acc += x[((b * C + ic) * H + oh + kh) * W + ow + kw] * {wexpr};
    y[idx] = acc;
}}

torch::Tensor conv2d_cuda(torch::Tensor x, torch::Tensor w) {{
    int B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), O = w.size(0);
    auto y = torch::empty({{B, O, H - 2, W - 2}}, x.options());
    int total = B * O * (H - 2) * (W - 2);
    conv2d_kernel<<<(total + {block} - 1) / {block}, {block}>>>(
        x.data_ptr<float>(), w.contiguous().data_ptr<float>(), y.data_ptr<float>(), B, C, O, H, W);
    return y;
}}'''


def conformance_kernels() -> list[CorpusKernel]:
    conf = str(ROOT / "tests" / "verifier" / "conformance")  # not a package: as conformance_gpu
    if conf not in sys.path:
        sys.path.insert(0, conf)
    import corpus

    return [CorpusKernel(r["name"], f"conf:{r['task']}", r["task_source"], r["code"],
                         r["strict"], "conformance") for r in corpus.load("cuda")]


def handwritten_kernels() -> list[CorpusKernel]:
    from benchmarks.gpu_candidates import all_candidates
    from benchmarks.gpu_tasks import TASKS

    return [CorpusKernel(c.candidate_id, f"hw:{c.task}", TASKS[c.task], c.source, c.expected,
                         "handwritten") for c in all_candidates()]


def corpus() -> list[CorpusKernel]:
    """Every kernel of the benchmark corpus, in a fixed order."""
    from benchmarks.kernel_corpus_gen import generated

    return conformance_kernels() + handwritten_kernels() + generated()
