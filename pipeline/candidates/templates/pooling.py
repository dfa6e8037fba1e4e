"""Max and average pooling, 1-D to 3-D (kernel, stride, padding, dilation, ceil_mode).

Like conv.py every case is treated as 3-D; one `HD` window function per output serves the CUDA
grid-stride kernel and the CPU loop. Its geometry struct holds only the fields that kind reads. Average pooling follows PyTorch's divisor rule: the window
clipped to the padded extent when `count_include_pad`, else to the real input, unless
`divisor_override` is given.
"""

from __future__ import annotations

import textwrap

from pipeline.candidates.templates.analysis import Node, NoTemplate
from pipeline.candidates.templates.program import Builder, ctype, numel
from pipeline.candidates.templates.symbolic import Dim

_HEAD = r"""
HD float K_point(const X_T* __restrict__ x, const K_Geom& g, int64_t o) {
    int64_t t = o;
    const int64_t ow = t % g.Wo; t /= g.Wo;
    const int64_t oh = t % g.Ho; t /= g.Ho;
    const int64_t od = t % g.Do; const int64_t nc = t / g.Do;
    const X_T* xc = x + nc * g.D * g.H * g.W;
"""

_ADAPTIVE = r"""
    // Adaptive windows: [floor(o * In / Out), ceil((o + 1) * In / Out)) on every dim.
    const int64_t ds = od * g.D / g.Do, de = ((od + 1) * g.D + g.Do - 1) / g.Do;
    const int64_t hs = oh * g.H / g.Ho, he = ((oh + 1) * g.H + g.Ho - 1) / g.Ho;
    const int64_t ws = ow * g.W / g.Wo, we = ((ow + 1) * g.W + g.Wo - 1) / g.Wo;
    float s = 0.f;
    for (int64_t id = ds; id < de; ++id)
        for (int64_t ih = hs; ih < he; ++ih)
            for (int64_t iw = ws; iw < we; ++iw) s += (float)xc[(id * g.H + ih) * g.W + iw];
    return s / (float)((de - ds) * (he - hs) * (we - ws));
}
"""

_ORIGIN = r"""
    const int64_t d0 = od * g.sd - g.pd, h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;"""

_MAX = _ORIGIN + r"""
    float best = -INFINITY;
    for (int64_t a = 0; a < g.kd; ++a) {
        const int64_t id = d0 + a * g.dd;
        if (id < 0 || id >= g.D) continue;
        for (int64_t c = 0; c < g.kh; ++c) {
            const int64_t ih = h0 + c * g.dh;
            if (ih < 0 || ih >= g.H) continue;
            for (int64_t e = 0; e < g.kw; ++e) {
                const int64_t iw = w0 + e * g.dw;
                if (iw < 0 || iw >= g.W) continue;
                const float v = (float)xc[(id * g.H + ih) * g.W + iw];
                if (v > best || v != v) best = v;
            }
        }
    }
    return best;
}
"""

_AVG = _ORIGIN + r"""
    // Window bounds clipped to the padded input (the count_include_pad divisor) ...
    const int64_t d1 = d0 + g.kd < g.D + g.pd ? d0 + g.kd : g.D + g.pd;
    const int64_t h1 = h0 + g.kh < g.H + g.ph ? h0 + g.kh : g.H + g.ph;
    const int64_t w1 = w0 + g.kw < g.W + g.pw ? w0 + g.kw : g.W + g.pw;
    const int64_t padded = (d1 - d0) * (h1 - h0) * (w1 - w0);
    // ... then to the real input (the summed elements and the other divisor).
    const int64_t ds = d0 > 0 ? d0 : 0, hs = h0 > 0 ? h0 : 0, ws = w0 > 0 ? w0 : 0;
    const int64_t de = d1 < g.D ? d1 : g.D, he = h1 < g.H ? h1 : g.H, we = w1 < g.W ? w1 : g.W;
    float s = 0.f;
    for (int64_t id = ds; id < de; ++id)
        for (int64_t ih = hs; ih < he; ++ih)
            for (int64_t iw = ws; iw < we; ++iw) s += (float)xc[(id * g.H + ih) * g.W + iw];
    const int64_t div = g.divisor > 0 ? g.divisor
                        : (g.include_pad ? padded : (de - ds) * (he - hs) * (we - ws));
    return s / (float)div;
}
"""

# the geometry fields each kind reads (the struct holds these and nothing else), and what
# forward's comment calls each group
_SIZES = ["D", "H", "W", "Do", "Ho", "Wo"]
_WINDOW = ["kd", "kh", "kw", "sd", "sh", "sw", "pd", "ph", "pw"]
_GROUPS = {"D": "input D/H/W", "Do": "output D/H/W", "kd": "kernel", "sd": "stride",
           "pd": "padding", "dd": "dilation (d/h/w)", "divisor": "divisor override",
           "include_pad": "count_include_pad"}


def _fields(adaptive: bool, is_max: bool) -> list[str]:
    if adaptive:
        return _SIZES
    return _SIZES + _WINDOW + (["dd", "dh", "dw"] if is_max else ["divisor", "include_pad"])


def _struct(fields: list[str]) -> tuple[str, str]:
    """(the K_Geom struct, its initializer from the vector `d`) for these fields."""
    ints = [f for f in fields if f != "include_pad"]
    decl = textwrap.fill("int64_t " + ", ".join(ints) + ";", width=84, subsequent_indent="    ")
    if "include_pad" in fields:
        decl += "\n    bool include_pad;"
    init = textwrap.fill(", ".join(f"d[{i}]" + (" != 0" if f == "include_pad" else "")
                                   for i, f in enumerate(fields)),
                         width=84, subsequent_indent="        ")
    return f"struct K_Geom {{\n    {decl}\n}};\n", f"K_Geom g{{{init}}};"


_CUDA = r"""
__global__ void K_kernel(const X_T* __restrict__ x, X_T* __restrict__ out, K_Geom g,
                         int64_t total) {
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < total;
         o += (int64_t)gridDim.x * blockDim.x) out[o] = (X_T)K_point(x, g, o);
}

void NAME(torch::Tensor x, torch::Tensor out, std::vector<int64_t> d) {
    GEOM_INIT
    const int64_t total = out.numel();
    K_kernel<<<ks_blocks(total, THREADS), THREADS, 0, KS_STREAM>>>(
        (const X_T*)x.data_ptr(), (X_T*)out.data_ptr(), g, total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

_CPU = r"""
void NAME(torch::Tensor x, torch::Tensor out, std::vector<int64_t> d) {
    GEOM_INIT
    const X_T* xp = (const X_T*)x.data_ptr();
    X_T* op = (X_T*)out.data_ptr();
    const int64_t total = out.numel();
    #pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < total; ++o) op[o] = (X_T)K_point(xp, g, o);
}
"""


def _pad3(vals, fill: int, nsp: int) -> list[int]:
    vals = list(vals) if isinstance(vals, list) else [vals] * nsp
    if len(vals) == 1 and nsp > 1:
        vals = vals * nsp
    return [fill] * (3 - len(vals)) + vals


def _out_sizes(sp_in: list, sp_out: list, k3: list, s3: list, p3: list, d3: list,
               ceil: bool) -> list:
    """Output sizes as expressions of the input's: the trace writes a pooled size as a number
    (`255` for `(512 - 4) // 2 + 1`), which would pin the candidate to the traced length."""
    out = list(sp_out)
    pad = 3 - len(sp_in)
    for i, (n, o) in enumerate(zip(sp_in, sp_out, strict=True)):
        j = pad + i
        if not isinstance(n, Dim) or isinstance(o, Dim):
            continue
        c = 2 * p3[j] - d3[j] * (k3[j] - 1) - 1 + (s3[j] - 1 if ceil else 0)
        size = ((n - (-c) if c < 0 else n + c) // s3[j]) + 1
        if ceil and (int(size) - 1) * s3[j] >= int(n) + p3[j]:
            continue  # PyTorch drops a last window that starts in the padding: keep the number
        if int(size) == int(o):
            out[i] = size
    return out


def lower_pool(b: Builder, node: Node) -> None:
    """Emit a pooling kernel for max_pool*d(_with_indices) / avg_pool*d."""
    base = node.base
    adaptive = base.startswith("_adaptive_avg_pool") or base.startswith("adaptive_avg_pool")
    if adaptive:
        base = base.removeprefix("_").replace("adaptive_", "")
    is_max = base.startswith("max_pool")
    x_ref = node.named["self"]
    xm = b.meta(x_ref)
    out_meta = node.meta[0] if isinstance(node.meta, list) else node.meta
    nsp = int(base[len("max_pool") if is_max else len("avg_pool")])
    if len(xm["shape"]) < nsp + 1:
        raise NoTemplate(f"{node.target} input rank {len(xm['shape'])}")
    sp_in = xm["shape"][-nsp:]
    sp_out = out_meta["shape"][-nsp:]
    ks = node.a("kernel_size") if not adaptive else [1] * nsp
    stride = (node.a("stride") or ks) if not adaptive else [1] * nsp
    k3 = _pad3(ks, 1, nsp)
    s3 = _pad3(stride, 1, nsp)
    p3 = _pad3(node.a("padding", 0), 0, nsp)
    d3 = _pad3(node.a("dilation", 1), 1, nsp) if is_max else [1, 1, 1]
    if not adaptive:
        sp_out = _out_sizes(sp_in, sp_out, k3, s3, p3, d3, bool(node.a("ceil_mode", False)))
        out_meta = {**out_meta, "shape": [*out_meta["shape"][:-nsp], *sp_out]}
    div = node.a("divisor_override") or 0
    include_pad = bool(node.a("count_include_pad", True))
    values = dict(zip([*_SIZES, *_WINDOW, "dd", "dh", "dw", "divisor", "include_pad"],
                      [*_pad3(sp_in, 1, nsp), *_pad3(sp_out, 1, nsp), *k3, *s3, *p3, *d3,
                       int(div), int(include_pad)], strict=True))
    fields = _fields(adaptive, is_max)
    geom = [values[f] for f in fields]
    struct, init = _struct(fields)
    xin = b.contiguous(x_ref)
    x_t = ctype(xm["dtype"])
    k = f"pool{len(b.kernels)}"
    threads = (256, 128, 512)[b.variant % 3]
    body = _ADAPTIVE if adaptive else _MAX if is_max else _AVG
    tpl = struct + _HEAD.rstrip("\n") + body + (_CUDA if b.cuda else _CPU).replace("GEOM_INIT",
                                                                                    init)
    src = (tpl.replace("K_", f"{k}_").replace("X_T", x_t).replace("THREADS", str(threads)))
    note = (f"{nsp}-D {'adaptive ' if adaptive else ''}{'max' if is_max else 'average'} pooling {xm['shape']} -> "
            f"{out_meta['shape']} (kernel {ks}, stride {stride}, padding {node.a('padding', 0)}"
            + (f", dilation {node.a('dilation', 1)}" if is_max else "")
            + "): one " + ("thread" if b.cuda else "loop iteration") + " per output walks its "
            "window with bounds checks instead of a padded copy"
            + (f", {threads} threads per block." if b.cuda else ", OpenMP-parallel."))
    name = b.add_kernel("pooling", k, src, "void NAME(torch::Tensor x, torch::Tensor out, "
                        "std::vector<int64_t> d)", note)
    out = b.alloc(out_meta["shape"], out_meta["dtype"])
    b.emit("# geometry: " + ", ".join(_GROUPS[f] for f in fields if f in _GROUPS))
    b.call(name, xin, out, repr(geom))
    b.tuples[node.name] = {0: out}
    b.env[node.name] = out
    b.params.setdefault("pooling", []).append({"max": is_max, "dims": nsp, "threads": threads,
                                               "outputs": numel(out_meta["shape"])})


LOWERINGS = {k: lower_pool for k in (
    "max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices",
    "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d",
    "avg_pool3d", "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_avg_pool1d")}
