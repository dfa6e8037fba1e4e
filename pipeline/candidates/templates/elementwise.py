"""Elementwise and activation chains (and broadcasting binaries) fused into one kernel.

A fused group is a chain of elementwise ATen nodes whose intermediates have one consumer and the
group's output shape. The per-element math becomes one `HD` function shared by the CUDA kernel
and the CPU loop; operands are read through their broadcast strides, so `x + bias[:, None, None]`
needs no expanded copy. Variants: grid-stride scalar loop with 256 or 512 threads, and a float4
vectorised loop when every operand is a contiguous fp32 tensor of the output's shape.
"""

from __future__ import annotations

from pipeline.candidates.templates.analysis import Node, NoTemplate
from pipeline.candidates.templates.program import Builder, acc_type, ctype, lit, numel

UNARY = {
    "abs": "fabs{f}({x})", "neg": "(-{x})", "exp": "exp{f}({x})", "exp2": "exp2{f}({x})",
    "log": "log{f}({x})", "log2": "log2{f}({x})", "log10": "log10{f}({x})",
    "log1p": "log1p{f}({x})", "expm1": "expm1{f}({x})", "sqrt": "sqrt{f}({x})",
    "rsqrt": "({one} / sqrt{f}({x}))", "sin": "sin{f}({x})", "cos": "cos{f}({x})",
    "tan": "tan{f}({x})", "tanh": "tanh{f}({x})", "erf": "erf{f}({x})",
    "sigmoid": "({one} / ({one} + exp{f}(-({x}))))", "reciprocal": "({one} / ({x}))",
    "relu": "fmax{f}({x}, 0)", "silu": "(({x}) / ({one} + exp{f}(-({x}))))",
    "mish": "(({x}) * tanh{f}(log1p{f}(exp{f}({x}))))",
    "hardswish": "(({x}) * fmin{f}(fmax{f}(({x}) + 3, 0), 6) / 6)",
    "hardsigmoid": "(fmin{f}(fmax{f}(({x}) + 3, 0), 6) / 6)",
    "floor": "floor{f}({x})", "ceil": "ceil{f}({x})", "trunc": "trunc{f}({x})",
    "round": "rint{f}({x})", "sign": "(({x}) > 0 ? {one} : (({x}) < 0 ? -{one} : 0))",
    "logical_not": "(({x}) == 0 ? {one} : 0)", "square": "(({x}) * ({x}))",
    "frac": "(({x}) - trunc{f}({x}))",
}
BINARY = {
    "mul": "(({a}) * ({b}))", "div": "(({a}) / ({b}))", "maximum": "fmax{f}({a}, {b})",
    "minimum": "fmin{f}({a}, {b})", "gt": "(({a}) > ({b}) ? {one} : 0)",
    "lt": "(({a}) < ({b}) ? {one} : 0)", "ge": "(({a}) >= ({b}) ? {one} : 0)",
    "le": "(({a}) <= ({b}) ? {one} : 0)", "eq": "(({a}) == ({b}) ? {one} : 0)",
    "ne": "(({a}) != ({b}) ? {one} : 0)", "logical_and": "((({a}) != 0 && ({b}) != 0) ? {one} : 0)",
    "logical_or": "((({a}) != 0 || ({b}) != 0) ? {one} : 0)", "atan2": "atan2{f}({a}, {b})",
    "fmod": "fmod{f}({a}, {b})",
}
OTHER = {"add", "sub", "rsub", "pow", "leaky_relu", "gelu", "hardtanh", "elu", "softplus",
         "clamp", "clamp_min", "clamp_max", "where", "_to_copy", "clone", "threshold",
         "hardshrink", "softshrink", "masked_fill", "lerp", "xlogy", "copy", "celu", "selu",
         "relu6", "logit", "alias", "lift_fresh_copy", "bitwise_not", "ks_huber", "ks_bce_logits"}
OPS = set(UNARY) | set(BINARY) | OTHER


def is_elementwise(node: Node) -> bool:
    """True for ATen ops the fused kernel computes (in-place forms included)."""
    if node.op != "call_function" or not isinstance(node.meta, dict):
        return False
    base = node.base.removesuffix("_") if node.base not in ("_to_copy",) else node.base
    if base == "div" and node.a("rounding_mode") not in (None, "true"):
        return base == "div" and node.a("rounding_mode") in ("trunc", "floor")
    if base == "_to_copy" and node.dtype not in ("float32", "float64", "float16", "bfloat16",
                                                 "bool", "int64", "int32"):
        return False
    return base in OPS


def _op_expr(node: Node, arg, acc: str) -> str:
    """C expression for one elementwise node; `arg(name)` gives an operand's C expression."""
    base = node.base if node.base == "_to_copy" else node.base.removesuffix("_")
    f = "f" if acc == "float" else ""
    one = lit(1, acc)
    if base in UNARY:
        return UNARY[base].format(x=arg("self"), f=f, one=one)
    if base in BINARY:
        if base == "div" and node.a("rounding_mode") == "trunc":
            return f"trunc{f}(({arg('self')}) / ({arg('other')}))"
        if base == "div" and node.a("rounding_mode") == "floor":
            return f"floor{f}(({arg('self')}) / ({arg('other')}))"
        return BINARY[base].format(a=arg("self"), b=arg("other"), f=f, one=one)
    if base in ("add", "sub"):
        alpha = node.a("alpha", 1)
        other = arg("other") if alpha == 1 else f"({lit(alpha, acc)} * ({arg('other')}))"
        return f"(({arg('self')}) {'+' if base == 'add' else '-'} {other})"
    if base == "rsub":
        alpha = node.a("alpha", 1)
        return f"(({arg('other')}) - {lit(alpha, acc)} * ({arg('self')}))"
    if base == "pow":
        if node.overload == "Scalar":
            return f"pow{f}({arg('self')}, {arg('exponent')})"
        e = node.a("exponent")
        if isinstance(e, int | float) and not isinstance(e, bool):
            x = arg("self")
            table = {1: f"({x})", 2: f"(({x}) * ({x}))", 3: f"(({x}) * ({x}) * ({x}))",
                     0.5: f"sqrt{f}({x})", -1: f"({one} / ({x}))", 0: one}
            return table.get(e, f"pow{f}({x}, {lit(e, acc)})")
        return f"pow{f}({arg('self')}, {arg('exponent')})"
    if base == "leaky_relu":
        x, s = arg("self"), lit(node.a("negative_slope", 0.01), acc)
        return f"(fmax{f}({x}, 0) + {s} * fmin{f}({x}, 0))"  # exact, and no branch
    if base == "gelu":
        x = arg("self")
        if node.a("approximate", "none") == "tanh":
            return (f"({lit(0.5, acc)} * ({x}) * ({one} + tanh{f}({lit(0.7978845608028654, acc)}"
                    f" * (({x}) + {lit(0.044715, acc)} * ({x}) * ({x}) * ({x})))))")
        return f"({lit(0.5, acc)} * ({x}) * ({one} + erf{f}(({x}) * {lit(0.7071067811865476, acc)})))"
    if base in ("hardtanh", "relu6"):
        lo, hi = (0, 6) if base == "relu6" else (node.a("min_val", -1), node.a("max_val", 1))
        return f"fmin{f}(fmax{f}({arg('self')}, {lit(lo, acc)}), {lit(hi, acc)})"
    if base in ("elu", "celu", "selu"):
        x = arg("self")
        if base == "selu":
            alpha, scale, iscale = 1.6732632423543772, 1.0507009873554805, 1.0
        elif base == "celu":
            alpha = node.a("alpha", 1.0)
            scale, iscale = 1.0, 1.0 / float(alpha)
        else:
            alpha, scale, iscale = node.a("alpha", 1), node.a("scale", 1), node.a("input_scale", 1)
        # branch-free (both sides are computed, exp of min(x, 0) is 1 - 1 = 0 for x > 0), so a
        # simd loop can vectorise the exp instead of calling it per element behind a branch
        neg = (f"{lit(float(alpha) * float(scale), acc)} * (exp{f}(fmin{f}({x}, 0) * "
               f"{lit(iscale, acc)}) - {one})")
        return f"(fmax{f}({x}, 0) * {lit(scale, acc)} + {neg})"
    if base == "softplus":
        x, beta, th = arg("self"), node.a("beta", 1), node.a("threshold", 20)
        # log1p(exp(z)) = max(z, 0) + log1p(exp(-|z|)): exact, cannot overflow, and has no
        # branch around the calls (a branch keeps a simd loop from vectorising them); above the
        # threshold the reference returns x, which this differs from by under exp(-threshold)
        z = f"(({x}) * {lit(beta, acc)})"
        return (f"((fmax{f}({z}, 0) + log1p{f}(exp{f}(-fabs{f}({z})))) / {lit(beta, acc)})"
                if isinstance(th, int | float) and th >= 15 else
                f"({z} > {lit(th, acc)} ? ({x}) : log1p{f}(exp{f}({z})) / {lit(beta, acc)})")
    if base in ("clamp", "clamp_min", "clamp_max"):
        x = arg("self")
        lo = node.a("min") if base != "clamp_max" else None
        hi = node.a("max") if base != "clamp_min" else None
        if lo is not None:
            lo_e = arg("min") if isinstance(lo, dict) and "node" in lo else lit(lo, acc)
            x = f"fmax{f}({x}, {lo_e})"
        if hi is not None:
            hi_e = arg("max") if isinstance(hi, dict) and "node" in hi else lit(hi, acc)
            x = f"fmin{f}({x}, {hi_e})"
        return x
    if base == "where":
        return f"(({arg('condition')}) != 0 ? ({arg('self')}) : ({arg('other')}))"
    if base == "masked_fill":
        return f"(({arg('mask')}) != 0 ? ({arg('value')}) : ({arg('self')}))"
    if base == "threshold":
        x = arg("self")
        return f"(({x}) > {lit(node.a('threshold'), acc)} ? ({x}) : {lit(node.a('value'), acc)})"
    if base == "hardshrink":
        x, lam = arg("self"), lit(node.a("lambd", 0.5), acc)
        return f"((({x}) > {lam} || ({x}) < -{lam}) ? ({x}) : 0)"
    if base == "softshrink":
        x, lam = arg("self"), lit(node.a("lambd", 0.5), acc)
        return f"(({x}) > {lam} ? ({x}) - {lam} : (({x}) < -{lam} ? ({x}) + {lam} : 0))"
    if base == "lerp":
        s, e, w = arg("self"), arg("end"), arg("weight")
        return f"(({s}) + ({w}) * (({e}) - ({s})))"
    if base == "xlogy":
        x, y = arg("self"), arg("other")
        return f"(({x}) == 0 ? 0 : ({x}) * log{f}({y}))"
    if base == "logit":
        x = arg("self")
        return f"log{f}(({x}) / ({one} - ({x})))"
    if base in ("_to_copy", "clone", "alias", "lift_fresh_copy"):
        return f"({arg('self')})"
    if base == "copy":
        return f"({arg('src')})"
    if base == "ks_huber":  # loss.py: elementwise part of huber_loss / smooth_l1_loss
        d = f"(({arg('self')}) - ({arg('other')}))"
        delta, smooth = lit(node.a("delta"), acc), node.a("smooth")
        quad = f"{lit(0.5, acc)} * {d} * {d}" + (f" / {delta}" if smooth else "")
        lin = (f"(fabs{f}({d}) - {lit(0.5, acc)} * {delta})" if smooth
               else f"{delta} * (fabs{f}({d}) - {lit(0.5, acc)} * {delta})")
        return f"(fabs{f}({d}) < {delta} ? {quad} : {lin})"
    if base == "ks_bce_logits":  # loss.py: stable BCE with logits
        x, t = arg("self"), arg("other")
        return (f"(fmax{f}({x}, 0) - ({x}) * ({t}) + log1p{f}(exp{f}(-fabs{f}({x}))))")
    if base == "bitwise_not":
        return f"(({arg('self')}) == 0 ? {one} : 0)"
    raise NoTemplate(f"elementwise op {node.target} has no expression")


def _bcast_strides(meta: dict, out_shape: list[int]) -> list[int]:
    """Strides of an operand broadcast to the output shape (0 on broadcast dims)."""
    shape, stride = meta["shape"], meta["stride"]
    pad = len(out_shape) - len(shape)
    if pad < 0:
        raise NoTemplate("operand has more dims than the output")
    out = [0] * pad
    for s, st, o in zip(shape, stride, out_shape[pad:], strict=True):
        if s != o and s != 1:
            raise NoTemplate(f"shape {shape} does not broadcast to {out_shape}")
        out.append(0 if s != o else st)
    return out


# elements per OpenMP iteration of a CPU elementwise kernel: 24 KiB of fp32, within an L1 cache.
# Not a power of two, so the power-of-two sizes of most tasks leave a partial last chunk and the
# verifier runs the tail path too.
CPU_CHUNK = 6144


def _offset_code(strides: list[list[int]], shape: list[int], i: str) -> tuple[str, list[str]]:
    """Index arithmetic turning the flat output index into each operand's element offset."""
    lines = [f"int64_t rem = {i};"]
    offs = ["0"] * len(strides)
    for d in range(len(shape) - 1, -1, -1):
        if all(st[d] == 0 for st in strides) or shape[d] == 1:
            if shape[d] != 1:
                lines.append(f"rem /= {shape[d]};")
            continue
        lines.append(f"const int64_t i{d} = rem % {shape[d]}; rem /= {shape[d]};")
        for k, st in enumerate(strides):
            if st[d]:
                offs[k] = f"{offs[k]} + i{d} * {st[d]}" if offs[k] != "0" else f"i{d} * {st[d]}"
    return "\n        ".join(lines), offs


def group_operands(b: Builder, members: list[Node]) -> list[dict]:
    """The group's external tensor operands (node refs) in first-use order."""
    inside = {m.name for m in members}
    leaves: list[str] = []
    for m in members:
        for r in _tensor_refs(m):
            if r not in inside and r not in leaves:
                leaves.append(r)
    return [{"node": r} for r in leaves]


def _tensor_refs(node: Node) -> list[str]:
    out = []
    for v in node.named.values():
        if isinstance(v, dict) and "node" in v:
            out.append(v["node"])
    return out


def element_function(b: Builder, members: list[Node], leaves: list[dict], acc: str,
                     fname: str) -> str:
    """`HD acc fname(acc x0, acc x1, ...)`: the whole chain for one element."""
    index = {lf["node"]: k for k, lf in enumerate(leaves)}
    local = {}
    body = []
    for j, m in enumerate(members):
        def arg(name: str, m=m) -> str:
            v = m.a(name)
            if isinstance(v, dict) and "node" in v:
                r = v["node"]
                return local[r] if r in local else f"x{index[r]}"
            if v is None:
                raise NoTemplate(f"{m.target}: argument {name} missing")
            return lit(v, acc)

        body.append(f"    const {acc} t{j} = {_op_expr(m, arg, acc)};")
        local[m.name] = f"t{j}"
    params = ", ".join(f"{acc} x{k}" for k in range(len(leaves)))
    return (f"HD {acc} {fname}({params}) {{\n" + "\n".join(body)
            + f"\n    return t{len(members) - 1};\n}}\n")


def lower_group(b: Builder, members: list[Node]) -> None:
    """Emit one fused kernel for a chain of elementwise nodes ending at members[-1]."""
    root = members[-1]
    out_shape, out_dtype = root.shape, root.dtype
    leaves = group_operands(b, members)
    if not leaves:
        raise NoTemplate("elementwise chain without tensor operands")
    metas = [b.meta(lf) for lf in leaves]
    acc = acc_type(out_dtype, *[m["dtype"] for m in metas])
    n = numel(out_shape)
    strides = [_bcast_strides(m, out_shape) for m in metas]
    # PyTorch keeps a permuted input's layout for elementwise results; match the traced strides
    # so later views see the same memory layout as the reference's.
    rm = root.meta
    out_strided = not rm.get("contiguous", True)
    if out_strided:
        strides.append(list(rm["stride"]))
    flat = all(m["shape"] == out_shape and m["contiguous"] for m in metas) and not out_strided
    vec = (flat and out_dtype == "float32" and all(m["dtype"] == "float32" for m in metas)
           and n % 4 == 0 and all(m["offset"] % 4 == 0 for m in metas) and b.variant % 2 == 0)
    threads = (256, 512, 256, 128)[b.variant % 4]
    kname = f"ew{len(b.kernels)}"
    efn = element_function(b, members, leaves, acc, f"{kname}_op")
    in_types = [ctype(m["dtype"]) for m in metas]
    out_t = ctype(out_dtype)
    ptr_params = ", ".join(f"const {t}* __restrict__ in{k}" for k, t in enumerate(in_types))
    offset_code, offs = ("", ["i"] * len(leaves)) if flat else _offset_code(strides, out_shape, "i")
    loads = ", ".join(f"({acc})in{k}[{offs[k]}]" for k in range(len(leaves)))
    o = offs[len(leaves)] if out_strided else "i"
    store = (f"out[{o}] = ({out_t})({kname}_op({loads}));" if out_dtype != "bool"
             else f"out[{o}] = {kname}_op({loads}) != 0;")
    ptr_args = ", ".join(f"(const {t}*)a{k}.data_ptr()" for k, t in enumerate(in_types))
    host_params = ", ".join(f"torch::Tensor a{k}" for k in range(len(leaves)))
    decl = f"void NAME(torch::Tensor out, {host_params})"
    ops = ", ".join(m.target.removeprefix("aten.") for m in members)
    if b.cuda:
        if vec:
            lanes = "xyzw"
            vloads = [f"const float4 v{k} = reinterpret_cast<const float4*>(in{k})[j];"
                      for k in range(len(leaves))]
            vcomp = "\n        ".join(
                f"r.{c} = {kname}_op({', '.join(f'v{k}.{c}' for k in range(len(leaves)))});"
                for c in lanes)
            kernel = f"""
__global__ void {kname}_kernel({ptr_params}, float* __restrict__ out, int64_t n4) {{
    // float4 path: every operand is contiguous fp32 with the output's shape, 16-byte aligned.
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n4;
         j += (int64_t)gridDim.x * blockDim.x) {{
        {" ".join(vloads)}
        float4 r;
        {vcomp}
        reinterpret_cast<float4*>(out)[j] = r;
    }}
}}
"""
            launch = (f"    const int64_t n4 = out.numel() / 4;\n"
                      f"    {kname}_kernel<<<ks_blocks(n4, {threads}), {threads}, 0, KS_STREAM>>>"
                      f"({ptr_args}, (float*)out.data_ptr(), n4);")
        else:
            kernel = f"""
__global__ void {kname}_kernel({ptr_params}, {out_t}* __restrict__ out, int64_t n) {{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {{
        {offset_code}
        {store}
    }}
}}
"""
            launch = (f"    const int64_t n = out.numel();\n"
                      f"    {kname}_kernel<<<ks_blocks(n, {threads}), {threads}, 0, KS_STREAM>>>"
                      f"({ptr_args}, ({out_t}*)out.data_ptr(), n);")
        host = f"""{decl} {{
{launch}
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}}
"""
        src = efn + kernel + host
        how = ("a float4-vectorised grid-stride loop (4 elements per thread per iteration, "
               "16-byte loads)" if vec else
               f"a grid-stride loop with {threads} threads per block" +
               ("" if flat else ", reading each operand through its broadcast strides"))
    elif b.simd and _row_form(flat, out_strided, strides, out_shape):
        src, how = _cpu_rows(kname, efn, decl, in_types, out_t, strides, out_shape, acc,
                             out_dtype, len(leaves))
    else:
        ptr_decls = "\n    ".join(f"const {t}* __restrict__ in{k} = (const {t}*)a{k}.data_ptr();"
                                   for k, t in enumerate(in_types))
        simd = "#pragma omp simd\n        " if b.simd and flat else ""
        src = efn + f"""{decl} {{
    {ptr_decls}
    {out_t}* __restrict__ out = ({out_t}*)out_t_.data_ptr();
    const int64_t n = out_t_.numel();
    // OpenMP shares out chunks of {CPU_CHUNK} elements (24 KiB of fp32, an L1's worth)
    const int64_t chunk = {CPU_CHUNK};
    const int64_t chunks = (n + chunk - 1) / chunk;
    #pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < chunks; ++ch) {{
        const int64_t end = std::min(n, (ch + 1) * chunk);
        {simd}for (int64_t i = ch * chunk; i < end; ++i) {{
            {offset_code.replace(chr(10), chr(10) + "    ")}
            {store}
        }}
    }}
}}
""".replace("torch::Tensor out,", "torch::Tensor out_t_,", 1)
        how = (f"an OpenMP-parallel loop over chunks of {CPU_CHUNK} output elements, each a "
               + ("vectorised (`omp simd`) " if simd else "") + "contiguous inner loop" + (
                   "" if flat else " reading each operand through its broadcast strides"))
    # "fused" only when the kernel computes several ops in one pass
    what = (f"Fused elementwise kernel for [{ops}]" if len(members) > 1
            else f"Elementwise kernel for {ops}")
    note = (f"{what} over {n} elements: one read of each operand and one write, computed in "
            f"{acc} with {how}.")
    family = "activation" if any(m.base.removesuffix("_") in ACTIVATIONS for m in members) \
        else ("broadcast" if not flat else "elementwise")
    name = b.add_kernel(family, kname, src, decl, note)
    if out_strided:
        var = b.fresh("buf")
        b.emit(f"{var} = torch.empty_strided({tuple(out_shape)!r}, {tuple(rm['stride'])!r}, "
               f"dtype=torch.{out_dtype}, device=dev)")
    else:
        var = b.alloc(out_shape, out_dtype)
    b.call(name, var, *[b.val(lf) for lf in leaves])
    b.env[root.name] = var
    b.params.setdefault("elementwise", []).append(
        {"threads": threads, "vectorized": vec, "broadcast": not flat, "ops": len(members)})


def _row_form(flat: bool, out_strided: bool, strides: list[list[int]], shape: list[int]) -> bool:
    """A broadcast chain whose operands are contiguous or broadcast along the last dim, which
    is long enough to vectorise: one offset computation per row, a simd loop along it."""
    return (not flat and not out_strided and len(shape) >= 2 and shape[-1] >= 16
            and all(st[-1] in (0, 1) for st in strides))


def _cpu_rows(kname: str, efn: str, decl: str, in_types: list[str], out_t: str,
              strides: list[list[int]], shape: list[int], acc: str, out_dtype: str,
              n_in: int) -> tuple[str, str]:
    """CPU text of a broadcast chain as rows: operand offsets once per row, then a vectorised
    loop along the last dim (stride 1, or 0 for an operand broadcast along it)."""
    offset_code, offs = _offset_code(strides, shape, "i")
    loads = ", ".join(f"({acc})in{k}[{offs[k]}{' + j' if strides[k][-1] else ''}]"
                      for k in range(n_in))
    value = f"{kname}_op({loads})"
    store = (f"out[i + j] = ({out_t})({value});" if out_dtype != "bool"
             else f"out[i + j] = {value} != 0;")
    ptr_decls = "\n    ".join(f"const {t}* __restrict__ in{k} = (const {t}*)a{k}.data_ptr();"
                               for k, t in enumerate(in_types))
    src = efn + f"""{decl} {{
    {ptr_decls}
    {out_t}* __restrict__ out = ({out_t}*)out_t_.data_ptr();
    const int64_t L = {shape[-1]};
    const int64_t rows = out_t_.numel() / L;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {{
        const int64_t i = r * L;
        {offset_code}
        #pragma omp simd
        for (int64_t j = 0; j < L; ++j) {{
            {store}
        }}
    }}
}}
""".replace("torch::Tensor out,", "torch::Tensor out_t_,", 1)
    how = ("an OpenMP loop over rows of the last dimension: each operand's offset is computed "
           "once per row, then a vectorised (`omp simd`) loop runs along the row (operands "
           "broadcast along it are read once)")
    return src, how


ACTIVATIONS = {"relu", "leaky_relu", "gelu", "sigmoid", "tanh", "silu", "mish", "hardswish",
               "hardsigmoid", "hardtanh", "elu", "selu", "celu", "softplus", "relu6", "threshold",
               "hardshrink", "softshrink"}


def copy_kernel(b: Builder, ref: dict) -> str:
    """Gather a strided view into a fresh contiguous buffer with a copy kernel."""
    src = b.node(ref["node"])
    fake = Node(name=f"{src.name}__copy", op="call_function", target="aten.clone",
                args=[ref], named={"self": ref}, meta=dict(src.meta, contiguous=True, offset=0,
                                                           stride=_contig(src.shape)),
                users=[])
    b.graph.by_name[fake.name] = fake
    lower_group(b, [fake])
    return b.env[fake.name]


def _contig(shape: list[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return list(reversed(out))
