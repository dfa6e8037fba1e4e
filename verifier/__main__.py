"""`python -m verifier`: verify one candidate, or a batch from Parquet/JSONL (torch + stdlib).

Single:  python -m verifier --task T.py --candidate C.py --backend cpu [--json]
Serve:   python -m verifier serve --port 8008 --backend cuda   (HTTP reward service; see
         verifier/reward/server.py)
Batch:   python -m verifier --batch candidates.jsonl|.parquet --out verdicts.jsonl|.parquet
         (rows: candidate_id, task_id, task_source, response or code, backend, optional
         variants; Parquet needs pyarrow, JSONL needs nothing). Each verdict is appended to
         --out (or <out>.jsonl beside a .parquet --out, which is written at the end) as it is
         decided; a re-run with the same --out keeps those verdicts and verifies only the rest
         (and any candidate whose task or response changed). Progress goes to stderr.
Add --generalize to check each candidate also at another size set and other constructor
arguments: a kernel that hard-codes a size or a constructor value fails, naming which.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from verifier.backends import BackendUnavailable
from verifier.protocol import NAMESPACES, VerifyOptions, VerifyRequest, parse_tolerance
from verifier.reward.batch_io import run_batch


def _parser() -> argparse.ArgumentParser:
    """The command line of `python -m verifier` (one candidate, or a batch)."""
    ap = argparse.ArgumentParser(prog="python -m verifier", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", type=Path, help="KernelBench task file (Model, get_inputs)")
    ap.add_argument("--candidate", type=Path, help="candidate file or raw model response")
    ap.add_argument("--batch", type=Path, help="candidates .jsonl or .parquet")
    ap.add_argument("--out", type=Path, help="verdicts .jsonl or .parquet (batch mode)")
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda", "musa"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=0,
                    help="cuda/musa: one worker on each of the first N visible GPUs (0: all)")
    ap.add_argument("--compile-workers", type=int, default=2)
    ap.add_argument("--compile-batch", type=int, default=16)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--standby-workers", type=int, default=VerifyOptions.standby_workers,
                    help="GPU backends: warm spare workers per GPU that replace one a candidate "
                         "killed at once (0: none; the cpu loop keeps at most 3)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--perf-trials", type=int, default=20)
    ap.add_argument("--torch-compile", action="store_true",
                    help="also time a torch.compile baseline (speedup_compiled)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per run stage")
    ap.add_argument("--cache-dir", help="build cache (default ~/.cache/kernelsynth/builds)")
    ap.add_argument("--cache-max-gb", type=float, default=5.0,
                    help="cut the build cache to this size after the batch, least recently "
                         "used first (0: no bound)")
    ap.add_argument("--json", action="store_true", help="print JSON verdicts")
    ap.add_argument("--progress", default="normal", choices=["quiet", "normal", "verbose"],
                    help="batch mode: progress lines on stderr (verbose: also one per verdict)")
    ap.add_argument("--profile", action="store_true",
                    help="batch mode: where the wall time went (phases, GPU lanes), at the end")
    ap.add_argument("--fallback", default="strict", choices=["strict", "partial"],
                    help="strict: no library compute in forward (default); partial: library "
                         "ops allowed if an own kernel runs (the reward is the judge's "
                         "speedup either way)")
    ap.add_argument("--generalize", action="store_true",
                    help="also check correctness at another size set and other constructor "
                         "arguments (a batch row's `variants`, else derived from the task)")
    ap.add_argument("--tolerance", default="strict", metavar="kernelbench|strict|ATOL,RTOL",
                    help="output tolerances: strict (fp32 1e-4, fp16/bf16 1e-2; default), "
                         "kernelbench (1e-2 for every dtype, as KernelBench's leaderboard "
                         "harness), or ATOL,RTOL for every dtype")
    ap.add_argument("--namespace", default="isolated", choices=list(NAMESPACES),
                    help="isolated: the candidate runs in its own module namespace (default); "
                         "kernelbench: it starts with the reference file's globals (sizes, "
                         "helpers), as KernelBench runs both in one namespace")
    return ap


def _options(a: argparse.Namespace) -> VerifyOptions:
    """The verify options the parsed flags ask for."""
    return VerifyOptions(backend=a.backend, workers=a.workers, gpus=a.gpus,
                         compile_workers=a.compile_workers,
                         compile_batch=a.compile_batch, compile_only=a.compile_only,
                         trials=a.trials, perf_trials=a.perf_trials, run_timeout_s=a.timeout,
                         torch_compile_baseline=a.torch_compile, build_cache_dir=a.cache_dir,
                         build_cache_max_gb=a.cache_max_gb,
                         fallback=a.fallback, generalize=a.generalize,
                         tolerance=a.tolerance, namespace=a.namespace,
                         standby_worker=a.standby_workers > 0,
                         standby_workers=max(0, a.standby_workers))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"]:
        from verifier.reward.server import main as serve_main

        return serve_main(args[1:])
    ap = _parser()
    a = ap.parse_args(args)
    try:
        parse_tolerance(a.tolerance)
    except ValueError as exc:
        ap.error(str(exc))
    opts = _options(a)
    if a.batch:
        try:
            return run_batch(a.batch, a.out, opts, progress=a.progress, profile=a.profile)
        except BackendUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if not (a.task and a.candidate):
        ap.error("give --task and --candidate, or --batch")
    return _verify_one(a, opts)


def _verify_one(a: argparse.Namespace, opts: VerifyOptions) -> int:
    """Verify --candidate against --task and print its verdict (JSON with --json)."""
    from verifier.api import verify_batch

    try:
        reqs = [VerifyRequest(a.candidate.stem, a.task.stem, a.task.read_text("utf-8"),
                              a.candidate.read_text("utf-8"), a.backend)]
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: cannot read input: {exc}", file=sys.stderr)
        return 2
    try:
        verdicts = verify_batch(reqs, opts)
    except BackendUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for v in verdicts:
        if a.json:
            print(json.dumps(v.to_dict()))
        else:
            print(f"{v.candidate_id}: {v.status} (stage {v.stage}, reward {v.reward:.3f})\n"
                  f"{v.feedback}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
