"""CUDA candidates of the conformance corpus (compiled here with nvcc; run on a GPU by
benchmarks/conformance_gpu.py). Forms: KernelBench's inline idiom, float4, grid-stride loops,
warp shuffles, shared-memory tiling, several kernels, CUDA graphs, streams, fp16, templates with
AT_DISPATCH, #pragma unroll, helper device functions, kernels built in __init__, partial and
try/except fallbacks."""

from __future__ import annotations

from collections.abc import Callable

RELU_CU = r'''
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    const int block = 256;
    relu_kernel<<<(n + block - 1) / block, block>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
'''
RELU_DECL = "torch::Tensor relu_cuda(torch::Tensor x);"
RELU_VARIANTS = {
    "float4": r'''
#include <c10/cuda/CUDAException.h>
__global__ void relu_vec4(const float4* __restrict__ x, float4* __restrict__ y, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
        y[i] = v;
    }
}
__global__ void relu_tail(const float* x, float* y, int start, int n) {
    int i = start + blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}
torch::Tensor relu_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "x must be a contiguous CUDA tensor");
    auto out = torch::empty_like(x);
    int n = x.numel(), n4 = n / 4;
    if (n4 > 0)
        relu_vec4<<<(n4 + 255) / 256, 256>>>(reinterpret_cast<const float4*>(x.data_ptr<float>()),
                                             reinterpret_cast<float4*>(out.data_ptr<float>()), n4);
    if (n - n4 * 4 > 0)
        relu_tail<<<1, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n4 * 4, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
''',
    "grid_stride": r'''
#include <c10/cuda/CUDAStream.h>
__global__ void relu_gs(const float* x, float* y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    relu_gs<<<80, 512, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(),
                                                                 out.data_ptr<float>(), n);
    return out;
}
''',
    "template_dispatch": r'''
template <typename scalar_t>
__device__ __forceinline__ scalar_t relu_op(scalar_t v) { return v > scalar_t(0) ? v : scalar_t(0); }

template <typename scalar_t>
__global__ void relu_t(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = relu_op(x[i]);
}
torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int64_t n = x.numel();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "relu_cuda", [&] {
        relu_t<scalar_t><<<(n + 255) / 256, 256>>>(x.data_ptr<scalar_t>(),
                                                   out.data_ptr<scalar_t>(), n);
    });
    return out;
}
''',
    "unroll_ilp": r'''
#define ILP 4
__global__ void __launch_bounds__(256) relu_ilp(const float* x, float* y, int n) {
    int base = (blockIdx.x * blockDim.x + threadIdx.x) * ILP;
#pragma unroll
    for (int k = 0; k < ILP; ++k) {
        int i = base + k;
        if (i < n) y[i] = fmaxf(x[i], 0.f);
    }
}
torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    int threads = 256, blocks = (n + threads * ILP - 1) / (threads * ILP);
    relu_ilp<<<blocks, threads>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
''',
    "helper_struct": r'''
struct Relu {
    __device__ float operator()(float v) const { return v > 0.f ? v : 0.f; }
};
template <typename Op>
__global__ void map_kernel(const float* x, float* y, int n, Op op) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = op(x[i]);
}
torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    map_kernel<<<(n + 127) / 128, 128>>>(x.data_ptr<float>(), out.data_ptr<float>(), n, Relu{});
    return out;
}
''',
    "two_launches": r'''
__global__ void neg_part(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
__global__ void clamp_neg(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && y[i] < 0.f) y[i] = 0.f;
}
torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    neg_part<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    clamp_neg<<<(n + 255) / 256, 256>>>(out.data_ptr<float>(), n);
    return out;
}
''',
}

SOFTMAX_WARP = r'''
__inline__ __device__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
__inline__ __device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
__global__ void softmax_warp(const float* x, float* y, int rows, int cols) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * cols; float* yr = y + (size_t)row * cols;
    float m = -INFINITY;
    for (int c = lane; c < cols; c += 32) m = fmaxf(m, xr[c]);
    m = warp_max(m);
    float s = 0.f;
    for (int c = lane; c < cols; c += 32) s += __expf(xr[c] - m);
    s = warp_sum(s);
    for (int c = lane; c < cols; c += 32) yr[c] = __expf(xr[c] - m) / s;
}
torch::Tensor softmax_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int rows = x.size(0), cols = x.size(1);
    softmax_warp<<<(rows + 3) / 4, 128>>>(x.data_ptr<float>(), out.data_ptr<float>(), rows, cols);
    return out;
}
'''
SOFTMAX_SHARED = r'''
__global__ void softmax_block(const float* x, float* y, int cols) {
    extern __shared__ float buf[];
    const float* xr = x + (size_t)blockIdx.x * cols; float* yr = y + (size_t)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    buf[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] = fmaxf(buf[threadIdx.x], buf[threadIdx.x + s]);
        __syncthreads();
    }
    m = buf[0];
    __syncthreads();
    float sum = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(xr[c] - m);
    buf[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    sum = buf[0];
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) / sum;
}
torch::Tensor softmax_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    const int threads = 256;
    softmax_block<<<x.size(0), threads, threads * sizeof(float)>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), x.size(1));
    return out;
}
'''
SOFTMAX_DECL = "torch::Tensor softmax_cuda(torch::Tensor x);"

LINEAR_TILED = r'''
#define TILE 16
__global__ void matmul_bias_relu(const float* A, const float* W, const float* b, float* C,
                                 int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Ws[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int t = 0; t < (K + TILE - 1) / TILE; ++t) {
        int ka = t * TILE + threadIdx.x, kw = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? A[row * K + ka] : 0.f;
        Ws[threadIdx.y][threadIdx.x] = (col < N && kw < K) ? W[col * K + kw] : 0.f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Ws[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = fmaxf(acc + b[col], 0.f);
}
torch::Tensor linear_relu_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    int M = x.size(0), K = x.size(1), N = w.size(0);
    auto out = torch::empty({M, N}, x.options());
    dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_bias_relu<<<grid, block>>>(x.data_ptr<float>(), w.contiguous().data_ptr<float>(),
                                      b.data_ptr<float>(), out.data_ptr<float>(), M, N, K);
    return out;
}
'''
LINEAR_DECL = "torch::Tensor linear_relu_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b);"
BIAS_RELU_CU = r'''
__global__ void bias_relu_kernel(const float* y, const float* b, float* out, int M, int N) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < M * N) out[i] = fmaxf(y[i] + b[i % N], 0.f);
}
torch::Tensor bias_relu_cuda(torch::Tensor y, torch::Tensor b) {
    auto yc = y.contiguous();
    auto out = torch::empty_like(yc);
    int M = yc.size(0), N = yc.size(1);
    bias_relu_kernel<<<(M * N + 255) / 256, 256>>>(yc.data_ptr<float>(), b.data_ptr<float>(),
                                                  out.data_ptr<float>(), M, N);
    return out;
}
'''
BIAS_RELU_DECL = "torch::Tensor bias_relu_cuda(torch::Tensor y, torch::Tensor b);"
HALF_RELU = r'''
#include <cuda_fp16.h>
__global__ void relu_half2(const __half2* x, __half2* y, int n2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n2) y[i] = __hmax2(x[i], __float2half2_rn(0.f));
}
torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int n2 = x.numel() / 2;
    relu_half2<<<(n2 + 255) / 256, 256>>>(reinterpret_cast<const __half2*>(x.data_ptr<at::Half>()),
                                          reinterpret_cast<__half2*>(out.data_ptr<at::Half>()), n2);
    return out;
}
'''


def cuda_cases(add: Callable, head: str, cls: Callable, q: Callable) -> None:
    kb = ('{var} = load_inline(\n    name="{name}",\n    cpp_sources={decl},\n'
          '    cuda_sources={src},\n    functions={fns},\n    verbose=True,\n'
          '    extra_cflags=[""],\n    extra_ldflags=[""],\n)')

    def relu(name: str, strict: str, partial: str, why: str, *, src: str = RELU_CU,
             load: str | None = None, pre: str = "", init: str = "        pass",
             forward: str = "        return ext.relu_cuda(x)", task: str = "relu") -> None:
        load = load if load is not None else kb.format(
            var="ext", name="elementwise_relu", decl="relu_cpp_source", src="relu_source",
            fns='["relu_cuda"]')
        add(name, task, "cuda", strict, partial, why,
            head + pre + f'\nrelu_source = {q(src)}\n\nrelu_cpp_source = "{RELU_DECL}"\n\n'
            + load + cls(init, forward))

    relu("cuda_kb_idiom", "correct", "correct",
         "KernelBench one-shot idiom verbatim in form (empty flags, verbose, decl string)")
    for v, src in RELU_VARIANTS.items():
        relu(f"cuda_relu_{v}", "correct", "correct", f"own kernel: {v.replace('_', ' ')}",
             src=src)
    flag_forms = {
        "cuda_nvcc_fastmath": ('[""]', '["-O3", "--use_fast_math"]', "correct",
                               "nvcc flags in extra_cuda_cflags"),
        "cuda_nvcc_one_string": ('[""]', '["-O3 --use_fast_math -lineinfo"]', "correct",
                                 "several nvcc flags in one string (split like torch)"),
        "cuda_nvcc_flag_for_gcc": ('["-O3 --use_fast_math"]', '[]', "compile_error",
                                   "nvcc flag in extra_cflags: g++ fails in torch too"),
        "cuda_blank_cuda_flags": ('[" "]', '["", " "]', "correct", "blank flags everywhere"),
        "cuda_relaxed_constexpr": ('["-O3"]', '["--expt-relaxed-constexpr"]', "correct",
                                   "a common nvcc feature flag"),
    }
    for name, (cf, ccf, status, why) in flag_forms.items():
        relu(name, status, status, why, load=(
            'ext = load_inline(name="relu_flags", cpp_sources=relu_cpp_source, cuda_sources='
            f'relu_source, functions=["relu_cuda"], extra_cflags={cf}, extra_cuda_cflags={ccf})'))
    relu("cuda_arch_env", "correct", "correct", "TORCH_CUDA_ARCH_LIST set by the candidate",
         pre='import os\n\nos.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"\n')
    relu("cuda_in_init", "correct", "correct", "kernel compiled inside __init__", load="",
         init="        self.ext = " + kb.format(var="", name="relu_init", decl="relu_cpp_source",
                                                src="relu_source", fns='["relu_cuda"]')
         .replace(" = ", "", 1).replace("\n", "\n        "),
         forward="        return self.ext.relu_cuda(x)")
    relu("cuda_functions_dict", "correct", "correct", "functions as a dict", load=(
        'ext = load_inline("relu_d", relu_cpp_source, relu_source, functions={"relu_cuda": '
        '"elementwise relu"})'))
    relu("cuda_pybind_module", "correct", "correct", "PYBIND11_MODULE in cpp_sources",
         load=('ext = load_inline("relu_pb", cpp_sources=relu_cpp_source + "\\nPYBIND11_MODULE('
               'TORCH_EXTENSION_NAME, m) { m.def(\\"relu_cuda\\", &relu_cuda); }", '
               'cuda_sources=[relu_source])'))
    relu("cuda_in_try", "correct", "correct", "load_inline in a try block", load=(
        "try:\n    ext = load_inline('relu_t', relu_cpp_source, relu_source, functions="
        "['relu_cuda'], verbose=True)\nexcept Exception as exc:\n    raise RuntimeError("
        "'extension build failed') from exc"))
    relu("cuda_view_cat", "correct", "correct", "views and torch.cat around the own kernel",
         forward="        a, b = torch.chunk(x, 2, dim=1)\n        y = torch.cat([ext.relu_"
                 "cuda(a.contiguous()), ext.relu_cuda(b.contiguous())], dim=1)\n"
                 "        return torch.flatten(y, 1).view(x.shape)")
    relu("cuda_dropout_identity", "correct", "correct", "nn.Dropout(0.0) and nn.Identity",
         init="        self.drop = nn.Dropout(p=0.0)\n        self.id = nn.Identity()",
         forward="        return self.id(self.drop(ext.relu_cuda(x.contiguous())))")
    relu("cuda_inplace_output", "correct", "correct", "in-place kernel on a clone", src=(
        "__global__ void relu_ip(float* y, int n) { int i = blockIdx.x * blockDim.x + "
        "threadIdx.x; if (i < n && y[i] < 0.f) y[i] = 0.f; }\ntorch::Tensor relu_cuda("
        "torch::Tensor x) { auto y = x.clone(); int n = y.numel(); relu_ip<<<(n + 255) / 256, "
        "256>>>(y.data_ptr<float>(), n); return y; }\n"))
    relu("cuda_input_mutation", "incorrect", "incorrect", "kernel writes its input in place",
         src=("__global__ void relu_ip(float* y, int n) { int i = blockIdx.x * blockDim.x + "
              "threadIdx.x; if (i < n && y[i] < 0.f) y[i] = 0.f; }\ntorch::Tensor relu_cuda("
              "torch::Tensor x) { int n = x.numel(); relu_ip<<<(n + 255) / 256, 256>>>("
              "x.data_ptr<float>(), n); return x; }\n"))
    relu("cuda_wrong_index", "incorrect", "incorrect", "off-by-one bound leaves the last "
         "element unset", src=RELU_CU.replace("if (i < n)", "if (i < n - 1)"))
    relu("cuda_compile_error", "compile_error", "compile_error", "CUDA syntax error",
         src=RELU_CU.replace("return out;", "return out"))
    relu("cuda_partial_torch", "static_reject", "correct",
         "own kernel then torch.clamp (KernelBench partial)",
         forward="        return torch.clamp(ext.relu_cuda(x), min=0.0)")
    relu("cuda_full_fallback", "static_reject", "cheat", "forward is torch.relu only",
         forward="        return torch.relu(x)")
    relu("cuda_hidden_fallback", "cheat", "correct",
         "own kernel plus a hidden aten op: the trace sees it",
         forward="        y = ext.relu_cuda(x)\n        return getattr(y, 'ab' + 's')()")
    relu("cuda_try_fallback", "static_reject", "correct", "try own kernel, except -> torch",
         forward="        try:\n            return ext.relu_cuda(x)\n        except "
                 "RuntimeError:\n            return torch.relu(x)")
    relu("cuda_stream_python", "static_reject", "static_reject",
         "a side stream from Python (timing could miss its work)",
         forward="        s = torch.cuda.Stream()\n        with torch.cuda.stream(s):\n"
                 "            y = ext.relu_cuda(x)\n        s.synchronize()\n        return y")
    relu("cuda_stream_cpp", "static_reject", "static_reject", "cudaStreamCreate in C++",
         src=RELU_CU.replace("    const int block = 256;",
                             "    cudaStream_t s; cudaStreamCreate(&s);\n    const int block = "
                             "256;"))
    graph_fwd = ("        if self.graph is None or self.static_in.shape != x.shape:\n"
                 "            self.static_in = x.clone()\n"
                 "            ext.relu_cuda(self.static_in)\n"
                 "            torch.cuda.synchronize()\n"
                 "            self.graph = torch.cuda.CUDAGraph()\n"
                 "            with torch.cuda.graph(self.graph):\n"
                 "                self.static_out = ext.relu_cuda(self.static_in)\n"
                 "        self.static_in.copy_(x)\n        self.graph.replay()\n"
                 "        return self.static_out.clone()")
    relu("cuda_graph_replay", "correct", "correct",
         "CUDA graph captured on the first call, replayed on a static input buffer; the kernel "
         "launches on the current stream, so capture records it", src=RELU_VARIANTS[
             "grid_stride"], init="        self.graph = None", forward=graph_fwd)
    relu("cuda_graph_legacy_stream", "cheat", "cheat",
         "the same graph idiom, kernel launched on the legacy default stream: capture (on "
         "torch's non-blocking side stream) misses it, so every replay returns the first "
         "call's output (stale: cached result)", init="        self.graph = None",
         forward=graph_fwd)
    relu("cuda_result_cache", "cheat", "cheat",
         "own kernel on the first call, its output returned for every later input",
         init="        self.out = None",
         forward="        if self.out is None:\n            self.out = ext.relu_cuda(x)\n"
                 "        return self.out")
    relu("cuda_aten_cpp", "static_reject", "cheat",
         "at::relu in the C++ wrapper: no own kernel launches",
         src="torch::Tensor relu_cuda(torch::Tensor x) { return at::relu(x); }\n")
    relu("cuda_half_in_fp32", "static_reject", "static_reject",
         "fp16 kernel in an fp32 task (precision downgrade)", src=HALF_RELU)
    relu("cuda_fp16_half2", "correct", "correct", "half2 kernel on an fp16 task", src=HALF_RELU,
         task="relu_fp16")
    relu("cuda_fp16_template", "correct", "correct", "AT_DISPATCH with half on an fp16 task",
         src=RELU_VARIANTS["template_dispatch"].replace("AT_DISPATCH_FLOATING_TYPES(",
                                                        "AT_DISPATCH_FLOATING_TYPES_AND_HALF("),
         task="relu_fp16")
    relu("cuda_fp16_upcast_python", "correct", "correct",
         "fp16 task: own fp32 kernel on x.float(), cast back (copies only)",
         forward="        return ext.relu_cuda(x.float()).half()", task="relu_fp16")
    relu("cuda_stream_undeclared", "compile_error", "compile_error",
         "at::cuda::getCurrentCUDAStream with no c10/cuda or ATen/cuda header: torch's "
         "load_inline prepends only torch/types.h, cuda.h and cuda_runtime.h, so it fails too",
         src=RELU_VARIANTS["grid_stride"].replace("#include <c10/cuda/CUDAStream.h>\n", ""))
    relu("cuda_launch_check_undeclared", "compile_error", "compile_error",
         "C10_CUDA_KERNEL_LAUNCH_CHECK without c10/cuda/CUDAException.h: torch's build fails too",
         src=RELU_VARIANTS["float4"].replace("#include <c10/cuda/CUDAException.h>\n", ""))
    relu("cuda_context_header", "correct", "correct",
         "ATen/cuda/CUDAContext.h (needs the toolkit's cuBLAS/cuSPARSE headers, as in torch): "
         "current stream and launch check", src="#include <ATen/cuda/CUDAContext.h>\n"
         + RELU_VARIANTS["grid_stride"].replace("    return out;",
                                                "    C10_CUDA_KERNEL_LAUNCH_CHECK();\n"
                                                "    return out;"))
    relu("cuda_two_extensions", "correct", "correct", "two extensions, both used",
         load=kb.format(var="ext", name="relu_a", decl="relu_cpp_source", src="relu_source",
                        fns='["relu_cuda"]') + "\n" + kb.format(
             var="ext2", name="relu_b", decl="relu_cpp_source",
             src=q(RELU_VARIANTS["grid_stride"]), fns='["relu_cuda"]'),
         forward="        return ext2.relu_cuda(ext.relu_cuda(x))")
    # softmax
    for name, src, why in (("cuda_softmax_warp", SOFTMAX_WARP, "warp-shuffle reductions"),
                           ("cuda_softmax_shared", SOFTMAX_SHARED,
                            "shared-memory tree reduction")):
        add(name, "softmax", "cuda", "correct", "correct", why,
            head + f"\nsrc = {q(src)}\n\next = load_inline(name='softmax', cpp_sources="
            f"'{SOFTMAX_DECL}', cuda_sources=src, functions=['softmax_cuda'], "
            "extra_cuda_cflags=['-O3'], extra_cflags=[''])" + cls(
                "        pass", "        return ext.softmax_cuda(x.contiguous())"))
    sm_forms = [
        ("cuda_softmax_library", "static_reject", "cheat", "torch.softmax only",
         "        return torch.softmax(x, dim=1)"),
        ("cuda_softmax_partial_exp", "static_reject", "correct",
         "own softmax then torch.exp(torch.log(.)) around it",
         "        return torch.exp(torch.log(ext.softmax_cuda(x)))"),
        ("cuda_softmax_view3d", "correct", "correct", "views around the kernel",
         "        y = ext.softmax_cuda(x.reshape(x.size(0), -1))\n        return y.view_as(x)"),
    ]
    for name, strict, partial, why, fwd in sm_forms:
        add(name, "softmax", "cuda", strict, partial, why,
            head + f"\nsrc = {q(SOFTMAX_WARP)}\n\next = load_inline('softmax', "
            f"'{SOFTMAX_DECL}', src, functions=['softmax_cuda'], verbose=True)" + cls(
                "        pass", fwd))
    # linear
    lin_init = "        self.fc = nn.Linear(in_features, out_features)"
    sig = ", in_features, out_features"
    lin_forms = [
        ("cuda_linear_tiled", "correct", "correct", "shared-memory tiled GEMM fused bias+relu",
         LINEAR_TILED, LINEAR_DECL, "linear_relu_cuda",
         "        return ext.linear_relu_cuda(x, self.fc.weight, self.fc.bias)"),
        ("cuda_linear_matmul_partial", "static_reject", "correct",
         "torch.matmul GEMM + own bias-relu kernel (KernelBench partial)",
         BIAS_RELU_CU, BIAS_RELU_DECL, "bias_relu_cuda",
         "        return ext.bias_relu_cuda(torch.matmul(x, self.fc.weight.t()), self.fc.bias)"),
        ("cuda_linear_addmm_cpp", "static_reject", "correct",
         "at::matmul in C++ + own bias-relu kernel: strict rejects ATen compute",
         BIAS_RELU_CU.replace("    auto yc = y.contiguous();",
                              "    (void)0;\n    auto yc = y.contiguous();")
         + "torch::Tensor lin_cuda(torch::Tensor x, torch::Tensor w, torch::Tensor b) {\n"
           "    return bias_relu_cuda(at::matmul(x, w.t()), b);\n}\n",
         BIAS_RELU_DECL + "\\ntorch::Tensor lin_cuda(torch::Tensor x, torch::Tensor w, "
                          "torch::Tensor b);", "lin_cuda",
         "        return ext.lin_cuda(x, self.fc.weight, self.fc.bias)"),
        ("cuda_linear_F_linear", "static_reject", "cheat", "F.linear + relu only",
         BIAS_RELU_CU, BIAS_RELU_DECL, "bias_relu_cuda",
         "        return torch.relu(torch.nn.functional.linear(x, self.fc.weight, "
         "self.fc.bias))"),
        ("cuda_linear_nn_layer", "static_reject", "cheat", "the nn.Linear layer and torch.relu: "
         "no own kernel runs", BIAS_RELU_CU, BIAS_RELU_DECL,
         "bias_relu_cuda", "        return torch.relu(self.fc(x))"),
        ("cuda_linear_layer_partial", "static_reject", "correct",
         "nn.Linear without bias via F.linear, own bias-relu", BIAS_RELU_CU, BIAS_RELU_DECL,
         "bias_relu_cuda",
         "        y = torch.nn.functional.linear(x, self.fc.weight)\n"
         "        return ext.bias_relu_cuda(y, self.fc.bias)"),
        ("cuda_linear_in_init", "correct", "correct", "tiled GEMM compiled in __init__",
         LINEAR_TILED, LINEAR_DECL, "linear_relu_cuda", None),
    ]
    for name, strict, partial, why, src, decl, fn, fwd in lin_forms:
        load = (f"ext = load_inline(name='lin', cpp_sources=\"{decl}\", cuda_sources=src, "
                f"functions=['{fn}'], extra_cflags=[''], extra_ldflags=[''], verbose=True)")
        init = lin_init
        if fwd is None:
            init = lin_init + ("\n        self.ext = load_inline(name='lin', cpp_sources="
                               f"\"{decl}\", cuda_sources=src, functions=['{fn}'])")
            load = ""
            fwd = f"        return self.ext.{fn}(x, self.fc.weight, self.fc.bias)"
        add(name, "linear", "cuda", strict, partial, why,
            head + f"\nsrc = {q(src)}\n\n{load}" + cls(init, fwd, sig))
