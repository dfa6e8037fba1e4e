"""FLOPs of the ops that torch's FLOP counter leaves out: pointwise ops, reductions, norms.

`torch.utils.flop_counter` counts matmuls, convolutions and attention. Everything else is
counted here per element of the tensor the op actually walks: a pointwise op costs one FLOP per
output element, a reduction one or more per *input* element (a row-wise L2 norm of a 4096x8192
matrix squares and adds 2 * 4096 * 8192 values, it does not cost 4096). The per-element costs
below are the arithmetic of the textbook algorithm, stated once so reasoning texts and rows agree.
"""

from __future__ import annotations

# FLOPs per input element for ops that read more than they write.
PER_INPUT_ELEMENT: dict[str, int] = {
    "sum": 1, "mean": 1, "prod": 1, "amax": 1, "amin": 1, "max": 1, "min": 1, "argmax": 1,
    "argmin": 1, "all": 1, "any": 1, "count_nonzero": 1, "cumsum": 1, "cumprod": 1,
    "cummax": 1, "cummin": 1,
    "linalg_vector_norm": 2, "norm": 2,  # square (or abs) and add
    "var": 3, "std": 3, "var_mean": 3, "std_mean": 3,  # subtract the mean, square, add
    "logsumexp": 4, "logcumsumexp": 4,  # max, subtract, exp, add
    "_softmax": 5, "_log_softmax": 5,  # max, subtract, exp, add, divide (or log)
    "native_layer_norm": 8, "native_group_norm": 8, "_fused_rms_norm": 5,
    "native_batch_norm": 8, "_native_batch_norm_legit": 8,
    "_native_batch_norm_legit_no_training": 4,  # running stats: scale and shift only
}


def op_flops(op: str, largest_input: int, output: int) -> int:
    """FLOPs of one call of ATen op `op` (`aten.sum` or `sum`) that torch does not count.

    `largest_input` is the element count of its largest tensor argument, `output` of its
    (first) result.
    """
    base = op.removeprefix("aten.").split(".")[0]
    cost = PER_INPUT_ELEMENT.get(base)
    if cost is not None:
        return cost * max(largest_input, output)
    return output


def largest_numel(obj) -> int:
    """Element count of the largest tensor in an argument structure (0 without tensors)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel()
    if isinstance(obj, list | tuple):
        return max((largest_numel(o) for o in obj), default=0)
    if isinstance(obj, dict):
        return max((largest_numel(o) for o in obj.values()), default=0)
    return 0


def first_numel(obj) -> int:
    """Element count of the first tensor result (the values of a (values, indices) pair)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel()
    if isinstance(obj, list | tuple):
        return next((first_numel(o) for o in obj if first_numel(o)), 0)
    return 0
