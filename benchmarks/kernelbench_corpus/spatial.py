"""Spatial CUDA sources for the KernelBench corpus: pooling, 2-D convolution and the elementwise
tail kernels that follow a library conv or GEMM (the same forms and bugs as `kernels`)."""

from __future__ import annotations

from benchmarks.kernelbench_corpus.kernels import HEADER


def pool(tag: str, dims: int, kind: str, bug: str = "") -> str:
    """Average or max pooling over the last `dims` dims: one thread per output element."""
    loops, inb, idx = [], [], []
    names = "dhw"[3 - dims:]
    for d in names:
        loops.append(f"for (int k{d} = 0; k{d} < ks; ++k{d}) {{ int64_t i{d} = o{d} * st - pd + "
                     f"k{d} * dl;")
        inb.append(f"i{d} >= 0 && i{d} < I{d}")
        idx.append(f"i{d}")
    flat = idx[0]
    for d, name in zip(idx[1:], names[1:], strict=True):
        flat = f"({flat}) * I{name} + {d}"
    body = ("acc += x[base + " + flat + "];") if kind == "avg" else \
        ("acc = fmaxf(acc, x[base + " + flat + "]);")
    init = "0.f" if kind == "avg" else "-INFINITY"
    div = "cnt" if bug == "wrong" else "(float)total"
    fin = f"acc / {div}" if kind == "avg" else "acc"
    dims_in = ", ".join(f"int64_t I{d}" for d in names)
    dims_out = ", ".join(f"int64_t O{d}" for d in names)
    decomp = []
    rest = "t"
    for d in reversed(names):
        decomp.append(f"int64_t o{d} = {rest} % O{d}; {rest} /= O{d};")
    loop_open = " ".join(loops)
    loop_close = " }" * dims
    cnt_inc = "cnt += 1.f;" if kind == "avg" else ""
    host_in = ", ".join(f"xc.size({i + 2})" for i in range(dims))
    host_out = ", ".join(f"(xc.size({i + 2}) + 2 * pd - dl * (ks - 1) - 1) / st + 1"
                         for i in range(dims))
    return HEADER + f"""
__global__ void k_{tag}(const float* __restrict__ x, float* __restrict__ y, int64_t NC, {dims_in},
                        {dims_out}, int ks, int st, int pd, int dl) {{
    int64_t total_out = NC{"".join(f" * O{d}" for d in names)};
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < total_out;
         g += (int64_t)blockDim.x * gridDim.x) {{
        int64_t t = g;
        {" ".join(decomp)}
        int64_t nc = t;
        int64_t base = nc{"".join(f" * I{d}" for d in names)};
        float acc = {init}; float cnt = 0.f;
        int total = {" * ".join(["ks"] * dims)};
        {loop_open}
            if ({" && ".join(inb)}) {{ {body} {cnt_inc} }}
        {loop_close}
        (void)total; (void)cnt;
        y[g] = {fin};
    }}
}}
torch::Tensor run_{tag}(torch::Tensor x, int64_t ks, int64_t st, int64_t pd, int64_t dl) {{
    auto xc = x.contiguous();
    int64_t NC = xc.size(0) * xc.size(1);
    std::vector<int64_t> shape = {{xc.size(0), xc.size(1), {host_out}}};
    auto y = torch::empty(shape, xc.options());
    int64_t n = y.numel();
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 1 << 16);
    k_{tag}<<<blocks, 256>>>(xc.data_ptr<float>(), y.data_ptr<float>(), NC, {host_in},
        {", ".join(f"shape[{i + 2}]" for i in range(dims))}, (int)ks, (int)st, (int)pd, (int)dl);
    return y;
}}
"""


def conv2d(tag: str, epilogue: str = "v", nparams: int = 0, bias: bool = True,
           bug: str = "") -> str:
    """Direct NCHW conv2d (stride 1, no padding), one thread per output, bias and an epilogue."""
    params = "".join(f", float p{i}" for i in range(nparams))
    wparams = "".join(f", double p{i}" for i in range(nparams))
    wargs = "".join(f", (float)p{i}" for i in range(nparams))
    widx = "((oc * Ci + ci) * KH + kw) * KW + kh" if bug == "wrong" else \
        "((oc * Ci + ci) * KH + kh) * KW + kw"
    bias_term = "b[oc]" if bias else "0.f"
    return HEADER + f"""
__global__ void k_{tag}(const float* __restrict__ x, const float* __restrict__ w,
                        const float* __restrict__ b, const float* __restrict__ post,
                        float* __restrict__ y, int N, int Ci, int H, int W, int Co, int KH,
                        int KW, int OH, int OW{params}) {{
    int64_t total = (int64_t)N * Co * OH * OW;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < total;
         g += (int64_t)blockDim.x * gridDim.x) {{
        int ow = g % OW; int64_t t = g / OW;
        int oh = t % OH; t /= OH;
        int oc = t % Co; int n = t / Co;
        float v = {bias_term};
        for (int ci = 0; ci < Ci; ++ci)
            for (int kh = 0; kh < KH; ++kh)
                for (int kw = 0; kw < KW; ++kw)
                    v += x[(((int64_t)n * Ci + ci) * H + oh + kh) * W + ow + kw] * w[{widx}];
        y[g] = {epilogue};
    }}
}}
torch::Tensor run_{tag}(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor post{wparams}) {{
    auto xc = x.contiguous(); auto wc = w.contiguous();
    int N = xc.size(0), Ci = xc.size(1), H = xc.size(2), W = xc.size(3);
    int Co = wc.size(0), KH = wc.size(2), KW = wc.size(3);
    int OH = H - KH + 1, OW = W - KW + 1;
    auto y = torch::empty({{N, Co, OH, OW}}, xc.options());
    int64_t n = y.numel();
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 1 << 16);
    k_{tag}<<<blocks, 256>>>(xc.data_ptr<float>(), wc.data_ptr<float>(), b.contiguous().data_ptr<float>(),
        post.contiguous().data_ptr<float>(), y.data_ptr<float>(), N, Ci, H, W, Co, KH, KW, OH, OW{wargs});
    return y;
}}
"""


def epilogue_only(tag: str, expr: str, nparams: int, per_channel: int = 0) -> str:
    """An in-place epilogue over a tensor a library op produced (the level-2 'fuse the tail' form).

    per_channel > 0: `c` is the channel of element i for an (N, C, H*W) layout of that size.
    """
    params = "".join(f", float p{i}" for i in range(nparams))
    wparams = "".join(f", double p{i}" for i in range(nparams))
    wargs = "".join(f", (float)p{i}" for i in range(nparams))
    return HEADER + f"""
__global__ void k_{tag}(float* __restrict__ y, const float* __restrict__ bias, int64_t n,
                        int64_t inner, int64_t channels{params}) {{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)blockDim.x * gridDim.x) {{
        int64_t c = (i / inner) % channels;
        float v = y[i];
        (void)c;
        y[i] = {expr};
    }}
}}
torch::Tensor run_{tag}(torch::Tensor y, torch::Tensor bias, int64_t inner{wparams}) {{
    int64_t n = y.numel();
    int64_t channels = bias.numel() > 0 ? bias.numel() : 1;
    int blocks = (int)std::min<int64_t>((n + 255) / 256, 1 << 16);
    k_{tag}<<<blocks, 256>>>(y.data_ptr<float>(), bias.data_ptr<float>(), n, inner, channels{wargs});
    return y;
}}
"""
