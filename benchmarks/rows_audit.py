"""Audit a published dataset version: rows worth training on (issues 18 and 31).

Each idea lives in its own module; this one runs them all and prints one table.

Checks, each counted pass/fail over the rows (or kernels) it applies to:
- `generalised`: every SFT/RFT answer's and preference chosen side's verdict records a passed
  generalisation check (a `generalised` finding, no `variant_skipped`).
- `no_switches`: no preprocessor switch (`#if`, `#ifdef`, `#elif`, `#else`, `#endif`, `#undef`),
  no macro defined but unused and no struct field never read (`g.divisor`; g++ does not warn on
  those) in any published kernel (SFT, RFT, preference chosen sides).
- `builds_clean`: the CPU kernels of those answers build with `-Wall -Wextra
  -Werror=unused-variable -Werror=unused-function` (one translation unit, each in a namespace;
  `-fsyntax-only`); CUDA kernels are counted as not built.
- `sizes_agree`: in every row that shows a reference (all configs), the `# inputs:`/`# returns`
  annotations, every shape in a comment, the stated constructor arguments, the stated input
  shapes and every shape in the answer's reasoning are the reference's own (run on the meta
  device in the verifier's sandbox).
- `init_named`: no row names a constructor value `get_init_inputs()[i]`.
- `pair_margin` / `pair_distinct`: every preference pair is correct over incorrect or >= 1.2x
  faster on the same device, and its two programs are at most 0.9 similar.
- `review_fix_verified`: applying each review row's labelled fix to its kernel gives a program
  the verifier passed.
- `review_kinds_spread` / `repair_kinds_spread`: no bug kind holds more than 30% of the review
  rows (of the repair rows whose chain starts from a mutant), and casts and off-by-ones together
  under 40% (counted once per version; fewer than 4 rows pass); the table notes each
  distribution and its number of kinds.
- `answer_format`: every assistant turn (SFT, RFT, repair, the history in RL repair prompts,
  both preference sides) answers in the form its user turn asked for: an explanation before the
  code when the prompt asks for one, one code block alone when it says "code block only".
- issue 31's speed checks (`benchmarks/speed_audit.py`): numbers by name, sft and chosen sides
  at least `select.min_speedup`, a third speed pairs, timings that repeat, one analysis per
  kernel without shared advice, validation splits, rl input_specs as the prompt shows them.
- issue 31's truth checks (`benchmarks/card_audit.py`): the card's counts, torch.compile named
  only when timed, pass@k only over model samples, repair explanations that match the diff.
- `backend_named`: the card's tags are exactly those of the backends in the rows, every row
  names its backend, a cpu row's system prompt names no GPU, and the card's text says which
  backend made and checked the kernels.

    python -m benchmarks.rows_audit --workspace WS [--name kernelsynth] [--version vN]
        [--out table.md] [--min-sft 10]

Exit status 1 when any check has a failure.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks.audit_table import Audit, read_config
from benchmarks.card_audit import check_card
from benchmarks.kernel_audit import (
    check_builds,
    check_generalised,
    check_switches,
    published_kernels,
)
from benchmarks.pair_audit import check_pairs, check_reviews
from benchmarks.size_audit import check_sizes
from benchmarks.speed_audit import check_speed
from pipeline.datasets import published
from pipeline.datasets.card import backend_tags
from pipeline.prompts import answer_format_problems
from pipeline.workspace import Workspace
from schemas import Candidate, Message, Verdict


def check_backend(audit: Audit, version_dir: Path, rows: dict[str, list[dict]]) -> None:
    backends = sorted({r["backend"] for rs in rows.values() for r in rs if "backend" in r})
    for config, rs in rows.items():
        for r in rs:
            if "backend" in r:
                audit.record("backend_named", bool(r["backend"]), f"{config} {r['row_id'][:12]}",
                             "empty backend")
            if r.get("backend") == "cpu":  # a CPU row's prompts must not claim a GPU
                said = " ".join(m["content"] for m in r.get("messages") or []
                                if m.get("role") == "system")
                audit.record("backend_named", not re.search(r"\bGPU\b|\bCUDA\b", said),
                             f"{config} {r['row_id'][:12]} system prompt",
                             f"a cpu row's system prompt says GPU: {said[:80]!r}")
    card = (version_dir / "README.md").read_text(encoding="utf-8")
    front = card.split("---")[1] if card.startswith("---") else ""
    tags = (yaml.safe_load(front) or {}).get("tags", []) if front else []
    audit.record("backend_named", tags == backend_tags(backends), "card tags",
                 f"{tags} for backends {backends}")
    audit.record("backend_named", "Kernels in this version:" in card, "card text",
                 "no sentence naming the backend")


def check_answer_format(audit: Audit, rows: dict[str, list[dict]]) -> None:
    def msgs(ms: list[dict]) -> list[Message]:
        return [Message(m["role"], m["content"]) for m in ms or []]

    for config, rs in rows.items():
        for r in rs:
            if config == "preference":
                convs = [msgs(r["prompt"]) + msgs(r[side]) for side in ("chosen", "rejected")]
            elif config == "rl":
                convs = [msgs(r["prompt"])]
            elif config in ("sft", "rft", "repair"):
                convs = [msgs(r["messages"])]
            else:
                continue
            problems = [p for conv in convs for p in answer_format_problems(conv)]
            audit.record("answer_format", not problems, f"{config} {r['row_id'][:12]}",
                         "; ".join(problems))


def latest_version(ws: Workspace, name: str) -> Path:
    """The folder of the latest version (the pipeline's one notion of "latest")."""
    latest = published.latest_version(ws, name)
    if latest is None:
        raise SystemExit(f"{ws.datasets_dir / name}: no published version")
    return latest.path


def audit_version(ws: Workspace, version_dir: Path, min_sft: int | None = None) -> Audit:
    manifest = json.loads((version_dir / "manifest.json").read_text(encoding="utf-8"))
    rows = {c: read_config(version_dir, c) for c in manifest["configs"] if c != "tasks"}
    cands = ws.read(Candidate)
    verdicts = {v.candidate_id: v for v in ws.read(Verdict)}
    audit = Audit()
    check_generalised(audit, rows, verdicts)
    kernels = published_kernels(rows)
    check_switches(audit, kernels)
    with tempfile.TemporaryDirectory() as tmp:
        check_builds(audit, kernels, Path(tmp))
    check_sizes(audit, rows)
    check_pairs(audit, rows, cands, verdicts)
    check_reviews(audit, rows, cands, verdicts)
    check_backend(audit, version_dir, rows)
    check_answer_format(audit, rows)
    check_speed(audit, manifest, rows, read_config(version_dir, "tasks"), cands, verdicts,
                min_sft)
    check_card(audit, version_dir, rows, cands, verdicts)
    return audit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", required=True, type=Path)
    ap.add_argument("--name", default="kernelsynth")
    ap.add_argument("--version", default=None, help="vN (default: the latest)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    ap.add_argument("--min-sft", type=int, default=None, help="fail below this many sft rows")
    args = ap.parse_args(argv)
    ws = Workspace(args.workspace)
    version_dir = (ws.datasets_dir / args.name / args.version if args.version
                   else latest_version(ws, args.name))
    audit = audit_version(ws, version_dir, args.min_sft)
    text = f"rows audit of {version_dir}\n\n" + audit.table()
    print(text, end="")
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 1 if audit.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
