"""`run_tasks`: the tasks stage over a workspace (RawModules -> curated Tasks), resumable.

Modules already turned into tasks, or rejected by extraction or curation (curate rejections
are keyed by module id), are skipped. Modules are processed in batches on `cfg.tasks.workers`
sandboxed probe workers shared by all batches; each batch's tasks and rejections are written as
one part each, so a crash loses at most the batch in flight.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import Config
from pipeline.curate import curate_tasks
from pipeline.extract import extract_tasks
from pipeline.probe_pool import ProbePool
from pipeline.workspace import Run, Workspace
from schemas import RawModule, Rejection, Task

SKIP_STAGES = ("extract", "curate")


def done_module_ids(ws: Workspace) -> set[str]:
    """Module ids that already became a task or were rejected by this stage."""
    done = set(ws.read_table(Task).column("module_id").to_pylist())
    rej = ws.read_table(Rejection)
    if rej.num_rows:
        mask = pc.is_in(rej.column("stage"), value_set=pa.array(SKIP_STAGES))
        done.update(rej.filter(mask).column("item_id").to_pylist())
    return done


def run_tasks(ws: Workspace, run: Run, cfg: Config, *, batch_size: int | None = None,
              progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """Build tasks for every pending RawModule of the workspace; returns counts."""
    modules = ws.read(RawModule)
    done = done_module_ids(ws)
    pending = [m for m in modules if m.module_id not in done]
    existing = ws.read(Task)
    counts: Counter[str] = Counter(modules=len(modules), skipped=len(modules) - len(pending))
    reasons: Counter[str] = Counter()
    size = max(1, batch_size or cfg.flows.batch_size)
    with ProbePool(cfg.tasks.workers, cfg.tasks.probe_memory_mb) as pool:
        for start in range(0, len(pending), size):
            batch = pending[start:start + size]
            tasks, rejections = extract_tasks(batch, cfg.tasks, pool=pool)
            kept, dropped = curate_tasks(tasks, cfg.tasks, existing, ws.root / "benchmarks")
            run.write(kept)
            run.write(rejections + dropped)
            existing.extend(kept)
            counts["tasks"] += len(kept)
            counts["rejected"] += len(rejections)
            counts["curated_out"] += len(dropped)
            reasons.update(r.reason for r in rejections + dropped)
            if progress:
                progress(len(batch))
    counts.update({f"reason:{k}": v for k, v in reasons.items()})
    return dict(counts)
