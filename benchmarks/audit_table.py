"""What every part of the rows audit shares: the pass/fail tally and reading a version's rows."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

CODE = re.compile(r"```(?:python)?\n(.*?)```", re.S)


class Audit:
    """Pass/fail counts per check and the first few failures of each."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter] = {}
        self.examples: dict[str, list[str]] = {}
        self.notes: list[str] = []

    def record(self, check: str, ok: bool, where: str = "", why: str = "") -> None:
        self.counts.setdefault(check, Counter())["pass" if ok else "fail"] += 1
        if not ok and len(self.examples.setdefault(check, [])) < 5:
            self.examples[check].append(f"{where}: {why}"[:300])

    def skip(self, check: str, n: int = 1) -> None:
        self.counts.setdefault(check, Counter())["skipped"] += n

    def failed(self) -> bool:
        return any(c["fail"] for c in self.counts.values())

    def table(self) -> str:
        lines = ["| check | pass | fail | skipped |", "| --- | ---: | ---: | ---: |"]
        for check, c in self.counts.items():
            lines.append(f"| {check} | {c['pass']} | {c['fail']} | {c['skipped']} |")
        for check, ex in self.examples.items():
            lines += ["", f"{check} failures (first {len(ex)}):", *[f"- {e}" for e in ex]]
        lines += ["", *self.notes] if self.notes else []
        return "\n".join(lines) + "\n"


def read_config(version_dir: Path, config: str) -> list[dict]:
    """Every row of one config of a published version (all splits)."""
    rows: list[dict] = []
    for path in sorted((version_dir / config).rglob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


def answer_code(content: str) -> str:
    m = CODE.findall(content or "")
    return m[-1] if m else ""
