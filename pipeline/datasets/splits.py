"""Train/validation splits: decided per dedup cluster, so no near-duplicate task sits on both
sides, and stable across versions (a cluster's side depends only on its own hash)."""

from __future__ import annotations

import hashlib

from schemas import Task


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


def with_validation(rows: dict[str, list], splits: dict[str, str], tasks: dict[str, Task],
                    configs: tuple[str, ...] = ("rft", "preference", "review")
                    ) -> dict[str, str]:
    """Splits in which each of `configs` with rows of two or more clusters has validation rows:
    a config without any gets its lowest-hash cluster moved to validation, for every config,
    so no cluster is on both sides anywhere."""
    splits = dict(splits)
    cluster = {tid: (t.dedup_cluster or tid) for tid, t in tasks.items()}
    for name in configs:
        present = {cluster[r.task_id] for r in rows.get(name, [])}
        if len(present) < 2 or any(splits[r.task_id] == "validation" for r in rows[name]):
            continue
        pick = min(present, key=lambda c: (hashlib.sha256(c.encode()).hexdigest(), c))
        splits.update({tid: "validation" for tid, c in cluster.items() if c == pick})
    return splits
