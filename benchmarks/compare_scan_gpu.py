"""The output comparison's scan on a GPU (`verifier.judge.device_compare._scan`).

    python -m benchmarks.compare_scan_gpu [--out FILE]

1. Agreement: every case of tests/verifier/test_compare_scan.py compared on the device and on
   the cpu: the same verdicts, messages and figures.
   (Figures to 1e-5 where the fast pass admits the output: it sums in fp32.)
2. Time of one compare of a KernelBench element-wise output (4096 x 393216 fp32, 6 GiB),
   against the baselines measured in the same run: the scan as it was before session 18, which
   read five figures back per 16M-element chunk (96 chunks, ~500 syncs), and session 18's
   fp64 scan alone (`_scan`); now: the fp32 fast pass (`_within`) of a correct output, and a
   wrong output (the fast pass, then the exact scan)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "verifier")]

from test_compare_scan import DTYPES, KINDS, TOL, _case  # noqa: E402

from verifier.judge.device_compare import CHUNK, _scan, _within, compare  # noqa: E402


def read_per_chunk(r: torch.Tensor, n: torch.Tensor, a: float, rt: float) -> int:
    """The baseline: the earlier scan's work and reads (its figures per chunk on the host)."""
    rf, nf, nbad, top = r.reshape(-1), n.reshape(-1), 0, 0.0
    for lo in range(0, rf.numel(), CHUNK):
        rd, nd = rf[lo:lo + CHUNK].double(), nf[lo:lo + CHUNK].double()
        diff = (nd - rd).abs()
        bad = ~((rd.isnan() & nd.isnan()) | (rd.isinf() & (nd == rd))) & ~(
            diff <= a + rt * rd.abs())
        finite = torch.isfinite(diff)
        if bool(finite.any()):
            top = max(top, float(diff[finite].max()))
            float(diff[finite].sum())
            float(diff[finite].square().sum())
        float(rd[torch.isfinite(rd)].square().sum())
        nbad += int(bad.sum())
    return nbad


def timed(fn: object, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        began = time.perf_counter()
        fn()  # type: ignore[operator]
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - began)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    differ = []
    for dt in DTYPES:
        for kind in KINDS:
            r, n = _case(dt, kind)
            want, got = compare(r, n, *TOL, chunk=1000), compare(r.cuda(), n.cuda(), *TOL,
                                                                 chunk=1000)
            rel = 1e-5 if want[0] == "ok" else 1e-9
            if want[:2] != got[:2] or any(abs(want[2][k] - got[2][k]) > rel * max(
                    1.0, abs(want[2][k])) for k in want[2]):
                differ.append(f"{dt} {kind}: cpu {want} cuda {got}")
    x = torch.randn(4096, 393216, device="cuda")
    y = x + 1e-7 * torch.randn_like(x)
    assert _within(x, y, *TOL[:2], CHUNK) is not None  # the fast pass admits it
    z = y.clone()
    z.view(-1)[-1] += 1.0  # one element off, at the end: the whole fast pass, then the scan
    now = timed(lambda: compare(x, y, *TOL))
    wrong = timed(lambda: compare(x, z, *TOL))
    exact = timed(lambda: _scan(x, y, *TOL[:2], CHUNK))
    before = timed(lambda: read_per_chunk(x, y, *TOL[:2]))
    lines = [f"# Output comparison scan on {torch.cuda.get_device_name()}", "",
             "`python -m benchmarks.compare_scan_gpu`", "",
             f"cases compared on cuda and cpu: {len(DTYPES) * len(KINDS)}, differing: "
             f"{len(differ)}", *differ, "",
             "| scan (6 GiB fp32 output, best of 3) | seconds |", "| --- | --- |",
             f"| before: figures read per chunk (session 17, baseline) | {before:.3f} |",
             f"| the fp64 scan, figures read once (session 18, baseline) | {exact:.3f} |",
             f"| now, a correct output: the fp32 fast pass | {now:.3f} |",
             f"| now, one element wrong: the fast pass, then the fp64 scan | {wrong:.3f} |",
             ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text, "utf-8")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
