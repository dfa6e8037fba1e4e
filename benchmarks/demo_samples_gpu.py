"""The shipped CUDA demo responses on a GPU: does each verify as its row says it should?

    python -m benchmarks.demo_samples_gpu --out benchmarks/results/demo_samples_gpu.md

Reads the `backend: cuda` rows of pipeline/candidates/demo_samples.jsonl (hand-written responses
in the forms models write for KernelBench, each with an `intended` label: correct, wrong or
hacked) and verifies every one against its task file (sources/seed/<task_name>.py) through
`verify_batch` on the cuda backend, with the generalisation check on as a dataset build runs it.
Writes a table: task, sample, intended label, why, verdict status, match yes/no, and a summary.
A label matches when the status is correct_* for `correct`; incorrect, runtime_error or timeout
for `wrong`; static_reject or cheat for `hacked`. Needs torch with CUDA and nvcc; torch +
stdlib + the repository's verifier only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from verifier.api import verify_batch  # noqa: E402
from verifier.backends import BackendUnavailable  # noqa: E402
from verifier.protocol import (  # noqa: E402
    CORRECT_STATUSES,
    VerdictData,
    VerifyOptions,
    VerifyRequest,
)

DEMO = REPO / "pipeline" / "candidates" / "demo_samples.jsonl"
SEEDS = REPO / "sources" / "seed"
EXPECTED: dict[str, tuple[str, ...]] = {
    "correct": CORRECT_STATUSES,
    "wrong": ("incorrect", "runtime_error", "timeout"),
    "hacked": ("static_reject", "cheat"),
}


def cuda_rows(path: Path = DEMO) -> list[dict]:
    """The CUDA demo rows, each with a case name `<task>#<sample>`; a bad row stops the run."""
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        row = json.loads(line)
        if row.get("backend") != "cuda":
            continue
        if row.get("intended") not in EXPECTED:
            raise SystemExit(f"{path} row {i}: `intended` is {row.get('intended')!r}, "
                             f"not one of {sorted(EXPECTED)}")
        row["case"] = f"{row['task_name']}#{row['sample']}"
        rows.append(row)
    return rows


def matches(intended: str, status: str) -> bool:
    return status in EXPECTED[intended]


def table(rows: list[dict], verdicts: dict[str, dict]) -> list[str]:
    lines = ["| task | sample | intended | why | status | match |", "|---|---|---|---|---|---|"]
    for r in rows:
        status = verdicts[r["case"]]["status"]
        ok = "yes" if matches(r["intended"], status) else "no"
        lines.append(f"| {r['task_name']} | {r['sample']} | {r['intended']} | "
                     f"{r['intended_why']} | {status} | {ok} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="table (markdown); verdicts .json")
    ap.add_argument("--compile-workers", type=int, default=os.cpu_count() or 8)
    ap.add_argument("--no-generalize", action="store_true",
                    help="skip the other-sizes/other-arguments check")
    a = ap.parse_args()
    import torch

    rows = cuda_rows()
    reqs = [VerifyRequest(r["case"], r["task_name"],
                          (SEEDS / f"{r['task_name']}.py").read_text(encoding="utf-8"),
                          r["response"], "cuda") for r in rows]
    cache = Path(tempfile.mkdtemp(prefix="ks_demo_gpu_"))
    opts = VerifyOptions(backend="cuda", workers=1, compile_workers=a.compile_workers,
                         compile_batch=4, generalize=not a.no_generalize, perf_budget_s=1.0,
                         build_cache_dir=str(cache / "builds"),
                         baseline_cache_dir=str(cache / "baselines"))
    t0 = time.monotonic()

    def show(v: VerdictData) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {v.candidate_id}: {v.status}", file=sys.stderr,
              flush=True)

    try:
        verdicts = {v.candidate_id: v.to_dict() for v in verify_batch(reqs, opts, show)}
    except BackendUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    wall = time.monotonic() - t0
    hits = sum(matches(r["intended"], verdicts[r["case"]]["status"]) for r in rows)
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    lines = [f"# CUDA demo responses ({len(rows)}) on {dev}, torch {torch.__version__}", "",
             f"Command: python -m benchmarks.demo_samples_gpu --out {a.out}", "",
             *table(rows, verdicts), "",
             f"As intended: {hits}/{len(rows)}. Generalisation check: "
             f"{'off' if a.no_generalize else 'on'}. Wall seconds: {wall:.0f}."]
    missed = [f"- {r['case']} ({r['intended']}): {verdicts[r['case']]['status']}: "
              f"{(verdicts[r['case']].get('feedback') or '')[:300]}"
              for r in rows if not matches(r["intended"], verdicts[r["case"]]["status"])]
    if missed:
        lines += ["", "Mismatches (status, feedback):", *missed]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    a.out.with_suffix(".json").write_text(json.dumps(verdicts, indent=1), encoding="utf-8")
    print("\n".join(lines))
    return 0 if hits == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
