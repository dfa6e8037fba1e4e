"""Index-moving ops that need a real copy: flip, diag (vector to matrix), cat along a dim."""

from __future__ import annotations

from pipeline.candidates.templates.analysis import Node, NoTemplate
from pipeline.candidates.templates.program import Builder, ctype, numel

_GATHER_CUDA = r"""
__global__ void K_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        INDEX
    }
}
void NAME(torch::Tensor x, torch::Tensor out) {
    const int64_t n = out.numel();
    K_kernel<<<ks_blocks(n, 256), 256, 0, KS_STREAM>>>((const T*)x.data_ptr(),
                                                      (T*)out.data_ptr(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

_GATHER_CPU = r"""
void NAME(torch::Tensor x, torch::Tensor out_) {
    const T* __restrict__ in = (const T*)x.data_ptr();
    T* __restrict__ out = (T*)out_.data_ptr();
    const int64_t n = out_.numel();
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        INDEX
    }
}
"""


def _gather(b: Builder, node: Node, x_ref: dict, index_code: str, what: str) -> None:
    xm = b.meta(x_ref)
    xin = b.contiguous(x_ref)
    k = f"idx{len(b.kernels)}"
    tpl = _GATHER_CUDA if b.cuda else _GATHER_CPU
    src = tpl.replace("INDEX", index_code).replace("K_", f"{k}_").replace("T*", ctype(xm["dtype"]) + "*")
    src = src.replace("(T)", f"({ctype(xm['dtype'])})")
    note = (f"{what}: one thread per output element computes its source index (a gather, so "
            "writes stay coalesced)." if b.cuda else
            f"{what}: an OpenMP loop over output elements, each computing its source index (a "
            "gather, so the writes stream through memory in order).")
    name = b.add_kernel("shape", k, src, "void NAME(torch::Tensor x, torch::Tensor out)", note)
    out = b.alloc(node.shape, node.dtype)
    b.call(name, xin, out)
    b.env[node.name] = out


def lower_flip(b: Builder, node: Node) -> None:
    """out[i] = x[i with the flipped dims mirrored]."""
    x = node.named["self"]
    shape = b.meta(x)["shape"]
    nd = len(shape)
    dims = {d % nd for d in node.a("dims")}
    lines = ["int64_t rem = i, src = 0, mul = 1;"]
    for d in range(nd - 1, -1, -1):
        idx = f"(rem % {shape[d]})"
        if d in dims:
            idx = f"({shape[d] - 1} - (rem % {shape[d]}))"
        lines.append(f"src += {idx} * mul; rem /= {shape[d]}; mul *= {shape[d]};")
    lines.append("out[i] = in[src];")
    _gather(b, node, x, "\n        ".join(lines), f"flip of {shape} over dims {sorted(dims)}")


def lower_diag(b: Builder, node: Node) -> None:
    """diag of a vector: an n x n matrix with the vector on the diagonal."""
    x = node.named["self"]
    shape = b.meta(x)["shape"]
    if len(shape) != 1 or node.a("diagonal", 0) != 0:
        raise NoTemplate("diag of a matrix or an off-diagonal")
    n = shape[0]
    code = f"const int64_t r = i / {n}, c = i % {n};\n        out[i] = r == c ? in[r] : (T)0;"
    _gather(b, node, x, code, f"diag of a {n}-vector into a {n} x {n} matrix")


def lower_cat(b: Builder, node: Node) -> None:
    """cat along a dim: each output element reads from the input that owns its slice."""
    tensors = node.a("tensors")
    dim = node.a("dim", 0)
    out_shape = node.shape
    nd = len(out_shape)
    dim %= nd
    if len(tensors) > 4:
        raise NoTemplate("cat of more than 4 tensors")
    metas = [b.meta(t) for t in tensors]
    ins = [b.contiguous(t) for t in tensors]
    dtype = node.dtype
    t = ctype(dtype)
    inner = numel(out_shape[dim + 1:])
    total = out_shape[dim]
    k = f"cat{len(b.kernels)}"
    ptrs = ", ".join(f"const {t}* __restrict__ in{j}" for j in range(len(ins)))
    branches, start = [], 0
    for j, m in enumerate(metas):
        size = m["shape"][dim]
        branches.append(f"if (d < {start + size}) {{ out[i] = in{j}[(o * {size} + (d - {start}))"
                        f" * {inner} + r]; continue; }}")
        start += size
    body = (f"const int64_t r = i % {inner}, d = (i / {inner}) % {total}, "
            f"o = i / ({inner} * {total});\n        " + "\n        ".join(branches))
    args = ", ".join(f"(const {t}*)a{j}.data_ptr()" for j in range(len(ins)))
    hp = ", ".join(f"torch::Tensor a{j}" for j in range(len(ins)))
    decl = f"void NAME(torch::Tensor out_, {hp})"
    if b.cuda:
        src = f"""
__global__ void {k}_kernel({ptrs}, {t}* __restrict__ out, int64_t n) {{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {{
        {body}
    }}
}}
{decl} {{
    const int64_t n = out_.numel();
    {k}_kernel<<<ks_blocks(n, 256), 256, 0, KS_STREAM>>>({args}, ({t}*)out_.data_ptr(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}}
"""
    else:
        src = f"""
{decl} {{
    {" ".join(f"const {t}* in{j} = (const {t}*)a{j}.data_ptr();" for j in range(len(ins)))}
    {t}* out = ({t}*)out_.data_ptr();
    const int64_t n = out_.numel();
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {{
        {body}
    }}
}}
"""
    note = (f"cat of {len(ins)} tensors along dim {dim} into {out_shape}: each output element "
            "finds its source tensor by its coordinate on the cat dim." if len(ins) > 1 else
            f"copy into {out_shape} (the task's cat has one tensor): each output element reads "
            "the input element at its own coordinate.")
    name = b.add_kernel("shape", k, src, decl, note)
    out = b.alloc(out_shape, dtype)
    b.call(name, out, *ins)
    b.env[node.name] = out


def lower_triangle(b: Builder, node: Node) -> None:
    """triu / tril over the last two dims: keep or zero each element by its (row, col)."""
    x = node.named["self"]
    shape = b.meta(x)["shape"]
    if len(shape) < 2:
        raise NoTemplate(f"{node.base} of a tensor with fewer than 2 dims")
    rows, cols = shape[-2], shape[-1]
    diag = node.a("diagonal", 0)
    keep = f"c - r >= {diag}" if node.base == "triu" else f"c - r <= {diag}"
    code = (f"const int64_t c = i % {cols}, r = (i / {cols}) % {rows};\n"
            f"        out[i] = ({keep}) ? in[i] : (T)0;")
    _gather(b, node, x, code, f"{node.base} (diagonal {diag}) of {shape}")


def lower_embedding(b: Builder, node: Node) -> None:
    """embedding: out[i, :] = weight[ids[i], :] (one thread per output element)."""
    w, ids = node.named["weight"], node.named["indices"]
    wm, im = b.meta(w), b.meta(ids)
    if len(wm["shape"]) != 2 or im["dtype"] not in ("int64", "int32"):
        raise NoTemplate("embedding beyond a 2-d table with integer ids")
    dim = wm["shape"][1]
    win, iin = b.contiguous(w), b.contiguous(ids)
    t, it = ctype(wm["dtype"]), ctype(im["dtype"])
    k = f"emb{len(b.kernels)}"
    body = f"out[i] = table[(int64_t)ids[i / {dim}] * {dim} + i % {dim}];"
    decl = "void NAME(torch::Tensor table_, torch::Tensor ids_, torch::Tensor out_)"
    ptrs = (f"const {t}* table = (const {t}*)table_.data_ptr();\n    "
            f"const {it}* ids = (const {it}*)ids_.data_ptr();\n    "
            f"{t}* out = ({t}*)out_.data_ptr();\n    const int64_t n = out_.numel();")
    if b.cuda:
        src = f"""
__global__ void {k}_kernel(const {t}* __restrict__ table, const {it}* __restrict__ ids,
                           {t}* __restrict__ out, int64_t n) {{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {body}
}}
{decl} {{
    {ptrs}
    {k}_kernel<<<ks_blocks(n, 256), 256, 0, KS_STREAM>>>(table, ids, out, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}}
"""
    else:
        src = f"""
{decl} {{
    {ptrs}
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {body}
}}
"""
    note = (f"Embedding lookup of {im['shape']} ids into a {wm['shape']} table: " + (
        "one thread per output element, so consecutive threads copy consecutive columns of the "
        "same row (coalesced)." if b.cuda else
        "an OpenMP loop over output elements; consecutive iterations copy consecutive columns "
        "of the same table row, a contiguous copy the compiler can vectorise."))
    name = b.add_kernel("embedding", k, src, decl, note)
    out = b.alloc(node.shape, node.dtype)
    b.call(name, win, iin, out)
    b.env[node.name] = out


LOWERINGS = {"triu": lower_triangle, "tril": lower_triangle, "embedding": lower_embedding,
             "flip": lower_flip, "diag": lower_diag, "diag_embed": lower_diag, "cat": lower_cat}
