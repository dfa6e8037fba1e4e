"""The rows audit's pair and bug-label checks: preference margins and distinct sides, review
fixes the verifier passed, bug kinds spread over review and repair rows."""

from __future__ import annotations

from collections import Counter

from benchmarks.audit_table import Audit, answer_code
from pipeline.datasets.analysis_rows import fix_source
from pipeline.datasets.pairs import (
    MAX_KIND_SHARE,
    MAX_SHALLOW_SHARE,
    MAX_SIMILARITY,
    MAX_SPEED_SIMILARITY,
    MIN_SPEEDUP,
    SHALLOW_KINDS,
    apply_label,
    code_similarity,
    fix_label,
    has_margin,
    mutant_kind,
    normalise_code,
    verified_codes,
)
from pipeline.datasets.rows import generalisation_checked
from schemas import Candidate, Verdict


def _side_verdict(code: str, task_id: str, reward: float, by_code: dict,
                  verdicts: dict[str, Verdict], runtime_us: float | None = None
                  ) -> Verdict | None:
    """The verdict of the candidate a pair side is: same program, and (when one program was
    verified more than once) the reward the row records, then its runtime (rewards of fast
    kernels tie at the cap)."""
    found = [verdicts[c.candidate_id] for c in by_code.get((task_id, normalise_code(code)), [])
             if c.candidate_id in verdicts]
    return min(found, key=lambda v: (abs(v.reward - reward), abs(
        (v.runtime_us or 0) - (runtime_us or 0)) if runtime_us else 0), default=None)


def check_pairs(audit: Audit, rows: dict[str, list[dict]], cands: list[Candidate],
                verdicts: dict[str, Verdict]) -> None:
    by_code: dict[tuple[str, str], list[Candidate]] = {}
    for c in cands:
        by_code.setdefault((c.task_id, normalise_code(c.code)), []).append(c)
    for r in rows.get("preference", []):
        where = f"preference {r['row_id'][:12]}"
        a, b = answer_code(r["chosen"][-1]["content"]), answer_code(r["rejected"][-1]["content"])
        sim = code_similarity(a, b)
        limit = MAX_SPEED_SIMILARITY if r.get("kind") == "speed" else MAX_SIMILARITY
        audit.record("pair_distinct", sim <= limit, where,
                     f"similarity {sim:.3f} over {limit} for a {r.get('kind')} pair")
        va = _side_verdict(a, r["task_id"], r["chosen_reward"], by_code, verdicts,
                           r.get("chosen_runtime_us"))
        vb = _side_verdict(b, r["task_id"], r["rejected_reward"], by_code, verdicts,
                           r.get("rejected_runtime_us"))
        if va is None or vb is None:
            audit.record("pair_margin", False, where, "a side has no verdict in the workspace")
            continue
        audit.record("pair_margin", has_margin(va, vb, MIN_SPEEDUP), where,
                     f"{va.status} {va.runtime_us} us vs {vb.status} {vb.runtime_us} us")
        # the chosen side is taught as correct: it must have generalised too
        audit.record("generalised", generalisation_checked(va), where + " chosen",
                     "no passed generalisation check recorded")


def check_reviews(audit: Audit, rows: dict[str, list[dict]], cands: list[Candidate],
                  verdicts: dict[str, Verdict]) -> None:
    by_id = {c.candidate_id: c for c in cands}
    passed = verified_codes(cands, verdicts)
    for r in rows.get("review", []):
        where = f"review {r['row_id'][:12]}"
        c = by_id.get(r["candidate_id"])
        fix = fix_source(c, by_id) if c else None
        label = fix_label(c.code, fix) if c and fix else None
        if label is None or label[0] != r["bug_line"]:
            audit.record("review_fix_verified", False, where, "no one-edit label at the row's line")
            continue
        fixed = normalise_code(apply_label(c.code, *label))
        audit.record("review_fix_verified", fixed in passed.get((c.task_id, c.backend), set()),
                     where, "the labelled fix was never verified correct")
    check_kind_spread(audit, "review", Counter(r["bug_kind"] for r in rows.get("review", [])))
    by_code = {(c.task_id, normalise_code(c.code)): c for c in cands}
    repair: Counter[str] = Counter()
    for r in rows.get("repair", []):
        first = next((m["content"] for m in r["messages"] if m["role"] == "assistant"), "")
        c = by_code.get((r["task_id"], normalise_code(answer_code(first))))
        if c is not None and c.generator.startswith("mutate:"):
            repair[mutant_kind(c)] += 1
    check_kind_spread(audit, "repair", repair, len(rows.get("repair", [])))


def check_kind_spread(audit: Audit, config: str, kinds: Counter[str],
                      total: int | None = None) -> None:
    """No bug kind over MAX_KIND_SHARE of a config's mutant rows, casts and bounds together
    under MAX_SHALLOW_SHARE; noted with the distribution. Fewer rows than 1 / MAX_KIND_SHARE
    cannot spread and pass."""
    n = sum(kinds.values())
    if not n:
        return
    spread = ", ".join(f"{k} {c}" for k, c in kinds.most_common())
    of = f" of {total}" if total is not None else ""
    audit.notes.append(f"{config} bug kinds ({n}{of} rows, {len(kinds)} kinds): {spread}")
    top = kinds.most_common(1)[0][1]
    shallow = sum(kinds[k] for k in SHALLOW_KINDS)
    ok = n * MAX_KIND_SHARE < 1 or (top <= MAX_KIND_SHARE * n
                                    and shallow < MAX_SHALLOW_SHARE * n)
    audit.record(f"{config}_kinds_spread", ok, config,
                 f"a kind over {MAX_KIND_SHARE:.0%} or {' + '.join(SHALLOW_KINDS)} at "
                 f"{MAX_SHALLOW_SHARE:.0%} or more: {spread}")
