"""Inclusive scans along a dim: cumsum and cumprod.

The input is viewed as (outer, R, inner). CUDA variants: one thread per line (sequential, the
right choice when inner is large since neighbouring threads read neighbouring columns), or for
rows (inner == 1) one block per row scanning blockDim-sized tiles: a warp-level Hillis-Steele
scan with __shfl_up_sync, a scan of the warp totals, and a carry from tile to tile.
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


def lower_scan(b: Builder, node: Node) -> None:
    """Emit a cumsum / cumprod kernel."""
    kind = node.base.removesuffix("_")
    x = node.named["self"]
    xm = b.meta(x)
    shape = xm["shape"]
    dim = node.a("dim")
    if not isinstance(dim, int):
        raise NoTemplate(f"{node.target} without an integer dim")
    outer, r, inner = layout(shape, [dim]) if shape else (1, 1, 1)
    xin = b.contiguous(x)
    in_t, out_t = ctype(xm["dtype"]), ctype(node.dtype)
    acc = acc_type(xm["dtype"], node.dtype)
    k = f"scan{len(b.kernels)}"
    oper, ident = {
        "cumsum": ("((a) + (b))", "0"), "cumprod": ("((a) * (b))", "1"),
        # log(exp(a) + exp(b)) without overflow; -inf is the identity.
        "logcumsumexp": ("((a) == -INFINITY ? (b) : ((b) == -INFINITY ? (a) : (((a) > (b) ? (a) "
                         ": (b)) + log1p(exp(-fabs((a) - (b)))))))", "(-INFINITY)"),
    }[kind]
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
    else:
        src = _CPU
        how = "an OpenMP loop over lines with a double running value"
    src = (f"#define {k}_OP(a, b) {oper}\n" + src.replace("OPER", f"{k}_OP")
           .replace("K_", f"{k}_").replace("IN_T", in_t).replace("OUT_T", out_t)
           .replace("ACC", acc).replace("IDENT", ident))
    note = (f"{kind} over dim {dim} of {shape} ({outer * inner} lines of length {r}) with {how}.")
    name = b.add_kernel("scan", k, src, "void NAME(torch::Tensor x, torch::Tensor out, "
                        "int64_t outer, int64_t R, int64_t inner)", note)
    out = b.alloc(node.shape, node.dtype)
    b.call(name, xin, out, str(outer), str(r), str(inner))
    b.env[node.name] = out
    b.params.setdefault("scan", []).append({"kind": kind, "block_per_row": rows})


LOWERINGS = {"cumsum": lower_scan, "cumprod": lower_scan, "logcumsumexp": lower_scan}
