"""The built-in seed corpus: small KernelBench task files written for kernelsynth.

Each `<family>_<name>.py` here is a complete task file (`Model`, module-level shape constants,
`get_inputs`, `get_init_inputs`); its docstring names the op families (`schemas.OP_FAMILIES`).
"""

from __future__ import annotations

import re
from pathlib import Path

SEED_DIR = Path(__file__).resolve().parent
_FAMILIES_LINE = re.compile(r"^Families: (?P<families>[a-z_, ]+)\. Level (?P<level>\d)\.$", re.M)


def seed_files() -> list[Path]:
    """The seed task files, sorted by name (package data, so they ship in the wheel)."""
    return sorted(p for p in SEED_DIR.glob("*.py") if not p.name.startswith("_"))


def seed_families(source: str) -> tuple[list[str], int]:
    """The op families and level a seed file declares in its docstring (([], 0) if none)."""
    match = _FAMILIES_LINE.search(source)
    if match is None:
        return [], 0
    families = [f.strip() for f in match.group("families").split(",") if f.strip()]
    return families, int(match.group("level"))
