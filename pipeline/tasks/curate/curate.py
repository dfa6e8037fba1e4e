"""Curation of tasks: exact and near dedup, decontamination against named benchmarks.

- exact: hash of the AST with user identifiers renamed in order of appearance, numbers zeroed,
  docstrings dropped (so the same computation at other sizes or names is one task);
- near: MinHash LSH (datasketch) over n-grams of that normalized token stream;
- decontamination: against fingerprint indexes (`pipeline.tasks.curate.kernelbench_index`; KernelBench
  levels 1-4 ship with the package and are on by default, folders in `decontaminate_against` get
  the same treatment): n-gram overlap, aten op sequence, AST op signature. A match removes the
  task (`contaminated`), unless the task is one generic op: then it is kept as `overlap:<file>`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from datasketch import MinHash, MinHashLSH

from pipeline.config import TasksConfig
from pipeline.tasks.curate.fingerprint import computation_ngrams, exact_hash
from pipeline.tasks.curate.kernelbench_index import (
    FingerprintIndex,
    Match,
    match_task,
    resolve_indexes,
)
from schemas import Rejection, Task

STAGE = "curate"
_PERM = 128


def _minhash(grams: set[str], num_perm: int = _PERM) -> MinHash:
    m = MinHash(num_perm=num_perm, seed=1)
    m.update_batch([g.encode("utf-8") for g in grams])
    return m


# --- the stage ---------------------------------------------------------------------------------


def _drop(t: Task, ref: str, reason: str, detail: str) -> Rejection:
    """A curate rejection keyed by the module (so a re-run skips it) naming the task."""
    return Rejection.make(STAGE, t.module_id or t.task_id, ref, reason,
                          f"task {t.task_id} ({t.name}): {detail}")


def contamination(task: Task, indexes: list[FingerprintIndex], cfg: TasksConfig
                  ) -> Match | None:
    """The first benchmark overlap of `task` (see `pipeline.tasks.curate.kernelbench_index`)."""
    shapes = [list(s.shape) for s in task.input_specs]
    for index in indexes:
        found = match_task(task.source, task.op_inventory, shapes, index, cfg.decontam_threshold)
        if found is not None:
            return found
    return None


def curate_tasks(tasks: list[Task], cfg: TasksConfig, existing: list[Task],
                 benchmark_dir: Path | None = None) -> tuple[list[Task], list[Rejection]]:
    """Dedup (against `existing` too) and decontaminate; every dropped task gets a Rejection.

    A task overlapping a benchmark only through one generic op is kept, marked `overlap:<file>`
    (unless `decontaminate_generic: reject`); `benchmark_dir` holds fetched indexes."""
    rejections: list[Rejection] = []
    indexes = resolve_indexes(cfg.decontaminate_against, cfg.ngram, benchmark_dir)
    # LSH proposes candidates (its banding needs a threshold below ~0.95); the estimated
    # Jaccard similarity then decides against the configured threshold
    lsh = MinHashLSH(threshold=min(cfg.near_dup_threshold, 0.9), num_perm=_PERM)
    hashes: dict[str, MinHash] = {}
    opsets: dict[str, frozenset[str]] = {}
    exact: dict[str, str] = {}
    for t in existing:
        try:
            exact.setdefault(exact_hash(t.source), t.task_id)
            key = f"old:{t.task_id}"
            if key not in hashes:
                hashes[key] = _minhash(computation_ngrams(t.source, cfg.ngram))
                opsets[key] = frozenset(t.op_inventory)
                lsh.insert(key, hashes[key])
        except (SyntaxError, ValueError, RecursionError):
            continue
    kept: list[Task] = []
    for pos, t in enumerate(tasks):
        ref = t.path or t.name
        if cfg.max_tasks is not None and len(kept) + len(existing) >= cfg.max_tasks:
            rejections.extend(_drop(u, u.path or u.name, "max_tasks",
                                    f"over max_tasks={cfg.max_tasks}") for u in tasks[pos:])
            break
        try:
            h = exact_hash(t.source)
        except (SyntaxError, ValueError, RecursionError) as exc:
            rejections.append(_drop(t, ref, "unparsable",
                                             f"{ref}: {exc}"))
            continue
        if h in exact:
            rejections.append(_drop(t, ref, "duplicate",
                                             f"{ref}: same normalized AST as task {exact[h]}"))
            continue
        mh = _minhash(computation_ngrams(t.source, cfg.ngram))
        ops = frozenset(t.op_inventory)
        # similar text is a near-duplicate only when it also runs the same aten ops: the
        # one-token difference between two activation files is a different kernel
        near = [k for k in lsh.query(mh) if hashes[k].jaccard(mh) >= cfg.near_dup_threshold
                and (not ops or not opsets[k] or ops == opsets[k])]
        if near:
            other = sorted(near)[0].split(":", 1)[1]
            rejections.append(_drop(t, ref, "near_duplicate",
                                             f"{ref}: near-duplicate of task {other}"))
            continue
        match = contamination(t, indexes, cfg)
        if match is not None and (not match.generic or cfg.decontaminate_generic == "reject"):
            rejections.append(_drop(t, f"{match.benchmark}/{match.entry}", "contaminated",
                                    f"{ref}: {match.describe()}"))
            continue
        exact[h] = t.task_id
        hashes[f"new:{t.task_id}"] = mh
        opsets[f"new:{t.task_id}"] = ops
        lsh.insert(f"new:{t.task_id}", mh)
        t.dedup_cluster = hashlib.sha256(h.encode()).hexdigest()[:12]
        t.decontamination = (f"overlap:{match.benchmark}/{match.entry}" if match is not None
                             else "clean")
        kept.append(t)
    return kept, rejections
