"""Softmax and log-softmax over one dim, numerically safe with the online (max, sum) recurrence.

One pass keeps a running maximum m and a running sum s of exp(x - m), rescaling s whenever m
grows, so the row is read twice (stats, then output) instead of three times, and exp never
overflows. Partial (m, s) pairs from different threads merge with the same rescaling rule.
CUDA variants: one block per row (block reduce of (m, s) with warp shuffles), one warp per row
(no shared memory, good for short rows) and one thread per column when the dim is not last.
"""

from __future__ import annotations

from pipeline.candidates.templates.analysis import Node, NoTemplate
from pipeline.candidates.templates.elementwise import element_function, group_operands
from pipeline.candidates.templates.program import Builder, acc_type, ctype
from pipeline.candidates.templates.reduction import layout
from pipeline.candidates.templates.tidy import cpu_inline

_MERGE = """
HD void NAME_merge(NAME_acc& m, NAME_acc& s, NAME_acc om, NAME_acc os) {
    // Merge two online-softmax states; an empty state has m = -inf and s = 0.
    const NAME_acc nm = m > om ? m : om;
    if (nm == -INFINITY) { m = nm; s = 0; return; }
    s = s * EXP(m - nm) + os * EXP(om - nm);
    m = nm;
}
"""


def lower_softmax(b: Builder, node: Node) -> None:
    """Emit the softmax / log-softmax kernel for `node` (aten._softmax / _log_softmax)."""
    log = node.base in ("_log_softmax", "log_softmax")
    lse = node.base == "logsumexp"
    safe = node.base == "_safe_softmax"
    x = node.named.get("self") or node.named.get("input")
    xm = b.meta(x)
    shape = xm["shape"]
    dim = node.a("dim")
    if isinstance(dim, list) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int):
        raise NoTemplate(f"{node.target} without an integer dim")
    outer, r, inner = layout(shape, [dim])
    k = f"sm{len(b.kernels)}"
    chain = b.prologues.get(x["node"]) if isinstance(x, dict) else None
    pro = ""
    if chain is not None:  # the chain's input is read and the chain applied on each load
        x = group_operands(b, chain)[0]
        xm = b.meta(x)
        pro = cpu_inline(element_function(b, chain, [x], acc_type(xm["dtype"]), f"{k}_pro"))
    xin = b.contiguous(x)
    in_t, out_t = ctype(xm["dtype"]), ctype(node.dtype)
    acc = acc_type(xm["dtype"])
    f = "f" if acc == "float" else ""

    def load(e: str) -> str:
        return f"{k}_pro(({k}_acc){e})" if pro else f"({k}_acc){e}"
    merge = _MERGE.replace("NAME", k).replace("EXP", f"exp{f}")
    final = (f"(({k}_acc)base[r * inner] - m - log{f}(s))" if log
             else f"(exp{f}(({k}_acc)base[r * inner] - m) / s)")
    if safe:  # rows that are entirely -inf give 0, not NaN
        final = f"(m == -INFINITY ? ({k}_acc)0 : {final})"
    mode = "column" if inner > 1 else ("warp" if b.variant % 2 == 1 and r <= 4096 else "block")
    threads = 256
    common = f"typedef {acc} {k}_acc;\n" + merge
    if b.cuda and mode == "block":
        body = f"""
__global__ void {k}_kernel(const {in_t}* __restrict__ in, {out_t}* __restrict__ out,
                           int64_t rows, int64_t R) {{
    __shared__ {k}_acc sm[32], ss[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {{
        const {in_t}* base = in + row * R;
        const int64_t inner = 1;
        {k}_acc m = -INFINITY, s = 0;
        for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {{
            {k}_merge(m, s, ({k}_acc)base[r], 1);
        }}
        for (int off = 16; off > 0; off >>= 1) {{
            {k}_merge(m, s, __shfl_xor_sync(0xffffffffu, m, off),
                      __shfl_xor_sync(0xffffffffu, s, off));
        }}
        if (lane == 0) {{ sm[warp] = m; ss[warp] = s; }}
        __syncthreads();
        const int nw = (blockDim.x + 31) >> 5;
        m = lane < nw ? sm[lane] : -INFINITY;
        s = lane < nw ? ss[lane] : 0;
        for (int off = 16; off > 0; off >>= 1) {{
            {k}_merge(m, s, __shfl_xor_sync(0xffffffffu, m, off),
                      __shfl_xor_sync(0xffffffffu, s, off));
        }}
        // Every warp now holds the row's (m, s); write the outputs.
        WRITE_BLOCK
        __syncthreads();
    }}
}}
"""
        launch = (f"{k}_kernel<<<(unsigned int)std::min<int64_t>(outer, 65535), {threads}, 0, "
                  f"KS_STREAM>>>(({'const ' + in_t}*)x.data_ptr(), ({out_t}*)out.data_ptr(), "
                  "outer, R);")
        how = (f"one {threads}-thread block per row: each thread folds its strided share of the "
               "row into an online (max, sum) state, the states merge across the warp with "
               "__shfl_xor_sync and across warps through shared memory, then the row is written")
    elif b.cuda and mode == "warp":
        body = f"""
__global__ void {k}_kernel(const {in_t}* __restrict__ in, {out_t}* __restrict__ out,
                           int64_t rows, int64_t R) {{
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); row < rows;
         row += warps) {{
        const {in_t}* base = in + row * R;
        const int64_t inner = 1;
        {k}_acc m = -INFINITY, s = 0;
        for (int64_t r = lane; r < R; r += 32) {k}_merge(m, s, ({k}_acc)base[r], 1);
        for (int off = 16; off > 0; off >>= 1) {{
            {k}_merge(m, s, __shfl_xor_sync(0xffffffffu, m, off),
                      __shfl_xor_sync(0xffffffffu, s, off));
        }}
        WRITE_WARP
    }}
}}
"""
        launch = (f"{k}_kernel<<<ks_blocks(outer * 32, {threads}), {threads}, 0, KS_STREAM>>>"
                  f"((const {in_t}*)x.data_ptr(), ({out_t}*)out.data_ptr(), outer, R);")
        how = ("one warp per row (8 rows per 256-thread block): lanes fold strided elements into "
               "online (max, sum) states that merge with __shfl_xor_sync, no shared memory")
    elif b.cuda:
        body = f"""
__global__ void {k}_kernel(const {in_t}* __restrict__ in, {out_t}* __restrict__ out,
                           int64_t outer, int64_t R, int64_t inner) {{
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < outer * inner;
         o += (int64_t)gridDim.x * blockDim.x) {{
        const int64_t off = (o / inner) * R * inner + (o % inner);
        const {in_t}* base = in + off;
        {k}_acc m = -INFINITY, s = 0;
        for (int64_t r = 0; r < R; ++r) {k}_merge(m, s, ({k}_acc)base[r * inner], 1);
        WRITE_COL
    }}
}}
"""
        launch = (f"{k}_kernel<<<ks_blocks(outer * inner, {threads}), {threads}, 0, KS_STREAM>>>"
                  f"((const {in_t}*)x.data_ptr(), ({out_t}*)out.data_ptr(), outer, R, inner);")
        how = ("one thread per (outer, inner) column; neighbouring threads read neighbouring "
               "columns so every step of the online loop is coalesced")
    lse_val = f"({out_t})(m == -INFINITY ? m : m + log{f}(s))"
    writes = {
        "WRITE_BLOCK": (f"if (threadIdx.x == 0) out[row] = {lse_val};" if lse else
                        f"for (int64_t r = threadIdx.x; r < R; r += blockDim.x) "
                        f"out[row * R + r] = ({out_t})({final});"),
        "WRITE_WARP": (f"if (lane == 0) out[row] = {lse_val};" if lse else
                       f"for (int64_t r = lane; r < R; r += 32) "
                       f"out[row * R + r] = ({out_t})({final});"),
        "WRITE_COL": (f"out[o] = {lse_val};" if lse else
                      f"for (int64_t r = 0; r < R; ++r) out[off + r * inner] = ({out_t})({final});"),
    }
    col_write = writes["WRITE_COL"]
    if b.cuda:
        for key, text in writes.items():
            body = body.replace(key, text)
    if b.cuda:
        src = common + body + f"""
void NAME(torch::Tensor x, torch::Tensor out, int64_t outer, int64_t R, int64_t inner) {{
    {launch}
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}}
"""
    elif b.simd and inner == 1 and not lse:
        # three vectorised passes over a contiguous row: the max; exp(x - max) written out and
        # summed (softmax: each exp computed once); then the row scaled (or, log-softmax,
        # x - max - log(sum) written)
        second = (f"s += exp{f}({load('row[r]')} - m);" if log else
                  f"{{ const {k}_acc e = exp{f}({load('row[r]')} - m); dst[r] = ({out_t})e; "
                  f"s += e; }}")
        value = "(v - m - ls)" if log else f"(({k}_acc)dst[r] * inv)"
        if safe:
            value = f"(m == -INFINITY ? ({k}_acc)0 : {value})"
        scale = (f"const {k}_acc ls = log{f}(s);" if log else f"const {k}_acc inv = ({k}_acc)1 / s;")
        read = f"const {k}_acc v = {load('row[r]')};\n            " if log else ""
        src = f"typedef {acc} {k}_acc;\n" + pro + f"""
void NAME(torch::Tensor x, torch::Tensor out_, int64_t outer, int64_t R, int64_t /*inner*/) {{
    const {in_t}* __restrict__ in = (const {in_t}*)x.data_ptr();
    {out_t}* __restrict__ out = ({out_t}*)out_.data_ptr();
    #pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {{
        const {in_t}* __restrict__ row = in + o * R;
        {out_t}* __restrict__ dst = out + o * R;
        {k}_acc m = -INFINITY, s = 0;
        #pragma omp simd reduction(max:m)
        for (int64_t r = 0; r < R; ++r) {{ const {k}_acc v = {load('row[r]')}; m = v > m ? v : m; }}
        #pragma omp simd reduction(+:s)
        for (int64_t r = 0; r < R; ++r) {second}
        {scale}
        #pragma omp simd
        for (int64_t r = 0; r < R; ++r) {{
            {read}dst[r] = ({out_t})({value});
        }}
    }}
}}
"""
        how = ("an OpenMP loop over rows, each three vectorised (`omp simd`) passes over its "
               "contiguous row: the max, exp(x - max) written and summed, then the "
               + ("write of x - max - log(sum)" if log else "scaling by 1 / sum"))
    elif b.simd and inner > 1 and not lse:
        # softmax over a middle dim: the `inner` contiguous columns of one outer index are
        # processed side by side, so every pass is a vectorised loop along inner
        second = (f"s[i] += exp{f}(v - m[i]);" if log else
                  f"{{ const {k}_acc e = exp{f}(v - m[i]); dst[r * inner + i] = ({out_t})e; "
                  f"s[i] += e; }}")
        value = ("(v - m[i] - s[i])" if log else f"(({k}_acc)dst[r * inner + i] * s[i])")
        if safe:
            value = f"(m[i] == -INFINITY ? ({k}_acc)0 : {value})"
        fin = f"s[i] = log{f}(s[i]);" if log else f"s[i] = ({k}_acc)1 / s[i];"
        read = (f"const {k}_acc v = {load('base[r * inner + i]')};\n                    "
                if log else "")
        src = f"typedef {acc} {k}_acc;\n" + pro + f"""
void NAME(torch::Tensor x, torch::Tensor out_, int64_t outer, int64_t R, int64_t inner) {{
    const {in_t}* __restrict__ in = (const {in_t}*)x.data_ptr();
    {out_t}* __restrict__ out = ({out_t}*)out_.data_ptr();
    #pragma omp parallel
    {{
        std::vector<{k}_acc> mv(inner), sv(inner);
        {k}_acc* __restrict__ m = mv.data();
        {k}_acc* __restrict__ s = sv.data();
        #pragma omp for schedule(static)
        for (int64_t o = 0; o < outer; ++o) {{
            const {in_t}* __restrict__ base = in + o * R * inner;
            {out_t}* __restrict__ dst = out + o * R * inner;
            #pragma omp simd
            for (int64_t i = 0; i < inner; ++i) {{ m[i] = -INFINITY; s[i] = 0; }}
            for (int64_t r = 0; r < R; ++r) {{
                #pragma omp simd
                for (int64_t i = 0; i < inner; ++i) {{
                    const {k}_acc v = {load('base[r * inner + i]')};
                    m[i] = v > m[i] ? v : m[i];
                }}
            }}
            for (int64_t r = 0; r < R; ++r) {{
                #pragma omp simd
                for (int64_t i = 0; i < inner; ++i) {{
                    const {k}_acc v = {load('base[r * inner + i]')};
                    {second}
                }}
            }}
            #pragma omp simd
            for (int64_t i = 0; i < inner; ++i) {fin}
            for (int64_t r = 0; r < R; ++r) {{
                #pragma omp simd
                for (int64_t i = 0; i < inner; ++i) {{
                    {read}dst[r * inner + i] = ({out_t})({value});
                }}
            }}
        }}
    }}
}}
"""
        how = ("an OpenMP loop over the outer index; its `inner` contiguous columns are reduced "
               "side by side in three vectorised (`omp simd`) passes along inner: the column "
               "maxima, exp(x - max) written and summed, then the "
               + ("write of x - max - log(sum)" if log else "scaling by 1 / sum"))
    else:
        src = common + f"""
void NAME(torch::Tensor x, torch::Tensor out_, int64_t outer, int64_t R, int64_t inner) {{
    const {in_t}* __restrict__ in = (const {in_t}*)x.data_ptr();
    {out_t}* __restrict__ out = ({out_t}*)out_.data_ptr();
    #pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer * inner; ++o) {{
        const int64_t off = (o / inner) * R * inner + (o % inner);
        const {in_t}* base = in + off;
        {k}_acc m = -INFINITY, s = 0;
        for (int64_t r = 0; r < R; ++r) {k}_merge(m, s, ({k}_acc)base[r * inner], 1);
        {col_write}
    }}
}}
"""
        how = "an OpenMP loop over rows, each doing the online pass then the write pass"
    if pro and pro not in src:
        raise NoTemplate(f"{node.target}: this softmax form cannot apply the fused elementwise "
                         "chain before it")
    decl = "void NAME(torch::Tensor x, torch::Tensor out, int64_t outer, int64_t R, int64_t inner)"
    what = "Logsumexp" if lse else ("Log-softmax" if log else "Softmax")
    fused = (f"; the elementwise {', '.join(m.target.removeprefix('aten.') for m in chain)} "
             "before it is applied to each element as it is read (no pass of its own)"
             if chain is not None else "")
    note = (f"{what} over dim {dim} of {shape} "
            f"(rows={outer * inner}, length {r}) with {how}{fused}.")
    name = b.add_kernel("softmax", k, src, decl, note)
    out = b.alloc(node.shape, node.dtype)
    b.call(name, xin, out, str(outer), str(r), str(inner))
    b.env[node.name] = out
    b.params.setdefault("softmax", []).append({"mode": mode if b.cuda else "cpu", "log": log})


LOWERINGS = {"_softmax": lower_softmax, "_safe_softmax": lower_softmax,
             "logsumexp": lower_softmax, "_log_softmax": lower_softmax,
             "softmax": lower_softmax, "log_softmax": lower_softmax}
