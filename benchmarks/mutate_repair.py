"""Bug mutation and known-fix repair, measured with the real verifier on built-in tasks.

For each task: template kernels (the baseline: how many verify correct), then every mutation kind
that applies to a correct kernel (how many mutants the verifier rejects, i.e. the bug changed
behaviour, and with which status), then one repair turn with the known fix (how many verify
correct again). Also counts, on CUDA template kernels, how often each GPU kind applies (text only;
running them needs a GPU).

    .venv/bin/python benchmarks/mutate_repair.py [--backend cpu] [--tasks relu,sum_dim,...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from pipeline.candidates.generate import generate_candidates
from pipeline.candidates.mutate import GPU_KINDS, kinds_for, mutate_candidates, mutate_code
from pipeline.candidates.repair import repair_round
from pipeline.config import Config, GenerateConfig, RepairConfig, VerifyConfig
from pipeline.stages.verify import verify_candidates
from pipeline.tasks.taskfile import inspect_task_source
from schemas import Task
from verifier.protocol import CORRECT_STATUSES

SEED = Path(__file__).resolve().parent.parent / "sources" / "seed"
DEFAULT_TASKS = ("activation_relu", "reduction_sum_dim", "softmax_softmax_rows",
                 "norm_layer_norm", "matmul_linear", "pooling_max_pool2d")


def load_task(name: str) -> Task:
    source = (SEED / f"{name}.py").read_text()
    report = inspect_task_source(source, name, scale=True, cpu_max_numel=1 << 14)
    if not report.valid:
        raise SystemExit(f"{name}: invalid task ({report.reason})")
    return Task(task_id=report.task_id, name=name, source=source, cpu_source=report.cpu_source,
                init_inputs=json.dumps(report.init_inputs), input_specs=report.inputs,
                path=f"sources/seed/{name}.py")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
    args = ap.parse_args()
    t0 = time.monotonic()
    tasks = [load_task(n) for n in args.tasks.split(",")]
    tmap = {t.task_id: t for t in tasks}
    gcfg = GenerateConfig(variants_per_task=1, mutations_per_kernel=len(kinds_for(args.backend)))
    vcfg = VerifyConfig(backend=args.backend, trials=3, perf_trials=3, perf_warmup=1)
    cache = Path(tempfile.mkdtemp(prefix="ks-bench-"))

    originals, rejected = generate_candidates(tasks, gcfg, args.backend)
    v_orig = verify_candidates(tmap, originals, vcfg, cache)
    t_orig = time.monotonic()
    mutants = mutate_candidates(tasks, originals, v_orig, gcfg)
    v_mut = verify_candidates(tmap, mutants, vcfg, cache)
    t_mut = time.monotonic()
    cfg = Config(generate=gcfg, verify=vcfg, repair=RepairConfig(turns=1))
    fixes = repair_round(tasks, originals + mutants, v_orig + v_mut, cfg, turn=1)
    v_fix = verify_candidates(tmap, fixes, vcfg, cache)
    t_fix = time.monotonic()

    status = {v.candidate_id: v.status for v in v_orig + v_mut + v_fix}
    print(f"\nbackend {args.backend}: {len(tasks)} tasks, {len(rejected)} without template")
    print(f"{'stage':<28}{'n':>4}{'correct':>9}{'failed':>8}  statuses")
    n_ok = sum(status.get(c.candidate_id) in CORRECT_STATUSES for c in originals)
    print(f"{'baseline: template kernels':<28}{len(originals):>4}{n_ok:>9}"
          f"{len(originals) - n_ok:>8}  "
          f"{dict(Counter(status.get(c.candidate_id, 'unverified') for c in originals))}")
    by_kind: dict[str, list[str]] = defaultdict(list)
    for m in mutants:
        by_kind[m.generator.removeprefix("mutate:")].append(status.get(m.candidate_id, "none"))
    for kind in kinds_for(args.backend):
        st = by_kind.get(kind, [])
        ok = sum(s in CORRECT_STATUSES for s in st)
        print(f"{'mutant: ' + kind:<28}{len(st):>4}{ok:>9}{len(st) - ok:>8}  {dict(Counter(st))}")
    all_st = [s for st in by_kind.values() for s in st]
    ok = sum(s in CORRECT_STATUSES for s in all_st)
    print(f"{'mutants, all kinds':<28}{len(all_st):>4}{ok:>9}{len(all_st) - ok:>8}  "
          f"behaviour changed: {100 * (len(all_st) - ok) / max(1, len(all_st)):.0f}%")
    ok = sum(status.get(c.candidate_id) in CORRECT_STATUSES for c in fixes)
    print(f"{'repair turn 1 (known fix)':<28}{len(fixes):>4}{ok:>9}{len(fixes) - ok:>8}  "
          f"{dict(Counter(status.get(c.candidate_id, 'none') for c in fixes))}")
    for v in (v_orig + v_mut + v_fix):
        if v.status not in CORRECT_STATUSES and v.status != "incorrect":
            print(f"  {v.candidate_id[:10]} {v.status}: {(v.error or v.compile_log)[-300:]!r}")
    print(f"time: templates+verify {t_orig - t0:.0f}s, mutants verify {t_mut - t_orig:.0f}s, "
          f"fixes verify {t_fix - t_mut:.0f}s")

    gpu, _ = generate_candidates(tasks, gcfg, "cuda")
    applies = Counter(k for c in gpu for k in GPU_KINDS if mutate_code(c.code, k, "cuda"))
    print(f"\nCUDA template kernels: {len(gpu)}; kernels each GPU kind applies to:")
    print("  " + ", ".join(f"{k} {applies.get(k, 0)}" for k in GPU_KINDS))


if __name__ == "__main__":
    main()
