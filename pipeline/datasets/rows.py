"""Dataset builders: verified records in, one Arrow table per dataset config out.

Configs (TRL conversational formats, explicit schemas from `schemas/records.py`):
`tasks`, `sft` (template/teacher kernels with reasoning), `rft` (selected verified model responses
with their group statistics), `rl` (prompt-only rows; all-failed groups as feedback-conditioned
repair prompts), `repair` (multi-turn attempt/feedback/fix chains), `preference` (correct-fast vs
incorrect or slower), `review` (find the injected bug) and `perf_analysis` (explain a measured
kernel's bottleneck). Every row carries `split`, decided by the task's dedup cluster so no
near-duplicate task sits on both sides.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import replace

import pyarrow as pa

from pipeline.config import Config
from pipeline.datasets.analysis_rows import perf_rows, review_rows, spread_kinds
from pipeline.datasets.pairs import (
    alternate,
    distinct_enough,
    has_margin,
    mutant_configs,
    mutant_kind,
    normalise_code,
    pair_similarity_limit,
    programs_not_held,
    unstable_timings,
)
from pipeline.datasets.retime import timing_held
from pipeline.datasets.selection import (
    SELECTORS,
    fastest_per_task,
    kernel_features,
    meets_speedup,
)
from pipeline.datasets.splits import assign_splits, with_validation
from pipeline.datasets.tables import ROW_TYPES, filter_licenses, provenance, tasks_table
from pipeline.prompts import (
    build_prompt,
    feedback_turn,
    has_prose,
    input_specs_for,
    reference_for,
)
from schemas import (
    Candidate,
    Message,
    PreferenceRow,
    RepairRow,
    RftRow,
    RlRow,
    SftRow,
    Task,
    Verdict,
    content_hash,
)
from verifier.protocol import CORRECT_STATUSES

CONFIGS = ("tasks", "sft", "rft", "rl", "repair", "preference", "review", "perf_analysis")

# --- splits ----------------------------------------------------------------------------------


# --- prompts and responses -------------------------------------------------------------------


def task_prompt(task: Task, backend: str, cfg: Config, reasoning: bool | None = None
                ) -> list[Message]:
    """System and user messages asking for a `ModelNew` (the generators' own prompt).

    `reasoning` says whether the answer that follows explains its design before the code
    (default: the config's `include_reasoning`); the prompt asks for exactly that, so a row never
    answers "explain your design first" with bare code.
    """
    gen = cfg.generate
    if reasoning is not None and reasoning != gen.include_reasoning:
        gen = gen.model_copy(update={"include_reasoning": reasoning})
    return build_prompt(task, backend, gen)



def _prompt_for(task: Task, cand: Candidate, cfg: Config) -> list[Message]:
    # The response was conditioned on the candidate's own prompt; keep it when it has a user turn.
    if any(m.role == "user" for m in cand.prompt):
        return [Message(m.role, m.content) for m in cand.prompt]
    return task_prompt(task, cand.backend, cfg)


def describe_strategy(code: str, backend: str) -> str:
    """One paragraph saying how a kernel is built, from its structural features."""
    f = kernel_features(code)
    parts = [f"{f.n_kernels} kernel{'s' if f.n_kernels != 1 else ''}"]
    if f.threads_per_block:
        parts.append(f"{f.threads_per_block} threads per block")
    for flag, text in (("shared_memory", "shared-memory tiling"), ("vectorized", "vectorized "
                       "memory access"), ("warp_primitives", "warp-level shuffles for reductions"),
                       ("tensor_cores", "tensor-core MMA instructions"), ("multithreaded",
                       "OpenMP multithreading"), ("unrolled", "unrolled inner loops")):
        if getattr(f, flag):
            parts.append(text)
    return f"Plan for the {backend} backend: " + ", ".join(parts) + "."


def assistant_content(task: Task, cand: Candidate, reasoning: bool = True) -> str:
    """The assistant turn: the model's own response when it has one, else reasoning + code."""
    if cand.raw_response.strip() and "```" in cand.raw_response:
        return cand.raw_response.strip()
    meta = cand.meta_dict()
    text = ""
    if reasoning:
        why = meta.get("reasoning") or meta.get("explanation") or ""
        lines = [s for s in (task.reasoning.strip(), str(why).strip(),
                             describe_strategy(cand.code, cand.backend)) if s]
        text = "\n\n".join(lines) + "\n\n"
    return f"{text}```python\n{cand.code.rstrip()}\n```"


def feedback_text(verdict: Verdict) -> str:
    """What the verifier tells the model about an attempt (its own feedback when it wrote one)."""
    if verdict.feedback.strip():
        return verdict.feedback.strip()
    detail = (verdict.error or verdict.compile_log).strip().splitlines()
    tail = f": {detail[0][:400]}" if detail else ""
    return f"The verifier stopped at stage `{verdict.stage}` with status `{verdict.status}`{tail}."


SAMPLED = ("llm:", "hf:", "import:")  # generators whose responses are a policy's samples


def _is_sample(cand: Candidate) -> bool:
    return cand.generator.startswith(SAMPLED)


def _is_teacher(cand: Candidate) -> bool:
    return cand.generator.startswith(("template:", "teacher:"))


def generalisation_checked(v: Verdict) -> bool:
    """The verifier ran the generalisation check and every variant passed: a `generalised`
    finding and no `variant_skipped` one (a correct verdict with neither was never checked)."""
    rules = {f.rule for f in v.findings or []}
    return "generalised" in rules and "variant_skipped" not in rules


# --- builders --------------------------------------------------------------------------------


def verdict_numbers(v: Verdict) -> dict[str, float | None]:
    """The verdict's figures under the row fields that carry them (always by name)."""
    return {"reward": v.reward, "speedup": v.speedup, "runtime_us": v.runtime_us,
            "runtime_iqr_us": v.runtime_iqr_us, "eager_us": v.eager_us}


def side_numbers(win: Verdict, lose: Verdict) -> dict[str, float | str | None]:
    """A preference pair's figures for both sides, and what the pair contrasts."""
    both = win.status in CORRECT_STATUSES and lose.status in CORRECT_STATUSES
    return {"chosen_reward": win.reward, "rejected_reward": lose.reward,
            "chosen_status": win.status, "rejected_status": lose.status,
            "chosen_speedup": win.speedup, "rejected_speedup": lose.speedup,
            "chosen_runtime_us": win.runtime_us, "rejected_runtime_us": lose.runtime_us,
            "chosen_runtime_iqr_us": win.runtime_iqr_us,
            "rejected_runtime_iqr_us": lose.runtime_iqr_us, "eager_us": win.eager_us,
            "kind": "speed" if both else "correctness"}


def _sft_rows(tasks: dict[str, Task], cands: list[Candidate], verdicts: dict[str, Verdict],
              splits: dict[str, str], cfg: Config) -> list[SftRow]:
    rows = []
    for c in cands:
        if not _is_teacher(c):
            continue
        task, v = tasks[c.task_id], verdicts[c.candidate_id]
        messages = task_prompt(task, c.backend, cfg) + [
            Message("assistant", assistant_content(task, c, cfg.generate.include_reasoning))]
        rows.append(SftRow(row_id=content_hash("sft", c.candidate_id), task_id=c.task_id,
                           candidate_id=c.candidate_id, messages=messages, backend=c.backend,
                           level=task.level, split=splits[c.task_id], **verdict_numbers(v)))
    return rows


def _group_stats(all_cands: list[Candidate], verdicts: dict[str, Verdict]
                 ) -> dict[tuple[str, str, str], tuple[int, float, float, float]]:
    """(task, backend, generator) -> (n, pass rate, reward mean, reward std) of first attempts."""
    groups: dict[tuple[str, str, str], list[Verdict]] = defaultdict(list)
    for c in all_cands:
        if _is_sample(c) and c.turn == 0 and c.candidate_id in verdicts:
            groups[(c.task_id, c.backend, c.generator)].append(verdicts[c.candidate_id])
    out = {}
    for key, vs in groups.items():
        rewards = [v.reward for v in vs]
        passed = sum(v.status in CORRECT_STATUSES for v in vs)
        out[key] = (len(vs), passed / len(vs), statistics.fmean(rewards),
                    statistics.pstdev(rewards) if len(rewards) > 1 else 0.0)
    return out


def _rft_rows(tasks: dict[str, Task], selected: list[Candidate], all_cands: list[Candidate],
              verdicts: dict[str, Verdict], splits: dict[str, str], cfg: Config
              ) -> list[RftRow]:
    stats = _group_stats(all_cands, verdicts)
    rows = []
    for c in selected:
        if not _is_sample(c):
            continue
        task, v = tasks[c.task_id], verdicts[c.candidate_id]
        size, rate, mean, std = stats.get((c.task_id, c.backend, c.generator),
                                          (1, 1.0, v.reward, 0.0))
        messages = _prompt_for(task, c, cfg) + [
            Message("assistant", assistant_content(task, c))]
        rows.append(RftRow(row_id=content_hash("rft", c.candidate_id), task_id=c.task_id,
                           candidate_id=c.candidate_id, messages=messages, backend=c.backend,
                           generator=c.generator, group_size=size, group_pass_rate=rate,
                           group_mean_reward=mean, group_std_reward=std,
                           split=splits[c.task_id], **verdict_numbers(v)))
    return rows


def _rft_selection(cands: list[Candidate], verdicts: list[Verdict], cfg: Config
                   ) -> list[Candidate]:
    """Per task, up to k correct sampled responses of distinct strategies (the selector of
    `cfg.select` over sampled generators only, so teacher kernels do not crowd them out)."""
    sampled = [c for c in cands if _is_sample(c)]
    if not sampled:
        return []
    sel = cfg.select
    # kept responses are fast enough to teach; the group statistics still count every sample
    verdicts = [v for v in verdicts if meets_speedup(v, sel.min_speedup)]
    if cfg.verify.generalize:
        verdicts = [v for v in verdicts if generalisation_checked(v)]
    ids = set(SELECTORS[sel.method](sampled, verdicts, sel.k, sel.diversity_weight, sel.seed))
    return [c for c in sampled if c.candidate_id in ids]


def _rl_rows(tasks: dict[str, Task], all_cands: list[Candidate], verdicts: dict[str, Verdict],
             splits: dict[str, str], cfg: Config) -> list[RlRow]:
    by_task: dict[str, list[Candidate]] = defaultdict(list)
    for c in all_cands:
        by_task[c.task_id].append(c)
    default_backend = cfg.generate.backend if cfg.generate.backend != "auto" else "cuda"
    rows = []
    for tid, task in tasks.items():
        backends = sorted({c.backend for c in by_task.get(tid, [])}) or [default_backend]
        for backend in backends:
            # input_specs: the sizes of the reference the prompt shows (the CPU copy's on cpu)
            rows.append(RlRow(row_id=content_hash("rl", tid, backend), task_id=tid,
                              prompt=task_prompt(task, backend, cfg),
                              reference=reference_for(task, backend),
                              input_specs=input_specs_for(task, backend), backend=backend,
                              level=task.level, kind="task", feedback="", split=splits[tid]))
            attempts = [c for c in by_task.get(tid, []) if c.backend == backend
                        and _is_sample(c) and c.candidate_id in verdicts]
            if not attempts or any(verdicts[c.candidate_id].status in CORRECT_STATUSES
                                   for c in attempts):
                continue
            # All-failed group: the furthest-reaching attempts become repair prompts.
            attempts.sort(key=lambda c: (-verdicts[c.candidate_id].reward, c.candidate_id))
            for c in attempts[:cfg.select.k]:
                fb = feedback_text(verdicts[c.candidate_id])
                attempt = assistant_content(task, c, reasoning=False)
                prompt = task_prompt(task, backend, cfg, has_prose(attempt)) + [
                    Message("assistant", attempt),
                    Message("user", feedback_turn(verdicts[c.candidate_id]))]
                rows.append(RlRow(row_id=content_hash("rl-repair", c.candidate_id), task_id=tid,
                                  prompt=prompt, reference=reference_for(task, backend),
                                  input_specs=input_specs_for(task, backend), backend=backend,
                                  level=task.level, kind="repair", feedback=fb,
                                  split=splits[tid]))
    return rows


def _repair_rows(tasks: dict[str, Task], all_cands: list[Candidate],
                 verdicts: dict[str, Verdict], splits: dict[str, str], cfg: Config
                 ) -> list[RepairRow]:
    by_id = {c.candidate_id: c for c in all_cands}
    has_child = {c.parent_id for c in all_cands if c.parent_id}
    owner = mutant_configs(all_cands, verdicts)
    rows = []
    for leaf in all_cands:
        if not leaf.parent_id or leaf.candidate_id in has_child:
            continue
        chain = [leaf]
        # Walk up through repair turns; the first non-repair ancestor is the original attempt
        # (a mutation's parent is the kernel it was made from, not a turn of the conversation).
        while (chain[-1].generator.startswith("repair:") and chain[-1].parent_id in by_id
               and len(chain) < 64):
            chain.append(by_id[chain[-1].parent_id])
        chain.reverse()
        if len(chain) < 2 or any(c.candidate_id not in verdicts for c in chain):
            continue
        if owner.get(chain[0].candidate_id, "repair") != "repair":
            continue  # this mutant's bug kind is taught by another config
        final = verdicts[leaf.candidate_id]
        if final.status not in CORRECT_STATUSES:
            continue  # a chain that never got fixed teaches no fix
        task = tasks[leaf.task_id]
        answers = [assistant_content(task, c, reasoning=False) for c in chain]
        messages = task_prompt(task, leaf.backend, cfg, has_prose(answers[0]))
        for i, answer in enumerate(answers):
            if i:  # the repair generator's own turn, asking for the form the answer has
                messages.append(Message("user", feedback_turn(
                    verdicts[chain[i - 1].candidate_id], explain=has_prose(answer))))
            messages.append(Message("assistant", answer))
        rows.append((RepairRow(
            row_id=content_hash("repair", *(c.candidate_id for c in chain)),
            task_id=leaf.task_id, messages=messages,
            turn_rewards=[verdicts[c.candidate_id].reward for c in chain],
            turn_statuses=[verdicts[c.candidate_id].status for c in chain],
            backend=leaf.backend, final_status=final.status, split=splits[leaf.task_id],
            final_reward=final.reward, final_speedup=final.speedup,
            final_runtime_us=final.runtime_us, final_runtime_iqr_us=final.runtime_iqr_us,
            eager_us=final.eager_us), mutant_kind(chain[0]) if chain[0].generator.startswith(
                "mutate:") else None))
    return [row for row, _kind in spread_kinds(rows, lambda r: r[1])]


def pair_side(cand: Candidate) -> list[Message]:
    """One side of a preference pair: the kernel alone, fenced, in the same format either side.

    No prose on either side, so a preference model learns which kernel is better, not which
    format; and nothing in it can refer to a bug the prompt does not mention.
    """
    return [Message("assistant", f"```python\n{cand.code.rstrip()}\n```")]


def _preference_rows(tasks: dict[str, Task], all_cands: list[Candidate],
                     verdicts: dict[str, Verdict], splits: dict[str, str],
                     cfg: Config) -> list[PreferenceRow]:
    """Correct over incorrect, or faster over >= MIN_SPEEDUP slower on the same device; the
    chosen side is always at least `select.min_speedup` times faster than eager.

    Both sides are bare code, never identical, code similarity at most MAX_SIMILARITY; mutants
    enter only when `mutant_configs` gives them to this config.
    """
    pairs_per_task = cfg.publish.preference_pairs_per_task
    min_speedup = cfg.select.min_speedup
    unstable = programs_not_held(all_cands, verdicts, min_speedup)  # either side's label
    owner = mutant_configs(all_cands, verdicts)
    groups: dict[tuple[str, str], list[Candidate]] = defaultdict(list)
    for c in all_cands:
        if c.candidate_id in verdicts and owner.get(c.candidate_id, "preference") == "preference":
            groups[(c.task_id, c.backend)].append(c)
    rows = []
    for (tid, _backend), cands in sorted(groups.items()):
        rank = sorted(cands, key=lambda c: (-verdicts[c.candidate_id].reward, c.candidate_id))
        chosen = [c for c in rank if meets_speedup(verdicts[c.candidate_id], min_speedup)
                  and timing_held(verdicts[c.candidate_id], min_speedup)
                  and not c.generator.startswith("mutate:") and c.candidate_id not in unstable]
        correct = [c for c in rank if verdicts[c.candidate_id].status in CORRECT_STATUSES
                   and not c.generator.startswith("mutate:")]
        if not chosen:
            continue
        incorrect = [c for c in rank if verdicts[c.candidate_id].status not in CORRECT_STATUSES]
        slow = sorted((c for c in correct if c is not chosen[0]
                       and c.candidate_id not in unstable),
                      key=lambda c: (-(verdicts[c.candidate_id].runtime_us or 0), c.candidate_id))
        task, made, used = tasks[tid], 0, set()
        seen_code: set[tuple[str, str]] = set()  # the same two programs under other ids
        speed: list[PreferenceRow] = []
        bugs: list[PreferenceRow] = []
        # speed pairs (a slower correct sibling) and correctness pairs take turns, speed first
        for rej in alternate(slow, incorrect):
            if made >= 2 * pairs_per_task:
                break
            rv = verdicts[rej.candidate_id]
            # spread the chosen side over the correct kernels, best first
            order = chosen[made % len(chosen):] + chosen[:made % len(chosen)]
            win = next((w for w in order if w.candidate_id != rej.candidate_id
                        and (w.candidate_id, rej.candidate_id) not in used
                        and has_margin(verdicts[w.candidate_id], rv)
                        and verdicts[w.candidate_id].reward > rv.reward
                        and distinct_enough(w, rej, pair_similarity_limit(rv))), None)
            if win is None:
                continue
            used.add((win.candidate_id, rej.candidate_id))
            key = (normalise_code(win.code), normalise_code(rej.code))
            if key in seen_code:
                continue
            seen_code.add(key)
            wv = verdicts[win.candidate_id]
            (speed if rv.status in CORRECT_STATUSES else bugs).append(PreferenceRow(
                row_id=content_hash("preference", win.candidate_id, rej.candidate_id),
                task_id=tid, prompt=task_prompt(task, win.backend, cfg, reasoning=False),
                chosen=pair_side(win), rejected=pair_side(rej), split=splits[tid],
                **side_numbers(wv, rv)))
            made += 1
        rows.extend(balanced_pairs(speed, bugs, pairs_per_task))
    return rows


def balanced_pairs(speed: list, bugs: list, limit: int) -> list:
    """A task's pairs, at most `limit`: its speed pairs first, then as many correctness pairs as
    speed pairs (at least one), so no task's pairs teach only "a bug is worse" while the
    correct kernel's measured speed goes untaught; speed and correctness alternate."""
    speed = speed[:limit]
    bugs = bugs[:min(max(1, len(speed)), limit - len(speed))] if len(speed) < limit else []
    return alternate(speed, bugs)


def build_datasets(tasks: list[Task], candidates: list[Candidate], verdicts: list[Verdict],
                   selected: list[str], cfg: Config) -> dict[str, pa.Table]:
    """Build every dataset config from verified records; rows sorted by id for stable output."""
    # Splits are decided over every task, so changing the license allowlist moves no cluster.
    splits = assign_splits(tasks, cfg.publish.validation_fraction)
    allowed, _ = filter_licenses(tasks, cfg.publish.licenses)
    task_map = {t.task_id: t for t in sorted(allowed, key=lambda t: t.task_id)}
    vmap = {v.candidate_id: v for v in verdicts}
    cands = sorted((c for c in candidates if c.task_id in task_map),
                   key=lambda c: c.candidate_id)
    picked = set(selected)
    chosen = [c for c in cands if c.candidate_id in picked and c.candidate_id in vmap
              and vmap[c.candidate_id].status in CORRECT_STATUSES]
    if cfg.verify.generalize:  # an answer taught as correct was also correct at other sizes
        chosen = [c for c in chosen if generalisation_checked(vmap[c.candidate_id])]
    # sft teaches, per task, the fastest teacher kernel that passed every gate (its slower
    # siblings feed preference pairs)
    taught = [c for c in cands if _is_teacher(c) and c.candidate_id in vmap
              and meets_speedup(vmap[c.candidate_id], cfg.select.min_speedup)
              and timing_held(vmap[c.candidate_id], cfg.select.min_speedup)
              and (not cfg.verify.generalize or generalisation_checked(vmap[c.candidate_id]))]
    unstable = unstable_timings(cands, vmap)  # a speed label must rest on a timing that held
    answers = fastest_per_task((c, vmap[c.candidate_id]) for c in taught
                               if c.candidate_id not in unstable)
    rows: dict[str, list] = {
        "sft": _sft_rows(task_map, answers, vmap, splits, cfg),
        "rft": _rft_rows(task_map, _rft_selection(cands, verdicts, cfg), cands, vmap, splits,
                         cfg),
        "rl": _rl_rows(task_map, cands, vmap, splits, cfg),
        "repair": _repair_rows(task_map, cands, vmap, splits, cfg),
        "preference": _preference_rows(task_map, cands, vmap, splits, cfg),
        "review": review_rows(task_map, cands, vmap, splits),
        "perf_analysis": perf_rows(task_map, chosen, vmap, splits),
    }
    splits = with_validation(rows, splits, task_map)
    out = {"tasks": tasks_table(list(task_map.values()), splits)}
    for name, items in rows.items():
        unique = {r.row_id: r for r in items}  # the same pair or chain reached twice is one row
        out[name] = ROW_TYPES[name].to_arrow(
            [replace(unique[k], split=splits[unique[k].task_id],
                     **provenance(task_map[unique[k].task_id])) for k in sorted(unique)])
    return {name: out[name] for name in CONFIGS}
