"""Reductions over a contiguous range of dims: sum, mean, prod, max/min (+indices), argmax/argmin,
vector norms.

The input is viewed as (outer, R, inner). CUDA: either one block per output (threads stride over
R, then warp shuffles and a shared-memory pass combine the partials; best when inner == 1) or one
thread per output (adjacent threads read adjacent `inner` elements, so loads coalesce; best when
inner is large). Arg-reductions carry (value, index) pairs and break ties by the lower index, as
PyTorch returns the first occurrence. CPU: an OpenMP loop over outputs with a double accumulator.
A reduction over the axis a module keeps (`self.dim`) whose result is the task's output derives
(outer, R, inner) and the output shape from `self.dim` in forward, so it follows another axis.
"""

from __future__ import annotations

import math

from pipeline.candidates.templates import reduction_split
from pipeline.candidates.templates.analysis import Node, NoTemplate, refs
from pipeline.candidates.templates.program import Builder, acc_type, ctype, numel
from pipeline.candidates.templates.symbolic import Dim, Scalar
from verifier.judge.variants import AXIS_ARG


def layout(shape: list[int], dims: list[int]) -> tuple[int, int, int]:
    """(outer, R, inner) for reducing `dims` of a contiguous tensor; dims must be adjacent."""
    nd = len(shape)
    if nd == 0:
        return 1, 1, 1
    ds = sorted({d % nd for d in dims}) if dims else list(range(nd))
    if ds != list(range(ds[0], ds[-1] + 1)):
        raise NoTemplate(f"reduction over non-adjacent dims {dims} of shape {shape}")
    return (math.prod(shape[:ds[0]]), math.prod(shape[ds[0]:ds[-1] + 1]),
            math.prod(shape[ds[-1] + 1:]))


def _spec(node: Node) -> tuple[str, list[int] | None, float]:
    """(kind, dims or None for all, p) for a reduction node."""
    base, ov = node.base, node.overload
    if ov in ("other", "binary_out", "dim_max", "dim_min"):
        raise NoTemplate(f"{node.target} is not a plain reduction")
    dim = node.a("dim")
    dims = None if dim is None or dim == [] else ([dim] if isinstance(dim, int) else list(dim))
    if base in ("sum", "mean", "prod", "amax", "amin"):
        kind = {"amax": "max", "amin": "min"}.get(base, base)
        return kind, dims, 0.0
    if base in ("max", "min"):
        return (base + "_idx" if ov == "dim" else base), dims, 0.0
    if base in ("argmax", "argmin"):
        return base, dims, 0.0
    if base == "linalg_vector_norm":
        p = node.a("ord", 2)
        return "norm", dims, float(p["float"]) if isinstance(p, dict) else float(p)
    if base == "norm":
        p = node.a("p", 2)
        p = 2.0 if p is None else (float(p["float"]) if isinstance(p, dict) else float(p))
        return "norm", dims, p
    raise NoTemplate(f"reduction {node.target} is not supported")


def _ops(kind: str, p: float, acc: str) -> tuple[str, str, str, str]:
    """(init, map x -> m, combine into (v, vi) from (ov, oi), finalize v) C snippets."""
    inf = "INFINITY"
    better_max = "(ov > v || (ov == v && oi < vi))"
    better_min = "(ov < v || (ov == v && oi < vi))"
    if kind in ("sum", "mean"):
        return "0", "x", "v += ov;", "v / (acc_t)R" if kind == "mean" else "v"
    if kind == "prod":
        return "1", "x", "v *= ov;", "v"
    if kind in ("max", "min"):  # values only: no index to break ties with
        return (f"-{inf}" if kind == "max" else inf), "x", \
            f"if (ov {'>' if kind == 'max' else '<'} v) v = ov;", "v"
    if kind in ("max_idx", "argmax"):
        return f"-{inf}", "x", f"if {better_max} {{ v = ov; vi = oi; }}", "v"
    if kind in ("min_idx", "argmin"):
        return inf, "x", f"if {better_min} {{ v = ov; vi = oi; }}", "v"
    if kind == "norm":
        f = "f" if acc == "float" else ""
        if math.isinf(p) and p > 0:
            return "0", f"fabs{f}(x)", "if (ov > v) v = ov;", "v"
        if p == 1:
            return "0", f"fabs{f}(x)", "v += ov;", "v"
        if p == 2:
            return "0", "x * x", "v += ov;", f"sqrt{f}(v)"
        if p == 0:
            return "0", "(x != 0 ? (acc_t)1 : (acc_t)0)", "v += ov;", "v"
        return "0", f"pow{f}(fabs{f}(x), (acc_t){p!r})", "v += ov;", f"pow{f}(v, (acc_t){1 / p!r})"
    raise NoTemplate(f"reduction kind {kind}")


def _drop_index(src: str, kname: str, mapx: str) -> str:
    """The kernel text without the running index a sum/mean/norm never reads (the shared text
    carries one for argmax/argmin)."""
    for a, b in ((f"HD void {kname}_combine(acc_t& v, int64_t& vi, acc_t ov, int64_t oi)",
                  f"HD void {kname}_combine(acc_t& v, acc_t ov)"),
                 (f"{kname}_combine(v, vi, {mapx}, r);", f"{kname}_combine(v, {mapx});"),
                 (f"{kname}_combine(v, vi, ov, oi);", f"{kname}_combine(v, ov);"),
                 (" int64_t vi = INT64_MAX;", ""),
                 ("{ sv[warp] = v; si[warp] = vi; }", "sv[warp] = v;")):
        src = src.replace(a, b)
    drop = ("const int64_t oi = __shfl_down_sync", "__shared__ int64_t si[32];",
            "vi = lane < nw ? si[lane] : INT64_MAX;")
    return "\n".join(ln for ln in src.splitlines() if not any(d in ln for d in drop)) + "\n"


# combine steps an `omp simd reduction` clause can express, and its operator
SIMD_COMBINE = {"v += ov;": "+", "v *= ov;": "*", "if (ov > v) v = ov;": "max",
                "if (ov < v) v = ov;": "min"}


def _cpu_simd(in_t: str, out_ptr: str, init: str, mapx: str, comb: str, store: str,
              inner: int, acc: str) -> tuple[str, str]:
    """CPU text of a value-only reduction with vectorised loops: a contiguous axis
    (inner == 1) is one `omp simd reduction` per output; otherwise each outer slice keeps a row
    of `inner` accumulators and adds the R rows into it with contiguous simd loops."""
    op = SIMD_COMBINE[comb]
    step = {"+": "v += m;", "*": "v *= m;", "max": "v = m > v ? m : v;",
            "min": "v = m < v ? m : v;"}[op]
    inner_arg = "/*inner*/" if inner == 1 else "inner"  # a contiguous axis never reads it
    head = f"""
typedef {acc} acc_t;

void NAME(torch::Tensor x, torch::Tensor out_, torch::Tensor,
          int64_t outer, int64_t R, int64_t {inner_arg}) {{
    const {in_t}* __restrict__ in = (const {in_t}*)x.data_ptr();
    {out_ptr}
"""
    if inner == 1:
        body = f"""    #pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {{
        const {in_t}* __restrict__ base = in + o * R;
        acc_t v = {init};
        #pragma omp simd reduction({op}:v)
        for (int64_t r = 0; r < R; ++r) {{
            const acc_t x = (acc_t)base[r];
            const acc_t m = {mapx};
            {step}
        }}
        {store}
    }}
}}
"""
        how = (f"an OpenMP loop over the outputs, each a vectorised `omp simd reduction({op})` "
               f"over its contiguous R elements in {acc}")
    else:
        body = f"""    #pragma omp parallel
    {{
        std::vector<acc_t> row(inner);
        #pragma omp for schedule(static)
        for (int64_t oo = 0; oo < outer; ++oo) {{
            std::fill(row.begin(), row.end(), (acc_t)({init}));
            for (int64_t r = 0; r < R; ++r) {{
                const {in_t}* __restrict__ src = in + (oo * R + r) * inner;
                #pragma omp simd
                for (int64_t j = 0; j < inner; ++j) {{
                    const acc_t x = (acc_t)src[j];
                    const acc_t m = {mapx};
                    acc_t v = row[j];
                    {step}
                    row[j] = v;
                }}
            }}
            for (int64_t j = 0; j < inner; ++j) {{
                const int64_t o = oo * inner + j;
                const acc_t v = row[j];
                {store}
            }}
        }}
    }}
}}
"""
        how = (f"an OpenMP loop over the outer slices, each adding its R contiguous rows of "
               f"`inner` elements into a row of {acc} accumulators with vectorised (`omp simd`) "
               "loops, so no load strides across the reduced axis")
    return head + body, how


def axis_attr(b: Builder, node: Node, dims: list[int] | None, nd: int) -> str | None:
    """The module attribute (`self.dim`) holding the one reduced axis, when the reduction's
    values are the task's outputs (nothing after it was traced at that axis's layout)."""
    if dims is None or len(dims) != 1:
        return None
    found = [path for path, v in b.graph.int_attrs.items()
             if AXIS_ARG.fullmatch(path.rsplit(".", 1)[-1]) and -nd <= v < nd
             and v % nd == dims[0] % nd]
    outs = set(refs(b.graph.outputs()))
    for user in node.users:
        u = b.graph.by_name.get(user)
        if u is None or user in outs or u.op == "output":
            continue
        if "getitem" in str(u.target) and (user in outs or not u.users):
            continue  # one half of (values, indices): an output, or unused
        return None
    return found[0] if len(found) == 1 else None


def lower_reduction(b: Builder, node: Node) -> None:
    """Emit one reduction kernel for `node` (values and, for arg-kinds, indices)."""
    kind, dims, p = _spec(node)
    x = node.named["self"]
    xm = b.meta(x)
    shape = xm["shape"]
    outer, r, inner = layout(shape, dims or [])
    if dims is None:
        outer, r, inner = 1, numel(shape), 1
    axis = axis_attr(b, node, dims, len(shape))
    rtxt = "R" if axis else r
    xin = b.contiguous(x)
    metas = node.meta if isinstance(node.meta, list) else [node.meta]
    has_val = kind not in ("argmax", "argmin")
    has_idx = kind in ("max_idx", "min_idx", "argmax", "argmin")
    out_meta = metas[0]
    idx_meta = metas[1] if kind in ("max_idx", "min_idx") else (metas[0] if has_idx else None)
    in_t = ctype(xm["dtype"])
    # CPU sums accumulate in double; the fast-math strategy (a tuning choice) keeps fp32 lanes,
    # twice as many per vector, whose many partial sums keep the error within fp32 tolerance
    wide = kind == "prod" or (kind in ("sum", "mean", "norm") and b.cpu_strategy != "simd_fastmath")
    acc = "double" if not b.cuda and wide else acc_type(xm["dtype"])
    out_t = ctype(out_meta["dtype"]) if has_val else "float"
    init, mapx, comb, fin = _ops(kind, p, acc)
    nout = outer * inner
    split = b.cuda and reduction_split.wanted(nout, r, has_idx)
    block_mode = b.cuda and (inner == 1 or nout < 2048 or b.variant % 3 == 2 or split)
    threads = (256, 512, 128)[b.variant % 3] if block_mode else (256, 128, 512)[b.variant % 3]
    kname = f"red{len(b.kernels)}"
    combine_fn = f"""
typedef {acc} acc_t;
HD void {kname}_combine(acc_t& v, int64_t& vi, acc_t ov, int64_t oi) {{
    {comb}
}}
"""
    val_store = f"out[o] = ({out_t})(({fin}));" if has_val else ""
    idx_store = "idx[o] = vi;" if has_idx else ""
    store = " ".join(x for x in (val_store, idx_store) if x)
    out_param = ", ".join([f"{out_t}* __restrict__ out"] * has_val
                          + ["int64_t* __restrict__ idx"] * has_idx)
    src_ptr = f"const {in_t}* base = in + (o / inner) * R * inner + (o % inner);"
    if split:
        body, how = reduction_split.source(kname, in_t, out_t, init, mapx, fin, src_ptr, threads)
    elif b.cuda and block_mode:
        body = f"""
__global__ void {kname}_kernel(const {in_t}* __restrict__ in, {out_param},
                              int64_t outer, int64_t R, int64_t inner) {{
    __shared__ acc_t sv[32];
    __shared__ int64_t si[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t o = blockIdx.x; o < outer * inner; o += gridDim.x) {{
        {src_ptr}
        acc_t v = {init}; int64_t vi = INT64_MAX;
        for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {{
            const acc_t x = (acc_t)base[r * inner];
            {kname}_combine(v, vi, {mapx}, r);
        }}
        // Warp-level tree with shuffles, then one partial per warp through shared memory.
        for (int off = 16; off > 0; off >>= 1) {{
            const acc_t ov = __shfl_down_sync(0xffffffffu, v, off);
            const int64_t oi = __shfl_down_sync(0xffffffffu, vi, off);
            {kname}_combine(v, vi, ov, oi);
        }}
        if (lane == 0) {{ sv[warp] = v; si[warp] = vi; }}
        __syncthreads();
        if (warp == 0) {{
            const int nw = (blockDim.x + 31) >> 5;
            v = lane < nw ? sv[lane] : (acc_t)({init});
            vi = lane < nw ? si[lane] : INT64_MAX;
            for (int off = 16; off > 0; off >>= 1) {{
                const acc_t ov = __shfl_down_sync(0xffffffffu, v, off);
                const int64_t oi = __shfl_down_sync(0xffffffffu, vi, off);
                {kname}_combine(v, vi, ov, oi);
            }}
            if (lane == 0) {{ {store} }}
        }}
        __syncthreads();  // shared partials are reused by the next output
    }}
}}
"""
        grid = "(unsigned int)std::min<int64_t>(outer * inner, 65535)"
        how = (f"one {threads}-thread block per output: threads stride over the {rtxt} reduced "
               "elements, then warp shuffles and a shared-memory pass combine the partials")
    elif b.cuda:
        body = f"""
__global__ void {kname}_kernel(const {in_t}* __restrict__ in, {out_param},
                              int64_t outer, int64_t R, int64_t inner) {{
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < outer * inner;
         o += (int64_t)gridDim.x * blockDim.x) {{
        {src_ptr}
        acc_t v = {init}; int64_t vi = INT64_MAX;
        for (int64_t r = 0; r < R; ++r) {{
            const acc_t x = (acc_t)base[r * inner];  // neighbouring threads: neighbouring o
            {kname}_combine(v, vi, {mapx}, r);
        }}
        {store}
    }}
}}
"""
        grid = f"ks_blocks(outer * inner, {threads})"
        how = (f"one thread per output ({threads} per block): neighbouring threads own "
               f"neighbouring inner positions, so each step of the {rtxt}-long loop is a coalesced "
               "load")
    out_ptr = "\n    ".join([f"{out_t}* __restrict__ out = ({out_t}*)out_.data_ptr();"] * has_val
                             + ["int64_t* __restrict__ idx = (int64_t*)idx_.data_ptr();"]
                             * has_idx)
    if split:
        src = combine_fn + body
    elif b.cuda:
        host = f"""
void NAME(torch::Tensor x, torch::Tensor{" out" * has_val}, torch::Tensor{" idx" * has_idx},
          int64_t outer, int64_t R, int64_t inner) {{
    {kname}_kernel<<<{grid}, {threads}, 0, KS_STREAM>>>(
        (const {in_t}*)x.data_ptr(), {", ".join(["(" + out_t + "*)out.data_ptr()"] * has_val
                                               + ["(int64_t*)idx.data_ptr()"] * has_idx)},
        outer, R, inner);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}}
"""
        src = combine_fn + body + host
    elif b.simd and not has_idx and comb in SIMD_COMBINE:
        src, how = _cpu_simd(in_t, out_ptr, init, mapx, comb, store, inner, acc)
    else:
        src = combine_fn + f"""
void NAME(torch::Tensor x, torch::Tensor{" out_" * has_val}, torch::Tensor{" idx_" * has_idx},
          int64_t outer, int64_t R, int64_t inner) {{
    const {in_t}* __restrict__ in = (const {in_t}*)x.data_ptr();
    {out_ptr}
    #pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer * inner; ++o) {{
        {src_ptr}
        acc_t v = {init}; int64_t vi = INT64_MAX;
        for (int64_t r = 0; r < R; ++r) {{
            const acc_t x = (acc_t)base[r * inner];
            {kname}_combine(v, vi, {mapx}, r);
        }}
        {store}
    }}
}}
"""
        extreme = "max" if kind in ("max", "max_idx", "argmax") else "min"
        verb = ("multiplying its" if kind == "prod" else "summing its"
                if kind in ("sum", "mean", "norm") else f"taking the {extreme}"
                + (" and its index" if has_idx else "") + " of its")
        how = (f"an OpenMP loop over the outer * inner outputs, each {verb} R elements in {acc}"
               if axis else
               f"an OpenMP loop over the {nout} outputs, each {verb} {r} elements in {acc}")
    decl = ("void NAME(torch::Tensor x, torch::Tensor out, torch::Tensor idx, int64_t outer, "
            "int64_t R, int64_t inner)")
    note = (f"Reduction ({kind}{'' if kind != 'norm' else f' p={p:g}'}) of shape {shape} viewed "
            f"as (outer={outer}, R={r}, inner={inner}) with {how}.")
    if axis:
        note = (f"Reduction ({kind}) over axis {axis} of a contiguous tensor viewed as (outer = "
                f"the sizes before the axis multiplied, R = its size, inner = the sizes after it "
                f"multiplied; forward computes them from {axis}) with {how}.")
    if not has_idx:
        src = _drop_index(src, kname, mapx)
    src = src.replace("acc_t", f"{kname}_acc")
    name = b.add_kernel("reduction", kname, src, decl, note)
    sizes = [str(outer), str(r), str(inner)]
    if axis:
        d = b.fresh("ax")
        b.emit(f"{d} = {axis} % {xin}.dim()  # the reduced axis, read from the module")
        keep = " + (1,)" if node.a("keepdim") else ""
        oshape = f"{xin}.shape[:{d}]{keep} + {xin}.shape[{d} + 1:]"
        sizes = [f"{xin}.shape[:{d}].numel()", f"{xin}.size({d})", f"{xin}.shape[{d} + 1:].numel()"]

    def alloc(meta: dict, dtype: str) -> str:
        if not axis:
            return b.alloc(meta["shape"], dtype)
        var = b.fresh("buf")
        b.emit(f"{var} = torch.empty({oshape}, dtype=torch.{dtype}, device=dev)")
        return var

    vals = alloc(out_meta, out_meta["dtype"]) if has_val else "dev_dummy"
    idxs = alloc(idx_meta, "int64") if has_idx else None
    if not has_val:
        vals = idxs
    if idxs is None:
        idxs = vals
    b.call(name, xin, vals, idxs, *sizes)
    if kind in ("max_idx", "min_idx"):
        b.tuples[node.name] = {0: vals, 1: idxs}
    else:
        b.env[node.name] = idxs if has_idx else vals
    b.params.setdefault("reduction", []).append(
        {"kind": kind, "block_per_output": block_mode, "threads": threads, "split": split})


def lower_var(b: Builder, node: Node) -> None:
    """var / std: mean (kept dims), squared deviations, sum, scale by 1/(R - correction)."""
    from pipeline.candidates.templates import elementwise

    x = node.named["self"]
    xm = b.meta(x)
    dim = node.a("dim")
    nd = len(xm["shape"])
    dims = list(range(nd)) if dim is None or dim == [] else (
        [dim] if isinstance(dim, int) else list(dim))
    dims = [d % nd for d in dims]
    r = numel([xm["shape"][d] for d in dims])
    corr = node.a("correction")
    corr = 1.0 if corr is None else float(corr)
    if node.named.get("unbiased") is not None:
        corr = 1.0 if node.a("unbiased") else 0.0
    kshape = [1 if i in dims else s for i, s in enumerate(xm["shape"])]
    full = dict(xm, contiguous=True, offset=0, stride=elementwise._contig(xm["shape"]))
    keep = dict(full, shape=kshape, stride=elementwise._contig(kshape))

    def fake(suffix: str, target: str, named: dict, meta: dict) -> Node:
        n = Node(f"{node.name}__{suffix}", "call_function", target, [], named, meta, [])
        b.graph.by_name[n.name] = n
        return n

    mean = fake("mean", "aten.mean.dim", {"self": x, "dim": dims, "keepdim": True}, keep)
    lower_reduction(b, mean)
    d = fake("d", "aten.sub.Tensor", {"self": x, "other": {"node": mean.name}}, full)
    sq = fake("sq", "aten.pow.Tensor_Scalar", {"self": {"node": d.name}, "exponent": 2}, full)
    elementwise.lower_group(b, [d, sq])
    out_meta = dict(node.meta, contiguous=True, offset=0)
    tot = fake("sum", "aten.sum.dim_IntList", {"self": {"node": sq.name}, "dim": dims,
                                               "keepdim": bool(node.a("keepdim"))}, out_meta)
    lower_reduction(b, tot)
    scale = 1.0 / max(r - corr, 0.0) if r - corr > 0 else float("inf")
    if isinstance(r, Dim) and r - corr > 0:  # 1 / (R - correction), R read at run time
        scale = Scalar(scale, f"1.0 / ({r.expr} - {corr!r})")
    members = [fake("scale", "aten.mul.Tensor", {"self": {"node": tot.name}, "other": scale},
                    out_meta)]
    if node.base == "std":
        members.append(fake("sqrt", "aten.sqrt", {"self": {"node": members[0].name}}, out_meta))
    elementwise.lower_group(b, members)
    b.env[node.name] = b.env[members[-1].name]


LOWERINGS = {"var": lower_var, "std": lower_var}
LOWERINGS |= {k: lower_reduction for k in ("sum", "mean", "prod", "amax", "amin", "max", "min",
                                          "argmax", "argmin", "linalg_vector_norm", "norm")}
