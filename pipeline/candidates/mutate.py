"""Inject realistic bugs into verified-correct kernels: failing first attempts with a known fix.

A mutation edits the C++/CUDA source inside the candidate's Python string literals (the
`load_inline` sources), never the Python around it, so the file still parses and the bug is in
the kernel. Every kind targets a change of behaviour, not of text: comments and C++ string
literals are masked before matching, and an edit that leaves the code unchanged once comments and
whitespace are ignored is discarded. Whether the bug shows on a given input is for the verifier
to find out (a mutation that still verifies correct is simply not used as a failing attempt).

Kinds (CUDA/MUSA and CPU C++ unless noted):
    off_by_one          a loop or guard bound one short (`i < n` -> `i < n - 1`)
    missing_bound_check a guard removed (`if (i < n)`, padding checks, early `return`/`continue`)
    missing_syncthreads a `__syncthreads()` removed (GPU)
    wrong_stride        a row-major subscript transposed (`[r * N + c]` -> `[c * N + r]`)
    wrong_index         block and thread index swapped in the global index (GPU)
    wrong_cast          a float accumulator or value truncated to `int`
    uninit_accumulator  an accumulator never (re)initialised: hoisted out of its loop, or
                        declared without a value
    bad_launch_config   more threads per block than the device allows (GPU)
    omp_race            an OpenMP reduction clause or atomic removed (CPU; not dealt unless
                        configured: the verifier runs CPU candidates on one thread, see UNSHOWN)
    and the kinds of `pipeline.candidates.mutation_kinds` (grid_rounding, unstable_softmax,
    wrong_reduction_axis, broadcast_stride, int32_index (GPU), wrong_init)

Kinds are dealt: each kernel gets the applicable kinds that have been used least so far, so
whichever kind matches most kernels (casts, loop bounds) does not crowd out the rest.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from pipeline.candidates.mutation_kinds import EXTRA_FINDERS, GPU_ONLY_EXTRA
from pipeline.candidates.mutation_sites import FINDERS as BASE_FINDERS
from pipeline.candidates.mutation_sites import (
    Site,
    kernel_spans,
    line_end,
    line_start,
    masked,
)
from pipeline.config import GenerateConfig
from pipeline.prompts import build_prompt, fence
from schemas import Candidate, Task, Verdict, content_hash
from verifier import pyast
from verifier.protocol import CORRECT_STATUSES

GPU_KINDS = ("off_by_one", "missing_bound_check", "missing_syncthreads", "wrong_stride",
             "wrong_index", "wrong_cast", "uninit_accumulator", "bad_launch_config")
CPU_KINDS = ("off_by_one", "missing_bound_check", "wrong_stride", "wrong_cast",
             "uninit_accumulator", "omp_race")
# the wider set (`mutation_kinds`): grid rounding, unstable softmax, reduction axis, broadcast
# stride, int32 index overflow; every backend
EXTRA_KINDS = tuple(EXTRA_FINDERS)
ALL_KINDS = tuple(dict.fromkeys(GPU_KINDS + CPU_KINDS + EXTRA_KINDS))
FINDERS = {**BASE_FINDERS, **EXTRA_FINDERS}


@dataclass
class Mutation:
    """A mutated candidate source and where its bug is."""

    kind: str
    code: str
    line: int  # 1-based line of the bug in `code`
    description: str
    before: str  # the original code line(s)
    after: str  # the mutated line(s)


class MutationError(ValueError):
    """An unknown mutation kind; the message names it."""


# Kinds whose bug no verifier run on the backend can show: CPU candidates run on one thread
# (OMP_NUM_THREADS=1 and torch.set_num_threads(1): verifier/run/runners.py, verifier/isolation/sandbox.py,
# verifier/run/worker.py), so an OpenMP race never changes a result there. Dealt only when
# configured by name (`generate.mutation_kinds`).
UNSHOWN = {"cpu": ("omp_race",)}


def kinds_for(backend: str, shown_only: bool = True) -> tuple[str, ...]:
    """The mutation kinds that make sense for kernels of `backend` (with `shown_only`, less
    those its verifier runs cannot show)."""
    if backend == "cpu":
        kinds = CPU_KINDS + tuple(k for k in EXTRA_KINDS if k not in GPU_ONLY_EXTRA)
    else:
        kinds = GPU_KINDS + EXTRA_KINDS
    hidden = UNSHOWN.get(backend, ()) if shown_only else ()
    return tuple(k for k in kinds if k not in hidden)


def find_sites(code: str, kind: str, backend: str) -> list[Site]:
    """Every place in `code`'s kernel sources where `kind` applies, best first."""
    if kind not in FINDERS:
        raise MutationError(f"unknown mutation kind {kind!r} (known: {', '.join(ALL_KINDS)})")
    sites: list[Site] = []
    for start, end in kernel_spans(code):
        sites.extend(FINDERS[kind](masked(code[start:end]), start, backend))
    return sorted(sites, key=lambda s: (s.priority, s.start))


def _strip_cxx(text: str) -> str:
    return re.sub(r"\s+", "", masked(text))


def apply_site(code: str, site: Site, kind: str) -> Mutation | None:
    """`code` with `site` applied, or None when the edit does not change the program."""
    edits = [(site.start, site.end, site.replacement)]
    if site.insert_at is not None:
        edits.append((site.insert_at, site.insert_at, site.insert_text))
    out = code
    for start, end, text in sorted(edits, key=lambda e: e[0], reverse=True):
        out = out[:start] + text + out[end:]
    if _strip_cxx(out) == _strip_cxx(code):
        return None
    try:
        pyast.parse(out)
    except SyntaxError:
        return None
    last = max(site.start, site.end - 1)  # a deleted line ends at its newline
    before = code[line_start(code, site.start):line_end(code, last)]
    if site.insert_at is not None and site.insert_at < site.start:
        # a hoisted statement: the bug is where it now stands, before its loop
        line = out.count("\n", 0, site.insert_at) + 1
        after = site.insert_text.rstrip("\n")
        return Mutation(kind, out, line, site.description, before.rstrip("\n"), after)
    new_start = site.start
    line = out.count("\n", 0, new_start) + 1
    new_end = new_start + len(site.replacement)
    after = out[line_start(out, new_start):line_end(out, new_end)]
    return Mutation(kind, out, line, site.description, before.rstrip("\n"), after)


def mutate_code(code: str, kind: str, backend: str, site_index: int = 0) -> Mutation | None:
    """Apply the `site_index`-th applicable site of `kind` (best first); None if none applies."""
    usable = 0
    for site in find_sites(code, kind, backend):
        mutation = apply_site(code, site, kind)
        if mutation is None:
            continue
        if usable == site_index:
            return mutation
        usable += 1
    return None


# --- the stage ---------------------------------------------------------------------------------


def _task_map(tasks: dict[str, Task] | Iterable[Task]) -> dict[str, Task]:
    return dict(tasks) if isinstance(tasks, dict) else {t.task_id: t for t in tasks}


def mutation_sources(candidates: list[Candidate], verdicts: list[Verdict]) -> set[str]:
    """Correct kernels to mutate: every correct non-template kernel, and of a task's template
    strategy variants only the fastest (they share their structure, so their mutants would be
    near copies of each other's; the fastest is the one sft teaches)."""
    vmap = {v.candidate_id: v for v in verdicts}
    best: dict[tuple[str, str], tuple[float, str]] = {}
    out: set[str] = set()
    for c in candidates:
        v = vmap.get(c.candidate_id)
        if v is None or v.status not in CORRECT_STATUSES:
            continue
        if not c.generator.startswith("template:"):
            out.add(c.candidate_id)
            continue
        key, rank = (c.task_id, c.backend), (v.speedup or 0.0, c.candidate_id)
        if key not in best or rank > best[key]:
            best[key] = rank
    return out | {cid for _, cid in best.values()}


def mutate_candidates(tasks: dict[str, Task] | Iterable[Task], candidates: list[Candidate],
                      verdicts: list[Verdict], cfg: GenerateConfig) -> list[Candidate]:
    """Failing first attempts made from correct kernels, tagged `mutate:<kind>`, fix in meta.

    A kernel whose mutants all verified correct (the edit did not change behaviour at the
    verified sizes: a unit stride, a size that divides evenly) gets `mutations_per_kernel` new
    ones of kinds and sites not tried on it yet, until it has `mutations_per_kernel *
    mutation_rounds`; a kernel with a failing mutant, or one still waiting for its verdict, none.
    """
    task_map = _task_map(tasks)
    status = {v.candidate_id: v.status for v in verdicts}
    wanted = [k for k in (cfg.mutation_kinds or ALL_KINDS)]
    for kind in wanted:
        if kind not in FINDERS:
            raise MutationError(f"mutation_kinds: unknown kind {kind!r} "
                                f"(known: {', '.join(ALL_KINDS)})")
    earlier: dict[str, list[Candidate]] = defaultdict(list)  # source kernel -> its mutants
    for c in candidates:
        if c.generator.startswith("mutate:"):
            earlier[str(c.meta_dict().get("fix_candidate_id", ""))].append(c)
    out: list[Candidate] = []
    seen = {c.candidate_id for c in candidates}
    # mutants per kind that teach a bug (failing, or not judged yet): the least used goes first
    used: Counter[str] = Counter(_kind(m) for ms in earlier.values() for m in ms
                                 if status.get(m.candidate_id) not in CORRECT_STATUSES)
    cap = cfg.mutations_per_kernel * max(1, cfg.mutation_rounds)
    sources = mutation_sources(candidates, verdicts)
    for cand in candidates:
        if cand.candidate_id not in sources:
            continue
        if cand.generator.startswith(("mutate:", "repair:fix")):
            continue
        before = earlier.get(cand.candidate_id, [])
        if any(status.get(m.candidate_id) not in CORRECT_STATUSES for m in before):
            continue
        budget = min(cfg.mutations_per_kernel, cap - len(before))
        tried = Counter(_kind(m) for m in before)
        kinds = [k for k in kinds_for(cand.backend, shown_only=not cfg.mutation_kinds)
                 if k in wanted]
        rng = random.Random(content_hash(cand.candidate_id, str(cfg.seed)))
        rng.shuffle(kinds)
        kinds.sort(key=lambda k: (tried[k], used[k]))  # stable: ties keep the shuffled order
        made = 0
        for kind in kinds:
            if made >= budget:
                break
            new = _untried(cand, kind, task_map.get(cand.task_id), cfg, seen)
            if new is None:
                continue
            seen.add(new.candidate_id)
            out.append(new)
            used[kind] += 1
            made += 1
    return out


def _kind(mutant: Candidate) -> str:
    return mutant.generator.split(":", 1)[1]


def _untried(cand: Candidate, kind: str, task: Task | None, cfg: GenerateConfig,
             seen: set[str]) -> Candidate | None:
    """The mutant of `kind` at its best site not made before (for a retry, the next site)."""
    # the first site of the best class: measured on the built-in tasks, the first (outermost)
    # loop or guard changes behaviour far more often than a random one
    for index in range(8):
        mutation = mutate_code(cand.code, kind, cand.backend, site_index=index)
        if mutation is None:
            return None
        new = _mutant(cand, mutation, task, cfg)
        if new.candidate_id not in seen:
            return new
    return None


def _mutant(source: Candidate, mutation: Mutation, task: Task | None,
            cfg: GenerateConfig) -> Candidate:
    prompt = list(source.prompt)
    if not prompt and task is not None:
        prompt = build_prompt(task, source.backend, cfg)
    source_meta = source.meta_dict()
    meta = {
        "mutation": mutation.kind,
        "bug_line": mutation.line,
        "bug_description": mutation.description,
        "bug_before": mutation.before,
        "bug_after": mutation.after,
        "fix_candidate_id": source.candidate_id,
        "fix_code": source.code,
        "fix_generator": source.generator,
        "fix_reasoning": source_meta.get("reasoning", ""),
        "expect": "fail",
    }
    return Candidate(
        candidate_id=Candidate.make_id(source.task_id, source.backend, mutation.code),
        task_id=source.task_id, backend=source.backend, generator=f"mutate:{mutation.kind}",
        code=mutation.code, raw_response=fence(mutation.code), prompt=prompt, parent_id=None,
        turn=0, meta=json.dumps(meta))


