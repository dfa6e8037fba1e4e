"""Where a timed window's check spends its time on a GPU (`verifier.judge.window_judge`).

    python -m benchmarks.window_check_gpu --kb-dir KernelBench/KernelBench [--out FILE]

For KernelBench main problem files at their real sizes, a `WindowJudge` on the device (as the
referee makes it) with an honest worker simulated in this process (each call's reference output
written into its slot): the judge's construction, a window's fill and its check (plain and
deep), each split into the check's parts: the draws of the checked sets, the reference's
forwards, the comparisons, the input check and the slots' clones. Times are wall seconds with
the device synchronized around each part (the best of three windows)."""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from verifier.judge import decide, device_compare, tensors, window_judge  # noqa: E402

PROBLEMS = ("level1/19_ReLU.py", "level1/23_Softmax.py", "level1/1_Square_matrix_multiplication_.py",
            "level1/47_Sum_reduction_over_a_dimension.py", "level1/40_LayerNorm.py")
TOL = (1e-4, 1e-4, 1e-2, 1e-2)
PARTS: dict[str, float] = defaultdict(float)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _sync()
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _sync()
            PARTS[name] += time.perf_counter() - t0
    return wrapped


def _instrument() -> None:
    decide.make_inputs = _timed("draws", decide.make_inputs)
    device_compare.judge = _timed("compare", device_compare.judge)
    window_judge.same = _timed("input check (same)", tensors.same)
    window_judge.clone = _timed("slot clone", tensors.clone)


def _honest(judge: Any, n: int) -> None:
    """The worker's window: each call's reference output into its slot."""
    with torch.no_grad():
        for k in range(max(1, min(n, judge.sets))):
            out = judge.model(*[v for v in judge.views[k]])
            for dst, src in zip(tensors.flatten(judge.slots[k]), tensors.flatten(out),
                                strict=True):
                dst.copy_(src)
            if judge.device == "cpu":  # (a dry run: the worker's side is the shared file)
                judge.arena.push(*judge._out_spans[k])
    _sync()


def profile(source: str, budget: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    judge = window_judge.WindowJudge(source, 0, TOL, budget)
    made = time.perf_counter() - t0
    judge.model = _timed("reference", judge.model)
    row: dict[str, Any] = {"sets": judge.sets, "out MiB": judge.out_bytes >> 20,
                           "make s": made}
    n = judge.sets
    for deep in (False, True):
        best: dict[str, float] = {}
        for _ in range(3):
            PARTS.clear()
            t0 = time.perf_counter()
            judge.fill(n)
            fill_s = time.perf_counter() - t0
            _honest(judge, n)
            t0 = time.perf_counter()
            why = judge.check(n, deep=deep)
            check_s = time.perf_counter() - t0
            assert why == "", why
            if not best or check_s < best["check s"]:
                best = {"fill s": fill_s, "check s": check_s, "picks": len(judge.checked),
                        **dict(PARTS)}
        row["deep" if deep else "plain"] = best
    judge.close()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kb-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--problems", nargs="*", default=list(PROBLEMS))
    ap.add_argument("--budget-gib", type=float, default=0.0,
                    help="the windows' arena budget (default: a quarter of the device)")
    a = ap.parse_args(argv)
    decide.DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run
    budget = int(a.budget_gib * (1 << 30)) or (torch.cuda.get_device_properties(0).total_memory
                                               // 4 if torch.cuda.is_available() else 1 << 26)
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    _instrument()
    lines = [f"# Window check parts on {name}", "",
             f"`python -m benchmarks.window_check_gpu` (arena budget {budget / (1 << 30):.1f} GiB)",
             "", "| problem | sets | out MiB | make s | kind | picks | fill s | check s | parts |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in a.problems:
        source = (a.kb_dir / name).read_text()
        row = profile(source, budget)
        for kind in ("plain", "deep"):
            r = row[kind]
            parts = ", ".join(f"{k} {v:.3f}" for k, v in r.items()
                              if k not in ("fill s", "check s", "picks"))
            lines.append(f"| {name} | {row['sets']} | {row['out MiB']} | {row['make s']:.2f} "
                         f"| {kind} | {r['picks']} | {r['fill s']:.3f} | {r['check s']:.3f} "
                         f"| {parts} |")
        print(lines[-2], lines[-1], sep="\n", flush=True)
        if a.out:
            a.out.write_text("\n".join(lines) + "\n", "utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
