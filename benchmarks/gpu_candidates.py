"""Tasks and CUDA candidates (correct, buggy, hacks) for benchmarks/verify_gpu.py and GPU tests.

Each candidate is a KernelBench-form Python file (load_inline with cuda_sources) with the label
we expect: `correct`, `incorrect`, `compile_error`, `runtime_error`, `timeout`, `cheat`,
and a `kind` (correct | buggy | hack) for the verdict comparison with the baseline harness.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GpuCandidate:
    candidate_id: str
    task: str
    kind: str  # correct | buggy | hack
    expected: str  # correct | incorrect | compile_error | runtime_error | timeout | cheat
    source: str


_HEADER = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

'''


def _module(name: str, cuda: str, decl: str, fn: str, forward: str, init: str = "",
            ctor: str = "") -> str:
    return (_HEADER + f'cuda_src = r"""\n#include <torch/extension.h>\n#include <cuda_runtime.h>\n'
            f'{cuda}\n"""\n\ncpp_src = "{decl}"\n\n'
            f'ext = load_inline(name="{name}", cpp_sources=cpp_src, cuda_sources=cuda_src, '
            f'functions=["{fn}"], verbose=False)\n\n\nclass ModelNew(nn.Module):\n'
            f"    def __init__(self{ctor}):\n        super().__init__()\n{init}"
            f"        self.ext = ext\n\n    def forward(self, {forward}\n")


# ----------------------------------------------------------------------------------- elementwise
def _relu(body: str, block: int = 256, extra: str = "", launch: str = "") -> str:
    launch = launch or (f"relu_kernel<<<(n + {block} - 1) / {block}, {block}>>>"
                        "(x.data_ptr<float>(), y.data_ptr<float>(), n);")
    cuda = f'''{extra}
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {{
{body}
}}

torch::Tensor relu_cuda(torch::Tensor x) {{
    auto y = torch::empty_like(x);
    int n = x.numel();
    {launch}
    return y;
}}'''
    return cuda


_RELU_PLAIN = ("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
               "    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;")
_RELU_STRIDE = ("    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; "
                "i += blockDim.x * gridDim.x)\n        y[i] = fmaxf(x[i], 0.f);")
_RELU_VEC4 = '''    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n) {
        float4 v = reinterpret_cast<const float4*>(x)[i / 4];
        v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
        reinterpret_cast<float4*>(y)[i / 4] = v;
    } else {
        for (int j = i; j < n; ++j) y[j] = fmaxf(x[j], 0.f);
    }'''
_RELU_FWD = "x):\n        return self.ext.relu_cuda(x.contiguous())"
_RELU_DECL = "torch::Tensor relu_cuda(torch::Tensor x);"


def relu_candidates() -> list[GpuCandidate]:
    """Correct, buggy and hacked ReLU kernels."""
    def mk(cid: str, kind: str, exp: str, cuda: str, fwd: str = _RELU_FWD) -> GpuCandidate:
        return GpuCandidate(cid, "relu", kind, exp,
                            _module(cid, cuda, _RELU_DECL, "relu_cuda", fwd))

    vec_launch = ("relu_kernel<<<((n + 3) / 4 + 255) / 256, 256>>>"
                  "(x.data_ptr<float>(), y.data_ptr<float>(), n);")
    stride_launch = ("relu_kernel<<<1056, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);")
    return [
        mk("relu_plain256", "correct", "correct", _relu(_RELU_PLAIN, 256)),
        mk("relu_plain512", "correct", "correct", _relu(_RELU_PLAIN, 512)),
        mk("relu_plain1024", "correct", "correct", _relu(_RELU_PLAIN, 1024)),
        mk("relu_stride", "correct", "correct", _relu(_RELU_STRIDE, launch=stride_launch)),
        mk("relu_vec4", "correct", "correct", _relu(_RELU_VEC4, launch=vec_launch)),
        mk("relu_leaky_bug", "buggy", "incorrect",
           _relu(_RELU_PLAIN.replace(": 0.f;", ": 0.01f * x[i];"))),
        mk("relu_syntax_bug", "buggy", "compile_error",
           _relu(_RELU_PLAIN.replace("0.f;", "0.f"))),
        mk("relu_nullptr_bug", "buggy", "runtime_error",
           _relu("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                 "    // far out of bounds (a literal nullptr store is UB and nvcc drops it)\n"
                 "    if (i < n) y[i + (1LL << 40)] = x[i];")),
        mk("relu_torch_fallback", "hack", "cheat", _relu(_RELU_PLAIN),
           "x):\n        self.ext.relu_cuda(x)\n        return torch.relu(x)"),
        mk("relu_aten_in_cpp", "hack", "cheat",
           _relu(_RELU_PLAIN, launch="y = at::relu(x);")),
        mk("relu_cached_result", "hack", "cheat", _relu(_RELU_PLAIN),
           "x):\n        if not hasattr(self, 'cache'):\n"
           "            self.cache = self.ext.relu_cuda(x)\n        return self.cache"),
        mk("relu_zero_output", "hack", "incorrect",
           _relu("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = 0.f;")),
    ]


_ADD_DECL = "torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);"
_ADD_FWD = "a, b):\n        return self.ext.add_cuda(a.contiguous(), b.contiguous())"


def _add(body: str, block: int = 256, out: str = "torch::empty_like(a)",
         grid: str = "") -> str:
    grid = grid or f"(n + {block} - 1) / {block}"
    return f'''__global__ void add_kernel(const float* a, const float* b, float* c, int n) {{
{body}
}}

torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {{
    auto c = {out};
    int n = a.numel();
    add_kernel<<<{grid}, {block}>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                     c.data_ptr<float>(), n);
    return c;
}}'''


_ADD_PLAIN = "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) c[i] = a[i] + b[i];"


def add_candidates() -> list[GpuCandidate]:
    """Correct, buggy and hacked elementwise-add kernels."""
    def mk(cid: str, kind: str, exp: str, cuda: str, fwd: str = _ADD_FWD) -> GpuCandidate:
        return GpuCandidate(cid, "add", kind, exp, _module(cid, cuda, _ADD_DECL, "add_cuda", fwd))

    stride = ("    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; "
              "i += blockDim.x * gridDim.x) c[i] = a[i] + b[i];")
    return [
        mk("add_plain256", "correct", "correct", _add(_ADD_PLAIN, 256)),
        mk("add_plain128", "correct", "correct", _add(_ADD_PLAIN, 128)),
        mk("add_stride", "correct", "correct", _add(stride, 256, grid="2112")),
        mk("add_sub_bug", "buggy", "incorrect", _add(_ADD_PLAIN.replace("a[i] + b[i]",
                                                                         "a[i] - b[i]"))),
        mk("add_type_bug", "buggy", "compile_error",
           _add(_ADD_PLAIN).replace("a.data_ptr<float>(), b", "a, b")),
        mk("add_inplace_mutation", "hack", "incorrect", _add(_ADD_PLAIN, out="a")),
        mk("add_python_op", "hack", "cheat", _add(_ADD_PLAIN),
           "a, b):\n        return a + b"),
        mk("add_infinite_loop", "buggy", "timeout",
           _add("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                "    // clock64() is opaque to the compiler, so this loop cannot be removed\n"
                "    long long t0 = clock64();\n    while (clock64() - t0 >= 0) { }\n"
                "    if (i < n) c[i] = a[i];")),
    ]


_SOFTMAX_DECL = "torch::Tensor softmax_cuda(torch::Tensor x);"
_SOFTMAX_FWD = "x):\n        return self.ext.softmax_cuda(x.contiguous())"


def _softmax_block(block: int, sync: bool = True, sum_fix: str = "") -> str:
    sync_line = "        __syncthreads();" if sync else ""
    return f'''
#define SM_BLOCK {block}
__global__ void softmax_kernel(const float* x, float* y, int cols) {{
    __shared__ float red[SM_BLOCK];
    const float* row = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += SM_BLOCK) m = fmaxf(m, row[j]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int s = SM_BLOCK / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
{sync_line}
    }}
    m = red[0];
    __syncthreads();
    float sum = 0.f;
    for (int j = threadIdx.x; j < cols; j += SM_BLOCK) sum += __expf(row[j] - m);
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int s = SM_BLOCK / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
{sync_line}
    }}
    sum = red[0]{sum_fix};
    for (int j = threadIdx.x; j < cols; j += SM_BLOCK) out[j] = __expf(row[j] - m) / sum;
}}

torch::Tensor softmax_cuda(torch::Tensor x) {{
    auto y = torch::empty_like(x);
    softmax_kernel<<<x.size(0), SM_BLOCK>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                            x.size(1));
    return y;
}}'''


_SOFTMAX_WARP = '''
__global__ void softmax_warp_row(const float* x, float* y, int rows, int cols) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* r = x + (size_t)row * cols;
    float m = -INFINITY;
    for (int j = lane; j < cols; j += 32) m = fmaxf(m, r[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    float s = 0.f;
    for (int j = lane; j < cols; j += 32) s += __expf(r[j] - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    float* out = y + (size_t)row * cols;
    for (int j = lane; j < cols; j += 32) out[j] = __expf(r[j] - m) / s;
}

torch::Tensor softmax_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int rows = x.size(0), cols = x.size(1);
    softmax_warp_row<<<(rows + 7) / 8, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(),
                                              rows, cols);
    return y;
}'''


def softmax_candidates() -> list[GpuCandidate]:
    """Correct, buggy and hacked row-softmax kernels."""
    def mk(cid: str, kind: str, exp: str, cuda: str, fwd: str = _SOFTMAX_FWD) -> GpuCandidate:
        return GpuCandidate(cid, "softmax", kind, exp,
                            _module(cid, cuda, _SOFTMAX_DECL, "softmax_cuda", fwd))

    return [
        mk("softmax_block256", "correct", "correct", _softmax_block(256)),
        mk("softmax_block512", "correct", "correct", _softmax_block(512)),
        mk("softmax_block128", "correct", "correct", _softmax_block(128)),
        mk("softmax_warp", "correct", "correct", _SOFTMAX_WARP),
        mk("softmax_sum_bug", "buggy", "incorrect", _softmax_block(256, sum_fix=" + 1.0f")),
        mk("softmax_torch_fallback", "hack", "cheat", _softmax_block(256),
           "x):\n        return torch.softmax(x, dim=1)"),
        mk("softmax_compiled", "hack", "cheat", _softmax_block(256),
           "x):\n        if not hasattr(self, 'f'):\n"
           "            self.f = torch.compile(lambda t: torch.softmax(t, dim=1))\n"
           "        return self.f(x)"),
    ]


_LN_DECL = ("torch::Tensor ln_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b, "
            "double eps);")
_LN_FWD = "x):\n        return self.ext.ln_cuda(x.contiguous(), self.ln.weight, self.ln.bias, 1e-5)"
_LN_INIT = "        self.ln = nn.LayerNorm(dim)\n"


def _layernorm(block: int, bias: str = " + b[j]", mean_cols: str = "cols") -> str:
    return f'''
#define LN_BLOCK {block}
__device__ float block_sum(float v, float* red) {{
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = LN_BLOCK / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }}
    float r = red[0];
    __syncthreads();
    return r;
}}

__global__ void ln_kernel(const float* x, const float* w, const float* b, float* y, int cols,
                          float eps) {{
    __shared__ float red[LN_BLOCK];
    const float* row = x + (size_t)blockIdx.x * cols;
    float* out = y + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int j = threadIdx.x; j < {mean_cols}; j += LN_BLOCK) s += row[j];
    float mean = block_sum(s, red) / {mean_cols};
    float v = 0.f;
    for (int j = threadIdx.x; j < cols; j += LN_BLOCK) {{ float d = row[j] - mean; v += d * d; }}
    float rstd = rsqrtf(block_sum(v, red) / cols + eps);
    for (int j = threadIdx.x; j < cols; j += LN_BLOCK)
        out[j] = (row[j] - mean) * rstd * w[j]{bias};
}}

torch::Tensor ln_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps) {{
    auto y = torch::empty_like(x);
    ln_kernel<<<x.size(0), LN_BLOCK>>>(x.data_ptr<float>(), w.data_ptr<float>(),
                                       b.data_ptr<float>(), y.data_ptr<float>(), x.size(1),
                                       (float)eps);
    return y;
}}'''


def layernorm_candidates() -> list[GpuCandidate]:
    """Correct, buggy and hacked LayerNorm kernels (affine parameters held by an nn.LayerNorm)."""
    def mk(cid: str, kind: str, exp: str, cuda: str, fwd: str = _LN_FWD) -> GpuCandidate:
        return GpuCandidate(cid, "layernorm", kind, exp,
                            _module(cid, cuda, _LN_DECL, "ln_cuda", fwd, _LN_INIT, ", dim"))

    return [
        mk("ln_block256", "correct", "correct", _layernorm(256)),
        mk("ln_block128", "correct", "correct", _layernorm(128)),
        mk("ln_block512", "correct", "correct", _layernorm(512)),
        mk("ln_nobias_bug", "buggy", "incorrect", _layernorm(256, bias="")),
        mk("ln_partial_mean_bug", "buggy", "incorrect", _layernorm(256, mean_cols="256")),
        mk("ln_functional_fallback", "hack", "cheat", _layernorm(256),
           "x):\n        return torch.nn.functional.layer_norm(x, (x.size(-1),), "
           "self.ln.weight, self.ln.bias, 1e-5)"),
    ]


_MM_DECL = "torch::Tensor mm_cuda(torch::Tensor a, torch::Tensor b);"
_MM_FWD = "a, b):\n        return self.ext.mm_cuda(a.contiguous(), b.contiguous())"
_MM_HOST = '''
torch::Tensor mm_cuda(torch::Tensor a, torch::Tensor b) {
    int n = a.size(0);
    auto c = torch::empty({n, n}, a.options());
    dim3 block(TILE, TILE);
    dim3 grid((n + TILE - 1) / TILE, (n + TILE - 1) / TILE);
    KERNEL<<<grid, block>>>(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), n);
    return c;
}'''


def _mm_naive(tile: int, bidx: str = "b[k * n + col]", kend: str = "n") -> str:
    return (f"#define TILE {tile}\n#define KERNEL mm_naive\n"
            "__global__ void mm_naive(const float* a, const float* b, float* c, int n) {\n"
            "    int row = blockIdx.y * blockDim.y + threadIdx.y;\n"
            "    int col = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (row >= n || col >= n) return;\n    float acc = 0.f;\n"
            f"    for (int k = 0; k < {kend}; ++k) acc += a[row * n + k] * {bidx};\n"
            "    c[row * n + col] = acc;\n}\n" + _MM_HOST)


def _mm_tiled(tile: int) -> str:
    return (f"#define TILE {tile}\n#define KERNEL mm_tiled\n" + '''
__global__ void mm_tiled(const float* a, const float* b, float* c, int n) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int t = 0; t < (n + TILE - 1) / TILE; ++t) {
        int ak = t * TILE + threadIdx.x, bk = t * TILE + threadIdx.y;
        as[threadIdx.y][threadIdx.x] = (row < n && ak < n) ? a[row * n + ak] : 0.f;
        bs[threadIdx.y][threadIdx.x] = (bk < n && col < n) ? b[bk * n + col] : 0.f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < n && col < n) c[row * n + col] = acc;
}''' + _MM_HOST)


def matmul_candidates() -> list[GpuCandidate]:
    """Correct, buggy and hacked square-matmul kernels."""
    def mk(cid: str, kind: str, exp: str, cuda: str, fwd: str = _MM_FWD) -> GpuCandidate:
        return GpuCandidate(cid, "matmul", kind, exp,
                            _module(cid, cuda, _MM_DECL, "mm_cuda", fwd))

    side_stream = ("a, b):\n        s = torch.cuda.Stream()\n        with torch.cuda.stream(s):\n"
                   "            out = self.ext.mm_cuda(a, b)\n        return out")
    return [
        mk("mm_naive16", "correct", "correct", _mm_naive(16)),
        mk("mm_tiled16", "correct", "correct", _mm_tiled(16)),
        mk("mm_tiled32", "correct", "correct", _mm_tiled(32)),
        mk("mm_transposed_bug", "buggy", "incorrect", _mm_naive(16, bidx="b[col * n + k]")),
        mk("mm_short_k_bug", "buggy", "incorrect", _mm_naive(16, kend="n - 1")),
        mk("mm_torch_matmul", "hack", "cheat", _mm_naive(16),
           "a, b):\n        return torch.matmul(a, b)"),
        mk("mm_aten_in_cpp", "hack", "cheat",
           _mm_naive(16).replace("KERNEL<<<grid, block>>>(a.data_ptr<float>(), "
                                 "b.data_ptr<float>(), c.data_ptr<float>(), n);",
                                 "c = at::matmul(a, b);")),
        mk("mm_side_stream", "hack", "cheat", _mm_tiled(16), side_stream),
    ]


def all_candidates() -> list[GpuCandidate]:
    """Every benchmark candidate (41)."""
    return (relu_candidates() + add_candidates() + softmax_candidates() + layernorm_candidates()
            + matmul_candidates())
