"""Deterministic analysis text for a task: op families, level, roofline, plan, hazards.

Everything here is computed from the probe's measurements (op inventory, FLOPs, bytes, shapes),
so the same task always gets the same reasoning trace.
"""

from __future__ import annotations

import math

from schemas import OP_FAMILIES

# Named GPUs: fp32 (non-tensor-core) FLOP/s, HBM bandwidth B/s. KernelBench references run fp32.
GPUS: dict[str, dict[str, float]] = {
    "H100": {"flops": 67e12, "bandwidth": 3.35e12},
    "H200": {"flops": 67e12, "bandwidth": 4.8e12},
    "A100": {"flops": 19.5e12, "bandwidth": 2.0e12},
    "L40S": {"flops": 91.6e12, "bandwidth": 0.864e12},
    "RTX4090": {"flops": 82.6e12, "bandwidth": 1.008e12},
    "MTT-S4000": {"flops": 25e12, "bandwidth": 0.768e12},
}

# Ops that only move or reinterpret data: they do not count as compute for levels.
SHAPE_OPS = frozenset({
    "view", "reshape", "_unsafe_view", "permute", "transpose", "t", "expand", "unsqueeze",
    "squeeze", "contiguous", "clone", "slice", "select", "split", "split_with_sizes", "chunk",
    "cat", "stack", "flatten", "unflatten", "alias", "detach", "to", "_to_copy", "copy_",
    "empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "arange", "lift_fresh", "new_empty", "new_zeros", "new_ones", "unbind", "narrow", "repeat",
    "index_select", "gather", "roll", "flip", "pad", "constant_pad_nd", "as_strided",
    "_reshape_alias", "unfold", "fill_", "zero_", "scalar_tensor", "masked_fill", "where",
    "_local_scalar_dense", "item", "tril", "triu", "movedim", "einsum", "new_full", "fill",
    "_unsafe_index", "index", "repeat_interleave", "diagonal", "stride", "sym_size",
})
_FAMILY_RULES: list[tuple[str, tuple[str, ...]]] = [
    ("attention", ("scaled_dot_product", "_efficient_attention", "_flash_attention")),
    ("conv_transpose", ("convolution_backward", "conv_transpose", "_convolution_transpose")),
    ("conv", ("convolution", "conv1d", "conv2d", "conv3d", "_convolution", "conv_depthwise")),
    ("matmul", ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm", "addmv", "mv",
                "dot", "_int_mm", "einsum")),
    ("softmax", ("_softmax", "softmax", "_log_softmax", "log_softmax")),
    ("norm", ("native_layer_norm", "layer_norm", "native_batch_norm", "batch_norm",
              "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "group_norm",
              "native_group_norm", "instance_norm", "rms_norm", "_fused_rms_norm", "norm",
              "linalg_vector_norm", "rsqrt")),
    ("pooling", ("max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool", "_adaptive",
                 "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool2d",
                 "lp_pool")),
    ("loss", ("mse_loss", "nll_loss", "cross_entropy", "binary_cross_entropy", "smooth_l1",
              "huber_loss", "kl_div", "l1_loss", "margin_ranking", "hinge", "triplet",
              "cosine_embedding", "soft_margin")),
    ("scan", ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp")),
    ("embedding", ("embedding", "embedding_bag")),
    ("activation", ("relu", "gelu", "silu", "sigmoid", "tanh", "elu", "selu", "leaky_relu",
                    "hardtanh", "hardswish", "hardsigmoid", "softplus", "mish", "relu6",
                    "celu", "glu", "prelu", "_prelu_kernel", "softsign", "threshold", "rrelu",
                    "log_sigmoid_forward", "logsigmoid")),
    ("reduction", ("sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std",
                   "var_mean", "std_mean", "argmax", "argmin", "logsumexp", "all", "any",
                   "count_nonzero")),
    ("elementwise", ("add", "sub", "mul", "div", "pow", "exp", "log", "sqrt", "abs", "neg",
                     "clamp", "clamp_min", "clamp_max", "sin", "cos", "reciprocal", "erf",
                     "minimum", "maximum", "sign", "floor", "ceil", "round", "lerp",
                     "addcmul", "addcdiv", "exp2", "log1p", "expm1", "log2", "fmod",
                     "remainder", "rsub", "square", "tan", "atan", "atan2", "erfc", "trunc",
                     "frac", "sgn", "lt", "gt", "le", "ge", "eq", "ne", "logical_and",
                     "logical_or", "logical_not", "bitwise_and", "hypot", "copysign",
                     "floor_divide",
                     "sigmoid_", "mul_", "add_", "div_", "xlogy", "nan_to_num", "clip")),
]
assert all(f in OP_FAMILIES for f, _ in _FAMILY_RULES)


def _bare(op: str) -> str:
    return op.split(".", 1)[-1].rstrip("_") if op.endswith("_") and not op.endswith("__") else \
        op.split(".", 1)[-1]


def op_family(op: str) -> str:
    """The OP_FAMILIES value of one aten op name (`aten.addmm` -> `matmul`)."""
    name = _bare(op)
    if name in SHAPE_OPS:
        return "shape"
    for fam, names in _FAMILY_RULES:
        if name in names:
            return fam
    for fam, names in _FAMILY_RULES:  # prefixes: max_pool2d_with_indices, _softmax_backward, ...
        if any(name.startswith(n) for n in names if len(n) > 3):
            return fam
    return "other"


def compute_ops(ops: list[str]) -> list[str]:
    return [o for o in ops if op_family(o) != "shape"]


def op_families(ops: list[str]) -> list[str]:
    """Families in first-use order; a broadcast family is added when shapes broadcast."""
    fams: list[str] = []
    for op in ops:
        fam = op_family(op)
        if fam not in fams and (fam != "shape" or len(ops) == 1):
            fams.append(fam)
    # eager attention: a batched matmul feeding a softmax (QK^T, softmax, PV)
    if "softmax" in fams and "attention" not in fams and {"aten.bmm", "aten.matmul",
                                                          "aten.baddbmm"} & set(ops):
        fams.append("attention")
    return fams or ["other"]


def task_level(ops: list[str], op_counts: dict[str, int], num_submodules: int = 0) -> int:
    """1: one compute op; 2: a short fusable chain; 3: a block or architecture."""
    comp = compute_ops(ops)
    calls = sum(op_counts.get(o, 1) for o in comp)
    fams = {op_family(o) for o in comp}
    heavy = fams & {"matmul", "conv", "conv_transpose", "attention"}
    if calls <= 1:
        return 1
    heavy_calls = sum(op_counts.get(o, 1) for o in comp if op_family(o) in
                      ("matmul", "conv", "conv_transpose", "attention"))
    if calls <= 10 and heavy_calls <= 3 and len(heavy) <= 1:
        return 2
    return 3


def roofline(flops: float, nbytes: float, gpu: str) -> dict[str, float | str]:
    """Time estimate and the bound (compute or memory) on the named GPU."""
    spec = GPUS.get(gpu, GPUS["H100"])
    t_compute = flops / spec["flops"]
    t_memory = nbytes / spec["bandwidth"]
    intensity = flops / nbytes if nbytes else math.inf
    ridge = spec["flops"] / spec["bandwidth"]
    return {"intensity": intensity, "ridge": ridge, "est_ms": 1e3 * max(t_compute, t_memory),
            "bound": "compute" if intensity > ridge else "memory"}


def _hum(x: float, unit: str) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {suffix}{unit}"
    return f"{x:.0f} {unit}"


def _fusions(ops: list[str]) -> list[str]:
    fams = [op_family(o) for o in compute_ops(ops)]
    out = []
    for i, fam in enumerate(fams):
        nxt = fams[i + 1] if i + 1 < len(fams) else None
        if fam in ("matmul", "conv", "conv_transpose") and nxt in ("elementwise", "activation",
                                                                   "norm", "reduction"):
            out.append(f"fold the {nxt} after {fam} into its epilogue (no extra pass over the "
                       f"output)")
        if fam in ("elementwise", "activation") and nxt in ("elementwise", "activation"):
            out.append("chain the elementwise/activation ops in one kernel, one load and one "
                       "store per element")
        if fam == "norm" or (fam == "reduction" and nxt in ("elementwise", "activation")):
            out.append("compute the row statistics and apply them in the same kernel "
                       "(one read of the row for the reduction, one for the update, or one "
                       "pass with Welford)")
        if fam == "softmax":
            out.append("online softmax: max, sum of exp and normalization in one pass per row")
    seen = []
    for f in out:
        if f not in seen:
            seen.append(f)
    return seen or ["nothing to fuse beyond the single op: focus on memory coalescing and "
                    "vectorized loads"]


def _plan(fams: list[str], out_shape: list[int]) -> str:
    last = out_shape[-1] if out_shape else 1
    rows = math.prod(out_shape[:-1]) if len(out_shape) > 1 else 1
    if {"matmul", "attention"} & set(fams):
        return ("tile the output into 128x128 blocks per thread block (64x64 for small dims), "
                "each warp owning a 64x32 sub-tile, K loop staged through shared memory with "
                "double buffering; epilogue ops applied on registers before the store")
    if {"conv", "conv_transpose"} & set(fams):
        return ("implicit GEMM: one thread block per (output-channel tile, spatial tile), "
                "input patches staged in shared memory, each thread accumulating a few output "
                "pixels for a few channels")
    if {"norm", "softmax", "reduction"} & set(fams):
        return (f"one thread block (or one warp when the row is short) per row: {rows} rows of "
                f"{last} elements; warp-shuffle reduction, then a block reduction through shared "
                f"memory; each thread keeps its slice of the row in registers for the update")
    if "pooling" in fams:
        return "one thread per output element, each reading its pooling window"
    if "scan" in fams:
        return (f"one thread block per row of {last} elements: a block-wide scan (warp scans, "
                f"then a scan of the warp totals)")
    return ("a grid-stride loop, one thread per 4 elements with 128-bit vectorized loads and "
            "stores; enough blocks to fill every SM several times")


def _hazards(fams: list[str], ops: list[str]) -> list[str]:
    out = []
    names = {_bare(o) for o in ops}
    if "softmax" in fams or "attention" in fams:
        out.append("softmax overflow: subtract the row max before exp")
    if names & {"exp", "pow", "log", "div", "rsqrt", "sqrt", "reciprocal"}:
        out.append("exp/log/div/sqrt: guard against overflow, log(0) and division by values "
                   "near zero (keep the reference's eps)")
    if {"matmul", "conv", "reduction", "norm", "attention"} & set(fams):
        out.append("accumulate in fp32: low-precision accumulation over long reductions loses "
                   "digits; the tolerance is fp32 (1e-4)")
    if "norm" in fams:
        out.append("variance: use the biased estimator as the reference does, eps inside the "
                   "rsqrt")
    return out or ["no special numerical hazards; match the reference op order for bitwise-close "
                   "results"]


def reasoning_trace(*, name: str, inputs: list[dict], outputs: list[dict], ops: list[str],
                    flops: float, nbytes: float, bytes_unfused: float, level: int, gpu: str
                    ) -> str:
    """The reasoning text stored in Task.reasoning (deterministic from the analysis)."""
    fams = op_families(ops)
    roof = roofline(flops, nbytes, gpu)
    shapes_in = "; ".join(f"{s['name']}: {s['shape']} {s['dtype']}" for s in inputs)
    shapes_out = "; ".join(f"{o['shape']} {o['dtype']}" for o in outputs)
    out_shape = outputs[0]["shape"] if outputs else []
    comp = compute_ops(ops)
    edge = []
    if out_shape and out_shape[-1] % 4:
        edge.append(f"the last dim ({out_shape[-1]}) is not a multiple of 4: vectorized access "
                    "needs a scalar tail")
    if any(d % 32 for d in out_shape[-1:]):
        edge.append("rows are not a multiple of the warp size: mask the last warp")
    edge.append("bounds-check every index (the grid may overshoot the tensor)")
    if any(len(s["shape"]) != len(out_shape) for s in inputs if s.get("dtype", "").startswith(
            "float")):
        edge.append("inputs and output differ in rank: broadcasting or a reduction changes the "
                    "indexing")
    lines = [
        f"Task {name} (level {level}).",
        f"Shapes: inputs {shapes_in or 'none'}; outputs {shapes_out}.",
        f"Ops ({len(comp)} compute of {len(ops)}): {', '.join(ops) or 'none'}; families: "
        f"{', '.join(fams)}.",
        f"Work: {_hum(flops, 'FLOP')}; minimum traffic {_hum(nbytes, 'B')} (inputs, weights, "
        f"outputs), {_hum(bytes_unfused, 'B')} if every op round-trips memory.",
        f"Roofline on {gpu}: arithmetic intensity {roof['intensity']:.2f} FLOP/B vs ridge "
        f"{roof['ridge']:.1f}: {roof['bound']}-bound; estimated {roof['est_ms']:.3f} ms at peak.",
        "Fusion: " + "; ".join(_fusions(ops)) + ".",
        "Parallelization: " + _plan(fams, out_shape) + ".",
        "Numerical hazards: " + "; ".join(_hazards(fams, ops)) + ".",
        "Edge cases: " + "; ".join(edge) + ".",
    ]
    return "\n".join(lines)
