"""The one shape every pipeline stage has (NeMo Curator's stages, datatrove's steps).

A `Stage` names itself, states the record types it reads and writes, the resources one batch
needs (so an executor can place it: a Ray task asks for exactly these) and its batch size, and
turns a batch into `StageOutput(records, rejections, counts)`. `pipeline.runner` decides what is
pending and writes the outputs; `flows/` maps the same stages onto Prefect task runners. A stage
never reads the workspace itself: everything a batch needs travels in the batch and `StageContext`,
so the batch can run in another process or on another machine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from pipeline.config import Config
from schemas import Candidate, Rejection, Task, Verdict

GPU_BACKENDS = ("cuda", "musa")


@dataclass(frozen=True)
class Resources:
    """What one batch of a stage holds while it runs."""

    cpus: float = 1.0
    gpus: float = 0.0
    memory_gb: float = 0.0
    io: bool = False  # waits on files and the network more than it computes: threads run it
    subprocesses: bool = False  # its work runs in worker processes it starts (sandboxes)

    def ray_options(self) -> dict[str, Any]:
        """The same resources as Ray `remote` options (what prefect-ray's RayTaskRunner takes)."""
        opts: dict[str, Any] = {"num_cpus": self.cpus}
        if self.gpus:
            opts["num_gpus"] = self.gpus
        if self.memory_gb:
            opts["memory"] = int(self.memory_gb * (1 << 30))
        return opts


@dataclass
class StageContext:
    """What a batch needs besides its items: the config and, for some stages, related records."""

    cfg: Config
    backend: str = "cpu"
    cache_dir: str = ""
    tasks: dict[str, Task] = field(default_factory=dict)  # task_id -> Task for the batch's items
    pool: Any = None  # workers the runner opened for all batches of the stage (`Stage.pool`)
    benchmark_dir: str = ""  # fetched benchmark indexes (curation's decontamination)
    candidates: list[Candidate] = field(default_factory=list)  # chains of the batch's tasks
    verdicts: list[Verdict] = field(default_factory=list)
    turn: int = 0
    progress: Callable[[Any], None] | None = None  # per-item callback (CLI progress bars)


@dataclass
class StageOutput:
    """One batch's result: new records, the items dropped (with why), and counts."""

    records: list = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def __iter__(self) -> Iterator[Any]:
        """`records, rejections, counts = stage.run(batch, ctx)`."""
        return iter((self.records, self.rejections, self.counts))


def reject(out: StageOutput, stage: str, item_id: str, ref: str, reason: str,
           detail: str = "") -> Rejection:
    """Record that `stage` dropped `item_id` because of `reason`; counted as `rejected:<reason>`."""
    rejection = Rejection.make(stage, item_id, ref, reason, detail)
    out.rejections.append(rejection)
    out.counts[f"rejected:{reason}"] += 1
    return rejection


Batch = list
RunFn = Callable[[Batch, StageContext], StageOutput]
ResourcesFn = Callable[[Config, str], Resources]


def _one_cpu(cfg: Config, backend: str) -> Resources:
    return Resources(cpus=1)


def _no_pool(cfg: Config) -> AbstractContextManager[Any]:
    return nullcontext()


@dataclass(frozen=True)
class Stage:
    """A named step from `input` records to `output` records, with declared resources.

    `run(batch, ctx)` returns `StageOutput(records, rejections, counts)`; a stage that keeps
    workers for all its batches (the tasks stage's probe pool) opens them in `pool(cfg)`, and the
    runner hands them to every batch as `ctx.pool`.
    """

    name: str
    input: type
    output: type
    fn: RunFn
    needs: ResourcesFn = _one_cpu  # resources of one batch, given the config and backend
    batch_size: Callable[[Config], int] = lambda cfg: cfg.flows.batch_size
    # batches depend on earlier ones (curation dedups against what they kept, a source stream
    # is read in order): the runner runs them one after another in one place, never mapped
    sequential: bool = False
    pool: Callable[[Config], AbstractContextManager[Any]] = _no_pool  # opened once per run

    def resources(self, cfg: Config, backend: str = "cpu") -> Resources:
        return self.needs(cfg, backend)

    def run(self, batch: Batch, ctx: StageContext) -> StageOutput:
        """Turn one batch into records, rejections and counts."""
        return self.fn(batch, ctx)
