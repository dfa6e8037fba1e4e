"""The one plan: the build order and every "what is still pending" rule.

`STEPS` is the order `kernelsynth build` runs; each step command (`ingest`, `tasks build`,
`generate`, `verify`, `mutate`, `repair`, `publish`) runs one of them, so the same config gives
the same dataset either way. A step reads the workspace, decides what is pending and hands
batches of a stage to an `Executor`, which runs them and writes their records: `pipeline.runner`
runs them here, `flows/` as Prefect tasks (on Ray by the stages' declared resources). The
executor decides where a batch runs, never what is pending or in which order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import Config, GenerateConfig
from pipeline.stage import StageContext, rejected_counter
from pipeline.stages import StageSet
from pipeline.workspace import Workspace
from schemas import Candidate, RawModule, Rejection, Task, Verdict
from verifier.protocol import CORRECT_STATUSES

T = TypeVar("T")

STEPS = ("ingest", "tasks", "generate", "verify", "mutate", "repair", "publish")
GENERATOR_PREFIX = {"template": "template:", "openai": "llm:", "hf": "hf:"}
TASK_STAGES = ("extract", "curate")  # rejections by these mean a module is done


class Executor(Protocol):
    """Runs a step's stage work and writes what it makes (local runner or Prefect flows)."""

    ws: Workspace
    cfg: Config  # with the backend pinned (`pin_backend`)
    backend: str
    run_id: str
    stages: StageSet

    def stream(self, stage: str, read: Callable[[], Iterable[Any]], ctx: StageContext
               ) -> Counter[str]:
        """Run a sequential stage over a stream read as it goes; write keys not yet written."""

    def sequential(self, stage: str, items: list, ctx: StageContext) -> Counter[str]:
        """Run a sequential stage over `items`, batch after batch in one place, with its pool."""

    def map(self, label: str, stage: str, batches: list[list], contexts: list[StageContext]
            ) -> Counter[str]:
        """Run independent batches anywhere; write new keys; counts: written rows per table
        (`candidates`, `verdicts`, `rejections`), `failed_batches`, and the stage's own."""

    def write(self, records: list) -> int:
        """Write records the plan itself made (e.g. rejections); returns how many were new."""


def pin_backend(cfg: Config, stages: StageSet) -> tuple[Config, str]:
    """The config with generate and verify on one resolved backend (`auto`: this machine's)."""
    requested = cfg.generate.backend if cfg.generate.backend != "auto" else cfg.verify.backend
    backend = stages.resolve_backend(requested)
    return cfg.model_copy(update={
        "verify": cfg.verify.model_copy(update={"backend": backend}),
        "generate": cfg.generate.model_copy(update={"backend": backend})}), backend


# --- batches -------------------------------------------------------------------------------------


def batches(items: list[T], size: int) -> list[list[T]]:
    """Consecutive batches of at most `size` items (the unit of work and of writing)."""
    size = max(1, size)
    return [items[i:i + size] for i in range(0, len(items), size)]


def task_batches(tasks: dict[str, Task], by_task: dict[str, list[Candidate]],
                 verdicts: list[Verdict], size: int
                 ) -> Iterator[tuple[list[Task], list[Candidate], list[Verdict]]]:
    """Batches of whole tasks (all their candidates and verdicts), about `size` candidates each."""
    vmap = {v.candidate_id: v for v in verdicts}
    batch_t: list[Task] = []
    batch_c: list[Candidate] = []
    for tid in sorted(by_task):
        batch_t.append(tasks[tid])
        batch_c.extend(by_task[tid])
        if len(batch_c) >= size:
            yield batch_t, batch_c, [vmap[c.candidate_id] for c in batch_c
                                     if c.candidate_id in vmap]
            batch_t, batch_c = [], []
    if batch_t:
        yield batch_t, batch_c, [vmap[c.candidate_id] for c in batch_c if c.candidate_id in vmap]


# --- what is pending -----------------------------------------------------------------------------


def done_module_ids(ws: Workspace) -> set[str]:
    """Module ids that already became a task or were rejected by extraction or curation."""
    done = set(ws.read_table(Task).column("module_id").to_pylist())
    rej = ws.read_table(Rejection)
    if rej.num_rows:
        mask = pc.is_in(rej.column("stage"), value_set=pa.array(TASK_STAGES))
        done.update(rej.filter(mask).column("item_id").to_pylist())
    return done


def generate_pending(ws: Workspace, tasks: list[Task], backend: str, cfg: GenerateConfig,
                     names: dict[str, str] | None = None) -> dict[str, list[Task]]:
    """For each configured generator, the `tasks` it still owes a first attempt on `backend`.

    `template`: a task is answered by a template candidate or a generate rejection (`no_template`,
    ...). `openai`/`hf`: by `cfg.samples` candidates of that generator (`names[gen]`: its exact
    name, e.g. `llm:coder`, else any of its kind); a rejection for an unreachable LLM is no
    answer, so the next run asks again. `import` owes every task (its file is read whole
    and candidate ids dedupe); mutation is a step of its own.
    """
    cands = ws.read_table(Candidate).select(["task_id", "backend", "turn", "generator"]).to_pylist()
    rejs = ws.read_table(Rejection).select(["stage", "item_id", "reason"]).to_pylist()
    rejected = {r["item_id"] for r in rejs
                if r["stage"] == "generate" and not r["reason"].startswith("llm")}
    names = names or {}
    have: Counter[tuple[str, str]] = Counter()
    for c in cands:
        if c["backend"] != backend or c["turn"] != 0:
            continue
        for gen, prefix in GENERATOR_PREFIX.items():
            name = names.get(gen)
            if c["generator"] == name if name else c["generator"].startswith(prefix):
                have[(c["task_id"], gen)] += 1
    pending: dict[str, list[Task]] = {}
    for gen in cfg.generators:
        if gen == "template":
            pending[gen] = [t for t in tasks
                            if not have[(t.task_id, gen)] and t.task_id not in rejected]
        elif gen in GENERATOR_PREFIX:
            pending[gen] = [t for t in tasks if have[(t.task_id, gen)] < cfg.samples]
        elif gen == "import":
            pending[gen] = list(tasks)
    return pending


def tasks_pending_generation(tasks: list[Task], pending: dict[str, list[Task]]) -> list[Task]:
    """The `tasks` some per-task generator (template, LLM) still owes, in order."""
    ids = {t.task_id for g, ts in pending.items() if g in GENERATOR_PREFIX for t in ts}
    return [t for t in tasks if t.task_id in ids]


def unverified(ws: Workspace, backend: str | None = None) -> list[Candidate]:
    """Candidates (of `backend`, or all) that have no verdict yet, in workspace order."""
    done = ws.done_keys(Verdict)
    return [c for c in ws.read(Candidate) if c.candidate_id not in done
            and (backend is None or c.backend == backend)]


def unverified_chain_ends(candidates: list[Candidate], verdicts: list[Verdict],
                          tasks: dict[str, Task], turn: int) -> list[Candidate]:
    """Chain ends at `turn - 1` still waiting for a verdict: a repair turn verifies these
    first, since an end without a verdict cannot be judged failing."""
    judged = {v.candidate_id for v in verdicts}
    return [c for c in candidates if c.turn == turn - 1
            and c.candidate_id not in judged and c.task_id in tasks]


def chains_by_task(ws: Workspace, backend: str
                   ) -> tuple[dict[str, Task], dict[str, list[Candidate]], list[Verdict]]:
    """Tasks, their candidates on `backend` grouped by task, and all verdicts."""
    tasks = {t.task_id: t for t in ws.read(Task)}
    by_task: dict[str, list[Candidate]] = {}
    for c in ws.read(Candidate):
        if c.backend == backend and c.task_id in tasks:
            by_task.setdefault(c.task_id, []).append(c)
    return tasks, by_task, ws.read(Verdict)


def mutation_pending(by_task: dict[str, list[Candidate]], verdicts: list[Verdict]
                     ) -> dict[str, list[Candidate]]:
    """Tasks with a correct first-attempt kernel that has no mutant yet, or whose mutants all
    verified correct (the mutate stage retries those with other kinds, up to its cap)."""
    status = {v.candidate_id: v.status for v in verdicts}
    mutants: dict[str, list[str]] = {}  # source kernel -> its mutants' ids
    for cs in by_task.values():
        for c in cs:
            if c.generator.startswith("mutate:"):
                source = str(c.meta_dict().get("fix_candidate_id", ""))
                mutants.setdefault(source, []).append(c.candidate_id)

    def open_kernel(c: Candidate) -> bool:
        if status.get(c.candidate_id) not in CORRECT_STATUSES:
            return False
        if c.generator.startswith(("mutate:", "repair:")):
            return False
        return all(status.get(m) in CORRECT_STATUSES for m in mutants.get(c.candidate_id, []))

    return {tid: cs for tid, cs in by_task.items() if any(open_kernel(c) for c in cs)}


def repair_pending(by_task: dict[str, list[Candidate]], verdicts: list[Verdict], turn: int
                   ) -> dict[str, list[Candidate]]:
    """Tasks with a failing chain end at `turn - 1` that has no follow-up yet."""
    vmap = {v.candidate_id: v for v in verdicts}
    has_child = {c.parent_id for cs in by_task.values() for c in cs if c.parent_id}
    return {tid: cs for tid, cs in by_task.items()
            if any(c.turn == turn - 1 and c.candidate_id in vmap
                   and vmap[c.candidate_id].status not in CORRECT_STATUSES
                   and c.candidate_id not in has_child for c in cs)}


# --- the steps -----------------------------------------------------------------------------------


def ingest_step(ex: Executor) -> Counter[str]:
    """Sources -> RawModules (keys already in the workspace are counted `existing`)."""
    cfg, ws = ex.cfg, ex.ws
    counts = ex.stream("ingest", lambda: ex.stages.read_sources(cfg.sources, ws.cache_dir),
                       StageContext(cfg, backend=ex.backend, cache_dir=str(ws.cache_dir)))
    counts["modules"] = counts.pop("raw_modules", 0)
    return counts


def tasks_step(ex: Executor) -> Counter[str]:
    """RawModules not yet turned into tasks nor rejected -> curated Tasks."""
    ws = ex.ws
    modules = ws.read(RawModule)
    done = done_module_ids(ws)
    pending = [m for m in modules if m.module_id not in done]
    counts: Counter[str] = Counter(modules=len(modules), skipped=len(modules) - len(pending))
    ctx = StageContext(ex.cfg, backend=ex.backend, cache_dir=str(ws.cache_dir),
                       tasks={t.task_id: t for t in ws.read(Task)},
                       benchmark_dir=str(ws.root / "benchmarks"))  # fetched indexes
    counts.update(ex.sequential("tasks", pending, ctx))
    return counts


def _with_generators(cfg: Config, generators: list[str]) -> Config:
    return cfg.model_copy(update={"generate": cfg.generate.model_copy(
        update={"generators": generators})})


def generate_step(ex: Executor) -> Counter[str]:
    """First attempts: per-task generators for the tasks they still owe, then the sample import
    over every task at once (its file is read whole; candidate ids dedupe)."""
    cfg, ws = ex.cfg, ex.ws
    tasks = ws.read(Task)
    counts: Counter[str] = Counter(tasks=len(tasks))
    gens = [g for g in cfg.generate.generators if g != "mutate"]  # mutation: its own step
    per_task = [g for g in gens if g in GENERATOR_PREFIX]
    size = ex.stages.generate.batch_size(cfg)
    if per_task:
        # a served model answers under its own name: another model has not answered yet
        names = {"openai": f"llm:{cfg.generate.openai_model}"} if cfg.generate.openai_model \
            else {}
        todo = tasks_pending_generation(tasks, generate_pending(ws, tasks, ex.backend,
                                                                cfg.generate, names))
        counts["pending"] = len(todo)
        gcfg = _with_generators(cfg, per_task)
        groups = batches(todo, size)
        counts.update(ex.map("generate", "generate", groups,
                             [StageContext(gcfg, backend=ex.backend) for _ in groups]))
    if "import" in gens and tasks and cfg.generate.import_file:  # "": no sample file
        icfg = _with_generators(cfg, ["import"])
        counts.update(ex.map("generate:import", "generate", [tasks],
                             [StageContext(icfg, backend=ex.backend)]))
    return counts


def verify_step(ex: Executor, label: str = "verify", limit: int | None = None) -> Counter[str]:
    """Candidates of the backend without a verdict -> Verdicts (a candidate whose task is not
    in the workspace is recorded as a `missing_task` rejection, never verified)."""
    from pipeline.stages.verify import missing_task

    ws, cfg = ex.ws, ex.cfg
    tasks = {t.task_id: t for t in ws.read(Task)}
    todo = unverified(ws, ex.backend)
    pending = [c for c in todo if c.task_id in tasks][:limit]
    orphans = [c for c in todo if c.task_id not in tasks]
    counts: Counter[str] = Counter(pending=len(pending), orphans=len(orphans))
    missing = [missing_task(c) for c in orphans]
    counts["rejections"] += ex.write(missing)
    counts.update(rejected_counter(r.reason) for r in missing)
    groups = batches(pending, ex.stages.verify.batch_size(cfg))
    contexts = [StageContext(cfg, backend=ex.backend, cache_dir=str(ws.cache_dir),
                             tasks={c.task_id: tasks[c.task_id] for c in g}) for g in groups]
    counts.update(ex.map(label, "verify", groups, contexts))
    return counts


def _chain_batches(ex: Executor, label: str, stage: str, todo: dict[str, list[Candidate]],
                   tasks: dict[str, Task], verdicts: list[Verdict], turn: int = 0
                   ) -> Counter[str]:
    groups = list(task_batches(tasks, todo, verdicts, ex.stages.stage(stage).batch_size(ex.cfg)))
    contexts = [StageContext(ex.cfg, backend=ex.backend, candidates=c, verdicts=v, turn=turn)
                for _, c, v in groups]
    return ex.map(label, stage, [t for t, _, _ in groups], contexts)


def mutate_step(ex: Executor) -> Counter[str]:
    """Rounds of mutate + verify (`generate.mutation_rounds`, while a round makes mutants): a
    later round retries the kernels whose mutants all verified correct."""
    g = ex.cfg.generate
    counts: Counter[str] = Counter()
    for r in range(g.mutation_rounds if g.mutations_per_kernel else 0):
        suffix = "" if r == 0 else f":{r + 1}"
        tasks, by_task, verdicts = chains_by_task(ex.ws, ex.backend)
        made = _chain_batches(ex, f"mutate{suffix}", "mutate",
                              mutation_pending(by_task, verdicts), tasks, verdicts)
        counts.update(made)
        if not made["candidates"]:
            break
        counts.update(verify_step(ex, f"verify:mutants{suffix}"))
    return counts


def repair_step(ex: Executor) -> Counter[str]:
    """Up to `repair.turns` turns: verify chain ends still unjudged, continue every failing one,
    verify the turn; a turn that makes nothing ends the step (a later one would have nothing to
    continue). With `repair.verify` off only the first turn can be made."""
    rcfg = ex.cfg.repair
    counts: Counter[str] = Counter()
    for turn in range(1, rcfg.turns + 1):
        tasks, by_task, verdicts = chains_by_task(ex.ws, ex.backend)
        ends = unverified_chain_ends([c for cs in by_task.values() for c in cs], verdicts,
                                     tasks, turn)
        if ends and rcfg.verify:
            counts.update(verify_step(ex, f"verify:repair{turn}-ends"))
            tasks, by_task, verdicts = chains_by_task(ex.ws, ex.backend)
        made = _chain_batches(ex, f"repair:{turn}", "repair",
                              repair_pending(by_task, verdicts, turn), tasks, verdicts, turn)
        counts.update(made)
        counts[f"turn{turn}"] = made["candidates"]
        if not made["candidates"]:
            break
        if not rcfg.verify:
            counts["unverified"] += made["candidates"]
            break
        counts.update(verify_step(ex, f"verify:repair{turn}"))
    return counts


def publish_step(ex: Executor, always: bool | None = None, version: str | None = None
                 ) -> dict[str, Any]:
    """A new dataset version (parent: the latest) unless nothing changed since the latest."""
    from pipeline.datasets.publish import publish_workspace
    from pipeline.datasets.published import inputs_fingerprint, latest_version, remember

    ws, cfg = ex.ws, ex.cfg
    always = cfg.flows.always_publish if always is None else always
    fingerprint = inputs_fingerprint(ws, cfg)
    latest = latest_version(ws, cfg.publish.name)
    if latest is not None and not always and version is None \
            and latest.fingerprint == fingerprint:
        return {"published": False, "version": latest.name, "path": str(latest.path),
                "parent": None}
    path = publish_workspace(ws, cfg, version, run_id=ex.run_id)
    remember(ws, cfg.publish.name, path.name, fingerprint)
    return {"published": True, "version": path.name, "path": str(path),
            "parent": latest.name if latest else None}


STEP_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "ingest": ingest_step, "tasks": tasks_step, "generate": generate_step,
    "verify": verify_step, "mutate": mutate_step, "repair": repair_step,
    "publish": publish_step,
}


def run_step(ex: Executor, step: str, **options: Any) -> Any:
    """Run one step of the plan (what a step command does)."""
    return STEP_FUNCTIONS[step](ex, **options)


def run_plan(ex: Executor, always_publish: bool | None = None) -> dict[str, Any]:
    """Every step in order (what `kernelsynth build` does); returns the publish step's result."""
    for step in STEPS[:-1]:
        run_step(ex, step)
    return publish_step(ex, always=always_publish)
