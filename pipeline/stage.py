"""The one shape every pipeline stage has (NeMo Curator's stages, datatrove's steps).

A `Stage` names itself, states the record types it reads and writes, the resources one batch
needs (so an executor can place it: a Ray task asks for exactly these) and its batch size, and
turns a batch into `StageOutput(records, rejections, counts)`. `pipeline.plan` decides what is
pending and in which order; `pipeline.runner` (local) or `flows/` (Prefect) runs the batches. A stage
never reads the workspace itself: everything a batch needs travels in the batch and `StageContext`,
so the batch can run in another process or on another machine.
"""

from __future__ import annotations

import subprocess
import urllib.error
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


def rejected_counter(reason: str) -> str:
    """The one counter name of a drop: `rejected:<reason>` (every stage, every executor)."""
    return f"rejected:{reason}"


def reject(out: StageOutput, stage: str, item_id: str, ref: str, reason: str,
           detail: str = "") -> Rejection:
    """Record that `stage` dropped `item_id` because of `reason`, and count it."""
    rejection = Rejection.make(stage, item_id, ref, reason, detail)
    keep_rejections(out, [rejection])
    return rejection


def keep_rejections(out: StageOutput, rejections: list[Rejection]) -> None:
    """Add rejections a stage's function already made to `out`, counted as `reject` counts."""
    out.rejections.extend(rejections)
    out.counts.update(rejected_counter(r.reason) for r in rejections)


# Failures worth retrying: the network and git, never the verdict of a candidate.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError, TimeoutError, urllib.error.URLError, subprocess.CalledProcessError,
    subprocess.TimeoutExpired,
)


def is_transient(exc: BaseException | None) -> bool:
    """True for network/git failures (worth a retry); False for everything else."""
    if exc is None:
        return False
    if isinstance(exc, TRANSIENT_ERRORS):
        return True
    name = type(exc).__module__ + "." + type(exc).__name__
    # httpx / huggingface_hub / requests transport errors, without importing them here.
    return any(part in name for part in ("httpx.", "requests.exceptions", "HTTPError",
                                         "ConnectError", "ReadTimeout"))


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
    # a batch that failed on the network or git may be run again (LLM calls); a verdict never is
    retry_transient: bool = False

    def resources(self, cfg: Config, backend: str = "cpu") -> Resources:
        return self.needs(cfg, backend)

    def run(self, batch: Batch, ctx: StageContext) -> StageOutput:
        """Turn one batch into records, rejections and counts."""
        return self.fn(batch, ctx)
