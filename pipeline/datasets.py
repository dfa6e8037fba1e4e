"""Dataset builders: verified records in, one Arrow table per dataset config out.

Configs (TRL conversational formats, explicit schemas from `schemas/records.py`):
`tasks`, `sft` (template/teacher kernels with reasoning), `rft` (selected verified model responses
with their group statistics), `rl` (prompt-only rows; all-failed groups as feedback-conditioned
repair prompts), `repair` (multi-turn attempt/feedback/fix chains), `preference` (correct-fast vs
incorrect or slower), `review` (find the injected bug) and `perf_analysis` (explain a measured
kernel's bottleneck). Every row carries `split`, decided by the task's dedup cluster so no
near-duplicate task sits on both sides.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import statistics
from collections import defaultdict
from typing import Any

import pyarrow as pa

from pipeline.config import Config
from pipeline.prompts import build_prompt, reference_for
from pipeline.select import SELECTORS, kernel_features
from schemas import (
    Candidate,
    Message,
    PerfAnalysisRow,
    PreferenceRow,
    RepairRow,
    ReviewRow,
    RftRow,
    RlRow,
    SftRow,
    Task,
    Verdict,
    content_hash,
)
from verifier.protocol import CORRECT_STATUSES

CONFIGS = ("tasks", "sft", "rft", "rl", "repair", "preference", "review", "perf_analysis")

REVIEW_SYSTEM = (
    "You are an expert GPU kernel reviewer. Find the bug in the kernel, give its line number and "
    "the fix."
)
PERF_SYSTEM = (
    "You are an expert GPU performance engineer. Given a verified kernel and its measurements, "
    "explain the bottleneck and the next optimization to try."
)
# Peak fp32 FLOP/s and memory bandwidth (B/s) of devices we can name a roofline for.
DEVICE_PEAKS: dict[str, tuple[float, float]] = {
    "H200": (67e12, 4.8e12), "H100": (67e12, 3.35e12), "A100": (19.5e12, 2.0e12),
    "L40S": (91.6e12, 0.864e12), "A10": (31.2e12, 0.6e12), "V100": (15.7e12, 0.9e12),
    "T4": (8.1e12, 0.32e12), "MTT S4000": (25e12, 0.768e12),
}


# --- splits ----------------------------------------------------------------------------------


def assign_splits(tasks: list[Task], validation_fraction: float) -> dict[str, str]:
    """task_id -> train | validation, decided per dedup cluster (stable across versions).

    A cluster goes to validation when its hash falls below the fraction, so adding tasks never
    moves an existing cluster; when that leaves validation empty and there are two or more
    clusters, the lowest-hash cluster is moved so every version has a validation split.
    """
    clusters = {t.task_id: (t.dedup_cluster or t.task_id) for t in tasks}
    position = {c: int(hashlib.sha256(c.encode()).hexdigest()[:12], 16) / 16**12
                for c in set(clusters.values())}
    validation = {c for c, p in position.items() if p < validation_fraction}
    if not validation and validation_fraction > 0 and len(position) >= 2:
        validation = {min(position, key=lambda c: (position[c], c))}
    return {tid: ("validation" if c in validation else "train") for tid, c in clusters.items()}


# --- prompts and responses -------------------------------------------------------------------


def task_prompt(task: Task, backend: str, cfg: Config) -> list[Message]:
    """System and user messages asking for a `ModelNew` (the generators' own prompt)."""
    return build_prompt(task, backend, cfg.generate)


def _prompt_for(task: Task, cand: Candidate, cfg: Config) -> list[Message]:
    # The response was conditioned on the candidate's own prompt; keep it when it has a user turn.
    if any(m.role == "user" for m in cand.prompt):
        return [Message(m.role, m.content) for m in cand.prompt]
    return task_prompt(task, cand.backend, cfg)


def _meta(cand: Candidate) -> dict[str, Any]:
    try:
        meta = json.loads(cand.meta or "{}")
    except json.JSONDecodeError:
        return {}
    return meta if isinstance(meta, dict) else {}


def describe_strategy(code: str, backend: str) -> str:
    """One paragraph saying how a kernel is built, from its structural features."""
    f = kernel_features(code)
    parts = [f"{f.n_kernels} kernel{'s' if f.n_kernels != 1 else ''}"]
    if f.threads_per_block:
        parts.append(f"{f.threads_per_block} threads per block")
    for flag, text in (("shared_memory", "shared-memory tiling"), ("vectorized", "vectorized "
                       "memory access"), ("warp_primitives", "warp-level shuffles for reductions"),
                       ("tensor_cores", "tensor-core MMA instructions"), ("multithreaded",
                       "OpenMP multithreading"), ("unrolled", "unrolled inner loops")):
        if getattr(f, flag):
            parts.append(text)
    return f"Plan for the {backend} backend: " + ", ".join(parts) + "."


def assistant_content(task: Task, cand: Candidate, reasoning: bool = True) -> str:
    """The assistant turn: the model's own response when it has one, else reasoning + code."""
    if cand.raw_response.strip() and "```" in cand.raw_response:
        return cand.raw_response.strip()
    meta = _meta(cand)
    text = ""
    if reasoning:
        why = meta.get("reasoning") or meta.get("explanation") or ""
        lines = [s for s in (task.reasoning.strip(), str(why).strip(),
                             describe_strategy(cand.code, cand.backend)) if s]
        text = "\n\n".join(lines) + "\n\n"
    return f"{text}```python\n{cand.code.rstrip()}\n```"


def feedback_text(verdict: Verdict) -> str:
    """What the verifier tells the model about an attempt (its own feedback when it wrote one)."""
    if verdict.feedback.strip():
        return verdict.feedback.strip()
    detail = (verdict.error or verdict.compile_log).strip().splitlines()
    tail = f": {detail[0][:400]}" if detail else ""
    return f"The verifier stopped at stage `{verdict.stage}` with status `{verdict.status}`{tail}."


SAMPLED = ("llm:", "hf:", "import:")  # generators whose responses are a policy's samples


def _is_sample(cand: Candidate) -> bool:
    return cand.generator.startswith(SAMPLED)


def _is_teacher(cand: Candidate) -> bool:
    return cand.generator.startswith(("template:", "teacher:"))


# --- builders --------------------------------------------------------------------------------


def _sft_rows(tasks: dict[str, Task], cands: list[Candidate], verdicts: dict[str, Verdict],
              splits: dict[str, str], cfg: Config) -> list[SftRow]:
    rows = []
    for c in cands:
        if not _is_teacher(c):
            continue
        task, v = tasks[c.task_id], verdicts[c.candidate_id]
        messages = task_prompt(task, c.backend, cfg) + [
            Message("assistant", assistant_content(task, c, cfg.generate.include_reasoning))]
        rows.append(SftRow(content_hash("sft", c.candidate_id), c.task_id, c.candidate_id,
                           messages, c.backend, task.level, splits[c.task_id], v.reward,
                           v.speedup))
    return rows


def _group_stats(all_cands: list[Candidate], verdicts: dict[str, Verdict]
                 ) -> dict[tuple[str, str, str], tuple[int, float, float, float]]:
    """(task, backend, generator) -> (n, pass rate, reward mean, reward std) of first attempts."""
    groups: dict[tuple[str, str, str], list[Verdict]] = defaultdict(list)
    for c in all_cands:
        if _is_sample(c) and c.turn == 0 and c.candidate_id in verdicts:
            groups[(c.task_id, c.backend, c.generator)].append(verdicts[c.candidate_id])
    out = {}
    for key, vs in groups.items():
        rewards = [v.reward for v in vs]
        passed = sum(v.status in CORRECT_STATUSES for v in vs)
        out[key] = (len(vs), passed / len(vs), statistics.fmean(rewards),
                    statistics.pstdev(rewards) if len(rewards) > 1 else 0.0)
    return out


def _rft_rows(tasks: dict[str, Task], selected: list[Candidate], all_cands: list[Candidate],
              verdicts: dict[str, Verdict], splits: dict[str, str], cfg: Config
              ) -> list[RftRow]:
    stats = _group_stats(all_cands, verdicts)
    rows = []
    for c in selected:
        if not _is_sample(c):
            continue
        task, v = tasks[c.task_id], verdicts[c.candidate_id]
        size, rate, mean, std = stats.get((c.task_id, c.backend, c.generator),
                                          (1, 1.0, v.reward, 0.0))
        messages = _prompt_for(task, c, cfg) + [
            Message("assistant", assistant_content(task, c))]
        rows.append(RftRow(content_hash("rft", c.candidate_id), c.task_id, c.candidate_id,
                           messages, c.backend, c.generator, v.reward, v.speedup, size, rate,
                           mean, std, splits[c.task_id]))
    return rows


def _rft_selection(cands: list[Candidate], verdicts: list[Verdict], cfg: Config
                   ) -> list[Candidate]:
    """Per task, up to k correct sampled responses of distinct strategies (the selector of
    `cfg.select` over sampled generators only, so teacher kernels do not crowd them out)."""
    sampled = [c for c in cands if _is_sample(c)]
    if not sampled:
        return []
    sel = cfg.select
    ids = set(SELECTORS[sel.method](sampled, verdicts, sel.k, sel.diversity_weight, sel.seed))
    return [c for c in sampled if c.candidate_id in ids]


def _rl_rows(tasks: dict[str, Task], all_cands: list[Candidate], verdicts: dict[str, Verdict],
             splits: dict[str, str], cfg: Config) -> list[RlRow]:
    by_task: dict[str, list[Candidate]] = defaultdict(list)
    for c in all_cands:
        by_task[c.task_id].append(c)
    default_backend = cfg.generate.backend if cfg.generate.backend != "auto" else "cuda"
    rows = []
    for tid, task in tasks.items():
        backends = sorted({c.backend for c in by_task.get(tid, [])}) or [default_backend]
        for backend in backends:
            rows.append(RlRow(content_hash("rl", tid, backend), tid,
                              task_prompt(task, backend, cfg), reference_for(task, backend),
                              task.input_specs, backend,
                              task.level, "task", "", splits[tid]))
            attempts = [c for c in by_task.get(tid, []) if c.backend == backend
                        and _is_sample(c) and c.candidate_id in verdicts]
            if not attempts or any(verdicts[c.candidate_id].status in CORRECT_STATUSES
                                   for c in attempts):
                continue
            # All-failed group: the furthest-reaching attempts become repair prompts.
            attempts.sort(key=lambda c: (-verdicts[c.candidate_id].reward, c.candidate_id))
            for c in attempts[:cfg.select.k]:
                fb = feedback_text(verdicts[c.candidate_id])
                prompt = task_prompt(task, backend, cfg) + [
                    Message("assistant", assistant_content(task, c, reasoning=False)),
                    Message("user", f"{fb}\nFix the kernel and return the complete file.")]
                rows.append(RlRow(content_hash("rl-repair", c.candidate_id), tid, prompt,
                                  reference_for(task, backend), task.input_specs, backend,
                                  task.level, "repair", fb, splits[tid]))
    return rows


def _repair_rows(tasks: dict[str, Task], all_cands: list[Candidate],
                 verdicts: dict[str, Verdict], splits: dict[str, str], cfg: Config
                 ) -> list[RepairRow]:
    by_id = {c.candidate_id: c for c in all_cands}
    has_child = {c.parent_id for c in all_cands if c.parent_id}
    rows = []
    for leaf in all_cands:
        if not leaf.parent_id or leaf.candidate_id in has_child:
            continue
        chain = [leaf]
        # Walk up through repair turns; the first non-repair ancestor is the original attempt
        # (a mutation's parent is the kernel it was made from, not a turn of the conversation).
        while (chain[-1].generator.startswith("repair:") and chain[-1].parent_id in by_id
               and len(chain) < 64):
            chain.append(by_id[chain[-1].parent_id])
        chain.reverse()
        if len(chain) < 2 or any(c.candidate_id not in verdicts for c in chain):
            continue
        final = verdicts[leaf.candidate_id]
        if final.status not in CORRECT_STATUSES:
            continue  # a chain that never got fixed teaches no fix
        task = tasks[leaf.task_id]
        messages = task_prompt(task, leaf.backend, cfg)
        for i, c in enumerate(chain):
            if i:
                fb = feedback_text(verdicts[chain[i - 1].candidate_id])
                messages.append(Message("user", f"{fb}\nFix the kernel and return the complete "
                                                "file."))
            messages.append(Message("assistant", assistant_content(task, c, reasoning=False)))
        rows.append(RepairRow(
            content_hash("repair", *(c.candidate_id for c in chain)), leaf.task_id, messages,
            [verdicts[c.candidate_id].reward for c in chain],
            [verdicts[c.candidate_id].status for c in chain], leaf.backend, final.status,
            splits[leaf.task_id]))
    return rows


def _preference_rows(tasks: dict[str, Task], all_cands: list[Candidate],
                     verdicts: dict[str, Verdict], splits: dict[str, str],
                     cfg: Config) -> list[PreferenceRow]:
    pairs_per_task, fast_ratio = cfg.publish.preference_pairs_per_task, cfg.verify.fast_threshold
    groups: dict[tuple[str, str], list[Candidate]] = defaultdict(list)
    for c in all_cands:
        if c.candidate_id in verdicts:
            groups[(c.task_id, c.backend)].append(c)
    rows = []
    for (tid, _backend), cands in sorted(groups.items()):
        rank = sorted(cands, key=lambda c: (-verdicts[c.candidate_id].reward, c.candidate_id))
        chosen = [c for c in rank if verdicts[c.candidate_id].status in CORRECT_STATUSES
                  and not c.generator.startswith("mutate:")]
        if not chosen:
            continue
        best = verdicts[chosen[0].candidate_id]
        incorrect = [c for c in rank if verdicts[c.candidate_id].status not in CORRECT_STATUSES]
        slow = [c for c in chosen[1:] if _clearly_slower(best, verdicts[c.candidate_id],
                                                         fast_ratio)]
        task = tasks[tid]
        for i, rej in enumerate((incorrect + slow)[:pairs_per_task]):
            win = chosen[i % len(chosen)]
            wv, rv = verdicts[win.candidate_id], verdicts[rej.candidate_id]
            if rv.status in CORRECT_STATUSES and not _clearly_slower(wv, rv, fast_ratio):
                win, wv = chosen[0], best
            rows.append(PreferenceRow(
                content_hash("preference", win.candidate_id, rej.candidate_id), tid,
                task_prompt(task, win.backend, cfg),
                [Message("assistant", assistant_content(task, win))],
                [Message("assistant", assistant_content(task, rej))],
                wv.reward, rv.reward, wv.status, rv.status, splits[tid]))
    return rows


def _clearly_slower(fast: Verdict, slow: Verdict, ratio: float) -> bool:
    if fast.speedup is None or slow.speedup is None or slow.speedup <= 0:
        return False
    return fast.speedup >= ratio * slow.speedup


def _mutation_facts(cand: Candidate, parent: Candidate | None
                    ) -> tuple[str, int | None, str, str]:
    """(bug kind, line, description, fixed code) from the mutation's metadata.

    `pipeline.mutate` writes `mutation` (kind), `bug_line`, `bug_description`, `bug_before` /
    `bug_after` (the edit) and `fix_code` (the original kernel); where a field is missing, the
    line and the fix come from a diff against the original kernel.
    """
    meta = _meta(cand)
    inner = meta.get("mutation") if isinstance(meta.get("mutation"), dict) else {}
    info = {**meta, **inner}

    def pick(*keys: str) -> Any:
        return next((info[k] for k in keys if isinstance(info.get(k), str | int | float)
                     and str(info[k]).strip()), None)

    kind = str(pick("kind", "bug_kind", "mutation") or cand.generator.split(":", 1)[-1])
    raw_line = pick("bug_line", "line", "lineno")
    line = int(raw_line) if raw_line is not None and str(raw_line).isdigit() else None
    desc = str(pick("bug_description", "description", "explanation", "message") or "")
    lines = cand.code.splitlines()
    fix = ""
    before, after = pick("bug_before", "original"), pick("bug_after", "mutated")
    if line is not None and 0 < line <= len(lines) and before is not None and after is not None \
            and str(after) in lines[line - 1]:
        fix = lines[line - 1].replace(str(after), str(before), 1).strip()
    explicit = pick("fix", "fix_line", "fixed_line")
    if not fix and explicit is not None and "\n" not in str(explicit).strip():
        fix = str(explicit).strip()
    original = parent.code if parent is not None else pick("fix_code", "fixed_code")
    if (line is None or not fix) and isinstance(original, str):
        good = original.splitlines()
        for tag, i1, _i2, j1, j2 in difflib.SequenceMatcher(None, lines, good).get_opcodes():
            if tag != "equal":
                line = line if line is not None else i1 + 1
                fix = fix or ("\n".join(s.strip() for s in good[j1:j2]) or "(delete the line)")
                break
    return kind, line, desc, fix


def _review_rows(tasks: dict[str, Task], all_cands: list[Candidate],
                 verdicts: dict[str, Verdict], splits: dict[str, str]) -> list[ReviewRow]:
    by_id = {c.candidate_id: c for c in all_cands}
    rows = []
    for c in all_cands:
        if not c.generator.startswith("mutate:"):
            continue
        v = verdicts.get(c.candidate_id)
        if v is not None and v.status in CORRECT_STATUSES:
            continue  # the mutation did not change behaviour, so there is no bug to find
        meta = _meta(c)
        parent = by_id.get(c.parent_id or "") or by_id.get(str(meta.get("fix_candidate_id", "")))
        kind, line, desc, fix = _mutation_facts(c, parent)
        if line is None or not fix:
            continue
        task = tasks[c.task_id]
        numbered = "\n".join(f"{i:4d} | {s}" for i, s in enumerate(c.code.splitlines(), 1))
        user = (f"This `ModelNew` for the {c.backend} backend should match the reference below "
                "but has a bug. Name the bug, its line and the fix.\n\nReference:\n```python\n"
                f"{reference_for(task, c.backend).rstrip()}\n```\n\nKernel:\n```\n{numbered}\n```")
        lines = c.code.splitlines()
        buggy = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        answer = [f"Bug ({kind.replace('_', ' ')}) on line {line}: `{buggy}`."]
        if desc:
            answer.append(desc)
        if v is not None:
            answer.append(f"Running it gives `{v.status}`.")
        answer.append(f"Fix:\n```\n{fix.strip()}\n```")
        messages = [Message("system", REVIEW_SYSTEM), Message("user", user),
                    Message("assistant", "\n".join(answer))]
        rows.append(ReviewRow(content_hash("review", c.candidate_id), c.task_id, c.candidate_id,
                              messages, kind, line, c.backend,
                              v.status if v is not None else "unverified", splits[c.task_id]))
    return rows


def _peaks(device: str) -> tuple[float, float] | None:
    up = device.upper()
    return next((p for name, p in DEVICE_PEAKS.items() if name in up), None)


def analyse_performance(task: Task, cand: Candidate, v: Verdict) -> tuple[str, float | None, str]:
    """(bottleneck, arithmetic intensity, explanation) from measurements and kernel features."""
    f = kernel_features(cand.code)
    rt = v.runtime_us or 0.0
    intensity = task.flops / task.bytes_moved if task.flops > 0 and task.bytes_moved > 0 else None
    peaks = _peaks(v.device)
    facts = [f"Measured {rt:.2f} us on {v.device or v.backend}"]
    if v.eager_us:
        facts.append(f"eager PyTorch {v.eager_us:.2f} us (speedup {v.eager_us / rt:.2f}x)"
                     if rt else f"eager PyTorch {v.eager_us:.2f} us")
    if v.compiled_us:
        facts.append(f"torch.compile {v.compiled_us:.2f} us")
    lines = ["; ".join(facts) + "."]
    bottleneck = "unknown"
    if rt > 0 and (task.flops > 0 or task.bytes_moved > 0):
        gflops, gbs = task.flops / (rt * 1e3), task.bytes_moved / (rt * 1e3)
        lines.append(f"The task does {task.flops:.3g} FLOPs over {task.bytes_moved:.3g} bytes: "
                     f"{gflops:.1f} GFLOP/s and {gbs:.1f} GB/s achieved"
                     + (f", arithmetic intensity {intensity:.2f} FLOP/byte." if intensity else "."))
        if peaks:
            pf, pb = peaks
            ideal_us = max(task.flops / pf, task.bytes_moved / pb) * 1e6
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
            lines.append(f"With {intensity:.2f} FLOP/byte the kernel is most likely "
                         f"{bottleneck}-bound on this device (no roofline is known for it).")
    ideas = []
    families = set(task.op_families)
    if bottleneck in ("launch", "memory") and f.n_kernels > 1:
        ideas.append(f"fuse the {f.n_kernels} kernels into one so intermediates stay on chip")
    if bottleneck == "memory" and not f.vectorized:
        ideas.append("use vectorized 128-bit loads and stores (float4)")
    if families & {"matmul", "conv", "attention"} and not f.shared_memory:
        ideas.append("tile the operands through shared memory to reuse each loaded element")
    if bottleneck == "compute" and families & {"matmul", "conv", "attention"} and \
            not f.tensor_cores and cand.backend != "cpu":
        ideas.append("move the inner product onto tensor cores (WMMA/MMA)")
    if families & {"reduction", "softmax", "norm"} and not f.warp_primitives and \
            cand.backend != "cpu":
        ideas.append("reduce within a warp with shuffles before touching shared memory")
    if cand.backend == "cpu" and not f.multithreaded:
        ideas.append("parallelize the outer loop with OpenMP")
    if bottleneck == "launch":
        ideas.append("give each thread more work, or capture the launches in a CUDA graph")
    if not ideas:
        ideas.append("tune the launch shape and unroll the inner loop; the structure is sound")
    lines.append("Next optimization: " + "; ".join(ideas) + ".")
    return bottleneck, intensity, "\n".join(lines)


def _perf_rows(tasks: dict[str, Task], selected: list[Candidate], verdicts: dict[str, Verdict],
               splits: dict[str, str]) -> list[PerfAnalysisRow]:
    rows = []
    for c in selected:
        v = verdicts[c.candidate_id]
        if not v.runtime_us:
            continue
        task = tasks[c.task_id]
        bottleneck, intensity, text = analyse_performance(task, c, v)
        measured = [f"runtime {v.runtime_us:.2f} us (IQR {v.runtime_iqr_us or 0:.2f})"]
        if v.eager_us:
            measured.append(f"eager {v.eager_us:.2f} us")
        if v.compiled_us:
            measured.append(f"torch.compile {v.compiled_us:.2f} us")
        measured.append(f"FLOPs {task.flops:.4g}, bytes moved {task.bytes_moved:.4g}")
        user = (f"Reference:\n```python\n{reference_for(task, c.backend).rstrip()}\n```\n\n"
                f"Verified kernel ({c.backend}, {v.device or 'unknown device'}):\n```python\n"
                f"{c.code.rstrip()}\n```\n\nMeasurements: " + "; ".join(measured) + ".\n"
                "What limits this kernel, and what should be optimized next?")
        messages = [Message("system", PERF_SYSTEM), Message("user", user),
                    Message("assistant", text)]
        rows.append(PerfAnalysisRow(
            content_hash("perf", c.candidate_id), c.task_id, c.candidate_id, messages, c.backend,
            v.device, float(v.runtime_us), v.eager_us, v.speedup, intensity, bottleneck,
            splits[c.task_id]))
    return rows


def tasks_table(tasks: list[Task], splits: dict[str, str]) -> pa.Table:
    """The tasks config: every Task column plus its split."""
    table = Task.to_arrow(tasks)
    return table.append_column(pa.field("split", pa.string(), nullable=False),
                               pa.array([splits[t.task_id] for t in tasks], pa.string()))


def tasks_schema() -> pa.Schema:
    """The tasks config's schema: Task's columns plus `split`."""
    return Task.arrow_schema().append(pa.field("split", pa.string(), nullable=False))


ROW_TYPES = {"sft": SftRow, "rft": RftRow, "rl": RlRow, "repair": RepairRow,
             "preference": PreferenceRow, "review": ReviewRow, "perf_analysis": PerfAnalysisRow}


def config_schema(config: str) -> pa.Schema:
    """The explicit Arrow schema of one dataset config."""
    return tasks_schema() if config == "tasks" else ROW_TYPES[config].arrow_schema()


def build_datasets(tasks: list[Task], candidates: list[Candidate], verdicts: list[Verdict],
                   selected: list[str], cfg: Config) -> dict[str, pa.Table]:
    """Build every dataset config from verified records; rows sorted by id for stable output."""
    task_map = {t.task_id: t for t in sorted(tasks, key=lambda t: t.task_id)}
    vmap = {v.candidate_id: v for v in verdicts}
    cands = sorted((c for c in candidates if c.task_id in task_map),
                   key=lambda c: c.candidate_id)
    picked = set(selected)
    chosen = [c for c in cands if c.candidate_id in picked and c.candidate_id in vmap
              and vmap[c.candidate_id].status in CORRECT_STATUSES]
    splits = assign_splits(list(task_map.values()), cfg.publish.validation_fraction)
    rows: dict[str, list] = {
        "sft": _sft_rows(task_map, chosen, vmap, splits, cfg),
        "rft": _rft_rows(task_map, _rft_selection(cands, verdicts, cfg), cands, vmap, splits,
                         cfg),
        "rl": _rl_rows(task_map, cands, vmap, splits, cfg),
        "repair": _repair_rows(task_map, cands, vmap, splits, cfg),
        "preference": _preference_rows(task_map, cands, vmap, splits, cfg),
        "review": _review_rows(task_map, cands, vmap, splits),
        "perf_analysis": _perf_rows(task_map, chosen, vmap, splits),
    }
    out = {"tasks": tasks_table(list(task_map.values()), splits)}
    for name, items in rows.items():
        unique = {r.row_id: r for r in items}  # the same pair or chain reached twice is one row
        out[name] = ROW_TYPES[name].to_arrow([unique[k] for k in sorted(unique)])
    return {name: out[name] for name in CONFIGS}
