"""What the probe measures on a module's forward: the aten op inventory, FLOPs and bytes, the shapes
each statement of forward produces, and the validity checks (constant, input-independent,
nondeterministic, input-mutating outputs).
"""

from __future__ import annotations

import sys
import time

from pipeline.tasks.annotate.flops import first_numel, largest_numel, op_flops
from pipeline.tasks.probe.runtime import (
    ProbeReject,
    dtype_name,
    load_torch,
    tensor_outputs,
)

# --- op inventory, flops, bytes, per-line shapes -----------------------------------------------


def _op_recorder():
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpRecorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []
            self.counts: dict[str, int] = {}
            self.traffic = 0
            self.pointwise = 0

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket).replace("aten::", "aten.")
            if name.startswith("aten."):
                if name not in self.counts:
                    self.ops.append(name)
                self.counts[name] = self.counts.get(name, 0) + 1
            self.traffic += _nbytes(args) + _nbytes(kwargs) + _nbytes(out)
            if func.overloadpacket not in _counted() and name.split(".")[-1] not in _NO_FLOPS:
                self.pointwise += op_flops(name, largest_numel((args, kwargs)), first_numel(out))
            return out

    return OpRecorder()


_NO_FLOPS = frozenset({
    "view", "reshape", "_unsafe_view", "permute", "transpose", "t", "expand", "unsqueeze",
    "squeeze", "contiguous", "clone", "slice", "select", "split", "split_with_sizes", "cat",
    "stack", "alias", "detach", "_to_copy", "copy_", "empty", "zeros", "ones", "full",
    "arange", "lift_fresh", "unbind", "as_strided", "_reshape_alias", "new_empty", "new_zeros",
    "empty_like", "zeros_like", "ones_like", "full_like", "index_select", "embedding",
    "_local_scalar_dense", "fill_", "zero_", "index", "gather", "constant_pad_nd", "roll",
})


def _counted():
    from torch.utils.flop_counter import flop_registry

    return flop_registry


def _numel(obj) -> int:
    torch = load_torch()
    if isinstance(obj, torch.Tensor):
        return obj.numel()
    if isinstance(obj, list | tuple):
        return sum(_numel(o) for o in obj)
    return 0


def _nbytes(obj) -> int:
    torch = load_torch()
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, list | tuple):
        return sum(_nbytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_nbytes(o) for o in obj.values())
    return 0


class _LineShapes:
    """sys.settrace hook: tensor locals of `forward` before each line runs (first pass only)."""

    def __init__(self, code):
        self.code = code
        self.before: dict[int, dict] = {}

    def _snap(self, frame) -> dict:
        torch = load_torch()
        snap = {}
        for k, v in frame.f_locals.items():
            if isinstance(v, torch.Tensor):
                snap[k] = [list(v.shape), dtype_name(v.dtype)]
            elif isinstance(v, tuple) and v and all(isinstance(t, torch.Tensor) for t in v):
                snap[k] = [[list(t.shape) for t in v], "tuple"]
        return snap

    def __call__(self, frame, event, arg):
        if frame.f_code is not self.code:
            return None
        return self._local

    def _local(self, frame, event, arg):
        if event == "line" and frame.f_lineno not in self.before:
            self.before[frame.f_lineno] = self._snap(frame)
        return self._local


def analyze_run(model, inputs: list, trace_lines: bool) -> dict:
    """One forward under the op recorder, the FLOP counter and (optionally) the line tracer."""
    torch = load_torch()
    from torch.utils.flop_counter import FlopCounterMode

    rec = _op_recorder()
    flop = FlopCounterMode(display=False)
    tracer = _LineShapes(type(model).forward.__code__) if trace_lines else None
    if tracer:
        sys.settrace(tracer)
    try:
        with torch.no_grad(), flop, rec:
            out = model(*inputs)
    finally:
        if tracer:
            sys.settrace(None)
    outs = tensor_outputs(out)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    ideal = _nbytes(inputs) + _nbytes(outs) + params + buffers
    return {
        "ops": rec.ops, "op_counts": rec.counts,
        "flops": float(flop.get_total_flops() + rec.pointwise),
        "bytes": float(ideal), "bytes_unfused": float(rec.traffic),
        "outputs": [{"shape": list(o.shape), "dtype": dtype_name(o.dtype)} for o in outs],
        "lines": {str(k): v for k, v in (tracer.before.items() if tracer else [])},
        "param_bytes": float(params + buffers),
    }


# --- validity --------------------------------------------------------------------------------


def check_validity(model, inputs: list, make_inputs) -> dict:
    """Run on CPU: deterministic, input-dependent, non-constant, not near zero, no mutation."""
    torch = load_torch()
    clones = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    t0 = time.perf_counter()
    with torch.no_grad():
        out1 = tensor_outputs(model(*inputs))
    ms = (time.perf_counter() - t0) * 1e3
    mutated = [i for i, (a, b) in enumerate(zip(inputs, clones, strict=True))
               if isinstance(a, torch.Tensor) and not torch.equal(a, b)]
    if mutated:
        raise ProbeReject("mutates_inputs", f"forward modifies input {mutated[0]} in place")
    with torch.no_grad():
        out2 = tensor_outputs(model(*clones))
    for a, b in zip(out1, out2, strict=True):
        if a.shape != b.shape or not torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)):
            raise ProbeReject("nondeterministic", "two runs on the same inputs differ")
    floats = [o for o in out1 if o.is_floating_point() or o.is_complex()]
    for o in floats:
        if o.numel() and not bool(torch.isfinite(o).all()):
            raise ProbeReject("not_finite", "output has inf or nan")
    if all(o.numel() == 0 for o in out1):
        raise ProbeReject("empty_output", "every output is empty")
    numeric = [o.double() if not o.is_complex() else o.abs().double() for o in out1 if o.numel()]
    if all(bool((o == o.flatten()[0]).all()) for o in numeric):
        raise ProbeReject("constant_output", "every output element is the same value")
    if floats and all(float(o.abs().max()) < 0.01 for o in floats if o.numel()):
        raise ProbeReject("near_zero_output", "all outputs have |y| < 0.01")
    torch.manual_seed(1234)
    other = make_inputs()
    with torch.no_grad():
        out3 = tensor_outputs(model(*other))
    same = all(a.shape == b.shape and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
               for a, b in zip(out1, out3, strict=True))
    if same and any(isinstance(x, torch.Tensor) and x.numel() > 1 for x in inputs):
        raise ProbeReject("input_independent", "outputs do not change when the inputs change")
    return {"cpu_ms": ms, "abs_mean": [float(o.double().abs().mean()) for o in numeric]}
