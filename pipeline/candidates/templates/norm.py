"""Normalisations: layer norm, group norm, batch norm (batch statistics or running statistics).

All three are "statistics per group, then an affine elementwise pass". Group g's j-th element
lives at `(j / S) * T + g * S + (j % S)`: layer norm (S = row length, one chunk), group norm
(S = C/G * HW) and batch norm (S = HW, chunks of stride T = C * HW over the batch) share one
statistics kernel: one block per group, a mean pass and a centred variance pass (two passes are
exact where E[x^2] - E[x]^2 cancels), block-reduced with warp shuffles. The apply kernel is a
grid-stride loop that finds each element's group and channel by division. Batch norm follows the
module's mode at run time (`self.training`), as the reference does.
"""

from __future__ import annotations

from pipeline.candidates.templates.analysis import Node, NoTemplate
from pipeline.candidates.templates.program import Builder, acc_type, ctype, numel

_STATS_CUDA = r"""
typedef ACC K_acc;
__device__ __forceinline__ K_acc K_block_sum(K_acc v, K_acc* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? shared[lane] : (K_acc)0;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    __syncthreads();  // shared is reused by the next call
    return v;  // every thread holds the block total
}

// Calls f on this thread's share of group g's L values. Whole chunks of S contiguous values
// are walked chunk by chunk: no 64-bit division per element (tens of instructions each on a
// GPU); short chunks (S < 32, e.g. batch norm of (N, C)) would idle most threads that way.
template <class F>
__device__ __forceinline__ void K_visit(const IN_T* __restrict__ x, int64_t g, int64_t L,
                                        int64_t S, int64_t T, F f) {
    if (S >= 32 && L % S == 0) {
        for (int64_t c = 0; c < L / S; ++c) {
            const IN_T* __restrict__ xc = x + c * T + g * S;
            for (int64_t j = threadIdx.x; j < S; j += blockDim.x) f((K_acc)xc[j]);
        }
    } else {
        for (int64_t j = threadIdx.x; j < L; j += blockDim.x)
            f((K_acc)x[(j / S) * T + g * S + (j % S)]);
    }
}

__global__ void K_stats(const IN_T* __restrict__ x, float* __restrict__ mean,
                        float* __restrict__ rstd, int64_t groups, int64_t L, int64_t S,
                        int64_t T, double eps) {
    __shared__ K_acc shared[32];
    for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
        K_acc s = 0;
        K_visit(x, g, L, S, T, [&](K_acc v) { s += v; });
        const K_acc mu = K_block_sum(s, shared) / (K_acc)L;
        K_acc q = 0;
        K_visit(x, g, L, S, T, [&](K_acc v) { q += (v - mu) * (v - mu); });
        const K_acc var = K_block_sum(q, shared) / (K_acc)L;
        if (threadIdx.x == 0) {
            mean[g] = (float)mu;
            rstd[g] = (float)(1.0 / sqrt((double)var + eps));
        }
    }
}

__global__ void K_running(const float* __restrict__ rm, const float* __restrict__ rv,
                          float* __restrict__ mean, float* __restrict__ rstd, int64_t groups,
                          double eps) {
    const int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (g < groups) { mean[g] = rm[g]; rstd[g] = (float)(1.0 / sqrt((double)rv[g] + eps)); }
}

__global__ void K_apply(const IN_T* __restrict__ x, const W_T* __restrict__ w,
                        const W_T* __restrict__ b, const float* __restrict__ mean,
                        const float* __restrict__ rstd, OUT_T* __restrict__ out, int64_t n,
                        int64_t gdiv, int64_t gmod, int64_t cdiv, int64_t cmod) {
    // 32-bit division is a few times cheaper; every operand must fit
    const bool narrow = (n | gdiv | gmod | cdiv | cmod) <= (int64_t)UINT32_MAX;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t g = narrow ? (int64_t)(((uint32_t)e / (uint32_t)gdiv) % (uint32_t)gmod)
                                 : (e / gdiv) % gmod;
        const int64_t c = narrow ? (int64_t)(((uint32_t)e / (uint32_t)cdiv) % (uint32_t)cmod)
                                 : (e / cdiv) % cmod;
        float y = ((float)x[e] - mean[g]) * rstd[g];
        if (w) y = y * (float)w[c];
        if (b) y = y + (float)b[c];
        out[e] = (OUT_T)y;
    }
}

void NAME(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor rm, torch::Tensor rv,
          torch::Tensor out, torch::Tensor mean, torch::Tensor rstd, bool batch_stats,
          int64_t groups, int64_t L, int64_t S, int64_t T, double eps, int64_t gdiv, int64_t gmod,
          int64_t cdiv, int64_t cmod, bool has_w, bool has_b) {
    if (batch_stats) {
        K_stats<<<(unsigned int)std::min<int64_t>(groups, 65535), THREADS, 0, KS_STREAM>>>(
            (const IN_T*)x.data_ptr(), (float*)mean.data_ptr(), (float*)rstd.data_ptr(), groups,
            L, S, T, eps);
    } else {
        K_running<<<ks_blocks(groups, 256), 256, 0, KS_STREAM>>>(
            (const float*)rm.data_ptr(), (const float*)rv.data_ptr(), (float*)mean.data_ptr(),
            (float*)rstd.data_ptr(), groups, eps);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int64_t n = x.numel();
    K_apply<<<ks_blocks(n, 256), 256, 0, KS_STREAM>>>(
        (const IN_T*)x.data_ptr(), has_w ? (const W_T*)w.data_ptr() : nullptr,
        has_b ? (const W_T*)b.data_ptr() : nullptr, (const float*)mean.data_ptr(),
        (const float*)rstd.data_ptr(), (OUT_T*)out.data_ptr(), n, gdiv, gmod, cdiv, cmod);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

_STATS_CPU = r"""
void NAME(torch::Tensor x_, torch::Tensor w_, torch::Tensor b_, torch::Tensor rm_,
          torch::Tensor rv_, torch::Tensor out_, torch::Tensor mean_, torch::Tensor rstd_,
          bool batch_stats, int64_t groups, int64_t L, int64_t S, int64_t T, double eps,
          int64_t gdiv, int64_t gmod, int64_t cdiv, int64_t cmod, bool has_w, bool has_b) {
    const IN_T* __restrict__ x = (const IN_T*)x_.data_ptr();
    float* __restrict__ mean = (float*)mean_.data_ptr();
    float* __restrict__ rstd = (float*)rstd_.data_ptr();
    #pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
        if (!batch_stats) {
            mean[g] = ((const float*)rm_.data_ptr())[g];
            rstd[g] = (float)(1.0 / std::sqrt((double)((const float*)rv_.data_ptr())[g] + eps));
            continue;
        }
        double s = 0, q = 0;
        for (int64_t j = 0; j < L; ++j) s += (double)x[(j / S) * T + g * S + (j % S)];
        const double mu = s / (double)L;
        for (int64_t j = 0; j < L; ++j) {
            const double d = (double)x[(j / S) * T + g * S + (j % S)] - mu;
            q += d * d;
        }
        mean[g] = (float)mu;
        rstd[g] = (float)(1.0 / std::sqrt(q / (double)L + eps));
    }
    const W_T* w = has_w ? (const W_T*)w_.data_ptr() : nullptr;
    const W_T* b = has_b ? (const W_T*)b_.data_ptr() : nullptr;
    OUT_T* __restrict__ out = (OUT_T*)out_.data_ptr();
    const int64_t n = x_.numel();
    #pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < n; ++e) {
        const int64_t g = (e / gdiv) % gmod, c = (e / cdiv) % cmod;
        float y = ((float)x[e] - mean[g]) * rstd[g];
        if (w) y = y * (float)w[c];
        if (b) y = y + (float)b[c];
        out[e] = (OUT_T)y;
    }
}
"""

_FUSED_CPU = r"""
void NAME(torch::Tensor x_, torch::Tensor w_, torch::Tensor b_, torch::Tensor rm_,
          torch::Tensor rv_, torch::Tensor out_, torch::Tensor mean_, torch::Tensor rstd_,
          bool batch_stats, int64_t groups, int64_t L, int64_t S, int64_t T, double eps,
          int64_t /*gdiv*/, int64_t /*gmod*/, int64_t cdiv, int64_t cmod, bool has_w,
          bool has_b) {
    const IN_T* __restrict__ x = (const IN_T*)x_.data_ptr();
    const W_T* w = has_w ? (const W_T*)w_.data_ptr() : nullptr;
    const W_T* b = has_b ? (const W_T*)b_.data_ptr() : nullptr;
    OUT_T* __restrict__ out = (OUT_T*)out_.data_ptr();
    float* __restrict__ mean = (float*)mean_.data_ptr();
    float* __restrict__ rstd = (float*)rstd_.data_ptr();
    const int64_t runs = L / S;  // a group is `runs` contiguous runs of S elements, T apart
    #pragma omp parallel for schedule(static) if (groups * L > GRAIN)
    for (int64_t g = 0; g < groups; ++g) {
        double mu, rs;
        if (batch_stats) {
            double s = 0;
            for (int64_t o = 0; o < runs; ++o) {
                const IN_T* __restrict__ p = x + o * T + g * S;
                ACC part = 0;
                #pragma omp simd reduction(+:part)
                for (int64_t j = 0; j < S; ++j) part += (ACC)p[j];
                s += part;
            }
            mu = s / (double)L;
            const ACC m = (ACC)mu;
            double q = 0;
            for (int64_t o = 0; o < runs; ++o) {
                const IN_T* __restrict__ p = x + o * T + g * S;
                ACC part = 0;
                #pragma omp simd reduction(+:part)
                for (int64_t j = 0; j < S; ++j) { const ACC d = (ACC)p[j] - m; part += d * d; }
                q += part;
            }
            rs = 1.0 / std::sqrt(q / (double)L + eps);
        } else {
            mu = ((const float*)rm_.data_ptr())[g];
            rs = 1.0 / std::sqrt((double)((const float*)rv_.data_ptr())[g] + eps);
        }
        mean[g] = (float)mu;
        rstd[g] = (float)rs;
        // the apply pass runs while the group is still in cache: y = x * scale + shift
        const float fm = (float)mu, fr = (float)rs;
        for (int64_t o = 0; o < runs; ++o) {
            const int64_t base = o * T + g * S;
            const IN_T* __restrict__ p = x + base;
            OUT_T* __restrict__ y = out + base;
            if (cdiv == 1) {  // layer norm: the weight index is the position in the row
                #pragma omp simd
                for (int64_t j = 0; j < S; ++j) {
                    float v = ((float)p[j] - fm) * fr;
                    if (w) v = v * (float)w[j];
                    if (b) v = v + (float)b[j];
                    y[j] = (OUT_T)v;
                }
                continue;
            }
            for (int64_t j0 = 0; j0 < S; j0 += cdiv) {  // one channel per run of cdiv elements
                const int64_t c = ((base + j0) / cdiv) % cmod;
                const float sc = fr * (w ? (float)w[c] : 1.f);
                const float sh = (b ? (float)b[c] : 0.f) - fm * sc;
                const int64_t j1 = std::min<int64_t>(S, j0 + cdiv);
                #pragma omp simd
                for (int64_t j = j0; j < j1; ++j) y[j] = (OUT_T)((float)p[j] * sc + sh);
            }
        }
    }
}
"""

_DECL = ("void NAME(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor rm, "
         "torch::Tensor rv, torch::Tensor out, torch::Tensor mean, torch::Tensor rstd, "
         "bool batch_stats, int64_t groups, int64_t L, int64_t S, int64_t T, double eps, "
         "int64_t gdiv, int64_t gmod, int64_t cdiv, int64_t cmod, bool has_w, bool has_b)")


def _opt(b: Builder, node: Node, name: str, fallback: str) -> tuple[str, bool, dict | None]:
    v = node.named.get(name)
    if isinstance(v, dict) and "node" in v:
        return b.contiguous(v), True, b.meta(v)
    return fallback, False, None


def lower_norm(b: Builder, node: Node) -> None:
    """Layer / group / batch norm: statistics kernel + apply kernel in one host function."""
    base = node.base
    x = node.named.get("input") or node.named.get("self")
    xm = b.meta(x)
    shape = xm["shape"]
    xin = b.contiguous(x)
    n = numel(shape)
    eps = float(node.a("eps", 1e-5))
    if base == "native_layer_norm":
        d = numel(node.a("normalized_shape"))
        groups, length, s, t = n // d, d, d, 0
        gdiv, gmod, cdiv, cmod = d, groups, 1, d
        kind, batch = "layer norm", "True"
    elif base == "native_group_norm":
        nb, c, hw, g = node.a("N"), node.a("C"), node.a("HxW"), node.a("group")
        groups, length = nb * g, (c // g) * hw
        s, t = length, 0
        gdiv, gmod, cdiv, cmod = length, groups, hw, c
        kind, batch = "group norm", "True"
    else:
        if len(shape) < 2:
            raise NoTemplate("batch norm over a 1-d input")
        nb, c = shape[0], shape[1]
        hw = numel(shape[2:])
        groups, length, s, t = c, nb * hw, hw, c * hw
        gdiv, gmod, cdiv, cmod = hw, c, hw, c
        kind = "batch norm"
        has_running = isinstance(node.named.get("running_mean"), dict)
        training = node.a("training", False) if base != "_native_batch_norm_legit_no_training" \
            else False
        if training and has_running:
            batch = "self.training"
        else:
            batch = "True" if training or not has_running else "False"
    w, has_w, wm = _opt(b, node, "weight", xin)
    bb, has_b, _ = _opt(b, node, "bias", xin)
    rm, _, rmm = _opt(b, node, "running_mean", xin)
    rv, _, _ = _opt(b, node, "running_var", xin)
    if rmm is not None and rmm["dtype"] != "float32":
        raise NoTemplate("batch norm running stats that are not fp32")
    out_meta = node.meta[0] if isinstance(node.meta, list) else node.meta
    in_t, out_t = ctype(xm["dtype"]), ctype(out_meta["dtype"])
    w_t = ctype(wm["dtype"]) if wm else in_t
    k = f"nrm{len(b.kernels)}"
    threads = (256, 512, 128)[b.variant % 3]
    fused = b.simd and s > 0 and length % s == 0 and (s == cmod if cdiv == 1 else s % cdiv == 0)
    # tuning: the least work (elements) worth a parallel region, written as a shift
    grain = "(1 << 15)" if b.cpu_strategy == "simd" else "(1 << 17)"
    tpl = _STATS_CUDA if b.cuda else (_FUSED_CPU.replace("GRAIN", grain) if fused
                                      else _STATS_CPU)
    src = (tpl.replace("K_", f"{k}_").replace("ACC", acc_type(xm["dtype"]))
           .replace("IN_T", in_t).replace("OUT_T", out_t).replace("W_T", w_t)
           .replace("THREADS", str(threads)))
    note = (f"{kind.capitalize()} of {shape}: {groups} statistic groups of {length} elements "
            + (f"(one {threads}-thread block per group computes mean then centred variance with "
               "warp-shuffle block sums), then a grid-stride apply pass"
               if b.cuda else "(OpenMP over groups, walked as contiguous runs with vectorised "
               "(`omp simd`) sums for the mean and the centred variance; the group is then "
               "normalised while it is still in cache, as x * scale + shift per channel)"
               if fused else "(OpenMP over groups, double accumulators), then an OpenMP apply"
               " pass") + f"; eps={eps:g}.")
    name = b.add_kernel("norm", k, src, _DECL, note)
    out = b.alloc(out_meta["shape"], out_meta["dtype"])
    mean = b.alloc([groups], "float32")
    rstd = b.alloc([groups], "float32")
    b.call(name, xin, w, bb, rm, rv, out, mean, rstd, batch, str(groups), str(length), str(s),
           str(t), repr(eps), str(gdiv), str(gmod), str(cdiv), str(cmod), str(has_w), str(has_b))
    b.tuples[node.name] = {0: out}  # saved mean/rstd outputs are not reproduced
    b.params.setdefault("norm", []).append({"kind": kind, "threads": threads, "fused": fused})


LOWERINGS = {k: lower_norm for k in (
    "native_layer_norm", "native_group_norm", "native_batch_norm", "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional")}
