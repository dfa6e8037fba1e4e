"""The verifier's public data contract (stdlib only: the verifier runs where only torch exists).

`pipeline/` talks to the verifier through these types; verdict dicts carry exactly the fields of
`schemas.Verdict` (the pipeline converts them with `Verdict.from_dict`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

VERIFIER_VERSION = "0.1.0"

STAGES = ("extract", "static", "compile", "correctness", "performance", "done")

# Ordered from worst to best; `compiled` ends a --compile-only run; `does_not_fit` judges the
# task, not the candidate (its run cannot fit the device's memory, `verifier.judge.admission`).
STATUSES = (
    "does_not_fit",
    "format_error",
    "static_reject",
    "compile_error",
    "runtime_error",
    "timeout",
    "incorrect",
    "cheat",
    "compiled",
    "correct_slow",
    "correct_fast",
)

CORRECT_STATUSES = ("correct_slow", "correct_fast")
# No reward and no failure of the candidate: left out of training signals and pass rates.
EXCLUDED_STATUSES = ("does_not_fit",)

NAMESPACES = ("isolated", "kernelbench")
# KernelBench v0/v0.1 (the leaderboard's harness) compares every dtype at atol = rtol = 1e-2;
# its later eval.py uses 1e-4 for fp32 and 1e-2 for fp16/bf16, which is `strict` here.
KERNELBENCH_TOLERANCE = (1e-2, 1e-2)


def parse_tolerance(spec: str) -> tuple[float, float] | None:
    """(atol, rtol) for every dtype from `kernelbench` or `ATOL,RTOL`; None for `strict` (the
    atol/rtol options stand). ValueError names a bad spec."""
    if spec == "strict":
        return None
    if spec == "kernelbench":
        return KERNELBENCH_TOLERANCE
    try:
        atol, rtol = (float(x) for x in spec.split(","))
    except ValueError:  # not two numbers
        atol = rtol = float("nan")
    if not (0 <= atol < float("inf") and 0 <= rtol < float("inf")):
        raise ValueError(f"tolerance must be kernelbench, strict or ATOL,RTOL (two non-negative "
                         f"numbers), not {spec!r}")
    return atol, rtol


@dataclass
class VerifyRequest:
    """One candidate to verify against its task."""

    candidate_id: str
    task_id: str
    task_source: str  # the KernelBench reference file (Model, get_inputs, get_init_inputs)
    response: str  # raw model response (markdown with code fences) or plain Python code
    backend: str = "cpu"  # cpu | cuda | musa
    # other size sets / constructor arguments for the generalisation check (verifier.judge.variants:
    # {label, source, changes}); None: derived from task_source when options.generalize is on
    variants: list[dict[str, Any]] | None = None
    # the task's FLOPs and the bytes its work must move (`Task.flops` / `Task.bytes_moved`):
    # the physics floor a runtime cannot beat (0: unknown; the output's bytes still count)
    flops: float = 0.0
    bytes_moved: float = 0.0


@dataclass
class VerifyOptions:
    """How to verify; mirrors pipeline's VerifyConfig (kept stdlib-only here)."""

    backend: str = "auto"
    workers: int = 2
    gpus: int = 0  # GPU backends: execution workers on the first N visible GPUs (0: all)
    # GPU backends: warm standby workers per GPU replace one a candidate killed at once
    standby_worker: bool = True
    # how many (with standby_worker): a crash and its confirmation in a fresh worker take two;
    # with two, the next job waited ~10 s for a spare (an H200 KernelBench batch, 3 of them);
    # with three, an H100 batch waited 34 s in all, mostly in runs of runtime fallbacks (each a
    # cheat and its confirmation: two workers) faster than a spare starts (~12 s)
    standby_workers: int = 5
    compile_workers: int = 2
    compile_batch: int = 16  # most specs a build unit (verifier.compile.compile_plan sizes them)
    compile_timeout_s: float = 600.0
    run_timeout_s: float = 60.0
    trials: int = 5
    atol_fp32: float = 1e-4
    rtol_fp32: float = 1e-4
    atol_low: float = 1e-2
    rtol_low: float = 1e-2
    fast_threshold: float = 1.1
    perf_trials: int = 20  # timed calls at least; more until the spread is small
    perf_max_trials: int = 100
    perf_budget_s: float = 3.0  # stop adding timed calls after this (past perf_trials)
    perf_target_rel_iqr: float = 0.02  # stop when IQR / median is under this
    perf_warmup: int = 3
    repeat_timing: int = 1  # >1: time the candidate that many times (benchmarks: repeat CV)
    torch_compile_baseline: bool = False
    compile_only: bool = False
    # sandboxed runs are children forked from one server that imported torch once
    # (verifier.run.forkserver) instead of fresh interpreters; False: spawn each (slower)
    fork_server: bool = True
    memory_limit_mb: int = 8192
    build_cache_dir: str | None = None
    # after each batch the build cache is cut to this many GB, least recently used entries first
    # (verifier.compile.cache_bound: never one a running build may use); 0: no bound
    build_cache_max_gb: float = 5.0
    baseline_cache_dir: str | None = None
    seed: int = 0
    # strict (MooreEval): no library compute in forward; partial (KernelBench): library ops
    # allowed, at least one own kernel on the hot path (the own-kernel share: a diagnostic)
    fallback: str = "strict"
    # generalisation check: also correct at another size set and other constructor arguments
    # (verifier.judge.generalize); the pipeline turns it on for dataset builds
    generalize: bool = False
    # output tolerances: strict (the atol/rtol fields above: fp32 1e-4, fp16/bf16 1e-2),
    # kernelbench (1e-2 for every dtype, as KernelBench v0/v0.1 judged its leaderboard), or
    # "ATOL,RTOL" for every dtype; resolved onto the atol/rtol fields at construction
    tolerance: str = "strict"
    # isolated: the candidate runs in its own module namespace; kernelbench: it starts with the
    # reference file's globals (batch_size, helpers), as KernelBench runs both in one namespace
    namespace: str = "isolated"

    def __post_init__(self) -> None:
        if self.fallback not in ("strict", "partial"):
            raise ValueError(f"fallback must be 'strict' or 'partial', not {self.fallback!r}")
        if self.namespace not in NAMESPACES:
            raise ValueError(f"namespace must be one of {', '.join(NAMESPACES)}, not "
                             f"{self.namespace!r}")
        fixed = parse_tolerance(self.tolerance)
        if fixed is not None:
            self.atol_fp32 = self.atol_low = fixed[0]
            self.rtol_fp32 = self.rtol_low = fixed[1]

    def tolerance_policy(self) -> str:
        """The tolerances in force, as every verdict records them."""
        return (f"{self.tolerance}: fp32 atol={self.atol_fp32:g} rtol={self.rtol_fp32:g}, "
                f"fp16/bf16 atol={self.atol_low:g} rtol={self.rtol_low:g}")

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> VerifyOptions:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class VerdictData:
    """A verdict as the verifier produces it; field names match `schemas.Verdict`."""

    candidate_id: str
    task_id: str
    status: str
    stage: str
    backend: str
    device: str = ""
    verifier_version: str = VERIFIER_VERSION
    compile_log: str = ""
    error: str = ""
    trials: int = 0
    max_abs_diff: float | None = None
    mean_abs_diff: float | None = None
    mismatch_frac: float | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)  # {rule, message, line, severity}
    kernel_names: list[str] = field(default_factory=list)
    runtime_us: float | None = None
    runtime_iqr_us: float | None = None
    eager_us: float | None = None
    compiled_us: float | None = None
    speedup: float | None = None
    speedup_compiled: float | None = None
    faster: bool = False
    reward: float = 0.0
    reward_components: str = "{}"
    feedback: str = ""
    compile_s: float = 0.0
    wall_s: float = 0.0
    tolerance_policy: str = ""  # VerifyOptions.tolerance_policy(): the tolerances judged at

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
