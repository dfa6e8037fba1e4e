"""What a dataset card says about sampled responses and decontamination, from the tables.

`rft`: which sampled generators its rows come from (`import:demo` marks the shipped demo set,
not a model run) and how many distinct kernel strategies per task the selection kept.
Decontamination: tasks removed as `contaminated` and tasks kept although they overlap a
benchmark through one generic op (`Task.decontamination = overlap:<file>`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.candidates.response_code import extract_code
from pipeline.config import Config
from pipeline.datasets.selection import kernel_features
from pipeline.workspace import Workspace
from schemas import Rejection


def rft_facts(rft: pa.Table | None) -> dict[str, Any]:
    """Rows per generator, tasks, and mean distinct strategies per task of the `rft` config."""
    if rft is None or rft.num_rows == 0:
        return {"rows": 0, "generators": {}, "tasks": 0, "distinct_strategies_per_task": 0.0}
    strategies: dict[str, set[str]] = defaultdict(set)
    for tid, messages in zip(rft.column("task_id").to_pylist(),
                             rft.column("messages").to_pylist(), strict=True):
        answer = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), "")
        strategies[tid].add(kernel_features(extract_code(answer) or answer).strategy())
    per_task = [len(s) for s in strategies.values()]
    return {"rows": rft.num_rows,
            "generators": dict(sorted(Counter(rft.column("generator").to_pylist()).items())),
            "tasks": len(per_task),
            "distinct_strategies_per_task": round(sum(per_task) / len(per_task), 2)}


def decontamination_facts(ws: Workspace, tasks: pa.Table | None, cfg: Config) -> dict[str, Any]:
    """Benchmarks checked, tasks removed as contaminated, tasks kept with a generic overlap."""
    rej = ws.read_table(Rejection)
    removed = 0
    if rej.num_rows:
        mask = pc.and_(pc.equal(rej.column("stage"), "curate"),
                       pc.equal(rej.column("reason"), "contaminated"))
        removed = len(set(rej.filter(mask).column("item_id").to_pylist()))
    kept = 0
    if tasks is not None and tasks.num_rows:
        kept = sum(str(d).startswith("overlap:")
                   for d in tasks.column("decontamination").to_pylist())
    return {"against": list(cfg.tasks.decontaminate_against), "contaminated_removed": removed,
            "overlapping_kept": kept, "generic_policy": cfg.tasks.decontaminate_generic}


def card_lines(facts: dict[str, Any]) -> list[str]:
    """Markdown lines for the card from `rft_facts` and `decontamination_facts`."""
    lines = []
    rft = facts.get("rft")
    if rft and rft["rows"]:
        gens = ", ".join(f"`{g}` ({n})" for g, n in rft["generators"].items())
        lines += ["## Sampled responses (rft)", "",
                  f"{rft['rows']} verified responses for {rft['tasks']} tasks from {gens}; "
                  f"the diversity-preserving selection kept {rft['distinct_strategies_per_task']}"
                  " distinct kernel strategies per task on average."]
        if "import:demo" in rft["generators"]:
            lines.append("`import:demo` rows come from the demo response set shipped with "
                         "kernelsynth (written by hand in the forms models use), not from a "
                         "model run.")
        lines.append("")
    dec = facts.get("decontamination")
    if dec is not None:
        against = ", ".join(f"`{a}`" for a in dec["against"]) or "nothing"
        lines += ["## Decontamination", "",
                  f"Checked against {against} (aten op sequences, normalized n-grams, shapes): "
                  f"{dec['contaminated_removed']} tasks removed as contaminated; "
                  f"{dec['overlapping_kept']} tasks kept that overlap a benchmark only through "
                  "generic ops: one op, or two without shapes or text in common "
                  f"(policy: {dec['generic_policy']}).", ""]
    return lines
