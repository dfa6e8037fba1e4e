"""Rows of the two analysis configs: `review` (find the bug injected into a verified kernel) and
`perf_analysis` (explain a measured kernel's bottleneck against the device's roofline).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from pipeline.datasets.pairs import (
    MAX_KIND_SHARE,
    MAX_SHALLOW_SHARE,
    SHALLOW_KINDS,
    apply_label,
    fix_label,
    mutant_configs,
    normalise_code,
    verified_codes,
)
from pipeline.datasets.selection import kernel_features
from pipeline.prompts import reference_for, task_meta
from schemas import Candidate, Message, PerfAnalysisRow, ReviewRow, Task, Verdict, content_hash
from verifier.protocol import CORRECT_STATUSES

REVIEW_SYSTEM = (
    "You are an expert reviewer of {device} kernels. Find the bug in the kernel, give its line "
    "number and the fix."
)
REVIEW_DEVICE = {"cpu": "C++ (CPU)", "cuda": "CUDA (GPU)", "musa": "MUSA (GPU)"}


def review_system(backend: str) -> str:
    """The review rows' system prompt, naming the backend the kernels were made and checked for
    (a CPU row's reviewer is not a GPU reviewer)."""
    return REVIEW_SYSTEM.format(device=REVIEW_DEVICE.get(backend, backend))
PERF_SYSTEM = (
    "You are an expert GPU performance engineer. Given a verified kernel and its measurements, "
    "explain the bottleneck and the next optimization to try."
)
PERF_SYSTEM_CPU = (
    "You are an expert CPU performance engineer for C++ (OpenMP) kernels. Given a verified "
    "kernel and its measurements, explain the bottleneck and the next optimization to try."
)
# Peak fp32 FLOP/s and memory bandwidth (B/s) of devices we can name a roofline for.
DEVICE_PEAKS: dict[str, tuple[float, float]] = {
    "H200": (67e12, 4.8e12), "H100": (67e12, 3.35e12), "A100": (19.5e12, 2.0e12),
    "L40S": (91.6e12, 0.864e12), "A10": (31.2e12, 0.6e12), "V100": (15.7e12, 0.9e12),
    "T4": (8.1e12, 0.32e12), "MTT S4000": (25e12, 0.768e12),
}


def _mutation_facts(cand: Candidate) -> tuple[str, str]:
    """(bug kind, description) from the metadata `pipeline.candidates.mutate` writes."""
    meta = cand.meta_dict()
    inner = meta.get("mutation") if isinstance(meta.get("mutation"), dict) else {}
    info = {**meta, **inner}

    def pick(*keys: str) -> Any:
        return next((info[k] for k in keys if isinstance(info.get(k), str | int | float)
                     and str(info[k]).strip()), None)

    kind = str(pick("kind", "bug_kind", "mutation") or cand.generator.split(":", 1)[-1])
    desc = str(pick("bug_description", "description", "explanation", "message") or "")
    return kind, desc


def fix_source(cand: Candidate, by_id: dict[str, Candidate]) -> str | None:
    """The program a mutant was made from: its parent, the candidate its metadata names as the
    fix, or the fix code its metadata carries (None when it names none)."""
    meta = cand.meta_dict()
    parent = by_id.get(cand.parent_id or "") or by_id.get(str(meta.get("fix_candidate_id", "")))
    if parent is not None:
        return parent.code
    fix = meta.get("fix_code") or meta.get("fixed_code")
    return fix if isinstance(fix, str) and fix.strip() else None


def _fix_text(line: int, action: str, new: list[str]) -> str:
    body = "\n".join(s.strip() for s in new)
    if action == "insert":
        return f"Insert before line {line}:\n```\n{body}\n```"
    if action == "delete":
        return f"Delete line {line}."
    return f"Replace line {line} with:\n```\n{body}\n```"


def review_rows(tasks: dict[str, Task], all_cands: list[Candidate],
                verdicts: dict[str, Verdict], splits: dict[str, str]) -> list[ReviewRow]:
    """Find-the-bug rows from the mutants given to `review`, each label checked.

    The label (line and fix) is the one edit between the mutant and the kernel it was made
    from; a row is kept only when the mutant failed verification and applying its label gives
    a program the verifier passed (the same task and backend), so every labelled fix is verified.
    """
    by_id = {c.candidate_id: c for c in all_cands}
    owner = mutant_configs(all_cands, verdicts)
    passed = verified_codes(all_cands, verdicts)
    rows = []
    for c in all_cands:
        if not c.generator.startswith("mutate:") or owner.get(c.candidate_id) != "review":
            continue
        v = verdicts.get(c.candidate_id)
        if v is None or v.status in CORRECT_STATUSES:
            continue  # unverified, or the mutation did not change behaviour: no bug to find
        source = fix_source(c, by_id)
        label = fix_label(c.code, source) if source is not None else None
        if label is None:
            continue
        line, action, new = label
        fixed = normalise_code(apply_label(c.code, line, action, new))
        if fixed not in passed.get((c.task_id, c.backend), set()):
            continue  # the labelled fix was never verified correct
        kind, desc = _mutation_facts(c)
        task = tasks[c.task_id]
        numbered = "\n".join(f"{i:4d} | {s}" for i, s in enumerate(c.code.splitlines(), 1))
        user = (f"This `ModelNew` for the {c.backend} backend should match the reference below "
                "but has a bug. Name the bug, its line and the fix.\n\nReference:\n```python\n"
                f"{reference_for(task, c.backend).rstrip()}\n```\n\nKernel:\n```\n{numbered}\n```")
        lines = c.code.splitlines()
        at = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        answer = [f"Bug ({kind.replace('_', ' ')}) at line {line}"
                  + (f": `{at}`." if at and action != "insert" else ".")]
        if desc:
            answer.append(desc)
        answer.append(f"Running it gives `{v.status}`.")
        answer.append(_fix_text(line, action, new))
        messages = [Message("system", review_system(c.backend)), Message("user", user),
                    Message("assistant", "\n".join(answer))]
        rows.append(ReviewRow(row_id=content_hash("review", c.candidate_id), task_id=c.task_id,
                              candidate_id=c.candidate_id, messages=messages, bug_kind=kind,
                              bug_line=line, backend=c.backend, observed_status=v.status,
                              split=splits[c.task_id]))
    return spread_kinds(rows, lambda r: r.bug_kind)


def spread_kinds(rows: list, kind_of: Any, max_share: float = MAX_KIND_SHARE,
                 shallow: tuple[str, ...] = SHALLOW_KINDS,
                 max_shallow: float = MAX_SHALLOW_SHARE) -> list:
    """`rows` less the last ones of the commonest bug kind until none holds more than
    `max_share` of them and the `shallow` kinds together less than `max_shallow`: a reviewer
    should not learn that most bugs are casts. Rows whose kind is None (a repair chain that did
    not start from a mutant) are kept and not counted. Left as they are when fewer kinds exist
    than such a spread needs (1 / max_share)."""
    rows = list(rows)
    while True:
        counts = Counter(k for k in map(kind_of, rows) if k is not None)
        n = sum(counts.values())
        if len(counts) * max_share < 1:
            return rows
        top = max(counts, key=lambda k: counts[k])
        low = {k: counts[k] for k in shallow if counts[k]}
        if counts[top] > max_share * n:
            drop = top
        elif low and sum(low.values()) >= max_shallow * n:
            drop = max(low, key=lambda k: low[k])
        else:
            return rows
        del rows[max(i for i, r in enumerate(rows) if kind_of(r) == drop)]


FAR_BEHIND_EAGER = 5.0  # this many times slower than eager: not at a roof, whatever the intensity


def _peaks(device: str) -> tuple[float, float] | None:
    up = device.upper()
    return next((p for name, p in DEVICE_PEAKS.items() if name in up), None)


def measured_work(task: Task, backend: str) -> tuple[float, float]:
    """(FLOPs, bytes) of the file the verifier ran for `backend`: the CPU copy's own figures
    when its sizes were scaled down, (0, 0) when they are unknown (never the GPU sizes' work
    against a CPU runtime)."""
    scaled = backend == "cpu" and bool(task.cpu_source) and task.cpu_source != task.source
    if not scaled:
        return task.flops, task.bytes_moved
    meta = task_meta(task)
    try:
        return float(meta.get("cpu_flops") or 0.0), float(meta.get("cpu_bytes") or 0.0)
    except (TypeError, ValueError):
        return 0.0, 0.0


def analyse_performance(task: Task, cand: Candidate, v: Verdict) -> tuple[str, float | None, str]:
    """(bottleneck, arithmetic intensity, explanation) from measurements and kernel features,
    at the sizes that ran and in the terms of the backend that ran them."""
    f = kernel_features(cand.code)
    rt = v.runtime_us or 0.0
    flops, nbytes = measured_work(task, cand.backend)
    intensity = flops / nbytes if flops > 0 and nbytes > 0 else None
    peaks = _peaks(v.device)
    speedup = v.eager_us / rt if v.eager_us and rt else None
    facts = [f"Measured {rt:.2f} us on {v.device or v.backend}"]
    if v.eager_us:
        facts.append(f"eager PyTorch {v.eager_us:.2f} us (speedup {speedup:.2f}x)"
                     if speedup else f"eager PyTorch {v.eager_us:.2f} us")
    if v.compiled_us:
        facts.append(f"torch.compile {v.compiled_us:.2f} us")
    lines = ["; ".join(facts) + "."]
    bottleneck = "unknown"
    if rt > 0 and (flops > 0 or nbytes > 0):
        gflops, gbs = flops / (rt * 1e3), nbytes / (rt * 1e3)
        lines.append(f"The task does {flops:.3g} FLOPs over {nbytes:.3g} bytes: "
                     f"{gflops:.1f} GFLOP/s and {gbs:.1f} GB/s achieved"
                     + (f", arithmetic intensity {intensity:.2f} FLOP/byte." if intensity else "."))
        if peaks:
            pf, pb = peaks
            ideal_us = max(flops / pf, nbytes / pb) * 1e6
            ridge = pf / pb
            if ideal_us < 0.2 * rt and ideal_us < 5.0:
                bottleneck = "launch"
                lines.append(f"At peak the work would take {ideal_us:.2f} us, so the time is "
                             "dominated by launch and synchronization overhead, not by the math.")
            elif intensity is not None and intensity < ridge:
                bottleneck = "memory"
                lines.append(f"Below the ridge point of {ridge:.1f} FLOP/byte the kernel is "
                             f"memory-bound; it reaches {100 * gbs * 1e9 / pb:.0f}% of peak "
                             "bandwidth.")
            else:
                bottleneck = "compute"
                lines.append(f"Above the ridge point of {ridge:.1f} FLOP/byte the kernel is "
                             f"compute-bound; it reaches {100 * gflops * 1e9 / pf:.0f}% of peak "
                             "FP32 throughput.")
        elif intensity is not None:
            bottleneck = "memory" if intensity < 4.0 else "compute"
            if speedup is not None and speedup * FAR_BEHIND_EAGER < 1:
                # no roofline, but eager PyTorch on the same device is a floor on what it allows
                lines.append(
                    f"No roofline is known for this device, but eager PyTorch does the same work "
                    f"at {flops / (v.eager_us * 1e3):.1f} GFLOP/s and "
                    f"{nbytes / (v.eager_us * 1e3):.1f} GB/s, {1 / speedup:.0f}x this kernel: "
                    f"the {bottleneck}-heavy work ({intensity:.2f} FLOP/byte) is far from any "
                    "hardware limit, and the kernel's loop structure is what holds it back.")
            else:
                lines.append(f"With {intensity:.2f} FLOP/byte the kernel is most likely "
                             f"{bottleneck}-bound on this device (no roofline is known for it).")
    families = set(task.op_families)
    if cand.backend == "cpu":
        ideas = cpu_ideas(f, families, bottleneck, cand.code, speedup,
                          nbytes / (rt * 1e3) if rt > 0 and nbytes > 0 else None)
    else:
        ideas = gpu_ideas(f, families, bottleneck, rt,
                          nbytes / (rt * 1e3) if rt > 0 and nbytes > 0 else None)
    lines.append("Next optimization: " + "; ".join(ideas) + ".")
    return bottleneck, intensity, "\n".join(lines)


def cpu_ideas(f: Any, families: set[str], bottleneck: str, code: str = "",
              speedup: float | None = None, gbs: float | None = None) -> list[str]:
    """Next steps for a C++ (OpenMP) kernel on the CPU, read from its own code and figures."""
    ideas = []
    if not f.multithreaded:
        ideas.append("parallelize the outer loop with OpenMP")
    simd = "omp simd" in code
    # per-element offset arithmetic, unless the kernel already computes it once per row
    index_math = bool(re.search(r"rem\s*%", code)) and "const int64_t L =" not in code
    if index_math:
        ideas.append("the loop recomputes every operand's offset with `%` and `/` per element; "
                     "a row loop that computes the offsets once per row and runs along the "
                     "contiguous last dimension removes those divisions")
    if not simd and bottleneck in ("memory", "compute", "unknown"):
        at = f" at {speedup:.2f}x eager" if speedup is not None else ""
        ideas.append(f"no loop is marked `#pragma omp simd` and the build does not target the "
                     f"host's vector ISA (-march=native), which leaves it{at}: vectorise the "
                     "contiguous inner loop"
                     + (", and call the vector math library for its exp/log/tanh"
                        if re.search(r"\b(expf?|logf?|tanhf?|erff?)\s*\(", code) else ""))
    if bottleneck in ("launch", "memory") and f.n_kernels > 1:
        ideas.append(f"fuse the {f.n_kernels} loops into one pass so intermediates stay in cache")
    if families & {"matmul", "conv", "attention"} and "Bp" not in code:
        ideas.append("pack B into a contiguous panel and block the loops so tiles of both "
                     "operands stay in L1/L2 cache")
    if bottleneck == "launch":
        ideas.append("do more work per call: the fixed cost of entering the extension and "
                     "starting OpenMP threads dominates")
    if not ideas and speedup is not None:
        rate = f" at {gbs:.1f} GB/s" if gbs else ""
        ideas.append(f"the loops are already vectorised and contiguous and run {speedup:.2f}x "
                     f"eager{rate}; what remains is memory traffic, so only removing a pass "
                     "over the data (fusing with the neighbouring op) would gain more")
    return ideas or ["measure again with a larger input: the figures above leave no clear "
                     "limit to act on"]


def gpu_ideas(f: Any, families: set[str], bottleneck: str, rt: float = 0.0,
              gbs: float | None = None) -> list[str]:
    """Next steps for a CUDA/MUSA kernel on the GPU, each tied to the figure or code fact that
    calls for it."""
    ideas = []
    per_launch = f"{rt / max(f.n_kernels, 1):.2f} us per launch on average"
    if bottleneck in ("launch", "memory") and f.n_kernels > 1:
        ideas.append(f"fuse the {f.n_kernels} kernels into one ({per_launch}) so intermediates "
                     "stay on chip")
    if bottleneck == "memory" and not f.vectorized:
        rate = f" at {gbs:.1f} GB/s" if gbs else ""
        ideas.append(f"the loads are scalar{rate}: use vectorized 128-bit loads and stores "
                     "(float4)")
    if families & {"matmul", "conv", "attention"} and not f.shared_memory:
        ideas.append("no operand is staged in shared memory: tile them so each loaded element "
                     "is reused")
    if bottleneck == "compute" and families & {"matmul", "conv", "attention"} and \
            not f.tensor_cores:
        ideas.append("the inner product runs on CUDA cores: move it onto tensor cores (WMMA/MMA)")
    if families & {"reduction", "softmax", "norm"} and not f.warp_primitives:
        ideas.append("the reduction goes through shared memory only: reduce within a warp with "
                     "shuffles first")
    if bottleneck == "launch":
        ideas.append(f"at {rt:.2f} us the call is launch-bound: give each thread more work, or "
                     "capture the launches in a CUDA graph")
    return ideas or [f"tune the launch shape ({f.threads_per_block or 'unknown'} threads per "
                     f"block now) and unroll the inner loop; the structure is sound"]


def perf_rows(tasks: dict[str, Task], selected: list[Candidate], verdicts: dict[str, Verdict],
               splits: dict[str, str]) -> list[PerfAnalysisRow]:
    rows = []
    seen: set[tuple[str, str]] = set()  # one row per distinct kernel of a task
    for c in selected:
        v = verdicts[c.candidate_id]
        key = (c.task_id, content_hash(normalise_code(c.code)))
        if not v.runtime_us or key in seen:
            continue
        seen.add(key)
        task = tasks[c.task_id]
        bottleneck, intensity, text = analyse_performance(task, c, v)
        measured = [f"runtime {v.runtime_us:.2f} us (IQR {v.runtime_iqr_us or 0:.2f})"]
        if v.eager_us:
            measured.append(f"eager {v.eager_us:.2f} us")
        if v.compiled_us:
            measured.append(f"torch.compile {v.compiled_us:.2f} us")
        flops, nbytes = measured_work(task, c.backend)
        if flops or nbytes:
            measured.append(f"FLOPs {flops:.4g}, bytes moved {nbytes:.4g} (at the reference's "
                            "sizes above)")
        user = (f"Reference:\n```python\n{reference_for(task, c.backend).rstrip()}\n```\n\n"
                f"Verified kernel ({c.backend}, {v.device or 'unknown device'}):\n```python\n"
                f"{c.code.rstrip()}\n```\n\nMeasurements: " + "; ".join(measured) + ".\n"
                "What limits this kernel, and what should be optimized next?")
        system = PERF_SYSTEM_CPU if c.backend == "cpu" else PERF_SYSTEM
        messages = [Message("system", system), Message("user", user),
                    Message("assistant", text)]
        rows.append(PerfAnalysisRow(
            row_id=content_hash("perf", c.candidate_id), task_id=c.task_id,
            candidate_id=c.candidate_id, messages=messages, backend=c.backend, device=v.device,
            runtime_us=float(v.runtime_us), eager_us=v.eager_us, speedup=v.speedup,
            arithmetic_intensity=intensity, bottleneck=bottleneck, split=splits[c.task_id],
            reward=v.reward, runtime_iqr_us=v.runtime_iqr_us))
    return rows
