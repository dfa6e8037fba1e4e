"""The tables under every dataset config: the tasks config's columns, each config's Arrow schema,
the provenance columns rows carry and the license gate of a publish."""

from __future__ import annotations

import pyarrow as pa

from schemas import (
    PROVENANCE_FIELDS,
    PerfAnalysisRow,
    PreferenceRow,
    Rejection,
    RepairRow,
    ReviewRow,
    RftRow,
    RlRow,
    SftRow,
    Task,
)


def provenance(task: Task) -> dict[str, str]:
    """The provenance columns every row of `task` carries (PROVENANCE_FIELDS)."""
    return {f: getattr(task, f) for f in PROVENANCE_FIELDS}


def license_allowed(spdx: str, allowlist: list[str]) -> bool:
    """Whether an SPDX id is in the allowlist (case-insensitive; an empty id never is)."""
    return bool(spdx) and spdx.casefold() in {a.casefold() for a in allowlist}


def filter_licenses(tasks: list[Task], allowlist: list[str]
                    ) -> tuple[list[Task], list[Rejection]]:
    """Tasks whose license is allowed, and a publish Rejection for each one that is not."""
    kept, rejected = [], []
    for t in tasks:
        if license_allowed(t.license, allowlist):
            kept.append(t)
        else:
            lic = t.license or "unknown"
            ref = f"{t.repo_url}@{t.commit}:{t.path}" if t.repo_url else t.path or t.name
            rejected.append(Rejection.make(
                "publish", t.task_id, ref, f"license_not_allowed: {lic}",
                f"{ref}: license {lic} is not in publish.licenses"))
    return kept, rejected


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
