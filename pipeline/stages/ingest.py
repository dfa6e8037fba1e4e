"""The ingest stage: what the sources yield (RawModules and their own Rejections) -> RawModules.

`sources.collect.iter_modules` reads the sources; the stage sorts what they yield into modules
and the sources' own rejections, counting both (`kind:<source_kind>`, `rejected:<reason>`);
`pipeline.runner.run_stream` batches the stream and writes only keys not yet in the workspace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pipeline.config import Config
from pipeline.stage import Resources, Stage, StageContext, StageOutput, keep_rejections
from schemas import RawModule, Rejection
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
    keep_rejections(out, [item for item in batch if isinstance(item, Rejection)])
    return out


def _one_reader(cfg: Config, backend: str) -> Resources:
    return Resources(cpus=1, io=True)  # reading files and cloning repositories: I/O, one core


# Input: what the sources yield, in order (RawModules and the sources' own Rejections).
INGEST = Stage("ingest", RawModule, RawModule, _ingest_batch, needs=_one_reader,
               sequential=True, retry_transient=True)  # git clones and HTTP may fail and pass

# What feeds the stage: `iter_modules` or another reader with its signature
# `(SourcesConfig, cache_dir, *, manifest)`.
SourceReader = Callable[..., Iterable[RawModule | Rejection]]
