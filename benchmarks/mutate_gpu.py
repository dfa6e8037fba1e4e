"""GPU side of the mutation benchmark: do injected CUDA bugs change behaviour on a real GPU?

Two steps, because the GPU node has torch but not the pipeline's dependencies:

    # here: CUDA template kernels for built-in tasks and every GPU mutation of each -> bundle
    .venv/bin/python -m benchmarks.mutate_gpu prepare BUNDLE_DIR [--tasks a,b,...]
    # on the GPU node (torch + stdlib): verify originals (the baseline) and mutants, print table
    python3 -m benchmarks.mutate_gpu run BUNDLE_DIR/bundle.json

The run step imports only `verifier` (torch + stdlib).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

DEFAULT_TASKS = ("activation_relu", "activation_gelu", "reduction_sum_dim", "reduction_max_dim",
                 "softmax_softmax_rows", "norm_layer_norm", "norm_rms_norm", "matmul_linear",
                 "matmul_square_matmul", "matmul_bmm", "pooling_max_pool2d", "conv_conv2d",
                 "broadcast_add_row_bias", "elementwise_sqrt")


def prepare(out_dir: Path, names: list[str]) -> None:
    """Build the bundle: task sources, CUDA template kernels, and their mutants."""
    from pipeline.candidates.mutate import GPU_KINDS, mutate_code
    from pipeline.candidates.templates import NoTemplate, template_candidates
    from schemas import Task

    seed = Path(__file__).resolve().parent.parent / "sources" / "seed"
    tasks, items = {}, []
    for name in names:
        source = (seed / f"{name}.py").read_text()
        task = Task(task_id=name, name=name, source=source, cpu_source=source)
        try:
            cands = template_candidates(task, "cuda", 1)
        except NoTemplate as exc:
            print(f"{name}: no template ({exc})", file=sys.stderr)
            continue
        tasks[name] = source
        for c in cands:
            items.append({"id": c.candidate_id, "task": name, "kind": "original",
                          "code": c.code, "of": ""})
            for kind in GPU_KINDS:
                m = mutate_code(c.code, kind, "cuda")
                if m is not None:
                    items.append({"id": f"{c.candidate_id}-{kind}", "task": name, "kind": kind,
                                  "code": m.code, "of": c.candidate_id, "line": m.line,
                                  "description": m.description})
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bundle.json").write_text(json.dumps({"tasks": tasks, "items": items}))
    print(f"{len(tasks)} tasks, {sum(i['kind'] == 'original' for i in items)} kernels, "
          f"{sum(i['kind'] != 'original' for i in items)} mutants -> {out_dir / 'bundle.json'}")


def run(bundle_path: Path, out: Path | None, only: list[str] | None = None) -> None:
    """Verify the bundle on this machine's GPU and print the table."""
    from verifier.api import verify_batch
    from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest

    bundle = json.loads(bundle_path.read_text())
    tasks, items = bundle["tasks"], bundle["items"]
    if only:
        items = [i for i in items if i["task"] in only]
    kinds = {i["id"]: i["kind"] for i in items}
    reqs = [VerifyRequest(i["id"], i["task"], tasks[i["task"]], i["code"], "cuda")
            for i in items]
    opts = VerifyOptions(backend="cuda", workers=1, compile_workers=8, trials=3, perf_trials=5,
                         perf_warmup=2, run_timeout_s=120)
    t0 = time.monotonic()
    verdicts = verify_batch(reqs, opts, progress=lambda v: print(
        f"  {v.task_id:<24}{kinds[v.candidate_id]:<22}{v.status}", flush=True))
    wall = time.monotonic() - t0
    status = {v.candidate_id: v.status for v in verdicts}
    ok_orig = {i["id"] for i in items if i["kind"] == "original" and status[i["id"]] in CORRECT_STATUSES}
    by_kind: dict[str, list[str]] = defaultdict(list)
    for i in items:
        # a mutant only says something when its original verified correct
        if i["kind"] == "original" or i["of"] in ok_orig:
            by_kind[i["kind"]].append(status[i["id"]])
    print(f"{'kernels':<22}{'n':>4}{'correct':>9}{'failed':>8}  statuses")
    for kind in ["original", *sorted(k for k in by_kind if k != "original")]:
        st = by_kind[kind]
        ok = sum(s in CORRECT_STATUSES for s in st)
        print(f"{kind:<22}{len(st):>4}{ok:>9}{len(st) - ok:>8}  {dict(Counter(st))}")
    mut = [s for k, st in by_kind.items() if k != "original" for s in st]
    changed = sum(s not in CORRECT_STATUSES for s in mut)
    print(f"mutants whose behaviour changed: {changed}/{len(mut)} "
          f"({100 * changed / max(1, len(mut)):.0f}%); verify wall {wall:.0f}s")
    for v in verdicts:
        if v.status in ("runtime_error",) and v.candidate_id in ok_orig:
            print(f"  original {v.candidate_id}: {v.error[:200]!r}")
    if out is not None:
        out.write_text(json.dumps([v.to_dict() for v in verdicts]))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
    r = sub.add_parser("run")
    r.add_argument("bundle", type=Path)
    r.add_argument("--out", type=Path)
    r.add_argument("--tasks", default="")
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.out_dir, args.tasks.split(","))
    else:
        run(args.bundle, args.out, [t for t in args.tasks.split(",") if t])


if __name__ == "__main__":
    main()
