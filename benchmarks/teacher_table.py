"""Per template family: the teacher's median speedup over eager before and after (two builds).

Reads the template candidates and verdicts of two workspaces (`kernelsynth build` runs of the
old and the new teacher, same config and host) and prints, per family (the generator's
`template:<family>/...`) and overall: tasks, the median speedup of every correct template kernel
(what sft taught before: every selected variant) and of the fastest correct kernel per task (the
sft answer now), and how many tasks have an answer at least 1.0x eager. Only tasks both builds
verified are counted.

    python -m benchmarks.teacher_table --before WS_OLD --after WS_NEW [--out table.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from pipeline.workspace import Workspace
from schemas import Candidate, Task, Verdict
from verifier.protocol import CORRECT_STATUSES


def template_speedups(ws: Workspace) -> dict[str, dict[str, list[float]]]:
    """family -> task name -> speedups of its correct template kernels."""
    names = {t.task_id: t.name for t in ws.read(Task)}
    verdicts = {v.candidate_id: v for v in ws.read(Verdict)}
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for c in ws.read(Candidate):
        v = verdicts.get(c.candidate_id)
        if not c.generator.startswith("template:") or v is None:
            continue
        fam = c.generator.removeprefix("template:").split("/")[0]
        if v.status in CORRECT_STATUSES and v.speedup:
            out[fam][names.get(c.task_id, c.task_id)].append(v.speedup)
        else:
            out[fam].setdefault(names.get(c.task_id, c.task_id), [])
    return out


def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}x" if xs else "-"


def common_tasks(before: dict, after: dict) -> tuple[dict, dict, int]:
    """Both builds restricted to the tasks each of them verified, so medians compare like with
    like; and how many tasks were left out."""
    def names(side: dict) -> set[str]:
        return {t for g in side.values() for t in g}

    keep = names(before) & names(after)
    cut = len((names(before) | names(after)) - keep)
    return ({f: {t: sp for t, sp in g.items() if t in keep} for f, g in before.items()},
            {f: {t: sp for t, sp in g.items() if t in keep} for f, g in after.items()}, cut)


def table(before: dict, after: dict) -> str:
    """The markdown table of the two builds."""
    lines = ["| family | tasks | before: all correct | before: fastest/task | before >= 1.0x "
             "| after: all correct | after: fastest/task (sft) | after >= 1.0x |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    fams = sorted(set(before) | set(after))
    for fam in [*fams, "all"]:
        cells = []
        tasks: set[str] = set()
        for side in (before, after):
            groups = ([side.get(fam, {})] if fam != "all" else list(side.values()))
            per_task = {t: sp for g in groups for t, sp in g.items()}
            tasks |= set(per_task)
            every = [s for sp in per_task.values() for s in sp]
            best = [max(sp) for sp in per_task.values() if sp]
            cells += [_med(every), _med(best),
                      f"{sum(b >= 1.0 for b in best)}/{len(per_task)}"]
        lines.append(f"| {fam} | {len(tasks)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path)
    ap.add_argument("--after", required=True, type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    before, after, cut = common_tasks(template_speedups(Workspace(args.before)),
                                      template_speedups(Workspace(args.after)))
    text = table(before, after) + (f"\n{cut} tasks verified in only one of the builds are left "
                                   "out.\n" if cut else "")
    print(text, end="")
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
