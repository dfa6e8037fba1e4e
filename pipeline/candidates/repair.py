"""Multi-turn repair: a failing candidate's verifier feedback becomes the next user turn.

A chain is turn 0 (a first attempt), then one candidate per turn whose `parent_id` is the turn
before; its `prompt` holds the whole conversation so far (task, attempt, feedback, attempt, ...).
The answer comes from the known fix when the failing attempt is an injected bug
(`generator="repair:fix"`), otherwise from the configured LLM (`generator="repair:<turn>"`).

Buffered Dynamic Retry: a task group (task, backend) in which every first attempt failed gives no
learning signal as it is; it is queued as a feedback-conditioned repair prompt built from its best
attempt, which is sampled `RepairConfig.retry_samples` times instead of once.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from pipeline.candidates.llm import ChatBackend, LLMError, make_backend
from pipeline.candidates.response_code import extract_code
from pipeline.config import Config
from pipeline.prompts import feedback_turn, fence
from schemas import Candidate, Message, Rejection, Task, Verdict, content_hash
from verifier.protocol import CORRECT_STATUSES, EXCLUDED_STATUSES

# Statuses that say nothing about correctness (a --compile-only run, a task too big for the
# device): not repaired.
UNDECIDED = ("compiled", *EXCLUDED_STATUSES)
STATUS_ORDER = ("format_error", "static_reject", "compile_error", "runtime_error", "timeout",
                "incorrect", "cheat")


@dataclass
class RetryItem:
    """A task group whose every first attempt failed, as a feedback-conditioned prompt."""

    task_id: str
    backend: str
    candidate_id: str  # the best failing attempt, whose feedback conditions the prompt
    messages: list[Message]
    group_size: int


def is_failure(verdict: Verdict | None) -> bool:
    """True when the verifier decided the candidate is not a correct kernel."""
    return verdict is not None and verdict.status not in CORRECT_STATUSES + UNDECIDED


def conversation(cand: Candidate) -> list[Message]:
    """The chat so far with `cand`'s answer appended as the assistant turn."""
    answer = cand.raw_response.strip() or fence(cand.code)
    return [*cand.prompt, Message("assistant", answer)]


def repair_candidate_id(task_id: str, backend: str, code: str, parent_id: str) -> str:
    """A repair turn's id: its code in its chain (the same fix in two chains is two turns)."""
    return content_hash(task_id, backend, code, "repair-of", parent_id)


def chain_ends(candidates: list[Candidate], verdicts: dict[str, Verdict],
               turn: int) -> list[Candidate]:
    """Failing candidates at `turn - 1` with no repair yet: the chains to continue."""
    has_child = {c.parent_id for c in candidates if c.parent_id}
    return [c for c in candidates
            if c.turn == turn - 1 and c.candidate_id not in has_child
            and is_failure(verdicts.get(c.candidate_id))]


def _rank(v: Verdict) -> tuple[float, int]:
    later = STATUS_ORDER.index(v.status) if v.status in STATUS_ORDER else -1
    return (v.reward, later)


def retry_buffer(candidates: list[Candidate], verdicts: list[Verdict] | dict[str, Verdict]
                 ) -> list[RetryItem]:
    """Buffered Dynamic Retry: groups whose every first attempt failed, best attempt first."""
    vmap = verdicts if isinstance(verdicts, dict) else {v.candidate_id: v for v in verdicts}
    groups: dict[tuple[str, str], list[Candidate]] = defaultdict(list)
    for c in candidates:
        if c.turn == 0 and not c.generator.startswith("mutate:"):
            groups[(c.task_id, c.backend)].append(c)
    items = []
    for (task_id, backend), members in sorted(groups.items()):
        if not all(is_failure(vmap.get(c.candidate_id)) for c in members):
            continue
        best = max(members, key=lambda c: (_rank(vmap[c.candidate_id]), c.candidate_id))
        messages = [*conversation(best), Message("user", feedback_turn(vmap[best.candidate_id]))]
        items.append(RetryItem(task_id, backend, best.candidate_id, messages, len(members)))
    return items


def _changed_line(buggy: str, fixed: str) -> tuple[int, str, str] | None:
    """(1-based line in `buggy`, its text, the fixed text) when the fix replaces one line."""
    ops = [op for op in difflib.SequenceMatcher(None, buggy.splitlines(), fixed.splitlines(),
                                                autojunk=False).get_opcodes() if op[0] != "equal"]
    if len(ops) != 1 or ops[0][0] != "replace" or ops[0][2] - ops[0][1] != 1 \
            or ops[0][4] - ops[0][3] != 1:
        return None
    _, i1, _, j1, _ = ops[0]
    return i1 + 1, buggy.splitlines()[i1], fixed.splitlines()[j1]


def _changed_lines(buggy: str, fixed: str, meta: dict) -> str | None:
    """The explanation of a fix that inserts, deletes or rewrites several lines in one place,
    quoting the lines the diff changes (the mutation's own before/after text can be a line the
    fix never touches); None when the programs differ in more than one place."""
    a, b = buggy.splitlines(), fixed.splitlines()
    ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    kind = str(meta.get("mutation") or "an injected bug")
    if len(ops) == 2:
        return _moved_lines(a, b, ops, str(meta.get("bug_description") or kind))
    if len(ops) != 1:
        return None
    tag, i1, i2, j1, j2 = ops[0]
    old, new = "\n".join(a[i1:i2]).strip("\n"), "\n".join(b[j1:j2]).strip("\n")
    if tag == "insert":
        return (f"The bug is a missing line before line {i1 + 1} ({kind}); it should read\n"
                f"```\n{new}\n```\nHere is the corrected kernel.")
    if tag == "delete":
        return (f"The bug is on line{'s' if i2 - i1 > 1 else ''} {i1 + 1}"
                + (f"-{i2}" if i2 - i1 > 1 else "") + f" ({kind}), which should not be there:\n"
                f"```\n{old}\n```\nHere is the corrected kernel.")
    where = f"line {i1 + 1}" if i2 - i1 == 1 else f"lines {i1 + 1}-{i2}"
    return (f"The bug is on {where} ({kind}). The code there reads\n```\n{old}\n```\n"
            f"and should read\n```\n{new}\n```\nHere is the corrected kernel.")


def _moved_lines(a: list[str], b: list[str], ops: list[tuple], desc: str) -> str | None:
    """The explanation of a fix that moves lines (one hunk deleted, the same text inserted
    elsewhere: a hoisted accumulator put back into its loop); None for any other pair of hunks."""
    tags = sorted(op[0] for op in ops)
    if tags != ["delete", "insert"]:
        return None
    dele = next(op for op in ops if op[0] == "delete")
    ins = next(op for op in ops if op[0] == "insert")
    moved = a[dele[1]:dele[2]]
    if [x.strip() for x in moved] != [x.strip() for x in b[ins[3]:ins[4]]] or ins[3] == 0:
        return None
    text = "\n".join(x.strip() for x in moved)
    return (f"The bug is on line {dele[1] + 1}: {desc}. The line\n```\n{text}\n```\n"
            f"belongs at line {ins[3] + 1} of the corrected kernel, right after\n```\n"
            f"{b[ins[3] - 1].strip()}\n```\nHere is the corrected kernel.")


def fix_explanation(buggy: str, fixed: str, meta: dict) -> str:
    """The known fix's explanation, checked against the diff: the line it names and the text
    it quotes are those the fix changes, and the bug's description is kept only when the code
    it quotes is in the faulty line (a description that quotes the correct code reads backwards)."""
    changed = _changed_line(buggy, fixed)
    if changed is None:
        other = _changed_lines(buggy, fixed, meta)
        if other is not None:
            return other
    line, after, before = (changed if changed is not None else
                           (meta.get("bug_line", "?"), str(meta.get("bug_after", "")),
                            str(meta.get("bug_before", ""))))
    desc = str(meta.get("bug_description") or "")
    quoted = re.findall(r"`([^`]+)`", desc)
    backwards = (changed is not None and quoted
                 and "".join(quoted[0].split()) not in "".join(after.split()))
    if not desc or backwards:
        desc = f"the line was changed ({meta.get('mutation', 'an injected bug')})"
    return (f"The bug is on line {line}: {desc}.\n"
            f"The faulty line is\n```\n{after.strip()}\n```\n"
            f"and it should read\n```\n{before.strip()}\n```\n"
            "Here is the corrected kernel.")


def known_fix(end: Candidate, verdict: Verdict, turn: int) -> Candidate | None:
    """The next turn of a mutation chain: the original kernel, explained; None if unknown."""
    meta = end.meta_dict()
    code = meta.get("fix_code")
    if not end.generator.startswith("mutate:") or not isinstance(code, str) or not code:
        return None
    explanation = fix_explanation(end.code, code, meta)
    return Candidate(
        candidate_id=repair_candidate_id(end.task_id, end.backend, code, end.candidate_id),
        task_id=end.task_id, backend=end.backend, generator="repair:fix", code=code,
        raw_response=fence(code, explanation),
        prompt=[*conversation(end), Message("user", feedback_turn(verdict))],
        parent_id=end.candidate_id, turn=turn,
        meta=json.dumps({"fix_for": meta.get("mutation", ""), "bug_line": meta.get("bug_line"),
                         "feedback_status": verdict.status}))


def _llm_kind(cfg: Config) -> str | None:
    wanted = cfg.repair.generator
    if wanted in ("openai", "hf"):
        return wanted
    if wanted in ("auto", "llm"):
        for kind in ("openai", "hf"):
            if kind in cfg.generate.generators:
                return kind
    return None


def repair_round(
    tasks: dict[str, Task] | Iterable[Task],
    candidates: list[Candidate],
    verdicts: list[Verdict],
    cfg: Config,
    turn: int,
    *,
    llm: ChatBackend | None = None,
    api_key: str | None = None,
    rejections: list[Rejection] | None = None,
) -> list[Candidate]:
    """Turn `turn` of every failing chain (`turn - 1` ends): known fixes and LLM answers."""
    if turn < 1 or turn > cfg.repair.turns:
        return []
    task_ids = set(tasks) if isinstance(tasks, dict) else {t.task_id for t in tasks}
    vmap = {v.candidate_id: v for v in verdicts}
    ends = [c for c in chain_ends(candidates, vmap, turn) if c.task_id in task_ids]
    out: list[Candidate] = []
    to_llm: list[Candidate] = []
    use_fix = cfg.repair.generator in ("auto", "fix")
    for end in ends:
        fixed = known_fix(end, vmap[end.candidate_id], turn) if use_fix else None
        if fixed is not None:
            out.append(fixed)
        elif cfg.repair.generator != "fix":
            to_llm.append(end)
    if not to_llm:
        return out
    kind = _llm_kind(cfg)
    if llm is None:
        if kind is None:
            return out  # no LLM configured: only mutation chains can be repaired
        try:
            llm = make_backend(kind, cfg.generate, api_key)
        except LLMError as exc:
            _reject(rejections, "llm_unavailable", turn, to_llm[0], str(exc))
            return out
    retry_ids = ({item.candidate_id for item in retry_buffer(candidates, vmap)}
                 if turn == 1 and cfg.repair.retry_samples > 1 else set())
    prompts = [[*conversation(e), Message("user", feedback_turn(vmap[e.candidate_id]))]
               for e in to_llm]
    # one chat call per sample count so servers batch the common case (n=1) together
    by_n: dict[int, list[int]] = defaultdict(list)
    for i, e in enumerate(to_llm):
        by_n[cfg.repair.retry_samples if e.candidate_id in retry_ids else 1].append(i)
    seen: set[str] = set()
    for n, idxs in sorted(by_n.items()):
        answers = llm.chat([prompts[i] for i in idxs], n=n)
        for i, answer in zip(idxs, answers, strict=True):
            end = to_llm[i]
            if isinstance(answer, LLMError):
                _reject(rejections, "llm_error", turn, end, str(answer))
                continue
            for j, completion in enumerate(answer):
                code = extract_code(completion.text) or ""
                cid = repair_candidate_id(end.task_id, end.backend, code or completion.text,
                                          end.candidate_id)
                if cid in seen:
                    continue
                seen.add(cid)
                meta = {"model": llm.generator_name, "usage": completion.usage(), "sample": j,
                        "feedback_status": vmap[end.candidate_id].status}
                if end.candidate_id in retry_ids:
                    meta["retry"] = "buffered_dynamic_retry"
                if completion.extra.get("reasoning_content"):
                    meta["reasoning"] = completion.extra["reasoning_content"]
                out.append(Candidate(
                    candidate_id=cid, task_id=end.task_id, backend=end.backend,
                    generator=f"repair:{turn}", code=code, raw_response=completion.text,
                    prompt=prompts[i], parent_id=end.candidate_id, turn=turn,
                    meta=json.dumps(meta)))
    return out


def _reject(rejections: list[Rejection] | None, reason: str, turn: int, end: Candidate,
            detail: str) -> None:
    if rejections is not None:
        rejections.append(Rejection.make("repair", end.candidate_id,
                                         f"task {end.task_id} turn {turn}", reason,
                                         detail.splitlines()[0] if detail else reason))
