"""The ingest wrapper: stream `sources.collect.iter_modules` into the workspace in batches."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from pipeline.config import Config, SourcesConfig
from pipeline.workspace import Run, Workspace
from schemas import RawModule, Rejection
from sources.collect import iter_modules


def sources_for_run(cfg: SourcesConfig, *, nnsmith: int | None = None, seed: int | None = None,
                    default: bool = True) -> SourcesConfig:
    """The sources section with CLI overrides: an NNSmith count/seed, or no built-in default."""
    nn_cfg = cfg.nnsmith.model_copy(update={
        k: v for k, v in (("count", nnsmith), ("seed", seed)) if v is not None})
    update: dict = {"nnsmith": nn_cfg}
    if not default:
        update.update(seed_corpus=False, transformers_sample=0)
        if nnsmith is None:
            update["nnsmith"] = nn_cfg.model_copy(update={"count": 0})
    return cfg.model_copy(update=update)


def run_ingest(ws: Workspace, run: Run, cfg: Config, *, manifest: Path | None = None,
               nnsmith: int | None = None, seed: int | None = None, default: bool = True,
               batch_size: int = 64,
               progress: Callable[[RawModule | Rejection], None] | None = None) -> dict[str, int]:
    """Ingest every configured source; skip module ids already in the workspace; return counts.

    Counts: `modules` (new rows), `existing` (already ingested), `rejections` (new rows),
    and `kind:<source_kind>` / `reason:<reason>` breakdowns of this run's items.
    """
    sources_cfg = sources_for_run(cfg.sources, nnsmith=nnsmith, seed=seed, default=default)
    done_modules = ws.done_keys(RawModule)
    done_rejections = ws.done_keys(Rejection)
    counts: Counter[str] = Counter()
    modules: list[RawModule] = []
    rejections: list[Rejection] = []

    def flush() -> None:
        if modules:
            run.write(modules)
            modules.clear()
        if rejections:
            run.write(rejections)
            rejections.clear()

    for item in iter_modules(sources_cfg, ws.cache_dir, manifest=manifest):
        if progress is not None:
            progress(item)
        if isinstance(item, RawModule):
            counts[f"kind:{item.source_kind}"] += 1
            if item.module_id in done_modules:
                counts["existing"] += 1
                continue
            done_modules.add(item.module_id)
            modules.append(item)
            counts["modules"] += 1
        else:
            counts[f"reason:{item.reason}"] += 1
            if item.rejection_id in done_rejections:
                continue
            done_rejections.add(item.rejection_id)
            rejections.append(item)
            counts["rejections"] += 1
        if len(modules) + len(rejections) >= batch_size:
            flush()
    flush()
    for key in ("modules", "existing", "rejections"):
        counts.setdefault(key, 0)
    return dict(counts)
