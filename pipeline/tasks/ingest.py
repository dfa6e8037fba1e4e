"""The ingest stage: every configured source, streamed into the workspace as RawModules.

`sources.collect.iter_modules` reads the sources; the stage sorts what they yield into modules
and the sources' own rejections and counts both by kind and reason; `pipeline.runner.run_stream`
batches the stream and writes only keys not yet in the workspace.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from pipeline.config import Config
from pipeline.runner import run_stream
from pipeline.stage import Resources, Stage, StageContext, StageOutput
from pipeline.workspace import Run, Workspace
from schemas import RawModule, Rejection
from sources.collect import iter_modules
from sources.config import SourcesConfig


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


def _ingest_batch(batch: list[RawModule | Rejection], ctx: StageContext) -> StageOutput:
    out = StageOutput()
    for item in batch:
        if isinstance(item, RawModule):
            out.records.append(item)
            out.counts[f"kind:{item.source_kind}"] += 1
        else:
            out.rejections.append(item)
            out.counts[f"reason:{item.reason}"] += 1
    return out


def _one_reader(cfg: Config, backend: str) -> Resources:
    return Resources(cpus=1, io=True)  # reading files and cloning repositories: I/O, one core


# Input: what the sources yield, in order (RawModules and the sources' own Rejections).
INGEST = Stage("ingest", RawModule, RawModule, _ingest_batch, needs=_one_reader,
               sequential=True)

# What feeds the stage: `iter_modules` or another reader with its signature
# `(SourcesConfig, cache_dir, *, manifest)`.
SourceReader = Callable[..., Iterable[RawModule | Rejection]]


def _ticking(items: Iterable[RawModule | Rejection],
             progress: Callable[[RawModule | Rejection], None] | None
             ) -> Iterator[RawModule | Rejection]:
    for item in items:
        if progress is not None:
            progress(item)  # as each item is read, not when its batch is written
        yield item


def run_ingest(ws: Workspace, run: Run, cfg: Config, *, manifest: Path | None = None,
               nnsmith: int | None = None, seed: int | None = None, default: bool = True,
               batch_size: int = 64,
               progress: Callable[[RawModule | Rejection], None] | None = None,
               stage: Stage = INGEST, read: SourceReader = iter_modules) -> dict[str, int]:
    """Ingest every configured source; skip module ids already in the workspace; return counts.

    Counts: `modules` (new rows), `existing` (already ingested), `rejections` (new rows),
    and `kind:<source_kind>` / `reason:<reason>` breakdowns of this run's items.
    """
    sources_cfg = sources_for_run(cfg.sources, nnsmith=nnsmith, seed=seed, default=default)
    items = _ticking(read(sources_cfg, ws.cache_dir, manifest=manifest), progress)
    counts: Counter[str] = run_stream(
        stage, items, StageContext(cfg, cache_dir=str(ws.cache_dir)), run, size=batch_size,
        done=ws.done_keys(RawModule), done_rejections=ws.done_keys(Rejection))
    counts["modules"] = counts.pop("written")
    return dict(counts)
