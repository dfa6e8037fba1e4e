"""The generate stage: candidate kernels for tasks from templates, served LLMs or local models.

`generate_candidates` is the pure stage (tasks in, candidates and rejections out); the `run_*`
wrappers read the workspace, skip work already done, and write each batch as a Parquet part.
`mutate` needs verdicts, so it runs in `run_generate` over what is already verified.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

from pipeline.candidates.import_samples import import_candidates
from pipeline.candidates.llm import ChatBackend, LLMError, make_backend
from pipeline.candidates.mutate import mutate_candidates
from pipeline.candidates.prompts import build_prompt, fence
from pipeline.candidates.repair import repair_round
from pipeline.candidates.response_code import extract_code
from pipeline.config import Config, GenerateConfig
from pipeline.runner import generate_pending, unverified_chain_ends, write_new
from pipeline.workspace import Run, Workspace
from schemas import Candidate, Rejection, Task, Verdict
from verifier.protocol import CORRECT_STATUSES

GENERATORS = ("template", "openai", "hf", "import", "mutate")


class GenerateError(ValueError):
    """The generate configuration cannot work (unknown generator, no model); names the field."""


def resolve_backend(requested: str) -> str:
    """`auto` -> the verifier's choice for this machine (cuda, musa or cpu); others unchanged."""
    if requested != "auto":
        return requested
    try:
        from verifier.backends import select_backend
    except ImportError:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return select_backend("auto")


def _ref(task: Task) -> str:
    return task.path or task.name or task.task_id


def _prefetch_traces(tasks: list[Task], backend: str) -> None:
    """Trace the batch's references in one sandboxed child (one torch import, not one per task).

    A failed batch trace is not an error: each task is then traced on its own, so one bad
    reference only costs its own task.
    """
    from pipeline.candidates.templates import NoTemplate
    from pipeline.candidates.templates.analysis import trace_sources

    sources = [t.cpu_source if backend == "cpu" else t.source for t in tasks]
    if len(sources) < 2:
        return
    try:
        trace_sources(sources, timeout_s=60.0 + 5.0 * len(sources))
    except NoTemplate:
        return


def template_stage(tasks: list[Task], cfg: GenerateConfig, backend: str
                   ) -> tuple[list[Candidate], list[Rejection]]:
    """The built-in teacher: template kernels; uncovered tasks become `no_template` rejections."""
    try:
        from pipeline.candidates.templates import NoTemplate, template_candidates
    except ImportError as exc:
        return [], [Rejection.make("generate", t.task_id, _ref(t), "generator_unavailable",
                                   f"pipeline.candidates.templates cannot be imported: {exc}")
                    for t in tasks]
    out: list[Candidate] = []
    rejected: list[Rejection] = []
    _prefetch_traces(tasks, backend)
    for task in tasks:
        try:
            made = template_candidates(task, backend, cfg.variants_per_task)
        except NoTemplate as exc:
            rejected.append(Rejection.make("generate", task.task_id, _ref(task), "no_template",
                                           f"{_ref(task)}: {exc}"))
            continue
        except Exception as exc:  # noqa: BLE001 - one task's template bug must not end the run
            rejected.append(Rejection.make("generate", task.task_id, _ref(task), "template_error",
                                           f"{_ref(task)}: {type(exc).__name__}: {exc}"))
            continue
        prompt = build_prompt(task, backend, cfg)
        for cand in made:
            if not cand.prompt:
                cand.prompt = list(prompt)
            if not cand.raw_response:
                reasoning = cand.meta_dict().get("reasoning", "") if cfg.include_reasoning else ""
                cand.raw_response = fence(cand.code, reasoning)
            out.append(cand)
    return out, rejected


def llm_stage(tasks: list[Task], cfg: GenerateConfig, backend: str, llm: ChatBackend
              ) -> tuple[list[Candidate], list[Rejection]]:
    """`cfg.samples` answers per task from `llm`; unusable answers still become candidates."""
    prompts = [build_prompt(t, backend, cfg) for t in tasks]
    answers = llm.chat(prompts, n=cfg.samples)
    out: list[Candidate] = []
    rejected: list[Rejection] = []
    for task, prompt, answer in zip(tasks, prompts, answers, strict=True):
        if isinstance(answer, LLMError):
            rejected.append(Rejection.make("generate", task.task_id, _ref(task), "llm_error",
                                           f"{llm.generator_name}: {answer}"))
            continue
        for j, completion in enumerate(answer):
            # an answer without code is kept: the verifier scores it format_error, which is
            # itself training signal (and counts in the group's pass rate)
            code = extract_code(completion.text) or ""
            meta = {"model": llm.generator_name, "sample": j, "usage": completion.usage(),
                    "temperature": cfg.temperature, "top_p": cfg.top_p}
            if completion.extra.get("reasoning_content"):
                meta["reasoning"] = completion.extra["reasoning_content"]
            out.append(Candidate(
                candidate_id=Candidate.make_id(task.task_id, backend, code or completion.text),
                task_id=task.task_id, backend=backend, generator=llm.generator_name, code=code,
                raw_response=completion.text, prompt=prompt, meta=json.dumps(meta)))
    return out, rejected


def generate_candidates(
    tasks: list[Task],
    cfg: GenerateConfig,
    backend: str,
    *,
    llm: ChatBackend | None = None,
    api_key: str | None = None,
) -> tuple[list[Candidate], list[Rejection]]:
    """Candidates for `tasks` on `backend` from every generator in `cfg.generators`."""
    unknown = [g for g in cfg.generators if g not in GENERATORS]
    if unknown:
        raise GenerateError(f"generate.generators: unknown {unknown} (known: {GENERATORS})")
    backend = resolve_backend(backend)
    candidates: list[Candidate] = []
    rejections: list[Rejection] = []
    for gen in cfg.generators:
        if gen == "template":
            made, rejected = template_stage(tasks, cfg, backend)
        elif gen in ("openai", "hf"):
            if not tasks:
                continue
            try:
                chat = llm or make_backend(gen, cfg, api_key)
            except LLMError as exc:
                rejections.extend(Rejection.make("generate", t.task_id, _ref(t),
                                                 "llm_unavailable", str(exc)) for t in tasks)
                continue
            made, rejected = llm_stage(tasks, cfg, backend, chat)
        elif gen == "import":
            # a batch sees only its tasks: rows for other tasks are not errors here
            # (`run_generate` imports the whole file and reports every unusable row)
            made = import_candidates(tasks, cfg, backend, report=False)[0]
            rejected = []
        else:  # mutate works from verdicts: run_generate / run_repair
            continue
        candidates.extend(made)
        rejections.extend(rejected)
    unique = {c.candidate_id: c for c in candidates}  # the first of identical kernels wins
    return list(unique.values()), rejections


def run_generate(
    ws: Workspace,
    run: Run,
    cfg: Config,
    backend: str | None = None,
    *,
    llm: ChatBackend | None = None,
    api_key: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, int]:
    """Generate for every workspace task, batch by batch; ids already written are skipped.

    LLM groups ask only for what `runner.generate_pending` says they still owe (their samples
    cost); templates and imports see every task.
    """
    gcfg = cfg.generate
    backend = resolve_backend(backend or gcfg.backend)
    tasks = ws.read(Task)
    done = ws.done_keys(Candidate)
    done_rej = ws.done_keys(Rejection)
    counts: Counter[str] = Counter(tasks=len(tasks))
    batch = max(1, cfg.flows.batch_size)
    chats: dict[str, ChatBackend] = {}
    for gen in gcfg.generators:
        if gen in ("openai", "hf"):
            try:
                chats[gen] = llm or make_backend(gen, gcfg, api_key)
            except LLMError as exc:
                rejected = [Rejection.make("generate", t.task_id, _ref(t), "llm_unavailable",
                                           str(exc)) for t in tasks]
                counts["rejections"] += len(write_new(run, rejected, done_rej, "rejection_id"))
    # an LLM group that already has its samples is not asked again on a re-run
    pending = generate_pending(ws, tasks, backend, gcfg,
                               {g: c.generator_name for g, c in chats.items()})
    for gen in gcfg.generators:
        if gen == "mutate" or (gen in ("openai", "hf") and gen not in chats):
            continue
        if gen == "import":
            made, rejected = import_candidates(tasks, gcfg, backend, report=True)
            written = len(write_new(run, made, done, "candidate_id"))
            counts["candidates"] += written
            counts["imported"] += written
            counts["skipped"] += len(made) - written
            counts["rejections"] += len(write_new(run, rejected, done_rej, "rejection_id"))
            counts.update(f"rejected:{r.reason}" for r in rejected)
            if progress is not None:
                progress(len(tasks))
            continue
        chat = chats.get(gen, llm)
        todo = tasks
        if gen in ("openai", "hf"):
            todo = pending[gen]
            counts["skipped_tasks"] += len(tasks) - len(todo)
            if progress is not None and len(todo) < len(tasks):
                progress(len(tasks) - len(todo))
        # templates are cheap and deterministic, so every task is offered again (rejected ones
        # too): a re-run after a template change or a larger `variants_per_task` adds what is new,
        # and ids already written are counted `skipped`
        one = gcfg.model_copy(update={"generators": [gen]})
        for start in range(0, len(todo), batch):
            part = todo[start:start + batch]
            made, rejected = generate_candidates(part, one, backend, llm=chat)
            written = len(write_new(run, made, done, "candidate_id"))
            counts["candidates"] += written
            counts["skipped"] += len(made) - written
            counts["rejections"] += len(write_new(run, rejected, done_rej, "rejection_id"))
            for r in rejected:
                counts[f"rejected:{r.reason}"] += 1
            if progress is not None:
                progress(len(part))
    if "mutate" in gcfg.generators:
        mutants = mutate_candidates(tasks, ws.read(Candidate), ws.read(Verdict), gcfg)
        written = len(write_new(run, mutants, done, "candidate_id"))
        counts["mutations"] += written
        counts["candidates"] += written
        counts["skipped"] += len(mutants) - written
    return dict(counts)


def run_repair(
    ws: Workspace,
    run: Run,
    cfg: Config,
    *,
    llm: ChatBackend | None = None,
    api_key: str | None = None,
    verify: Callable[[dict[str, Task], list[Candidate]], list[Verdict]] | None = None,
) -> dict[str, int]:
    """Up to `cfg.repair.turns` repair turns, each written and (by default) verified in turn.

    `verify` defaults to `pipeline.candidates.verify.verify_candidates` with `cfg.verify`; without a
    verifier only the first turn can be made (later turns need the earlier turn's verdicts).
    """
    tasks = {t.task_id: t for t in ws.read(Task)}
    counts: Counter[str] = Counter()
    if verify is None and cfg.repair.verify:
        verify = _default_verify(ws, cfg)
    done = ws.done_keys(Candidate)
    done_rej = ws.done_keys(Rejection)
    for turn in range(1, cfg.repair.turns + 1):
        candidates = ws.read(Candidate)
        verdicts = ws.read(Verdict)
        if verify is not None:
            # chain ends still waiting for a verdict (e.g. fresh mutations) are verified first
            pending = unverified_chain_ends(candidates, verdicts, tasks, turn)
            if pending:
                new_verdicts = verify(tasks, pending)
                run.write(new_verdicts)
                verdicts += new_verdicts
                counts["verified"] += len(new_verdicts)
        rejections: list[Rejection] = []
        made = repair_round(tasks, candidates, verdicts, cfg, turn, llm=llm, api_key=api_key,
                            rejections=rejections)
        fresh = write_new(run, made, done, "candidate_id")
        counts[f"turn{turn}"] += len(fresh)
        counts["candidates"] += len(fresh)
        counts["rejections"] += len(write_new(run, rejections, done_rej, "rejection_id"))
        if not fresh:
            break
        if verify is None:
            counts["unverified"] += len(fresh)
            break
        new_verdicts = verify(tasks, fresh)
        run.write(new_verdicts)
        counts["verified"] += len(new_verdicts)
        counts["repaired"] += sum(v.status in CORRECT_STATUSES for v in new_verdicts)
    return dict(counts)


def _default_verify(ws: Workspace, cfg: Config
                    ) -> Callable[[dict[str, Task], list[Candidate]], list[Verdict]] | None:
    try:
        from pipeline.candidates.verify import verify_candidates
    except ImportError:
        return None

    def verify(tasks: dict[str, Task], candidates: list[Candidate]) -> list[Verdict]:
        return verify_candidates(tasks, candidates, cfg.verify, ws.cache_dir)

    return verify
