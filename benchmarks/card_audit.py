"""The rows audit's truth checks (issue 31, items 4 and 5): what a card and a repair row say is
what was measured and what the code shows.

- `card_counts`: the card's subsets table gives each config's train and validation rows as
  published.
- `card_compile`: the card names torch.compile as a baseline only when a verdict of the version's
  workspace timed it.
- `card_samples`: a card that reports pass@k / avg@k / fast_p has independent model samples
  (llm, hf or import) behind them, never template variants alone.
- `repair_explained`: every repair explanation "The bug is on line N ... The faulty line is X
  and it should read Y" names the line the attempt shows as X, and the fixed code that follows
  has Y where X was; a move ("The line X belongs at line M of the corrected kernel, right after
  P") names a line N that reads X in the attempt, and the fix has X at M with P just above.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.audit_table import Audit, answer_code
from pipeline.datasets.stats import is_sample
from schemas import Candidate, Verdict

EXPLAINED = re.compile(r"The bug is on line (\d+):.*?The faulty line is\n```\n(.*?)\n```\n"
                       r"and it should read\n```\n(.*?)\n```", re.S)
MOVED = re.compile(r"The bug is on line (\d+):.*?The line\n```\n(.*?)\n```\nbelongs at line "
                   r"(\d+) of the corrected kernel, right after\n```\n(.*?)\n```", re.S)
SUBSET = re.compile(r"^\| `(\w+)` \| (\d+) \| (\d+) \|", re.M)


def check_card(audit: Audit, version_dir: Path, rows: dict[str, list[dict]],
               cands: list[Candidate], verdicts: dict[str, Verdict]) -> None:
    """Record the card checks above for one published version."""
    card = (version_dir / "README.md").read_text(encoding="utf-8")
    for config, train, valid in SUBSET.findall(card):
        if config == "tasks" or config not in rows:
            continue
        got = rows[config]
        have = (sum(r.get("split") == "train" for r in got),
                sum(r.get("split") == "validation" for r in got))
        audit.record("card_counts", have == (int(train), int(valid)), f"card {config}",
                     f"card says {train}/{valid} train/validation, rows have {have[0]}/{have[1]}")
    timed = any(v.compiled_us is not None for v in verdicts.values())
    says = "timing against eager and torch.compile" in card
    audit.record("card_compile", says == timed or not says, "card text",
                 "names torch.compile as a timed baseline but no verdict timed it")
    if re.search(r"^\| (pass@|avg@|fast_)", card, re.M):
        samples = [c for c in cands if is_sample(c) and c.turn == 0
                   and c.candidate_id in verdicts]
        audit.record("card_samples", bool(samples), "card metrics",
                     "pass@k is reported but no independent model sample was verified")
    for r in rows.get("repair", []):
        _check_explanations(audit, r)


def _check_explanations(audit: Audit, row: dict) -> None:
    turns = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    for before, after in zip(turns, turns[1:], strict=False):
        old, new = answer_code(before).splitlines(), answer_code(after).splitlines()
        moved = MOVED.search(after)
        if moved is not None:
            _check_move(audit, row, moved, old, new)
            continue
        m = EXPLAINED.search(after)
        if m is None:
            continue
        line, faulty, fixed = int(m.group(1)), m.group(2).strip(), m.group(3).strip()
        where = f"repair {row['row_id'][:12]} line {line}"
        shown = old[line - 1].strip() if 0 < line <= len(old) else None
        now = new[line - 1].strip() if 0 < line <= len(new) else None
        audit.record("repair_explained", shown == faulty and now == fixed, where,
                     f"the attempt's line reads {shown!r}, the fix's {now!r}; the explanation "
                     f"says {faulty!r} -> {fixed!r}")


def _line(lines: list[str], n: int) -> str | None:
    return lines[n - 1].strip() if 0 < n <= len(lines) else None


def _check_move(audit: Audit, row: dict, m: re.Match, old: list[str], new: list[str]) -> None:
    """A moved line: the attempt has it at the named line, the fix at the target, after P."""
    line, text, to, prev = int(m.group(1)), m.group(2).strip(), int(m.group(3)), m.group(4).strip()
    first = text.splitlines()[0].strip() if text else ""
    shown, now, above = _line(old, line), _line(new, to), _line(new, to - 1)
    audit.record("repair_explained", shown == first and now == first and above == prev,
                 f"repair {row['row_id'][:12]} line {line}",
                 f"the attempt's line reads {shown!r}, the fix's line {to} {now!r} after "
                 f"{above!r}; the explanation moves {first!r} after {prev!r}")
