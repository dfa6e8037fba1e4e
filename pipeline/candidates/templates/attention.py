"""Scaled dot-product attention on the CPU as one fused pass per (batch, head).

The reference's `matmul(softmax(q @ k^T / c [masked causally]), v)` traces to two bmm calls with
a division, an optional `masked_fill` by a `triu(ones)` mask and a softmax between them; the
generic lowering writes every intermediate (the scores, the probabilities) to memory and runs
four kernels. With small heads (KernelBench's 16 x 16) that costs more than the math. The simd
strategies instead give each (batch, head) one task: K's block is transposed once into a small
buffer, so a query row's scores are `head_dim` vector FMAs along the keys; the row's max, its
exponentials and their sum stay in that buffer; the output row accumulates p_j * v_j along the
value dim. Nothing but the output is written. The `omp` strategy keeps the generic lowering
(the slower sibling preference pairs contrast with this one).
"""

from __future__ import annotations

from pipeline.candidates.templates.analysis import Node
from pipeline.candidates.templates.program import Builder, lit

VIEWS = ("view", "_unsafe_view", "reshape", "expand", "alias", "clone", "contiguous")


def _source(b: Builder, ref: object) -> Node | None:
    """The node a value comes from, through shape-only views (expand, view)."""
    if not (isinstance(ref, dict) and "node" in ref):
        return None
    n = b.node(ref["node"])
    while n.base in VIEWS and isinstance(n.a("self"), dict):
        n = b.node(n.a("self")["node"])
    return n


def _input(b: Builder, n: Node | None, rank: int = 4) -> Node | None:
    """`n` when it is a contiguous fp32 forward input of `rank` dims."""
    if n is None or n.op != "placeholder" or not isinstance(n.meta, dict):
        return None
    m = n.meta
    ok = (m.get("dtype") == "float32" and len(m.get("shape", [])) == rank
          and m.get("contiguous") and not m.get("offset"))
    return n if ok and n.name in b.env else None


def match(b: Builder, live: list[Node]) -> dict | None:
    """The attention pattern when it is the whole graph (q, k, v, the scale, the causal offset),
    else None. Only the CPU simd strategies fuse it."""
    if b.cuda or not b.simd:
        return None
    bmms = [n for n in live if n.base == "bmm"]
    if len(bmms) != 2:
        return None
    first, second = bmms
    sm = _source(b, second.a("self"))
    if sm is None or sm.base != "_softmax" or sm.a("dim") not in (-1, 3):
        return None
    v = _input(b, _source(b, second.a("mat2")))
    used = {first.name, second.name, sm.name}
    n = _source(b, sm.a("self"))
    diagonal = None
    if n is not None and n.base == "masked_fill":
        mask = _source(b, n.a("mask"))
        ones = _source(b, mask.a("self")) if mask is not None else None
        if (mask is None or mask.base != "triu" or ones is None or ones.base != "ones"
                or not isinstance(mask.a("diagonal", 0), int) or mask.a("diagonal", 0) < 1
                or (n.a("value") or {}).get("float") != "-inf"):
            return None
        diagonal = int(mask.a("diagonal", 0))  # keys j < i + diagonal are attended to
        used |= {n.name, mask.name, ones.name}
        n = _source(b, n.a("self"))
    divisor = 1.0
    if n is not None and n.base in ("div", "mul") and not isinstance(n.a("other"), dict):
        c = n.a("other")
        divisor = c if n.base == "div" else None
        if divisor is None:
            return None  # a multiplied scale: left to the generic lowering
        used.add(n.name)
        n = _source(b, n.a("self"))
    if n is not first:
        return None
    q = _input(b, _source(b, first.a("self")))
    kt = _source(b, first.a("mat2"))
    if kt is None or kt.base != "transpose" or sorted((kt.a("dim0"), kt.a("dim1"))) not in (
            [-2, -1], [2, 3]):
        return None
    k = _input(b, _source(b, kt.a("self")))
    if q is None or k is None or v is None:
        return None
    used.add(kt.name)
    outs = [_source(b, o) for o in b.graph.outputs()]
    # every other live node must be a view on the way between the matched ones
    rest = [x for x in live if x.name not in used and x.base not in VIEWS]
    if rest or outs != [second]:
        return None
    out_node = b.node(b.graph.outputs()[0]["node"])
    return {"q": q, "k": k, "v": v, "divisor": divisor, "diagonal": diagonal,
            "out": out_node}


def lower_fused(b: Builder, pattern: dict) -> None:
    """Emit the fused kernel and its call; the output node's value is its result."""
    q, k, v, out = pattern["q"], pattern["k"], pattern["v"], pattern["out"]
    diagonal = pattern["diagonal"]
    keys = "S" if diagonal is None else f"std::min<int64_t>(S, i + {diagonal})"
    scale = lit(pattern["divisor"])
    src = f"""
void NAME(torch::Tensor q_, torch::Tensor k_, torch::Tensor v_, torch::Tensor out_) {{
    const float* __restrict__ Q = (const float*)q_.data_ptr();
    const float* __restrict__ K = (const float*)k_.data_ptr();
    const float* __restrict__ V = (const float*)v_.data_ptr();
    float* __restrict__ O = (float*)out_.data_ptr();
    const int64_t BH = q_.size(0) * q_.size(1), L = q_.size(2), D = q_.size(3);
    const int64_t S = k_.size(2), E = v_.size(3);
    const float scl = (float)({scale});
    // threads only when there is enough work to pay for waking them
    #pragma omp parallel if (BH * L * S * (D + E) > (1 << 20))
    {{
        std::vector<float> kt_(D * S), p_(S);
        float* __restrict__ kt = kt_.data();
        float* __restrict__ p = p_.data();
        #pragma omp for schedule(static)
        for (int64_t bh = 0; bh < BH; ++bh) {{
            const float* __restrict__ Kb = K + bh * S * D;
            const float* __restrict__ Vb = V + bh * S * E;
            for (int64_t j = 0; j < S; ++j)  // K's block transposed: scores run along keys
                for (int64_t t = 0; t < D; ++t) kt[t * S + j] = Kb[j * D + t];
            for (int64_t i = 0; i < L; ++i) {{
                const float* __restrict__ qi = Q + (bh * L + i) * D;
                float* __restrict__ oi = O + (bh * L + i) * E;
                const int64_t n = {keys};  // the keys row i attends to
                #pragma omp simd
                for (int64_t j = 0; j < n; ++j) p[j] = 0.0f;
                for (int64_t t = 0; t < D; ++t) {{
                    const float qv = qi[t];
                    #pragma omp simd
                    for (int64_t j = 0; j < n; ++j) p[j] += qv * kt[t * S + j];
                }}
                float m = -INFINITY, sum = 0.0f;
                #pragma omp simd reduction(max:m)
                for (int64_t j = 0; j < n; ++j) {{
                    p[j] = p[j] / scl;
                    m = p[j] > m ? p[j] : m;
                }}
                #pragma omp simd reduction(+:sum)
                for (int64_t j = 0; j < n; ++j) {{
                    const float e = expf(p[j] - m);
                    p[j] = e;
                    sum += e;
                }}
                const float inv = 1.0f / sum;
                #pragma omp simd
                for (int64_t t = 0; t < E; ++t) oi[t] = 0.0f;
                for (int64_t j = 0; j < n; ++j) {{
                    const float w = p[j] * inv;
                    const float* __restrict__ vj = Vb + j * E;
                    #pragma omp simd
                    for (int64_t t = 0; t < E; ++t) oi[t] += w * vj[t];
                }}
            }}
        }}
    }}
}}
"""
    masked = "" if diagonal is None else f", causally masked (key j < query i + {diagonal})"
    note = ("Fused attention, softmax(q @ k^T / scale" + masked + ") @ v, one OpenMP task per "
            "(batch, head): K's block transposed once into a per-thread buffer so each query "
            "row's scores are head_dim vectorised FMAs along the keys; the row's max, "
            "exponentials and sum stay in that buffer; the output row accumulates the "
            "weighted value rows, vectorised along the value dim. Only the output is written.")
    name = b.add_kernel("attention", "attn", src, "void NAME(torch::Tensor q_, torch::Tensor "
                        "k_, torch::Tensor v_, torch::Tensor out_)", note)
    buf = b.alloc(out.shape, "float32")
    b.call(name, b.val(q.name), b.val(k.name), b.val(v.name), buf)
    b.env[out.name] = buf
