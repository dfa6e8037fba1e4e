"""Rules that make preference pairs and bug labels teach something.

- A preference pair has a real margin: a correct kernel over an incorrect one, or a correct kernel
  over another correct kernel measured on the same device and at least `MIN_SPEEDUP` times slower
  across its repeated timing samples: the slower one's lower quartile against the faster one's
  upper quartile (median -/+ IQR/2), so a margin within the timing noise makes no pair.
- Its two sides are different programs: code similarity (difflib ratio over normalised code)
  at most `MAX_SIMILARITY`, never identical. A speed pair (two correct kernels) may be closer,
  up to `MAX_SPEED_SIMILARITY`: siblings of one strategy family that differ by a vectorising
  pragma, a loop order or a flag and run measurably apart teach exactly that difference.
- Mutants (`mutate:<kind>`) of one task are shared out by kind between the repair, review and
  preference configs, so no bug kind of a task is reused across configs, and each config gets
  its share of every kind.
- A review label (line + fix) is kept only when applying it to the mutant gives a program the
  verifier passed.
- Review and repair rows spread their bug kinds: no kind over `MAX_KIND_SHARE`, the one-token
  kinds (`SHALLOW_KINDS`) together under `MAX_SHALLOW_SHARE` (`analysis_rows.spread_kinds`).
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections import Counter, defaultdict

from pipeline.datasets.retime import timing_held
from schemas import Candidate, Verdict
from verifier.protocol import CORRECT_STATUSES

MIN_SPEEDUP = 1.2
MAX_SIMILARITY = 0.9
MAX_SPEED_SIMILARITY = 0.98
MUTANT_CONFIGS = ("review", "repair", "preference")
# review and repair rows: no bug kind over this share of a config's mutant rows, and the
# one-token kinds that nearly every kernel admits (a loop bound, a cast) together under the next
MAX_KIND_SHARE = 0.3
SHALLOW_KINDS = ("off_by_one", "wrong_cast")
MAX_SHALLOW_SHARE = 0.4

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/|^\s*#(?!\s*(?:pragma|include|define|if|else|"
                      r"elif|endif|ifdef|ifndef|undef))[^\n]*", re.S | re.M)
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+\.?\d*(?:[eE][-+]?\d+)?[fFuUlL]*|\S")


def normalise_code(code: str) -> str:
    """The code with comments dropped and whitespace collapsed: one token per line."""
    return "\n".join(_TOKEN.findall(_COMMENT.sub(" ", code)))


def code_similarity(a: str, b: str) -> float:
    """difflib ratio of the two programs' normalised token sequences (1.0: identical)."""
    ta, tb = normalise_code(a).split("\n"), normalise_code(b).split("\n")
    if ta == tb:
        return 1.0
    return difflib.SequenceMatcher(None, ta, tb, autojunk=False).ratio()


def has_margin(win: Verdict, lose: Verdict, min_speedup: float = MIN_SPEEDUP) -> bool:
    """`win` clearly beats `lose`: correct over incorrect, or >= min_speedup on the same device."""
    if win.status not in CORRECT_STATUSES:
        return False
    if lose.status not in CORRECT_STATUSES:
        return True
    if not win.device or win.device != lose.device or win.backend != lose.backend:
        return False
    if not win.runtime_us or not lose.runtime_us or win.runtime_us <= 0:
        return False  # speed is compared on measured runtimes only
    if win.runtime_iqr_us is None or lose.runtime_iqr_us is None:
        return False  # no spread recorded: one timing, whose noise is unknown
    win_slow = win.runtime_us + win.runtime_iqr_us / 2  # upper quartile, about
    lose_fast = lose.runtime_us - lose.runtime_iqr_us / 2  # lower quartile, about
    return lose_fast >= min_speedup * win_slow


def pair_similarity_limit(lose: Verdict) -> float:
    """The most similar a pair's sides may be: closer for a speed pair (both correct)."""
    return MAX_SPEED_SIMILARITY if lose.status in CORRECT_STATUSES else MAX_SIMILARITY


def distinct_enough(a: Candidate, b: Candidate, max_similarity: float = MAX_SIMILARITY) -> bool:
    """The two sides of a pair are different programs (similarity <= max_similarity)."""
    return code_similarity(a.code, b.code) <= max_similarity


def mutant_kind(c: Candidate) -> str:
    return c.generator.split(":", 1)[1] if ":" in c.generator else c.generator


def mutant_configs(cands: list[Candidate], verdicts: dict[str, Verdict] | None = None
                   ) -> dict[str, str]:
    """mutant candidate_id -> the one config (review, repair or preference) that may use it.

    A unit is one bug kind of one (task, backend); every mutant of a unit goes to one config, so
    no kind of a task is taught twice. Units are dealt rarest kind first, each to the config
    that has the fewest of its kind so far (then the fewest units), so every config gets its
    share of every kind instead of whatever a task's hash gives it. With `verdicts`, only
    mutants that failed verification are dealt; the others (no bug shows) get "".
    """
    units: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    unused: list[str] = []
    for c in cands:
        if not c.generator.startswith("mutate:"):
            continue
        v = verdicts.get(c.candidate_id) if verdicts is not None else None
        if verdicts is not None and (v is None or v.status in CORRECT_STATUSES):
            unused.append(c.candidate_id)
            continue
        units[(c.task_id, c.backend, mutant_kind(c))].append(c.candidate_id)
    per_kind = Counter(k for _t, _b, k in units)
    order = sorted(units, key=lambda u: (per_kind[u[2]], u[2], hashlib.sha256(
        "|".join(u).encode()).hexdigest()))
    have: dict[str, Counter[str]] = {cfg: Counter() for cfg in MUTANT_CONFIGS}
    owner = dict.fromkeys(unused, "")
    for unit in order:
        cfg = min(MUTANT_CONFIGS, key=lambda g: (have[g][unit[2]], sum(have[g].values()),
                                                 MUTANT_CONFIGS.index(g)))
        have[cfg][unit[2]] += 1
        owner.update(dict.fromkeys(units[unit], cfg))
    return owner


def fix_label(buggy: str, fixed: str) -> tuple[int, str, list[str]] | None:
    """(line, action, new lines) that turn `buggy` into `fixed`, when one edit does it.

    action is `replace` (line's run of lines by the new lines), `insert` (the new lines before
    line) or `delete` (the line). None when the programs differ in more than one place.
    """
    a, b = buggy.splitlines(), fixed.splitlines()
    while a and not a[-1].strip():
        a.pop()
    while b and not b[-1].strip():
        b.pop()
    ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    if len(ops) != 1:
        return None
    tag, i1, i2, j1, j2 = ops[0]
    if tag == "insert":
        return i1 + 1, "insert", b[j1:j2]
    if tag == "delete" and i2 - i1 == 1:
        return i1 + 1, "delete", []
    if tag == "replace" and i2 - i1 == 1:
        return i1 + 1, "replace", b[j1:j2]
    return None


def apply_label(buggy: str, line: int, action: str, new: list[str]) -> str:
    """`buggy` with a labelled fix applied (the inverse of `fix_label`)."""
    lines = buggy.splitlines()
    if not 0 < line <= len(lines) + (action == "insert"):
        raise ValueError(f"line {line} is outside the {len(lines)}-line kernel")
    i = line - 1
    if action == "insert":
        lines[i:i] = new
    elif action == "delete":
        del lines[i]
    elif action == "replace":
        lines[i:i + 1] = new
    else:
        raise ValueError(f"unknown fix action {action!r}")
    return "\n".join(lines) + "\n"


def verified_codes(cands: list[Candidate], verdicts: dict[str, Verdict]
                   ) -> dict[tuple[str, str], set[str]]:
    """(task, backend) -> normalised code of every candidate the verifier passed."""
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for c in cands:
        v = verdicts.get(c.candidate_id)
        if v is not None and v.status in CORRECT_STATUSES:
            out[(c.task_id, c.backend)].add(normalise_code(c.code))
    return out


def alternate(first: list[Candidate], second: list[Candidate]) -> list[Candidate]:
    """first[0], second[0], first[1], second[1], ... then the rest of the longer list."""
    out: list[Candidate] = []
    for i in range(max(len(first), len(second))):
        out.extend(x[i] for x in (first, second) if i < len(x))
    return out


def unstable_timings(cands: list[Candidate], verdicts: dict[str, Verdict]) -> set[str]:
    """Ids whose timing did not repeat: the same program (normalised code) of a task timed
    more than once on one device, with runtimes whose quartile ranges do not overlap."""
    timed: dict[tuple[str, str, str], list[tuple[str, Verdict]]] = defaultdict(list)
    for c in cands:
        v = verdicts.get(c.candidate_id)
        if v is not None and v.status in CORRECT_STATUSES and v.runtime_us:
            timed[(c.task_id, v.device, normalise_code(c.code))].append((c.candidate_id, v))
    out: set[str] = set()
    for group in timed.values():
        if len({v.runtime_us for _, v in group}) < 2:
            continue
        lo = max(v.runtime_us - (v.runtime_iqr_us or 0) / 2 for _, v in group)
        hi = min(v.runtime_us + (v.runtime_iqr_us or 0) / 2 for _, v in group)
        if lo > hi:  # no runtime lies within every timing's spread
            out.update(cid for cid, _ in group)
    return out


def programs_not_held(cands: list[Candidate], verdicts: dict[str, Verdict],
                      min_speedup: float) -> set[str]:
    """Ids whose program (task, normalised code) has a timing no speed label may rest on: one
    that did not repeat (`unstable_timings`), or a re-timing of any of its ids below
    `min_speedup` (`retime.timing_held`). A repair turn that restores a template kernel is the
    same program under another id: its one timing that held does not outvote the template's
    re-timing that fell below the gate."""
    unstable = unstable_timings(cands, verdicts)
    weak = {(c.task_id, normalise_code(c.code)) for c in cands
            if c.candidate_id in unstable or (c.candidate_id in verdicts
                                               and not timing_held(verdicts[c.candidate_id],
                                                                   min_speedup))}
    return {c.candidate_id for c in cands if (c.task_id, normalise_code(c.code)) in weak}
