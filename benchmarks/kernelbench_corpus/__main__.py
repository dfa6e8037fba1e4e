"""Write the corpus as a `python -m verifier --batch` file for KernelBench's problem files.

    python -m benchmarks.kernelbench_corpus --kb-dir KernelBench/ --out rows.jsonl
        [--levels 1,2,3] [--per-family N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.kernelbench_corpus import KbCandidate, candidates


def batch_rows(kb_dir: Path, cands: list[KbCandidate]) -> list[dict]:
    """Verifier batch rows (candidate_id, task_id, task_source, response, backend) for these."""
    rows, sources = [], {}
    for c in cands:
        if c.problem not in sources:
            path = kb_dir / c.problem
            try:
                sources[c.problem] = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise SystemExit(f"{path}: cannot read the problem file ({exc.strerror})") \
                    from None
        rows.append({"candidate_id": c.candidate_id, "task_id": c.problem,
                     "task_source": sources[c.problem], "response": c.source,
                     "backend": "cuda"})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernelbench_corpus")
    ap.add_argument("--kb-dir", type=Path, required=True,
                    help="KernelBench's problem folder (holding level1/, level2/, level3/)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--levels", default="1,2,3")
    ap.add_argument("--labels", default="", help="only these labels (comma-separated)")
    a = ap.parse_args(argv)
    levels = tuple(int(x) for x in a.levels.split(","))
    cands = [c for c in candidates(levels) if not a.labels or c.label in a.labels.split(",")]
    rows = batch_rows(a.kb_dir, cands)
    a.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} candidates -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
