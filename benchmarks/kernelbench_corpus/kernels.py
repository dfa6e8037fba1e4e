"""CUDA sources in the forms models write for KernelBench (our own code, written for this corpus).

Each function returns one `.cu` string (the `cuda_sources` of a load_inline call) with a host
wrapper; `tag` goes into every kernel's name so two samples never share a build, as two sampled
responses never do. Bugs are the ones sampled kernels have: a grid sized for half the data, a
stride mix-up, a missing cross-warp step, a global-barrier spin that deadlocks, a wrong index
stride that writes far out of bounds.
"""

from __future__ import annotations

HEADER = "#include <torch/extension.h>\n#include <cuda_runtime.h>\n#include <cmath>\n"


def unary(tag: str, expr: str, nparams: int, form: str = "grid_stride",
          bug: str = "") -> str:
    """An elementwise kernel computing `expr` of float `v` (params p0, p1): scalar or float4."""
    params = "".join(f", float p{i}" for i in range(nparams))
    wrapper_params = "".join(f", double p{i}" for i in range(nparams))
    wrapper_args = "".join(f", (float)p{i}" for i in range(nparams))
    if form == "float4":
        body = f"""
__global__ void k_{tag}(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4{params}) {{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (; i < n4; i += stride) {{
        float4 a = x[i];
        float4 r;
        {{ float v = a.x; r.x = {expr}; }}
        {{ float v = a.y; r.y = {expr}; }}
        {{ float v = a.z; r.z = {expr}; }}
        {{ float v = a.w; r.w = {expr}; }}
        y[{"i * 8" if bug == "crash" else "i"}] = r;
    }}
}}
__global__ void tail_{tag}(const float* __restrict__ x, float* __restrict__ y, int64_t start,
                           int64_t n{params}) {{
    int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {{ float v = x[i]; y[i] = {expr}; }}
}}
torch::Tensor run_{tag}(torch::Tensor x{wrapper_params}) {{
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t n = xc.numel();
    int64_t n4 = n / 4;
    int threads = 256;
    int blocks = (int)std::min<int64_t>((n4 + threads - 1) / threads, 65535LL * 8);
    if (n4 > 0)
        k_{tag}<<<blocks, threads>>>(reinterpret_cast<const float4*>(xc.data_ptr<float>()),
            reinterpret_cast<float4*>(y.data_ptr<float>()), {"n4 / 2" if bug == "half" else "n4"}{wrapper_args});
    if (n - n4 * 4 > 0)
        tail_{tag}<<<1, 4>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n4 * 4, n{wrapper_args});
    return y;
}}
"""
    else:
        spin = ""
        if bug == "hang":  # a home-made grid barrier: blocks that are not resident never arrive
            spin = f"""
    __shared__ int go;
    if (threadIdx.x == 0) {{
        atomicAdd(&arrived_{tag}, 1);
        while (atomicAdd(&arrived_{tag}, 0) < gridDim.x) {{ }}
        go = 1;
    }}
    __syncthreads();
    if (!go) return;"""
        body = f"""
{"__device__ int arrived_" + tag + " = 0;" if bug == "hang" else ""}
__global__ void k_{tag}(const float* __restrict__ x, float* __restrict__ y, int64_t n{params}) {{{spin}
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)blockDim.x * gridDim.x) {{
        float v = x[i];
        y[{"i * 8" if bug == "crash" else "i"}] = {expr};
    }}
}}
torch::Tensor run_{tag}(torch::Tensor x{wrapper_params}) {{
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t n = xc.numel();
    const int threads = 512;
    int64_t want = (n + threads - 1) / threads;
    int blocks = (int)std::min<int64_t>(want, {"1 << 20" if bug == "hang" else "4096"});
    k_{tag}<<<blocks, threads>>>(xc.data_ptr<float>(), y.data_ptr<float>(), {"n / 2" if bug == "half" else "n"}{wrapper_args});
    return y;
}}
"""
    return HEADER + body


def row_softmax(tag: str, log: bool = False, bug: str = "") -> str:
    """One block per row: max, sum of exp, write; warp shuffles then shared memory."""
    out = "(v - mx) - logf(sum)" if log else "expf(v - mx) / sum"
    cross = "" if bug == "one_warp" else """
    if (lane == 0) red[warp] = val;
    __syncthreads();
    val = (threadIdx.x < blockDim.x / 32) ? red[threadIdx.x] : INIT;
    if (warp == 0) val = OP_WARP(val);
    if (threadIdx.x == 0) red[0] = val;
    __syncthreads();
    val = red[0];
    __syncthreads();"""
    max_cross = cross.replace("INIT", "-INFINITY").replace("OP_WARP", f"warp_max_{tag}")
    sum_cross = cross.replace("INIT", "0.f").replace("OP_WARP", f"warp_sum_{tag}")
    single = "" if bug != "one_warp" else """
    val = __shfl_sync(0xffffffff, val, 0);"""
    return HEADER + f"""
__device__ __forceinline__ float warp_max_{tag}(float v) {{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}}
__device__ __forceinline__ float warp_sum_{tag}(float v) {{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}}
__global__ void k_{tag}(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {{
    __shared__ float red[32];
    const float* row = x + (int64_t)blockIdx.x * cols;
    float* orow = y + (int64_t)blockIdx.x * cols;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float val = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) val = fmaxf(val, row[c]);
    val = warp_max_{tag}(val);{max_cross}{single}
    float mx = val;
    val = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) val += expf(row[c] - mx);
    val = warp_sum_{tag}(val);{sum_cross}{single}
    float sum = val;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {{
        float v = row[c];
        orow[c] = {out};
    }}
}}
torch::Tensor run_{tag}(torch::Tensor x) {{
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t rows = xc.size(0), cols = xc.numel() / rows;
    k_{tag}<<<rows, 1024>>>(xc.data_ptr<float>(), y.data_ptr<float>(), cols);
    return y;
}}
"""


def row_norm(tag: str, kind: str, bug: str = "") -> str:
    """x / mean|x| (l1) or x / ||x||_2 (l2) per row, one block per row."""
    acc = "fabsf(v)" if kind == "l1" else "v * v"
    scale = "(s / (float)cols)" if kind == "l1" else "sqrtf(s)"
    if bug == "wrong":
        scale = "(s / (float)blockDim.x)" if kind == "l1" else "s"
    return HEADER + f"""
__global__ void k_{tag}(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {{
    __shared__ float part[1024];
    const float* row = x + (int64_t)blockIdx.x * cols;
    float acc = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {{ float v = row[c]; acc += {acc}; }}
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }}
    float s = part[0];
    float d = {scale};
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[(int64_t)blockIdx.x * cols + c] = row[c] / d;
}}
torch::Tensor run_{tag}(torch::Tensor x) {{
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t rows = xc.size(0);
    k_{tag}<<<rows, 1024>>>(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel() / rows);
    return y;
}}
"""


def layer_norm(tag: str, bug: str = "") -> str:
    """LayerNorm over all but the first dim: block-strided two-pass mean/var per sample."""
    var = "sq / n - mean * mean" if bug != "wrong" else "sq / n"
    return HEADER + f"""
__global__ void stats_{tag}(const float* __restrict__ x, float* __restrict__ stats, int64_t n) {{
    __shared__ double s1[512], s2[512];
    const float* row = x + (int64_t)blockIdx.y * n;
    double a = 0.0, b = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)blockDim.x * gridDim.x) {{ double v = row[i]; a += v; b += v * v; }}
    s1[threadIdx.x] = a; s2[threadIdx.x] = b;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) {{ s1[threadIdx.x] += s1[threadIdx.x + s]; s2[threadIdx.x] += s2[threadIdx.x + s]; }}
        __syncthreads();
    }}
    if (threadIdx.x == 0) {{
        atomicAdd(&stats[2 * blockIdx.y], (float)s1[0]);
        atomicAdd(&stats[2 * blockIdx.y + 1], (float)s2[0]);
    }}
}}
__global__ void apply_{tag}(const float* __restrict__ x, const float* __restrict__ w,
                            const float* __restrict__ b, const float* __restrict__ stats,
                            float* __restrict__ y, int64_t n, float eps) {{
    float mean = stats[2 * blockIdx.y] / n;
    float sq = stats[2 * blockIdx.y + 1];
    float var = {var};
    float inv = rsqrtf(var + eps);
    const float* row = x + (int64_t)blockIdx.y * n;
    float* out = y + (int64_t)blockIdx.y * n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)blockDim.x * gridDim.x)
        out[i] = (row[i] - mean) * inv * w[i] + b[i];
}}
torch::Tensor run_{tag}(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps) {{
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    int64_t rows = xc.size(0), n = xc.numel() / rows;
    auto stats = torch::zeros({{rows * 2}}, xc.options());
    dim3 grid(256, rows);
    stats_{tag}<<<grid, 512>>>(xc.data_ptr<float>(), stats.data_ptr<float>(), n);
    apply_{tag}<<<grid, 512>>>(xc.data_ptr<float>(), w.contiguous().data_ptr<float>(),
        b.contiguous().data_ptr<float>(), stats.data_ptr<float>(), y.data_ptr<float>(), n,
        (float)eps);
    return y;
}}
"""


def reduce_mid(tag: str, op: str, keepdim: bool, bug: str = "") -> str:
    """Reduce (B, R, C) over R: one thread per (b, c), coalesced over c."""
    init = {"sum": "0.f", "mean": "0.f", "max": "-INFINITY", "min": "INFINITY"}[op]
    step = {"sum": "acc += v;", "mean": "acc += v;", "max": "acc = fmaxf(acc, v);",
            "min": "acc = fminf(acc, v);"}[op]
    fin = "acc / (float)R" if op == "mean" else "acc"
    idx = "b * R * C + c * R + r" if bug == "wrong" else "b * R * C + r * C + c"
    shape = "{B, 1, C}" if keepdim else "{B, C}"
    return HEADER + f"""
__global__ void k_{tag}(const float* __restrict__ x, float* __restrict__ y, int64_t B, int64_t R,
                        int64_t C) {{
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= B * C) return;
    int64_t b = t / C, c = t % C;
    float acc = {init};
    for (int64_t r = 0; r < R; ++r) {{ float v = x[{idx}]; {step} }}
    y[t] = {fin};
}}
torch::Tensor run_{tag}(torch::Tensor x) {{
    auto xc = x.contiguous();
    int64_t B = xc.size(0), R = xc.size(1), C = xc.size(2);
    auto y = torch::empty({shape}, xc.options());
    int threads = 256;
    k_{tag}<<<(B * C + threads - 1) / threads, threads>>>(xc.data_ptr<float>(), y.data_ptr<float>(), B, R, C);
    return y;
}}
"""


def matmul(tag: str, tile: int = 32, bug: str = "", epilogue: str = "v",
           nparams: int = 0, bias: bool = False) -> str:
    """Shared-memory tiled C = op(A) @ op(B) (+ bias, epilogue) through strides; z is the batch.

    run(A, B, trans_a, trans_b): A is (M, K) or (K, M) with trans_a, batched when 3-D. With
    `bias` the wrapper takes W (N, K) as B with trans_b and a bias of N.
    """
    params = "".join(f", float p{i}" for i in range(nparams))
    wparams = "".join(f", double p{i}" for i in range(nparams))
    wargs = "".join(f", (float)p{i}" for i in range(nparams))
    kloop = "K / TILE" if bug == "ktail" else "(K + TILE - 1) / TILE"
    bload = "B[bo + (int64_t)col * sbk + (int64_t)kb * sbn]" if bug == "wrong" else \
        "B[bo + (int64_t)kb * sbk + (int64_t)col * sbn]"
    bias_arg = ", const float* __restrict__ bias" if bias else ""
    bias_add = "v += bias[col];" if bias else ""
    bias_w = ", torch::Tensor bias" if bias else ""
    bias_p = ", bias.contiguous().data_ptr<float>()" if bias else ""
    return HEADER + f"""
#define TILE {tile}
__global__ void k_{tag}(const float* __restrict__ A, const float* __restrict__ B,
                        float* __restrict__ C{bias_arg}, int M, int N, int K,
                        int64_t sam, int64_t sak, int64_t sbk, int64_t sbn,
                        int64_t sa_b, int64_t sb_b{params}) {{
    __shared__ float As[TILE][TILE + 1];
    __shared__ float Bs[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    int64_t ao = (int64_t)blockIdx.z * sa_b, bo = (int64_t)blockIdx.z * sb_b;
    float acc = 0.f;
    for (int t = 0; t < {kloop}; ++t) {{
        int ka = t * TILE + threadIdx.x, kb = t * TILE + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? A[ao + (int64_t)row * sam + (int64_t)ka * sak] : 0.f;
        Bs[threadIdx.y][threadIdx.x] = (col < N && kb < K) ? {bload} : 0.f;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }}
    if (row < M && col < N) {{
        float v = acc;
        {bias_add}
        C[(int64_t)blockIdx.z * M * N + (int64_t)row * N + col] = {epilogue};
    }}
}}
torch::Tensor run_{tag}(torch::Tensor A, torch::Tensor B{bias_w}, bool ta, bool tb{wparams}) {{
    bool batched = A.dim() == 3;
    int64_t nb = batched ? A.size(0) : 1;
    int d = batched ? 1 : 0;
    int64_t M = ta ? A.size(d + 1) : A.size(d), K = ta ? A.size(d) : A.size(d + 1);
    int64_t N = tb ? B.size(d) : B.size(d + 1);
    auto Ac = A.contiguous(); auto Bc = B.contiguous();
    int64_t sam = ta ? 1 : K, sak = ta ? M : 1;
    int64_t sbk = tb ? 1 : N, sbn = tb ? K : 1;
    auto C = batched ? torch::empty({{nb, M, N}}, A.options()) : torch::empty({{M, N}}, A.options());
    dim3 block(TILE, TILE), grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE, nb);
    k_{tag}<<<grid, block>>>(Ac.data_ptr<float>(), Bc.data_ptr<float>(), C.data_ptr<float>(){bias_p},
        (int)M, (int)N, (int)K, sam, sak, sbk, sbn, M * K, K * N{wargs});
    return C;
}}
"""


def matvec(tag: str, bug: str = "") -> str:
    """y = A @ x for a (M, K) A and (K, 1) x: one warp per row, float4 loads, shuffle sum."""
    final = "if (lane == 0) y[row] = s;" if bug != "wrong" else "y[row] = s;"
    lanes = "16" if bug == "wrong" else "32"
    return HEADER + f"""
__global__ void k_{tag}(const float* __restrict__ A, const float* __restrict__ x,
                        float* __restrict__ y, int64_t M, int64_t K) {{
    int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x & 31;
    if (row >= M) return;
    const float4* a4 = reinterpret_cast<const float4*>(A + row * K);
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float s = 0.f;
    for (int64_t i = lane; i < K / 4; i += 32) {{
        float4 a = a4[i], b = x4[i];
        s += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
    }}
    for (int64_t i = (K / 4) * 4 + lane; i < K; i += 32) s += A[row * K + i] * x[i];
    for (int o = {lanes} / 2; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffff, s, o);
    {final}
}}
torch::Tensor run_{tag}(torch::Tensor A, torch::Tensor x) {{
    auto Ac = A.contiguous(); auto xc = x.contiguous();
    int64_t M = Ac.size(0), K = Ac.size(1);
    auto y = torch::empty({{M, 1}}, A.options());
    k_{tag}<<<(M * 32 + 255) / 256, 256>>>(Ac.data_ptr<float>(), xc.data_ptr<float>(), y.data_ptr<float>(), M, K);
    return y;
}}
"""
