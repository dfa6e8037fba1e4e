"""An honest CUDA kernel's runtime with a batch's compilers beside it, the cores partitioned or
not (session 16: the red-team suite timed one honest 4 MB ReLU at 47 us while compilers ran and
its twins at 24-29 us in a quiet stretch of the same batch).

    python -m benchmarks.timing_load_gpu --out benchmarks/results/timing_load_h100.md

Four batches in turn on one GPU, each verifying the same honest ReLU (relu 64x16384, the
red-team task) `--repeat` times as separate jobs: quiet; with one busy process per cpu standing
for compilers on every cpu (`KS_TIMING_CORES=0`: no partition); the same load on the cpus
`compile_cores` leaves compilers (the partition a GPU batch now makes); quiet again. The load
runs at the compilers' niceness (`niced`). Prints a table of runtimes (median, min, max) per
batch. Needs torch with CUDA and nvcc.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.redteam_gpu import _load


def _batch(code: str, task: str, repeat: int, cache: Path) -> list[float]:
    import verifier.api as api
    from verifier.protocol import VerifyOptions, VerifyRequest

    reqs = [VerifyRequest(f"honest{i}", "relu", task, code, "cuda") for i in range(repeat)]
    got = api.verify_batch(reqs, VerifyOptions(
        backend="cuda", gpus=1, build_cache_dir=str(cache / "builds"),
        baseline_cache_dir=str(cache / "baselines")))
    bad = [(v.candidate_id, v.status, v.error[:120]) for v in got
           if not v.status.startswith("correct")]
    if bad:
        raise SystemExit(f"an honest run was not correct: {bad}")
    return [v.runtime_us for v in got]


def _load_procs(cpus: list[int] | None) -> list[subprocess.Popen]:
    from verifier.backends import compile_cpus, niced

    spin = [sys.executable, "-c", "while True: pass"]
    with compile_cpus(cpus):
        return [subprocess.Popen(niced(spin)) for _ in range(os.cpu_count() or 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=4)
    a = ap.parse_args()
    from verifier.isolation.cpu_bound import compile_cores

    cases = _load("redteam_cases")
    from verifier_cases import relu_task

    code, task = cases.for_backend(cases.honest("load"), "cuda"), relu_task(64, 16384)
    cache = Path(tempfile.mkdtemp(prefix="ks-load-"))
    os.environ.pop("KS_TIMING_CORES", None)
    part = compile_cores(1)
    modes = [("quiet", None, None), ("compilers on every cpu, no partition", "0", []),
             (f"compilers on cpus {part[0] if part else '-'}.. (partition)", None, part),
             ("quiet again", None, None)]
    lines = [f"# An honest CUDA ReLU's runtime beside a batch's compilers ({platform.node()})",
             "", f"`python -m benchmarks.timing_load_gpu --out {a.out}`; {os.cpu_count()} "
             f"cpus; relu 64x16384 fp32 (4 MB), {a.repeat} jobs a batch", "",
             "| batch | runtime us (median) | min | max | wall s |", "| --- | --- | --- | --- | --- |"]
    _batch(code, task, 1, cache)  # the build, cached for every batch after it
    for name, env, load_cpus in modes:
        if env is None:
            os.environ.pop("KS_TIMING_CORES", None)
        else:
            os.environ["KS_TIMING_CORES"] = env
        procs = _load_procs(load_cpus or None) if load_cpus is not None else []
        t0 = time.monotonic()
        try:
            us = _batch(code, task, a.repeat, cache)
        finally:
            for p in procs:
                p.kill()
                p.wait()
        lines.append(f"| {name} | {statistics.median(us):.1f} | {min(us):.1f} | {max(us):.1f} "
                     f"| {time.monotonic() - t0:.0f} |")
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text("\n".join(lines) + "\n")
        print(lines[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
