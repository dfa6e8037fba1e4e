"""Direct convolution (1-D, 2-D, 3-D; groups, stride, padding, dilation) and transposed convolution.

Every case is handled as 3-D (missing spatial dims have size 1), so one kernel covers standard,
depthwise, pointwise, dilated and asymmetric convolutions. The per-output dot product is one `HD`
function shared by the CUDA kernel and the CPU loop. Transposed convolution gathers instead of
scattering: an output position takes input `(o + pad - k * dil) / stride` when that divides
exactly, so no atomics are needed. CUDA variants: one thread per output (grid-stride), or one
block column per (batch, out-channel) with that channel's filter cached in shared memory; fp32
convolutions with >= 16 out-channels per group also run as an implicit GEMM (conv_gemm.py).
"""

from __future__ import annotations

import re
import textwrap

from pipeline.candidates.templates import conv_gemm, epilogue
from pipeline.candidates.templates.analysis import Node, NoTemplate
from pipeline.candidates.templates.program import Builder, ctype, numel

_GEOM = r"""
struct K_Geom {
    int64_t N, Ci, Co, Di, Hi, Wi, Do, Ho, Wo, Kd, Kh, Kw;
    int64_t sd, sh, sw, pd, ph, pw, dd, dh, dw, groups;
};

// One output element: o = ((((n * Co + co) * Do + od) * Ho + oh) * Wo + ow).
HD float K_point(const X_T* __restrict__ x, const W_T* __restrict__ w, const K_Geom& g,
                 int64_t o, const W_T* __restrict__ wsh) {
    int64_t t = o;
    const int64_t ow = t % g.Wo; t /= g.Wo;
    const int64_t oh = t % g.Ho; t /= g.Ho;
    const int64_t od = t % g.Do; t /= g.Do;
    const int64_t co = t % g.Co; const int64_t n = t / g.Co;
    const int64_t cig = g.Ci / g.groups, cog = g.Co / g.groups, grp = co / cog;
    float acc = 0.f;
    for (int64_t ci = 0; ci < cig; ++ci) {
        const X_T* xc = x + ((n * g.Ci + grp * cig + ci) * g.Di) * g.Hi * g.Wi;
        for (int64_t kd = 0; kd < g.Kd; ++kd) {
#if TRANSPOSED
            const int64_t td = od + g.pd - kd * g.dd;
            if (td < 0 || td % g.sd) continue;
            const int64_t id = td / g.sd;
#else
            const int64_t id = od * g.sd - g.pd + kd * g.dd;
#endif
            if (id < 0 || id >= g.Di) continue;
            for (int64_t kh = 0; kh < g.Kh; ++kh) {
#if TRANSPOSED
                const int64_t th = oh + g.ph - kh * g.dh;
                if (th < 0 || th % g.sh) continue;
                const int64_t ih = th / g.sh;
#else
                const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
#endif
                if (ih < 0 || ih >= g.Hi) continue;
                for (int64_t kw = 0; kw < g.Kw; ++kw) {
#if TRANSPOSED
                    const int64_t tw = ow + g.pw - kw * g.dw;
                    if (tw < 0 || tw % g.sw) continue;
                    const int64_t iw = tw / g.sw;
#else
                    const int64_t iw = ow * g.sw - g.pw + kw * g.dw;
#endif
                    if (iw < 0 || iw >= g.Wi) continue;
#if TRANSPOSED
                    const int64_t widx = ((((grp * cig + ci) * cog + (co % cog)) * g.Kd + kd)
                                          * g.Kh + kh) * g.Kw + kw;
#else
                    const int64_t widx = wsh ? ((ci * g.Kd + kd) * g.Kh + kh) * g.Kw + kw
                                             : (((co * cig + ci) * g.Kd + kd) * g.Kh + kh)
                                               * g.Kw + kw;
#endif
                    const W_T wv = wsh ? wsh[widx] : w[widx];
                    acc += (float)xc[(id * g.Hi + ih) * g.Wi + iw] * (float)wv;
                }
            }
        }
    }
    return acc;
}
"""

_CUDA_THREAD = r"""
__global__ void K_kernel(const X_T* __restrict__ x, const W_T* __restrict__ w,
                         const W_T* __restrict__ bias, X_T* __restrict__ out, K_Geom g,
                         int64_t total) {
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < total;
         o += (int64_t)gridDim.x * blockDim.x) {
        float v = K_point(x, w, g, o, nullptr);
        if (bias) v += (float)bias[(o / (g.Do * g.Ho * g.Wo)) % g.Co];
        out[o] = (X_T)v;
    }
}
"""

_CUDA_SHARED = r"""
// grid = (spatial blocks, Co, N): the block's filter slice (Ci/groups * Kd*Kh*Kw values) is
// loaded to shared memory once and reused by every output position of the block.
__global__ void K_kernel(const X_T* __restrict__ x, const W_T* __restrict__ w,
                         const W_T* __restrict__ bias, X_T* __restrict__ out, K_Geom g,
                         int64_t total) {
    extern __shared__ unsigned char K_smem[];
    W_T* wsh = reinterpret_cast<W_T*>(K_smem);
    const int64_t co = blockIdx.y, n = blockIdx.z;
    const int64_t per = (g.Ci / g.groups) * g.Kd * g.Kh * g.Kw;
    for (int64_t e = threadIdx.x; e < per; e += blockDim.x) wsh[e] = w[co * per + e];
    __syncthreads();
    const int64_t spatial = g.Do * g.Ho * g.Wo;
    const int64_t s = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (s < spatial) {
        const int64_t o = (n * g.Co + co) * spatial + s;
        float v = K_point(x, w, g, o, wsh);
        if (bias) v += (float)bias[co];
        out[o] = (X_T)v;
    }
}
"""

_CUDA_HOST = r"""
void NAME(torch::Tensor x, torch::Tensor w, torch::Tensor bias, torch::Tensor out, bool has_bias,
          std::vector<int64_t> d) {
    K_Geom g{d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12],
             d[13], d[14], d[15], d[16], d[17], d[18], d[19], d[20], d[21]};
    const int64_t total = out.numel();
    @LAUNCH@
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

_CPU_HOST = r"""
void NAME(torch::Tensor x, torch::Tensor w, torch::Tensor bias, torch::Tensor out, bool has_bias,
          std::vector<int64_t> d) {
    K_Geom g{d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12],
             d[13], d[14], d[15], d[16], d[17], d[18], d[19], d[20], d[21]};
    const X_T* xp = (const X_T*)x.data_ptr();
    const W_T* wp = (const W_T*)w.data_ptr();
    const W_T* bp = has_bias ? (const W_T*)bias.data_ptr() : nullptr;
    X_T* op = (X_T*)out.data_ptr();
    const int64_t total = out.numel(), spatial = g.Do * g.Ho * g.Wo;
    #pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < total; ++o) {
        float v = K_point(xp, wp, g, o, nullptr);
        if (bp) v += (float)bp[(o / spatial) % g.Co];
        op[o] = (X_T)v;
    }
}
"""

_DECL = ("void NAME(torch::Tensor x, torch::Tensor w, torch::Tensor bias, torch::Tensor out, "
         "bool has_bias, std::vector<int64_t> d)")


def _pad3(vals: list[int], fill: int) -> list[int]:
    return [fill] * (3 - len(vals)) + list(vals)


def lower_conv(b: Builder, node: Node) -> None:
    """Emit a direct (or transposed) convolution kernel for aten.convolution."""
    x_ref, w_ref = node.named["input"], node.named["weight"]
    bias = node.named.get("bias")
    xm, wm = b.meta(x_ref), b.meta(w_ref)
    transposed = bool(node.a("transposed"))
    nsp = len(xm["shape"]) - 2
    if nsp < 1 or nsp > 3:
        raise NoTemplate(f"convolution with {nsp} spatial dims")
    out_shape = node.shape
    n, ci = xm["shape"][:2]
    co = out_shape[1]
    di, hi, wi = _pad3(xm["shape"][2:], 1)
    do, ho, wo = _pad3(out_shape[2:], 1)
    kd, kh, kw = _pad3(wm["shape"][2:], 1)
    sd, sh, sw = _pad3(node.a("stride"), 1)
    pd, ph, pw = _pad3(node.a("padding"), 0)
    dd, dh, dw = _pad3(node.a("dilation"), 1)
    groups = node.a("groups", 1)
    geom = [n, ci, co, di, hi, wi, do, ho, wo, kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw,
            groups]
    xin, win = b.contiguous(x_ref), b.contiguous(w_ref)
    has_bias = isinstance(bias, dict) and "node" in bias
    bvar = b.contiguous(bias) if has_bias else win
    x_t, w_t = ctype(xm["dtype"]), ctype(wm["dtype"])
    if node.dtype != xm["dtype"]:
        raise NoTemplate("convolution output dtype differs from its input")
    k = f"conv{len(b.kernels)}"
    per = (ci // groups) * kd * kh * kw
    smem_bytes = per * (4 if wm["dtype"] == "float32" else 8)
    use_shared = (b.cuda and not transposed and b.variant % 2 == 1 and smem_bytes <= 32768)
    threads = (256, 128, 256, 512)[b.variant % 4]
    geom_src = "#define TRANSPOSED " + ("1" if transposed else "0") + _GEOM + "#undef TRANSPOSED\n"
    fast = b.cuda and conv_gemm.choose(b.variant, (xm["dtype"], wm["dtype"]), transposed,
                                       co // groups, numel(out_shape))
    if fast:
        src, igemm_how, igemm_name = conv_gemm.template(*fast)
        use_shared = False
    elif b.cuda:
        if use_shared:
            launch = (f"dim3 grid((unsigned int)((g.Do * g.Ho * g.Wo + {threads - 1}) / {threads}),"
                      f" (unsigned int)g.Co, (unsigned int)g.N);\n    K_kernel<<<grid, {threads}, "
                      f"{smem_bytes}, KS_STREAM>>>((const X_T*)x.data_ptr(), "
                      "(const W_T*)w.data_ptr(), has_bias ? (const W_T*)bias.data_ptr() : nullptr,"
                      " (X_T*)out.data_ptr(), g, total);")
            kern = _CUDA_SHARED
        else:
            launch = (f"K_kernel<<<ks_blocks(total, {threads}), {threads}, 0, KS_STREAM>>>("
                      "(const X_T*)x.data_ptr(), (const W_T*)w.data_ptr(), "
                      "has_bias ? (const W_T*)bias.data_ptr() : nullptr, (X_T*)out.data_ptr(), g, "
                      "total);")
            kern = _CUDA_THREAD
        src = geom_src + kern + _CUDA_HOST.replace("@LAUNCH@", launch)
    else:
        src = geom_src + _CPU_HOST
    src = src.replace("K_", f"{k}_").replace("X_T", x_t).replace("W_T", w_t).replace("C_T", x_t)
    src, fused_root, fused_note = epilogue.apply(b, node, src, k)
    names = "N, Ci, Co, Di, Hi, Wi, Do, Ho, Wo, Kd, Kh, Kw, stride d/h/w, padding d/h/w, " \
            "dilation d/h/w, groups"
    if "g.N" not in src and not fast:  # only the shared-filter launch reads the batch: no field for it
        src = src.replace("int64_t N, Ci,", "int64_t Ci,")
        geom, names = geom[1:], names.removeprefix("N, ")
        init = textwrap.fill(", ".join(f"d[{i}]" for i in range(len(geom))), width=84,
                             subsequent_indent="        ")
        src = re.sub(r"(_Geom g\{)[^}]*\}", lambda m: m.group(1) + init + "}", src)
    kind = "transposed convolution" if transposed else "convolution"
    extra = []
    if groups > 1:
        extra.append(f"groups={groups}" + (" (depthwise)" if groups == ci else ""))
    if any(s > 1 for s in (sd, sh, sw)):
        extra.append(f"stride={node.a('stride')}")
    if any(p for p in (pd, ph, pw)):
        extra.append(f"padding={node.a('padding')}")
    if any(d > 1 for d in (dd, dh, dw)):
        extra.append(f"dilation={node.a('dilation')}")
    how = ("one thread per output with the filter slice of its (batch, out-channel) block cached "
           "in shared memory" if use_shared else
           (f"one thread per output element in a {threads}-thread grid-stride loop" if b.cuda
            else "an OpenMP loop over output elements"))
    if fast:
        how = igemm_how
    note = (f"{nsp}-D {kind} {xm['shape']} * {wm['shape']} -> {out_shape}"
            f"{' (' + ', '.join(extra) + ')' if extra else ''}: "
            f"{'computed' if fast else 'direct computation'}, "
            + ("each output gathers the inputs whose stride-aligned positions reach it (no "
               "atomics); " if transposed else "")
            + f"{how}; fp32 accumulation over {per} products per output{fused_note}.")
    name = b.add_kernel("conv_transpose" if transposed else "conv", k, src, _DECL, note)
    out = b.alloc(out_shape, node.dtype)
    b.emit("# geometry: " + names)
    b.call(name, xin, win, bvar, out, str(has_bias), repr(geom))
    b.env[node.name] = out
    if fused_root:
        b.env[fused_root] = out
    b.params.setdefault("conv", []).append({"transposed": transposed, "shared_filter": use_shared,
                                            "threads": threads, "products": per,
                                            "igemm": igemm_name if fast else "",
                                            "outputs": numel(out_shape)})


LOWERINGS = {"convolution": lower_conv}
