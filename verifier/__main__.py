"""`python -m verifier`: verify one candidate, or a batch from Parquet/JSONL (torch + stdlib).

Single:  python -m verifier --task T.py --candidate C.py --backend cpu [--json]
Serve:   python -m verifier serve --port 8008 --backend cuda   (HTTP reward service; see
         verifier/reward_server.py)
Batch:   python -m verifier --batch candidates.jsonl|.parquet --out verdicts.jsonl|.parquet
         (rows: candidate_id, task_id, task_source, response or code, backend, optional
         variants; Parquet needs pyarrow, JSONL needs nothing)
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


def _read_rows(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise SystemExit(f"{path}: Parquet batches need pyarrow (pip install pyarrow), "
                             "or pass a .jsonl file") from None
        return pq.read_table(path).to_pylist()
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise SystemExit(f"{path}:{n}: not JSON ({exc})") from None
    return rows


def _write_rows(path: Path, rows: list[dict]) -> None:
    if path.suffix == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise SystemExit(f"{path}: writing Parquet needs pyarrow; use a .jsonl output") \
                from None
        for r in rows:
            r["findings"] = json.dumps(r["findings"])
        pq.write_table(pa.Table.from_pylist(rows), path)
        return
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


def _requests(rows: list[dict], source: Path) -> list[VerifyRequest]:
    out = []
    for i, r in enumerate(rows):
        missing = [k for k in ("task_source",) if not r.get(k)]
        if missing or not (r.get("response") or r.get("code")):
            raise SystemExit(f"{source} row {i}: needs task_source and response (or code)")
        variants = r.get("variants")
        if isinstance(variants, str):
            try:
                variants = json.loads(variants)
            except ValueError as exc:
                raise SystemExit(f"{source} row {i}: variants is not JSON ({exc})") from None
        out.append(VerifyRequest(str(r.get("candidate_id", i)), str(r.get("task_id", "")),
                                 r["task_source"], r.get("response") or r["code"],
                                 r.get("backend") or "auto", variants))
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"]:
        from verifier.reward_server import main as serve_main

        return serve_main(args[1:])
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
    ap.add_argument("--fallback", default="strict", choices=["strict", "partial"],
                    help="strict: no library compute in forward (default); partial: library "
                         "ops allowed if an own kernel runs, own-kernel share in the reward")
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
    a = ap.parse_args(args)
    try:
        parse_tolerance(a.tolerance)
    except ValueError as exc:
        ap.error(str(exc))
    opts = VerifyOptions(backend=a.backend, workers=a.workers, gpus=a.gpus,
                         compile_workers=a.compile_workers,
                         compile_batch=a.compile_batch, compile_only=a.compile_only,
                         trials=a.trials, perf_trials=a.perf_trials, run_timeout_s=a.timeout,
                         torch_compile_baseline=a.torch_compile, build_cache_dir=a.cache_dir,
                         build_cache_max_gb=a.cache_max_gb,
                         fallback=a.fallback, generalize=a.generalize,
                         tolerance=a.tolerance, namespace=a.namespace)
    from verifier.api import verify_batch

    if a.batch:
        reqs = _requests(_read_rows(a.batch), a.batch)
    elif a.task and a.candidate:
        try:
            reqs = [VerifyRequest(a.candidate.stem, a.task.stem, a.task.read_text("utf-8"),
                                  a.candidate.read_text("utf-8"), a.backend)]
        except (OSError, UnicodeDecodeError) as exc:
            print(f"error: cannot read input: {exc}", file=sys.stderr)
            return 2
    else:
        ap.error("give --task and --candidate, or --batch")
    try:
        verdicts = verify_batch(reqs, opts)
    except BackendUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = [v.to_dict() for v in verdicts]
    if a.batch and a.out:
        _write_rows(a.out, rows)
    for v in verdicts:
        if a.json or a.batch:
            print(json.dumps(v.to_dict()))
        else:
            print(f"{v.candidate_id}: {v.status} (stage {v.stage}, reward {v.reward:.3f})\n"
                  f"{v.feedback}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
