"""Losses that trace to single ATen ops: mse/l1/huber/smooth-l1 (an elementwise kernel, then a
full reduction) and nll_loss (cross entropy = log-softmax kernel + this gather-reduce kernel).

Composite losses (KL divergence, cosine similarity, triplet margin, hinge) already trace to
elementwise ops and reductions, so they need no template of their own.
"""

from __future__ import annotations

from pipeline.candidates.templates import elementwise, reduction
from pipeline.candidates.templates.analysis import Node, NoTemplate
from pipeline.candidates.templates.program import Builder, acc_type, ctype


def _fake(b: Builder, like: Node, suffix: str, target: str, named: dict, meta: dict) -> Node:
    node = Node(name=f"{like.name}__{suffix}", op="call_function", target=target, args=[],
                named=named, meta=meta, users=[])
    b.graph.by_name[node.name] = node
    return node


def lower_pointwise_loss(b: Builder, node: Node) -> None:
    """(pred - target)^2, |pred - target| or Huber per element, then mean / sum / none."""
    base = node.base
    x, t = node.named["self"], node.named["target"]
    xm = b.meta(x)
    elem_meta = dict(xm, contiguous=True, offset=0, stride=elementwise._contig(xm["shape"]))
    elem_meta["dtype"] = node.dtype
    if base == "mse_loss":
        d = _fake(b, node, "d", "aten.sub.Tensor", {"self": x, "other": t}, elem_meta)
        e = _fake(b, node, "e", "aten.pow.Tensor_Scalar", {"self": {"node": d.name},
                                                           "exponent": 2}, elem_meta)
        members = [d, e]
    elif base == "l1_loss":
        d = _fake(b, node, "d", "aten.sub.Tensor", {"self": x, "other": t}, elem_meta)
        e = _fake(b, node, "e", "aten.abs", {"self": {"node": d.name}}, elem_meta)
        members = [d, e]
    elif base == "binary_cross_entropy_with_logits":
        for opt in ("weight", "pos_weight"):
            if isinstance(node.named.get(opt), dict):
                raise NoTemplate(f"binary_cross_entropy_with_logits with {opt}")
        e = _fake(b, node, "e", "aten.ks_bce_logits", {"self": x, "other": t}, elem_meta)
        members = [e]
    else:
        smooth = base == "smooth_l1_loss"
        delta = node.a("beta", 1.0) if smooth else node.a("delta", 1.0)
        if smooth and float(delta) == 0.0:
            raise NoTemplate("smooth_l1_loss with beta=0")
        e = _fake(b, node, "e", "aten.ks_huber", {"self": x, "other": t, "delta": delta,
                                                  "smooth": smooth}, elem_meta)
        members = [e]
    elementwise.lower_group(b, members)
    red = node.a("reduction", 1)
    if red == 0:
        b.env[node.name] = b.env[members[-1].name]
        return
    r = _fake(b, node, "r", "aten.mean.default" if red == 1 else "aten.sum.default",
              {"self": {"node": members[-1].name}}, node.meta)
    reduction.lower_reduction(b, r)
    b.env[node.name] = b.env[r.name]
    b.families.append("loss")


_NLL_CUDA = r"""
__global__ void K_kernel(const X_T* __restrict__ logp, const int64_t* __restrict__ target,
                         const X_T* __restrict__ weight, X_T* __restrict__ out, int64_t N,
                         int64_t C, int64_t ignore, int mean) {
    __shared__ ACC ssum[32], swt[32];
    ACC s = 0, wt = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        const int64_t t = target[i];
        if (t == ignore || t < 0 || t >= C) continue;
        const ACC w = weight ? (ACC)weight[t] : (ACC)1;
        s -= w * (ACC)logp[i * C + t];
        wt += w;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int off = 16; off > 0; off >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, off);
        wt += __shfl_xor_sync(0xffffffffu, wt, off);
    }
    if (lane == 0) { ssum[warp] = s; swt[warp] = wt; }
    __syncthreads();
    if (threadIdx.x == 0) {
        ACC ts = 0, tw = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) { ts += ssum[w]; tw += swt[w]; }
        out[0] = (X_T)(mean ? ts / tw : ts);
    }
}
void NAME(torch::Tensor logp, torch::Tensor target, torch::Tensor weight, torch::Tensor out,
          bool has_weight, int64_t ignore, bool mean) {
    const int64_t N = logp.size(0), C = logp.size(1);
    K_kernel<<<1, 1024, 0, KS_STREAM>>>((const X_T*)logp.data_ptr(),
        (const int64_t*)target.data_ptr(), has_weight ? (const X_T*)weight.data_ptr() : nullptr,
        (X_T*)out.data_ptr(), N, C, ignore, mean ? 1 : 0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""

_NLL_CPU = r"""
void NAME(torch::Tensor logp_, torch::Tensor target_, torch::Tensor weight_, torch::Tensor out_,
          bool has_weight, int64_t ignore, bool mean) {
    const int64_t N = logp_.size(0), C = logp_.size(1);
    const X_T* logp = (const X_T*)logp_.data_ptr();
    const int64_t* target = (const int64_t*)target_.data_ptr();
    const X_T* weight = has_weight ? (const X_T*)weight_.data_ptr() : nullptr;
    double s = 0, wt = 0;
    for (int64_t i = 0; i < N; ++i) {
        const int64_t t = target[i];
        if (t == ignore || t < 0 || t >= C) continue;
        const double w = weight ? (double)weight[t] : 1.0;
        s -= w * (double)logp[i * C + t];
        wt += w;
    }
    ((X_T*)out_.data_ptr())[0] = (X_T)(mean ? s / wt : s);
}
"""


def lower_nll(b: Builder, node: Node) -> None:
    """nll_loss over (N, C) log-probabilities: gather -logp[i, target[i]], weighted mean/sum."""
    x, t = node.named["self"], node.named["target"]
    xm, tm = b.meta(x), b.meta(t)
    red = node.a("reduction", 1)
    if len(xm["shape"]) != 2 or tm["dtype"] != "int64" or red not in (1, 2):
        raise NoTemplate("nll_loss beyond (N, C) inputs with mean/sum reduction")
    w = node.named.get("weight")
    has_w = isinstance(w, dict) and "node" in w
    xin, tin = b.contiguous(x), b.contiguous(t)
    wv = b.contiguous(w) if has_w else xin
    k = f"nll{len(b.kernels)}"
    src = ((_NLL_CUDA if b.cuda else _NLL_CPU).replace("K_", f"{k}_")
           .replace("X_T", ctype(xm["dtype"])).replace("ACC", acc_type(xm["dtype"])))
    note = (f"Negative log-likelihood over {xm['shape'][0]} rows: "
            + ("one 1024-thread block gathers -logp[i, target[i]] and the class weights, "
               "reduced with warp shuffles" if b.cuda else "a serial gather-sum in double")
            + f", then {'divides by the weight total (mean)' if red == 1 else 'sums'}.")
    name = b.add_kernel("loss", k, src, "void NAME(torch::Tensor logp, torch::Tensor target, "
                        "torch::Tensor weight, torch::Tensor out, bool has_weight, "
                        "int64_t ignore, bool mean)", note)
    out_meta = node.meta[0] if isinstance(node.meta, list) else node.meta
    out = b.alloc(out_meta["shape"], out_meta["dtype"])
    b.call(name, xin, tin, wv, out, str(has_w), str(node.a("ignore_index", -100)), str(red == 1))
    b.tuples[node.name] = {0: out}


LOWERINGS = {"mse_loss": lower_pointwise_loss, "l1_loss": lower_pointwise_loss,
             "huber_loss": lower_pointwise_loss, "smooth_l1_loss": lower_pointwise_loss,
             "binary_cross_entropy_with_logits": lower_pointwise_loss,
             "nll_loss_forward": lower_nll, "nll_loss": lower_nll}
