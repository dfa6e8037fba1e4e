"""Inclusive scans along a dim: cumsum, cumprod, logcumsumexp and cummax's values.

The input is viewed as (outer, R, inner). CUDA variants: one thread per line (sequential, the
right choice when inner is large since neighbouring threads read neighbouring columns), or for
rows (inner == 1) one block per row scanning blockDim-sized tiles: a warp-level Hillis-Steele
scan with __shfl_up_sync, a scan of the warp totals, and a carry from tile to tile.
CPU simd strategies, rows (inner == 1): a scan is a chain of dependent adds (or multiplies), one
per element, so a row scanned alone waits out the operation's latency at every step; eight rows
scanned side by side keep eight independent chains in flight (each row still read and written
in order), which is where the time goes at these sizes.
"""

from __future__ import annotations

from pipeline.candidates.templates.analysis import Node, NoTemplate
from pipeline.candidates.templates.program import Builder, acc_type, ctype
from pipeline.candidates.templates.reduction import layout

_ROWS = r"""
__global__ void K_kernel(const IN_T* __restrict__ in, OUT_T* __restrict__ out, int64_t rows,
                         int64_t R) {
    __shared__ ACC wtot[32];
    __shared__ ACC carry_s;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        ACC carry = IDENT;
        for (int64_t base = 0; base < R; base += blockDim.x) {
            const int64_t r = base + threadIdx.x;
            ACC v = r < R ? (ACC)in[row * R + r] : (ACC)IDENT;
            for (int off = 1; off < 32; off <<= 1) {  // inclusive scan inside the warp
                const ACC nb = __shfl_up_sync(0xffffffffu, v, off);
                if (lane >= off) v = OPER(nb, v);
            }
            if (lane == 31) wtot[warp] = v;
            __syncthreads();
            if (warp == 0) {  // scan of the warp totals
                ACC t = lane < nw ? wtot[lane] : (ACC)IDENT;
                for (int off = 1; off < 32; off <<= 1) {
                    const ACC nb = __shfl_up_sync(0xffffffffu, t, off);
                    if (lane >= off) t = OPER(nb, t);
                }
                if (lane < nw) wtot[lane] = t;
            }
            __syncthreads();
            if (warp > 0) v = OPER(wtot[warp - 1], v);
            v = OPER(carry, v);
            if (r < R) out[row * R + r] = (OUT_T)v;
            if (threadIdx.x == blockDim.x - 1) carry_s = v;  // running total for the next tile
            __syncthreads();
            carry = carry_s;
            __syncthreads();
        }
    }
}
"""

_LINES = r"""
__global__ void K_kernel(const IN_T* __restrict__ in, OUT_T* __restrict__ out, int64_t outer,
                         int64_t R, int64_t inner) {
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < outer * inner;
         o += (int64_t)gridDim.x * blockDim.x) {
        const int64_t off = (o / inner) * R * inner + (o % inner);
        ACC v = IDENT;
        for (int64_t r = 0; r < R; ++r) {
            v = OPER(v, (ACC)in[off + r * inner]);
            out[off + r * inner] = (OUT_T)v;
        }
    }
}
"""

_CPU = r"""
void NAME(torch::Tensor x, torch::Tensor out_, int64_t outer, int64_t R, int64_t inner) {
    const IN_T* __restrict__ in = (const IN_T*)x.data_ptr();
    OUT_T* __restrict__ out = (OUT_T*)out_.data_ptr();
    #pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer * inner; ++o) {
        const int64_t off = (o / inner) * R * inner + (o % inner);
        double v = IDENT;
        for (int64_t r = 0; r < R; ++r) {
            v = OPER(v, (double)in[off + r * inner]);
            out[off + r * inner] = (OUT_T)v;
        }
    }
}
"""


# eight rows side by side: eight independent dependency chains (CPU simd, rows contiguous)
_CPU_ROWS = r"""
void NAME(torch::Tensor x, torch::Tensor out_, int64_t outer, int64_t R, int64_t /*inner*/) {
    const IN_T* __restrict__ in = (const IN_T*)x.data_ptr();
    OUT_T* __restrict__ out = (OUT_T*)out_.data_ptr();
    const int64_t groups = (outer + 7) / 8;  // groups of eight rows, the last one shorter
    #pragma omp parallel for schedule(static) if (outer * R > (1 << 18))
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t first = g * 8, n = std::min<int64_t>(8, outer - first);
        const IN_T* __restrict__ src = in + first * R;
        OUT_T* __restrict__ dst = out + first * R;
        double v[8];
        for (int r = 0; r < 8; ++r) v[r] = IDENT;
        if (n == 8) {
            for (int64_t j = 0; j < R; ++j) {
                #pragma GCC unroll 8
                for (int r = 0; r < 8; ++r) {
                    v[r] = OPER(v[r], (double)src[r * R + j]);
                    dst[r * R + j] = STORE(v[r]);
                }
            }
        } else {
            for (int64_t j = 0; j < R; ++j) {
                for (int64_t r = 0; r < n; ++r) {
                    v[r] = OPER(v[r], (double)src[r * R + j]);
                    dst[r * R + j] = STORE(v[r]);
                }
            }
        }
    }
}
"""


def lower_scan(b: Builder, node: Node) -> None:
    """Emit a cumsum / cumprod / logcumsumexp kernel, or cummax's values."""
    kind = node.base.removesuffix("_")
    x = node.named["self"]
    xm = b.meta(x)
    shape = xm["shape"]
    if kind == "cummax":
        if xm["dtype"] not in ("float32", "float64"):
            raise NoTemplate("cummax of a non-float tensor")
        live = {n.name for n in b.graph.live_nodes()}
        used = {b.node(u).args[1] for u in node.users
                if u in live and b.node(u).target == "getitem"}
        if used != {0}:
            raise NoTemplate("cummax's indices are used (only its values are templated)")
    dim = node.a("dim")
    if not isinstance(dim, int):
        raise NoTemplate(f"{node.target} without an integer dim")
    outer, r, inner = layout(shape, [dim]) if shape else (1, 1, 1)
    xin = b.contiguous(x)
    dtype = xm["dtype"] if kind == "cummax" else node.dtype
    in_t, out_t = ctype(xm["dtype"]), ctype(dtype)
    acc = acc_type(xm["dtype"], dtype)
    k = f"scan{len(b.kernels)}"
    oper, ident = {
        "cumsum": ("((a) + (b))", "0"), "cumprod": ("((a) * (b))", "1"),
        # log(exp(a) + exp(b)) without overflow; -inf is the identity.
        "logcumsumexp": ("((a) == -INFINITY ? (b) : ((b) == -INFINITY ? (a) : (((a) > (b) ? (a) "
                         ": (b)) + log1p(exp(-fabs((a) - (b)))))))", "(-INFINITY)"),
        # a NaN, once seen, stays the running value (as torch's cummax)
        "cummax": ("(((b) != (b) || (b) > (a)) && (a) == (a) ? (b) : (a))", "(-INFINITY)"),
    }[kind]
    # a product decays through fp32's subnormal range, where each store would take a
    # microcode assist; values under FLT_MIN are written as zero (off by < 1.2e-38)
    store = (f"({out_t})(fabs(x) < FLT_MIN ? 0.0 : (x))" if kind == "cumprod"
             and out_t == "float" else f"({out_t})(x)")
    rows = b.cuda and inner == 1 and b.variant % 2 == 0
    threads = 256
    if b.cuda:
        body = _ROWS if rows else _LINES
        grid = ("(unsigned int)std::min<int64_t>(outer, 65535)" if rows
                else f"ks_blocks(outer * inner, {threads})")
        args = "outer, R" if rows else "outer, R, inner"
        src = body + f"""
void NAME(torch::Tensor x, torch::Tensor out, int64_t outer, int64_t R, int64_t inner) {{
    K_kernel<<<{grid}, {threads}, 0, KS_STREAM>>>((const IN_T*)x.data_ptr(),
                                                   (OUT_T*)out.data_ptr(), {args});
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}}
"""
        how = ("one 256-thread block per row scanning 256-element tiles (warp shuffles-up scan, "
               "a scan of the warp totals, a carry between tiles)" if rows else
               "one thread per line walking the dim sequentially (coalesced across lines)")
    elif b.simd and inner == 1 and kind != "logcumsumexp":
        src = f"#define {k}_ST(x) {store}\n" + _CPU_ROWS.replace("STORE", f"{k}_ST")
        how = ("eight rows scanned side by side (eight independent running values in double, "
               "each row read and written in order), OpenMP over groups of rows when large")
    else:
        src = _CPU
        how = "an OpenMP loop over lines with a double running value"
    src = (f"#define {k}_OP(a, b) {oper}\n" + src.replace("OPER", f"{k}_OP")
           .replace("K_", f"{k}_").replace("IN_T", in_t).replace("OUT_T", out_t)
           .replace("ACC", acc).replace("IDENT", ident))
    note = (f"{kind} over dim {dim} of {shape} ({outer * inner} lines of length {r}) with {how}.")
    name = b.add_kernel("scan", k, src, "void NAME(torch::Tensor x, torch::Tensor out, "
                        "int64_t outer, int64_t R, int64_t inner)", note)
    out = b.alloc(shape if kind == "cummax" else node.shape, dtype)
    b.call(name, xin, out, str(outer), str(r), str(inner))
    if kind == "cummax":
        b.tuples[node.name] = {0: out}
    else:
        b.env[node.name] = out
    b.params.setdefault("scan", []).append({"kind": kind, "block_per_row": rows})


LOWERINGS = {"cumsum": lower_scan, "cumprod": lower_scan, "logcumsumexp": lower_scan,
             "cummax": lower_scan}
