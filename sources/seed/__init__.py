"""The built-in seed corpus: small KernelBench task files written for kernelsynth.

Each `<family>_<name>.py` here is a complete task file (`Model`, module-level shape constants,
`get_inputs`, `get_init_inputs`); its docstring names the op families (`schemas.OP_FAMILIES`).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

SEED_DIR = Path(__file__).resolve().parent
_FAMILIES_LINE = re.compile(r"^Families: (?P<families>[a-z_, ]+)\. Level (?P<level>\d)\.$", re.M)


def seed_files() -> list[Path]:
    """The seed task files, sorted by name (package data, so they ship in the wheel)."""
    return sorted(p for p in SEED_DIR.glob("*.py") if not p.name.startswith("_"))


def sample_seed_files(count: int, seed: int = 0) -> list[Path]:
    """`count` seed files spread round-robin over the family prefixes (0 or more than all: all).

    Deterministic for a given `seed`, so a small default build still sees every op family.
    """
    files = seed_files()
    if count <= 0 or count >= len(files):
        return files
    rng = random.Random(seed)
    groups: dict[str, list[Path]] = {}
    for path in files:
        groups.setdefault(path.name.split("_", 1)[0], []).append(path)
    for members in groups.values():
        rng.shuffle(members)
    order = sorted(groups)
    picked: list[Path] = []
    while len(picked) < count:
        for family in order:
            if groups[family] and len(picked) < count:
                picked.append(groups[family].pop())
    return sorted(picked)


def seed_families(source: str) -> tuple[list[str], int]:
    """The op families and level a seed file declares in its docstring (([], 0) if none)."""
    match = _FAMILIES_LINE.search(source)
    if match is None:
        return [], 0
    families = [f.strip() for f in match.group("families").split(",") if f.strip()]
    return families, int(match.group("level"))
