"""Pipeline statistics: the funnel, pass rates by slice, the metrics the field reports, speedup
quantiles and a compile-error taxonomy. Plain dicts, so they go to JSON, the card and the report.

Metrics follow their sources: pass@k is the unbiased estimator of Chen et al. (2021),
`1 - C(n-c, k) / C(n, k)` averaged over tasks with n >= k; fast_p is KernelBench's share of
(task, sample) pairs that are correct and faster than eager by more than p, averaged per task.
Sample-based metrics count only independent samples of a model (llm:, hf:, import:), not
template variants (the teacher's deterministic strategy family: a pass rate over them is no
model's pass@k), mutations (bugs on purpose) or repair turns (conditioned on an earlier attempt).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from schemas import Candidate, Rejection, Task, Verdict
from verifier.protocol import CORRECT_STATUSES, EXCLUDED_STATUSES

PASSED_COMPILE = frozenset({"runtime_error", "timeout", "incorrect", "cheat", "compiled",
                            *CORRECT_STATUSES})
CURATE_STAGES = frozenset({"curate", "dedup", "decontaminate", "decontamination"})
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
# Histogram bins of log2(speedup), shared by the report.
SPEEDUP_BINS = [float(x) for x in np.arange(-4.0, 4.01, 0.5)]

# (class, pattern) in priority order; the first that matches the compile log wins.
COMPILE_ERROR_CLASSES: list[tuple[str, re.Pattern[str]]] = [
    ("timeout", re.compile(r"timed? ?out|timeout", re.I)),
    ("toolchain_missing", re.compile(r"nvcc: not found|command not found|no such file or "
                                     r"directory.*(nvcc|cuda)|CUDA_HOME|ninja.*not", re.I)),
    ("link_error", re.compile(r"undefined reference|undefined symbol|multiple definition|ld "
                              r"returned", re.I)),
    ("undeclared_identifier", re.compile(r"is undefined|was not declared|undeclared identifier|"
                                         r"not declared in this scope|unknown type name", re.I)),
    ("overload_mismatch", re.compile(r"no matching function|no instance of (overloaded )?"
                                     r"function|no suitable (conversion|constructor)", re.I)),
    ("type_error", re.compile(r"cannot convert|invalid conversion|incompatible|a value of type|"
                              r"invalid operands", re.I)),
    ("missing_member", re.compile(r"has no member|is not a member", re.I)),
    ("redefinition", re.compile(r"redefinition|already defined", re.I)),
    ("syntax_error", re.compile(r"expected (a |an )?['\"`]?\S|syntax error|unterminated|"
                                r"stray", re.I)),
    ("resource_limit", re.compile(r"ptxas|too much shared data|uses too much|out of "
                                  r"registers", re.I)),
    ("python_error", re.compile(r"Traceback|Error:|SyntaxError|NameError", re.I)),
]


# Every metric this module reports, defined once; the card and the report print these texts.
METRIC_DEFINITIONS: dict[str, str] = {
    "pass@k": "unbiased pass@k (Chen et al. 2021), 1 - C(n-c, k) / C(n, k) per task over its n "
              "independent samples (c correct), averaged over tasks with n >= k",
    "avg@k": "c / n per task (share of its independent samples that are correct), averaged "
             "over the tasks with n >= k",
    "pass@k_tasks": "number of tasks with at least k independent samples (the pass@k "
                    "denominator)",
    "fast_p": "KernelBench fast_p: per task, the share of independent samples that are correct "
              "and faster than eager by more than p, averaged over tasks",
    "candidate_pass_rate": "correct candidates / verified candidates, all generators pooled",
    "first_attempt_pass_rate": "correct first-attempt candidates / first-attempt candidates "
                               "(turn 0, not mutations), pooled over tasks",
    "repair_pass_rate": "correct repair turns / repair turns (turn > 0), pooled",
    "faster_than_eager": "correct candidates with speedup over eager > 1 / correct candidates "
                         "with an eager timing",
    "faster_than_compile": "correct candidates faster than torch.compile / correct candidates "
                           "with a torch.compile timing",
    "faster_than_eager_n": "correct candidates with an eager timing",
    "faster_than_compile_n": "correct candidates with a torch.compile timing",
}


def format_value(v: Any) -> str:
    """A metric value as cards and reports print it (4 significant digits; n/a for None)."""
    if v is None:
        return "n/a"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def metric_definition(name: str) -> str:
    """The definition of a metric key as it appears in `compute_stats()["metrics"]`."""
    if name in METRIC_DEFINITIONS:
        return METRIC_DEFINITIONS[name]
    for pattern, generic in ((r"pass@\d+_tasks", "pass@k_tasks"), (r"pass@\d+", "pass@k"),
                             (r"avg@\d+", "avg@k"), (r"fast_[\d.]+", "fast_p")):
        if re.fullmatch(pattern, name):
            return METRIC_DEFINITIONS[generic]
    raise KeyError(f"metric {name!r} has no definition in METRIC_DEFINITIONS")


def first_attempts(cands: list[Candidate]) -> list[Candidate]:
    """First-attempt candidates: turn 0 and not a mutation (bugs on purpose)."""
    return [c for c in cands if c.turn == 0 and not c.generator.startswith("mutate:")]


def pooled_rates(cands: list[Candidate], vmap: dict[str, Verdict]) -> dict[str, float | None]:
    """candidate_pass_rate, first_attempt_pass_rate and repair_pass_rate (METRIC_DEFINITIONS)."""
    ok = {cid for cid, v in vmap.items() if v.status in CORRECT_STATUSES}
    judged = [c for c in cands if c.candidate_id in vmap]
    first = [c for c in first_attempts(cands) if c.candidate_id in vmap]
    repairs = [c for c in judged if c.turn > 0]
    return {
        "candidate_pass_rate": _rate(sum(c.candidate_id in ok for c in judged), len(judged)),
        "first_attempt_pass_rate": _rate(sum(c.candidate_id in ok for c in first), len(first)),
        "repair_pass_rate": _rate(sum(c.candidate_id in ok for c in repairs), len(repairs)),
    }


def classify_compile_error(log: str) -> str:
    """The error class of a compile log (first matching rule), `other` when none matches."""
    for name, pattern in COMPILE_ERROR_CLASSES:
        if pattern.search(log):
            return name
    return "other"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with n samples of which c are correct (requires n >= k)."""
    if n < k:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def generator_group(generator: str) -> str:
    """Slice key for a generator: llm:/hf: keep the model, others keep their kind."""
    kind, _, rest = generator.partition(":")
    return generator if kind in ("llm", "hf") else kind


def is_sample(cand: Candidate) -> bool:
    """Whether a candidate is an independent sample of a model (not a template variant, a
    mutation or a repair turn)."""
    return generator_group(cand.generator) not in ("mutate", "repair", "template")


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


def _slice(rows: list[tuple[str, Verdict]]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Verdict]] = defaultdict(list)
    for key, v in rows:
        groups[key].append(v)
    out = {}
    for key in sorted(groups):
        vs = groups[key]
        correct = sum(v.status in CORRECT_STATUSES for v in vs)
        out[key] = {"verified": len(vs), "correct": correct, "pass_rate": correct / len(vs),
                    "faster": sum(v.faster for v in vs)}
    return out


def compute_stats(tasks: list[Task], candidates: list[Candidate], verdicts: list[Verdict], *,
                  sourced: int | None = None, rejections: list[Rejection] | None = None,
                  ks: tuple[int, ...] = (1, 5, 10), fast_threshold: float = 1.1
                  ) -> dict[str, Any]:
    """All statistics as a JSON-ready dict (`funnel`, `metrics`, slices, `speedup`, ...)."""
    task_map = {t.task_id: t for t in tasks}
    cand_map = {c.candidate_id: c for c in candidates}
    # a task whose run cannot fit the device says nothing of its candidates: left out
    vmap = {v.candidate_id: v for v in verdicts if v.status not in EXCLUDED_STATUSES}
    rejections = rejections or []
    curated_out = sum(r.stage in CURATE_STAGES for r in rejections)
    verified = [(cand_map[cid], v) for cid, v in vmap.items() if cid in cand_map]
    funnel = {
        "sourced": sourced if sourced is not None else len({t.module_id for t in tasks}),
        "tasks": len(tasks) + curated_out,
        "deduped": len(tasks),
        "generated": len(candidates),
        "verified": len(verified),
        "compiled": sum(v.status in PASSED_COMPILE for _, v in verified),
        "correct": sum(v.status in CORRECT_STATUSES for _, v in verified),
        "faster": sum(bool(v.faster) for _, v in verified),
        "tasks_solved": len({c.task_id for c, v in verified if v.status in CORRECT_STATUSES}),
    }

    samples: dict[str, list[Verdict]] = defaultdict(list)
    for c, v in verified:
        if is_sample(c):
            samples[c.task_id].append(v)
    metrics: dict[str, Any] = {}
    for k in ks:
        eligible = [vs for vs in samples.values() if len(vs) >= k]
        if not eligible:
            continue
        metrics[f"pass@{k}"] = float(np.mean([
            pass_at_k(len(vs), sum(v.status in CORRECT_STATUSES for v in vs), k)
            for vs in eligible]))
        # avg@k: expected share correct among k samples, estimated by c/n per task.
        metrics[f"avg@{k}"] = float(np.mean([
            sum(v.status in CORRECT_STATUSES for v in vs) / len(vs) for vs in eligible]))
        metrics[f"pass@{k}_tasks"] = len(eligible)
    for p in (1.0, fast_threshold):
        if samples:
            metrics[f"fast_{p:.1f}"] = float(np.mean([
                sum(v.status in CORRECT_STATUSES and (v.speedup or 0.0) > p for v in vs) / len(vs)
                for vs in samples.values()]))
    metrics.update(pooled_rates(candidates, vmap))
    correct = [v for _, v in verified if v.status in CORRECT_STATUSES]
    with_eager = [v for v in correct if v.speedup is not None]
    with_comp = [v for v in correct if v.speedup_compiled is not None]
    metrics["faster_than_eager"] = _rate(sum(v.speedup > 1.0 for v in with_eager), len(with_eager))
    metrics["faster_than_compile"] = _rate(sum(v.speedup_compiled > 1.0 for v in with_comp),
                                           len(with_comp))
    metrics["faster_than_eager_n"] = len(with_eager)
    metrics["faster_than_compile_n"] = len(with_comp)

    speedups = np.array([v.speedup for v in with_eager if v.speedup > 0], dtype=float)
    speedup: dict[str, Any] = {"n": int(speedups.size)}
    if speedups.size:
        speedup.update({f"p{int(q * 100)}": float(np.quantile(speedups, q)) for q in QUANTILES})
        speedup["geomean"] = float(np.exp(np.log(speedups).mean()))
        speedup["max"] = float(speedups.max())
        logs = np.clip(np.log2(speedups), SPEEDUP_BINS[0], SPEEDUP_BINS[-1])
        speedup["histogram"] = {"bins_log2": SPEEDUP_BINS,
                                "counts": np.histogram(logs, bins=SPEEDUP_BINS)[0].tolist()}

    by_level = _slice([(f"level {task_map[c.task_id].level}", v) for c, v in verified
                       if c.task_id in task_map])
    by_family = _slice([(fam, v) for c, v in verified if c.task_id in task_map
                        for fam in (task_map[c.task_id].op_families or ["other"])])
    by_source = _slice([(task_map[c.task_id].source_kind or "unknown", v) for c, v in verified
                        if c.task_id in task_map])
    by_generator = _slice([(generator_group(c.generator), v) for c, v in verified])
    taxonomy = Counter(classify_compile_error(v.compile_log or v.error)
                       for _, v in verified if v.status == "compile_error")
    statuses = Counter(v.status for _, v in verified)
    rejected = Counter(f"{r.stage}:{r.reason}" for r in rejections)
    return {
        "funnel": funnel, "metrics": metrics, "speedup": speedup,
        "by_level": by_level, "by_op_family": by_family, "by_source": by_source,
        "by_generator": by_generator, "statuses": dict(sorted(statuses.items())),
        "compile_errors": dict(taxonomy.most_common()),
        "rejections": dict(rejected.most_common()),
    }


NOT_COMPILED = frozenset({"format_error", "static_reject", "compile_error"})


def backend_funnel(sourced: int, tasks: list[Task], candidates: list[Candidate],
                   verdicts: list[Verdict], backend: str) -> dict[str, Any]:
    """The build's funnel for one backend: counts and rates over the whole workspace."""
    vmap = {v.candidate_id: v for v in verdicts}
    cands = [c for c in candidates if c.backend == backend]
    judged = [(c, vmap[c.candidate_id]) for c in cands if c.candidate_id in vmap]
    correct = [(c, v) for c, v in judged if v.status in CORRECT_STATUSES]
    pooled = pooled_rates(cands, vmap)
    speedups = [v.speedup for _, v in correct if v.speedup is not None]
    verified = len(judged)
    compiled = sum(v.status not in NOT_COMPILED for _, v in judged)
    faster = sum(v.status == "correct_fast" for _, v in judged)
    rate = lambda a, n: round(a / n, 4) if n else None  # noqa: E731
    return {
        "sourced_modules": sourced, "tasks": len(tasks), "candidates": len(cands),
        "verified": verified, "compiled": compiled, "correct": len(correct), "faster": faster,
        "tasks_solved": len({c.task_id for c, _ in correct}),
        "compile_rate": rate(compiled, verified), "pass_rate": rate(len(correct), verified),
        "first_attempt_pass_rate": _round(pooled["first_attempt_pass_rate"]),
        "repair_pass_rate": _round(pooled["repair_pass_rate"]), "fast_rate": rate(faster, verified),
        "median_speedup": round(float(np.median(speedups)), 3) if speedups else None,
        "max_speedup": round(float(max(speedups)), 3) if speedups else None,
    }
