"""The GPU judge of the trials and the memory admission (issue 29, items 1 and 2), in one call.

    python -m benchmarks.gpu_judge_check --out DIR [--big-cols 196608] [--huge-cols 393216]

1. `verifier.judge.device_compare` on CUDA tensors in chunks against cpu copies in one chunk: the same
   verdicts, messages and statistics (elementwise tolerance, NaN/inf, fp16, ints, tuples, the fp64 second
   opinion on a K = 8192 matmul), and the chunked comparison's peak extra device memory on a
   1.6 GB output (the whole-tensor one needs ~5x the output in fp64 temporaries).
2. `verify_batch` on CUDA (the persistent worker, its referee): honest, wrong, input-mutating
   and tuple-output ReLU kernels with the generalisation check on; an honest and a wrong kernel
   on a task of 4096 x BIG_COLS fp32 (3.2 GB a tensor at the default); an honest kernel on
   4096 x HUGE_COLS (KernelBench's GELU size, 6.4 GB: judged on an H100, one trial, since the
   worker holds no reference of its own) and on 16384 x HUGE_COLS (26 GB a tensor: `does_not_fit`
   anywhere). Every verdict must be the expected one; no honest kernel may be `runtime_error`
   or `cheat`; the referee's and the verifier's peak host memory are printed (nothing of output
   size crosses host memory: both stay far under one output's size).
DIR/gpu_judge_check.json holds every figure; the exit status is 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_candidates import _RELU_DECL, _RELU_PLAIN, _module, _relu  # noqa: E402

TOL = (1e-4, 1e-4, 1e-2, 1e-2)
T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def relu_task(rows: int, cols: int, tuple_out: bool = False) -> str:
    ret = "(torch.relu(x), x.shape[0])" if tuple_out else "torch.relu(x)"
    return f'''import torch
import torch.nn as nn

batch_size = {rows}
dim = {cols}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {ret}


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''


def candidates() -> dict[str, str]:
    fwd = "x):\n        return self.ext.relu_cuda(x.contiguous())"
    tup = "x):\n        return (self.ext.relu_cuda(x.contiguous()), x.shape[0])"
    leaky = _relu(_RELU_PLAIN.replace(": 0.f;", ": 0.01f * x[i];"))
    mk = lambda cid, cuda, f=fwd: _module(cid, cuda, _RELU_DECL, "relu_cuda", f)  # noqa: E731
    return {"honest": mk("judge_honest", _relu(_RELU_PLAIN)),
            "wrong": mk("judge_wrong", leaky),
            "mutates": mk("judge_mutates", _relu(_RELU_PLAIN).replace(  # relu in place
                "auto y = torch::empty_like(x);", "auto y = x;")),
            "tuple": mk("judge_tuple", _relu(_RELU_PLAIN), tup)}


def compare_on_cuda() -> dict:
    """device_compare on CUDA tensors in chunks against cpu copies in one chunk; the chunked
    comparison's memory."""
    import torch

    from verifier.judge import device_compare

    whole = 1 << 40  # one chunk holds any tensor: the whole-tensor comparison

    def cpu(x: object) -> object:
        if isinstance(x, torch.Tensor):
            return x.cpu()
        return type(x)(cpu(v) for v in x) if isinstance(x, tuple | list) else x

    g = torch.Generator(device="cuda").manual_seed(3)
    r = torch.randn(3000, 517, device="cuda", generator=g)
    far = r.clone()
    far[7, 9] += 1
    nan = r.clone()
    nan[0, 0] = float("nan")
    cases = {"equal": (r, r.clone()), "near": (r, r + 3e-5), "far": (r, far), "nan": (r, nan),
             "half": (r.half(), (r + 1e-3).half()), "ints": (r.int(), r.int() + 1),
             "tuple": ((r, 3), (far, 3)), "shape": (r, r[:10])}
    out: dict = {"cases": {}, "ok": True}
    for name, (a, b) in cases.items():
        want = device_compare.compare(cpu(a), cpu(b), *TOL, chunk=whole)
        got = device_compare.compare(a, b, *TOL, chunk=1 << 16)
        same = got[:2] == want[:2] and all(
            math.isclose(got[2][k], v, rel_tol=1e-9, abs_tol=1e-15) for k, v in want[2].items())
        out["cases"][name] = {"same": same, "verdict": got[0]}
        out["ok"] &= same
    a, b = torch.randn(64, 8192, device="cuda") * 4, torch.randn(8192, 64, device="cuda") * 4
    m = torch.nn.Linear(8192, 64, bias=False).cuda()
    with torch.no_grad():
        m.weight.copy_(b.t())
        ref = m(a)
    exact = (a.double() @ b.double()).float()
    want = device_compare.judge(m, [a], ref, exact, TOL, whole)
    got = device_compare.judge(m, [a], ref, exact, TOL)
    out["fp64"] = {"judge": want[::3], "chunked": got[::3]}
    out["ok"] &= want[:2] == got[:2]
    big = torch.randn(1 << 30 | 1 << 29, device="cuda")  # 1.5 G elements, 6 GB fp32
    other = big.clone()
    other[123] += 1.0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    verdict = device_compare.compare(big, other, *TOL)[0]
    out["big"] = {"verdict": verdict, "output_gb": big.numel() * 4 / 1e9,
                  "peak_extra_gb": (torch.cuda.max_memory_allocated() - before) / 1e9}
    out["ok"] &= verdict == "values" and out["big"]["peak_extra_gb"] < 2.0
    del big, other
    torch.cuda.empty_cache()
    return out


def batch(big_cols: int, huge_cols: int, cache: Path) -> dict:
    """The verifier on CUDA: the expected verdict of every case."""
    from verifier.api import verify_batch
    from verifier.protocol import VerifyOptions, VerifyRequest

    c = candidates()
    small, tup = relu_task(4096, 1024), relu_task(4096, 1024, tuple_out=True)
    reqs = [  # (id, task, candidate, variants, expected statuses)
        ("honest", small, c["honest"], None, {"correct_fast", "correct_slow"}),
        ("wrong", small, c["wrong"], None, {"incorrect"}),
        ("mutates", small, c["mutates"], None, {"incorrect"}),
        ("tuple", tup, c["tuple"], [], {"correct_fast", "correct_slow"}),
        ("big_honest", relu_task(4096, big_cols), c["honest"], [],
         {"correct_fast", "correct_slow"}),
        ("big_wrong", relu_task(4096, big_cols), c["wrong"], [], {"incorrect"}),
        ("huge_honest", relu_task(4096, huge_cols), c["honest"], [],
         {"correct_fast", "correct_slow"}),
        ("giant_honest", relu_task(16384, huge_cols), c["honest"], [], {"does_not_fit"}),
    ]
    opts = VerifyOptions(backend="cuda", workers=1, trials=5, run_timeout_s=300.0,
                         generalize=True, build_cache_dir=str(cache / "build"),
                         baseline_cache_dir=str(cache / "baselines"))
    timings: dict = {}
    began = time.monotonic()
    verdicts = verify_batch([VerifyRequest(cid, cid, task, code, "cuda", variants=var)
                             for cid, task, code, var, _ in reqs], opts, timings=timings)
    got = {v.candidate_id: v for v in verdicts}
    rows, ok = {}, True
    for cid, _, _, _, want in reqs:
        v = got[cid]
        good = v.status in want
        ok &= good
        rows[cid] = {"status": v.status, "expected": sorted(want), "ok": good,
                     "error": v.error[:300], "trials": v.trials, "max_abs_diff": v.max_abs_diff,
                     "runtime_us": v.runtime_us, "referee_s": timings.get(cid, {}).get(
                         "referee_s"), "findings": [f["rule"] for f in v.findings]}
        log(f"{cid:14s} {v.status:14s} {'ok' if good else 'UNEXPECTED'} trials={v.trials} "
            f"{v.error[:120]}")
    return {"ok": ok, "wall_s": time.monotonic() - began, "verdicts": rows,
            "verifier_peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            "children_peak_rss_gb": resource.getrusage(
                resource.RUSAGE_CHILDREN).ru_maxrss / 1e6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--big-cols", type=int, default=196608)
    ap.add_argument("--huge-cols", type=int, default=393216)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    results = {"device": torch.cuda.get_device_name(0),
               "free_gb": torch.cuda.mem_get_info()[0] / 1e9}
    log(f"device {results['device']}, {results['free_gb']:.1f} GB free")
    results["compare"] = compare_on_cuda()
    log(f"device_compare vs judge on CUDA: {'ok' if results['compare']['ok'] else 'FAILED'} "
        f"(6 GB output: peak extra {results['compare']['big']['peak_extra_gb']:.2f} GB)")
    results["batch"] = batch(args.big_cols, args.huge_cols, args.out / "cache")
    b = results["batch"]
    log(f"batch {'ok' if b['ok'] else 'FAILED'} in {b['wall_s']:.0f} s; peak host RSS: "
        f"verifier {b['verifier_peak_rss_gb']:.2f} GB, largest child "
        f"{b['children_peak_rss_gb']:.2f} GB (one big output: "
        f"{4096 * args.big_cols * 4 / 1e9:.1f} GB)")
    (args.out / "gpu_judge_check.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if results["compare"]["ok"] and b["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
