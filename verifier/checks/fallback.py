"""Fallback judged by what runs: which aten ops and device kernels ModelNew.forward really uses.

Every aten op in the dispatcher trace of forward is classified from torch's own op metadata:

- `view`: a return aliases an input without writing it (schema alias annotation `Tensor(a)`,
  e.g. view, reshape, permute, split, contiguous, flatten, expand);
- `shape`: returns only sizes/ints (`sym_size`), or an `is_*` metadata query;
- `allocation`: a factory (no Tensor argument: empty, zeros, full, arange), its `*_like` /
  `new_*` form, or a fill that never reads the tensor it writes (`VALUE_FREE`);
- `copy`: ops tagged `torch.Tag.view_copy`, in-place/out= ops whose functional form is a copy,
  and `DATA_MOVEMENT` (clone, copy_, _to_copy, cat, stack, constant padding): torch's metadata
  has no tag for "moves values without arithmetic", so these few are named;
- `random`: a factory tagged `torch.Tag.nondeterministic_seeded` (rand, randn, bernoulli);
- `compute`: everything else (mm, addmm, relu, convolution, sum, ...).

Policies (`VerifyOptions.fallback`): `strict` (default, MooreEval): any compute/random op in
forward is a fallback (cheat). `partial` (KernelBench): library ops are allowed (recorded as
warnings) as long as at least one of the candidate's own extension functions runs in forward;
the share of device time in the candidate's own kernels (GPU profiler) scales the reward.
Only torch and stdlib are imported (the verifier's rule).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import lru_cache
from typing import Any

POLICIES = ("strict", "partial")
KINDS = ("view", "shape", "allocation", "copy", "random", "compute")
DATA_MOVEMENT = frozenset({"clone", "copy", "copy_", "_to_copy", "_copy_from",
                           "_copy_from_and_resize", "cat", "stack", "constant_pad_nd", "pad",
                           "_unsafe_view", "lift_fresh_copy", "_local_scalar_dense"})
VALUE_FREE = frozenset({"fill", "fill_", "zero", "zero_", "resize_", "resize_as_", "set_"})
CAND_FILE = "candidate.py"

# what to write instead, by op family (feedback); the default covers the rest
_HINTS = (
    (("mm", "bmm", "addmm", "matmul", "linear", "baddbmm", "addbmm", "mv", "dot"),
     "a tiled matrix-multiply kernel (shared-memory tiles, or register blocking on CPU)"),
    (("convolution", "conv", "cudnn_convolution", "mkldnn_convolution"),
     "a direct or implicit-GEMM convolution kernel"),
    (("sum", "mean", "amax", "max", "min", "var", "std", "norm", "softmax", "log_softmax",
      "logsumexp", "prod", "native_layer_norm", "native_batch_norm"),
     "a reduction kernel (one block per row, tree or warp-shuffle reduction)"),
)


def _base(op_name: str) -> str:
    """`aten::relu_.default` / `aten.relu_.default` -> `relu_`."""
    name = op_name.replace("::", ".").split(".")
    return name[1] if len(name) > 1 else name[0]


def _tensor_type(t: Any) -> bool:
    s = str(t)
    return "Tensor" in s


def _overloads(base: str) -> list[str] | None:
    """The overload names of `aten::<base>` ("default" for the unnamed one), None when there is
    no such op; read from torch._C, fresh: never through `torch.ops`' Python objects, whose
    attributes (a packet under a name, an overload's `_schema` and `_tags`) a job can set for
    every later job of its worker (tests/verifier/test_redteam_round17.py)."""
    import torch

    found = torch._C._jit_get_operation(f"aten::{base}")
    if not found or found[0] is None:
        return None
    return ["default" if not o else o for o in found[1]]


def _facts(base: str, overload: str) -> tuple[Any, set[Any]]:
    """(schema, tags) of one overload, from torch._C (`_overloads`)."""
    import torch

    name = "" if overload == "default" else overload
    tags = torch._C._get_operation_overload(f"aten::{base}", name)[2]
    return torch._C._get_schema(f"aten::{base}", name), set(tags)


@lru_cache(maxsize=4096)
def op_kind(op_name: str) -> str:
    """The kind of one aten op overload, from its schema and tags (see the module doc)."""
    import torch

    ns, _, rest = op_name.replace("::", ".").partition(".")
    base, _, overload = rest.partition(".")
    if ns != "aten":
        return "other"
    try:
        overloads = _overloads(base)
        if overloads is None:
            return "compute"
        if not overload and "default" not in overloads:  # a profiler's name: the kind
            # of its overloads (`aten::empty` has memory_format, names and out, all allocation)
            plain = [o for o in overloads if "out" not in o] or overloads
            kinds = {op_kind(f"aten.{base}.{o}") for o in plain}
            return kinds.pop() if len(kinds) == 1 else op_kind(f"aten.{base}.{plain[0]}")
        schema, tags = _facts(base, overload or "default")
    except (AttributeError, RuntimeError):
        return "compute"
    if base in DATA_MOVEMENT or torch.Tag.view_copy in tags:
        return "copy"
    if base in VALUE_FREE:
        return "allocation"
    rets = schema.returns
    if any(r.alias_info is not None and not r.alias_info.is_write for r in rets):
        return "view"
    if rets and not any(_tensor_type(r.type) for r in rets):
        if all(str(r.type).replace("Sym", "") in ("int", "int[]") for r in rets) or (
                base.startswith("is_") and all(str(r.type) == "bool" for r in rets)):
            return "shape"
        return "compute"
    if any(r.alias_info is not None and r.alias_info.is_write for r in rets):
        # in-place / out= form: the kind of its functional form
        functional = base[:-1] if base.endswith("_") else base
        if functional != base:
            return functional_kind(functional)
    if not any(_tensor_type(a.type) for a in schema.arguments):
        return "random" if torch.Tag.nondeterministic_seeded in tags else "allocation"
    for prefix, suffix in (("new_", ""), ("", "_like")):
        if base.startswith(prefix) and base.endswith(suffix) and (prefix or suffix):
            factory = base[len(prefix):len(base) - len(suffix)]
            kind = functional_kind(factory)
            if kind in ("allocation", "random"):
                return kind
    return "compute"


def functional_kind(base: str) -> str:
    try:
        overloads = _overloads(base)
    except RuntimeError:
        return "compute"
    if not overloads:
        return "compute"
    name = "default" if "default" in overloads else overloads[0]
    return op_kind(f"aten.{base}.{name}")


def is_fallback(kind: str) -> bool:
    return kind in ("compute", "random")


def hint(op_name: str) -> str:
    """What to write instead of a library op (feedback)."""
    base = _base(op_name).rstrip("_")
    for names, text in _HINTS:
        if base in names:
            return f"write {text} instead of {base}"
    return f"compute {base} in your own kernel (fuse it into the kernel that produces its input)"


def _candidate_line() -> int | None:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == CAND_FILE:
            return frame.f_lineno
        frame = frame.f_back
    return None


def own_counter(own: frozenset[str]) -> tuple[Callable[..., None], list[None]]:
    """A profile function counting C calls into the modules `own` (one item appended to the
    list returned beside it a call). It looks nothing up and runs no object's code: its names
    are its defaults (which the persistent worker refuses to rewrite, `verifier.run.audit`, as
    it refuses every profile but this one: a profile's frame locals are written back into its
    frame, and a job's rebound the worker loop's, tests/verifier/test_redteam_round18.py)."""
    hits: list[None] = []

    def count(frame: Any, event: str, arg: Any, hits: list[None] = hits,
              own: frozenset[str] = own, type_: type = type, str_: type = str,
              getattr_: Callable[..., Any] = getattr) -> None:
        if event == "c_call" and type_(m := getattr_(arg, "__module__", None)) is str_ and (
                m in own):
            hits.append(None)

    return count, hits


def make_trace_mode() -> Any:
    """A TorchDispatchMode recording (op, candidate line) and counting calls into the
    candidate's extension functions (`own_calls`, via a profile hook on C calls: `own_counter`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from verifier.checks.extspec import OWN_MODULES

    class OpTrace(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[tuple[str, int | None]] = []
            self._count, self._hits = own_counter(frozenset(map(str, OWN_MODULES)))
            self._prev: Callable | None = None

        @property
        def own_calls(self) -> int:
            return len(self._hits)

        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            self.ops.append((str(func), _candidate_line()))
            return func(*args, **(kwargs or {}))

        def __enter__(self) -> OpTrace:
            self._prev = sys.getprofile()
            profile = self._count  # (the worker's audit hook checks it: `audit.harness_profile`)
            sys.setprofile(profile)
            return super().__enter__()

        def __exit__(self, *exc: Any) -> Any:
            profile = self._prev
            sys.setprofile(profile)
            return super().__exit__(*exc)

    return OpTrace()


def judge_ops(events: list[tuple[str, int | None]], policy: str,
              own_calls: int) -> tuple[list[dict[str, Any]], str]:
    """(findings, cheat message or "") for the traced ops of forward under `policy`."""
    if policy not in POLICIES:
        raise ValueError(f"fallback policy {policy!r} is not one of {', '.join(POLICIES)}")
    # each job's kinds its own: an earlier job of the worker that asked `op_kind` while
    # `torch.ops.aten.<op>` was an object of its own (then deleted) left "compute" cached for
    # torch.empty_like: an honest sibling was a cheat (tests/verifier/test_redteam_round17.py)
    op_kind.cache_clear()
    first_line: dict[str, int | None] = {}
    for op, line in events:
        if op.startswith("aten") and is_fallback(op_kind(op)):
            first_line.setdefault(op, line)
    severity = "error" if policy == "strict" else "warning"
    findings = [{"rule": "aten_fallback", "severity": severity, "line": line,
                 "message": f"forward ran {op} ({op_kind(op)}) through torch"
                            + (f" at line {line}" if line else "") + f"; {hint(op)}"}
                for op, line in first_line.items()]
    if policy == "strict" and findings:
        return findings, "forward computes with torch ops: " + ", ".join(
            f"{op}" + (f" (line {ln})" if ln else "") for op, ln in list(first_line.items())[:5])
    if policy == "partial" and own_calls == 0:
        findings.append({"rule": "no_own_kernel", "severity": "error", "line": None,
                         "message": "forward never called the candidate's own extension"})
        return findings, "forward computes only with torch: no function of the candidate's " \
                         "extension ran"
    return findings, ""


def kernel_times(fn: Callable[[], Any], device: str) -> list[tuple[str, float]]:
    """(kernel name, device microseconds) of every kernel one `fn()` launches (profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with torch.no_grad(), profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize()
    out: list[tuple[str, float]] = []
    for evt in prof.events():
        if getattr(evt, "device_type", None) == torch.autograd.DeviceType.CUDA:
            us = getattr(evt, "device_time", None)
            out.append((evt.name, float(us if us is not None else evt.cuda_time)))
    return out


def own_share(times: list[tuple[str, float]], own: set[str]) -> tuple[float | None, int]:
    """(share of device time in the candidate's own kernels, number of own launches); memory
    traffic (fills, copies) counts for neither side. None when nothing ran on the device."""
    from verifier.backends.gpu_anticheat import classify_kernel, kernel_base_name

    own_us = lib_us = 0.0
    n_own = 0
    for name, us in times:
        if kernel_base_name(name) in own and classify_kernel(name, own) is None:
            own_us += us
            n_own += 1
        elif classify_kernel(name, own) is not None:
            lib_us += us
    total = own_us + lib_us
    return (round(own_us / total, 4) if total > 0 else None), n_own


def judge_kernels(backend: Any, sources: list[str], call: Callable[[], Any],
                  policy: str) -> tuple[list[str], list[dict[str, Any]], float | None, str]:
    """(kernel names, findings, own-kernel device-time share, cheat message or "") for one
    forward on a GPU backend. strict: a library kernel is a fallback; partial: library kernels
    are warnings, but at least one own kernel must run. The share is measured on CUDA."""
    from verifier.backends.gpu_anticheat import candidate_kernel_names

    share = None
    if str(backend.device()).startswith("cuda"):
        times = kernel_times(call, backend.device())
        names = list(dict.fromkeys(n for n, _ in times))
        share, n_own = own_share(times, candidate_kernel_names(sources))
    else:
        names, n_own = backend.kernel_names(call), -1  # -1: own launches not observable
    findings = backend.kernel_findings(names, sources)
    bad = next((f for f in findings if f["severity"] == "error"), None)
    if policy == "partial":
        for f in findings:
            f["severity"] = "warning"
        if n_own == 0 and names:
            return names, findings, share, "no kernel of the candidate's own ran in forward " \
                                           "(only library kernels)"
        return names, findings, share, ""
    if bad is not None:
        return names, findings, share, f"{bad['message']}: the computation fell back to a " \
                                       "library instead of the candidate's code"
    return names, findings, share, ""


# static rules that only say "a library computes here": errors under strict, warnings (kept in
# the verdict) under partial, where the dispatcher trace and the profiler judge what ran
LIBRARY_RULES = frozenset({"torch_compute", "nn_layer", "try_fallback", "cpp_torch_compute"})


def apply_policy(findings: list[dict[str, Any]], policy: str) -> list[dict[str, Any]]:
    """The static findings with library-compute rules downgraded under `partial`."""
    if policy == "partial":
        for f in findings:
            if f["rule"] in LIBRARY_RULES:
                f["severity"] = "warning"
    return findings


def errors(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if f.get("severity", "error") == "error"]
