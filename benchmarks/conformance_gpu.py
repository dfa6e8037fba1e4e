"""Conformance corpus on a GPU: every CUDA case under both fallback policies, one table.

    python -m benchmarks.conformance_gpu --out benchmarks/results/conformance_gpu.md

Runs tests/verifier/conformance's CUDA candidates through `verify_batch` (backend cuda) once per
policy (strict, partial) and writes per-status counts for both, the number as expected, every
difference, and the own-kernel share of each correct verdict. Needs torch with CUDA and nvcc.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "verifier" / "conformance"))

import corpus  # noqa: E402

from verifier.api import verify_batch  # noqa: E402
from verifier.protocol import VerifyOptions, VerifyRequest  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="table (markdown)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--compile-workers", type=int, default=8)
    ap.add_argument("--limit", type=int, default=0, help="only the first N cases (smoke runs)")
    a = ap.parse_args()
    import torch

    rows = corpus.load("cuda")[: a.limit or None]
    cache = Path(tempfile.mkdtemp(prefix="ks_conformance_"))
    verdicts, wall = {}, {}
    for policy in corpus.POLICIES:
        opts = VerifyOptions(backend="cuda", workers=a.workers, compile_workers=a.compile_workers,
                             compile_batch=16, build_cache_dir=str(cache / "builds"),
                             baseline_cache_dir=str(cache / "baselines"), fallback=policy)
        reqs = [VerifyRequest(r["name"], r["task"], r["task_source"], r["code"], "cuda")
                for r in rows]
        t0 = time.monotonic()

        def show(v, policy=policy, t0=t0):  # progress on stderr: a long GPU run shows where it is
            print(f"[{time.monotonic() - t0:6.1f}s] {policy} {v.candidate_id}: {v.status}",
                  file=sys.stderr, flush=True)

        verdicts[policy] = {v.candidate_id: v.to_dict() for v in verify_batch(reqs, opts, show)}
        wall[policy] = time.monotonic() - t0
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    lines = [f"# Conformance corpus, CUDA cases ({len(rows)}) on {dev}, torch "
             f"{torch.__version__}", "", "Command: python -m benchmarks.conformance_gpu --out "
             f"{a.out}", "", corpus.table(rows, verdicts), "",
             "Wall seconds: " + ", ".join(f"{p} {wall[p]:.0f}" for p in corpus.POLICIES), "",
             "Own-kernel device-time share (correct verdicts, partial policy):"]
    for r in rows:
        v = verdicts["partial"][r["name"]]
        if v["status"] in corpus.CORRECT:
            share = json.loads(v["reward_components"]).get("own_share")
            lines.append(f"- {r['name']}: own_share {share}, reward {v['reward']}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(lines) + "\n")
    (a.out.with_suffix(".json")).write_text(json.dumps(verdicts, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
