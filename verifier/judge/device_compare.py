"""Output judgement, in chunks, on whatever device the tensors live: types, shapes,
dtype-aware tolerances, and an fp64 second opinion for fp32 mismatches. The worker (its
trials), the judges (trials and timed windows, on the GPU) and the parent's own recheck all
judge outputs here.

Each tensor is walked in flat chunks of `chunk` elements (row-major, as `nonzero` orders
them), so the temporaries are a few chunks, never fp64 copies of whole outputs (for a 6.4 GB
fp32 output those were ~40 GB); sums accumulate in fp64. Beside the error statistics:
`rel_norm`, the relative L2 norm of the error (reported, not judged). Only torch and the
standard library.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

from verifier.judge.tensors import flatten

CHUNK = 1 << 24  # elements per chunk: ~8 temporaries of 8 bytes each, ~1 GB at most


# An fp32 result that misses the tolerance is still accepted when it is at least this many
# times more accurate (against fp64) than the task's outputs computed from inputs rounded to a
# 10-bit mantissa, the precision of fp16 and TF32. Measured (CPU, fp64 references): a
# sequential fp32 cumsum over 16k elements and a K-chunked matmul are 60x and >1000x more
# accurate than that yardstick; fp16/TF32 inputs or arithmetic are at about 1x and bf16 worse.
LOW_PRECISION_MARGIN = 8.0


def round_mantissa(x: Any, bits: int = 10) -> Any:
    """fp32 `x` rounded to nearest with `bits` mantissa bits (fp16/TF32 precision, fp32 range)."""
    import torch

    drop = 23 - bits
    i = x.contiguous().view(torch.int32)
    q = ((i + (1 << (drop - 1))) & ~((1 << drop) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(x), q, x)


def _flat(t: Any) -> Any:
    """`t` as one row-major dimension (a view where its strides allow, else a copy)."""
    return t.reshape(-1)


def _unravel(i: int, shape: list[int]) -> list[int]:
    idx = []
    for d in reversed(shape):
        idx.append(i % d)
        i //= d
    return list(reversed(idx))


class _Sums:
    """Running statistics of one tensor's |new - ref| in fp64."""

    def __init__(self) -> None:
        self.max: float | None = None
        self.sum = 0.0
        self.err_sq = 0.0
        self.ref_sq = 0.0
        self.nbad = 0
        self.first: int | None = None  # flat index of the first mismatch


def _scan(r: Any, n: Any, a: float, rt: float, chunk: int) -> _Sums:
    """One tensor pair walked in chunks: `compare`'s rule per element. The running figures stay
    on the tensors' device and are read once at the end: a 6 GiB output is 96 chunks, and a
    read per figure per chunk (five syncs each) made an H100's window check of one KernelBench
    element-wise problem take ~0.5 s (`benchmarks/results/verify_kernelbench_spans_h200.md`)."""
    import torch

    s = _Sums()
    rf, nf = _flat(r.detach()), _flat(n.detach())
    total = rf.numel()
    f64 = {"dtype": torch.float64, "device": rf.device}
    top, sums = torch.zeros((), **f64), torch.zeros(3, **f64)  # |diff|, its square, ref's square
    counts = torch.tensor([0, total, 0], dtype=torch.int64, device=rf.device)  # bad, first, finite
    for lo in range(0, total, chunk):
        rd = rf[lo:lo + chunk].double()
        diff = nf[lo:lo + chunk].to(torch.float64, copy=True).sub_(rd).abs_()  # (a copy: in place)
        bad = ~((diff <= a + rt * rd.abs()) | (rd.isnan() & nf[lo:lo + chunk].isnan())
                | (rd.isinf() & (nf[lo:lo + chunk] == rd)))
        finite = torch.isfinite(diff)
        kept = torch.where(finite, diff, 0.0)  # |diff| >= 0: the finite ones' max and sums
        top = torch.maximum(top, kept.max())
        sums[0] += kept.sum()
        sums[1] += kept.square_().sum()
        sums[2] += torch.where(torch.isfinite(rd), rd, 0.0).square_().sum()
        nbad = bad.sum()
        first = torch.where((nbad > 0) & (counts[1] == total),
                            lo + torch.argmax(bad.to(torch.uint8)), counts[1])
        counts = torch.stack([counts[0] + nbad, first, counts[2] + finite.sum()])
    (mx, sm, esq, rsq), (nb, fi, nfin) = (torch.cat([top.reshape(1), sums]).tolist(),
                                          counts.tolist())
    if nfin:
        s.max, s.sum, s.err_sq = mx, sm, esq
    s.ref_sq, s.nbad = rsq, int(nb)
    s.first = int(fi) if nb else None
    return s


# The fast pass (`_within`): every element checked in the output's own float precision (fp16
# and bf16 widened to fp32) against a bound shrunk by MARGIN, then less TINY: fp32 rounding of
# |n - r| and of atol + rtol * |r| is at most 2^-24 relative each (and subnormal rounding at
# most 2^-149 absolute), so an element the fast pass admits passes the fp64 rule too. Anything
# it does not admit (a miss, a NaN or an infinity anywhere, an element within the rounding of
# the bound) is walked again by the exact fp64 scan, whose verdict and figures then stand.
MARGIN, TINY = 2.0 ** -20, 2.0 ** -120


def _within(r: Any, n: Any, a: float, rt: float, chunk: int) -> _Sums | None:
    """`_scan`'s figures when every element of `n` is surely within `a + rt * |r|` and finite
    (None otherwise, or for a dtype without a fast pass: float64, integers): one pass in fp32,
    a third of the fp64 scan's memory traffic and a fifth of its kernels. The figures are
    fp32-accurate (relative error ~1e-6; reported, never judged). The verdict of a correct
    output is the judge's most frequent question: a 6 GiB output is compared a few times a
    job, in each trial and timed window (`verifier.judge.window_judge`)."""
    import torch

    if r.dtype not in (torch.float32, torch.float16, torch.bfloat16) or not (
            0.0 <= a < math.inf and 0.0 <= rt < math.inf):
        return None
    rf, nf = _flat(r.detach()), _flat(n.detach())
    total = rf.numel()
    lo32 = a * (1.0 - MARGIN) - TINY
    rt32 = rt * (1.0 - MARGIN)
    f64 = {"dtype": torch.float64, "device": rf.device}
    ok = torch.ones((), dtype=torch.bool, device=rf.device)
    top, sums = torch.zeros((), **f64), torch.zeros(3, **f64)  # |diff|, its square, ref's square
    for lo in range(0, total, chunk):
        rc, nc = rf[lo:lo + chunk].float(), nf[lo:lo + chunk].float()
        d = torch.sub(nc, rc).abs_()
        ok &= torch.le(d, torch.abs(rc).mul_(rt32).add_(lo32)).all()  # False on a NaN
        top = torch.maximum(top, d.max().double())
        sums += torch.stack([d.sum(), torch.dot(d, d), torch.dot(rc, rc)]).double()
    figures = torch.cat([top.reshape(1), sums])
    fine = ok & torch.isfinite(figures).all()  # an fp32 square that overflowed: the exact scan
    *values, passed = torch.cat([figures, fine.reshape(1).double()]).tolist()
    if not passed:
        return None
    s = _Sums()
    s.max, s.sum, s.err_sq, s.ref_sq = values
    return s


def precheck(i: int, r: Any, n: Any) -> tuple[str, str] | None:
    """(verdict, message) when output `i` cannot be compared element by element with its
    reference (a plain value that differs; not a plain tensor; another shape, dtype or
    device), else None."""
    import torch

    if not isinstance(r, torch.Tensor):
        return None if r == n else ("incorrect", f"output {i}: {n!r} != {r!r}")
    if type(n) is not torch.Tensor:
        kind = "cheat" if isinstance(n, torch.Tensor) else "incorrect"
        return kind, f"output {i} is a {type(n).__name__}, not a plain torch.Tensor"
    if n.shape != r.shape:
        return "incorrect", f"output {i} shape {list(n.shape)}, expected {list(r.shape)}"
    if n.dtype != r.dtype:
        return "incorrect", f"output {i} dtype {n.dtype}, expected {r.dtype}"
    if n.device != r.device:
        return "incorrect", f"output {i} on {n.device}, expected {r.device}"
    return None


def compare(ref: Any, new: Any, atol: float, rtol: float, atol_low: float, rtol_low: float,
            chunk: int = CHUNK) -> tuple[str, str, dict[str, float]]:
    """(verdict ok | incorrect | cheat | values, message, stats): types and shapes, then every
    element within atol + rtol * |ref| (fp16/bf16 at the low tolerances, integers exactly);
    stats with `rel_norm` added where some tensor was compared."""
    import torch

    refs, news = flatten(ref), flatten(new)
    if type(new) is not type(ref) and not (isinstance(ref, tuple | list)
                                           and isinstance(new, tuple | list)):
        if isinstance(new, torch.Tensor) and type(new) is not torch.Tensor:
            return "cheat", f"output is a {type(new).__name__}, not a plain torch.Tensor", {}
        return "incorrect", f"output type {type(new).__name__}, expected {type(ref).__name__}", {}
    if len(refs) != len(news):
        return "incorrect", f"{len(news)} outputs, expected {len(refs)}", {}
    stats = {"max_abs_diff": 0.0, "mean_abs_diff": 0.0, "mismatch_frac": 0.0}
    total, err_sq, ref_sq = 0, 0.0, 0.0
    for i, (r, n) in enumerate(zip(refs, news, strict=True)):
        unlike = precheck(i, r, n)
        if unlike is not None:
            return (*unlike, stats)
        if not isinstance(r, torch.Tensor) or r.numel() == 0:
            continue
        low = r.dtype in (torch.float16, torch.bfloat16)
        a, rt = (atol_low, rtol_low) if low else (atol, rtol)
        if not r.is_floating_point() and not r.is_complex():
            a = rt = 0.0
        if r.is_complex():  # .double() of a complex tensor keeps only its real part
            r, n = torch.view_as_real(r.resolve_conj()), torch.view_as_real(n.resolve_conj())
        s = _within(r, n, a, rt, chunk) or _scan(r, n, a, rt, chunk)
        if s.max is not None:
            stats["max_abs_diff"] = max(stats["max_abs_diff"], s.max)
            stats["mean_abs_diff"] += s.sum
        err_sq, ref_sq = err_sq + s.err_sq, ref_sq + s.ref_sq
        stats["rel_norm"] = (err_sq ** 0.5) / max(ref_sq ** 0.5, 1e-300)
        total += r.numel()
        if s.nbad:
            assert s.first is not None
            idx = _unravel(s.first, list(r.shape))
            got = float(_flat(n.detach())[s.first].double())
            want = float(_flat(r.detach())[s.first].double())
            msg = (f"output {i}: {s.nbad} of {r.numel()} elements differ beyond atol={a:g} "
                   f"rtol={rt:g}; first at index {idx}: got {got:.6g}, expected {want:.6g}")
            stats["mean_abs_diff"] /= total
            stats["mismatch_frac"] = (stats["mismatch_frac"] + s.nbad) / total
            return "values", msg, stats
    if total:
        stats["mean_abs_diff"] /= total
        stats["mismatch_frac"] /= total
    return "ok", "", stats


def _err_stats(out: Any, exact: Any, coarse: Any, ref: Any, atol: float, chunk: int
               ) -> dict[str, float]:
    """`against_fp64`'s error figures, accumulated over chunks."""
    k = LOW_PRECISION_MARGIN
    o, e, c, r = (_flat(x.detach()) for x in (out, exact, coarse, ref))
    new_max = low_max = ref_max = 0.0
    new_sum = low_sum = 0.0
    over = 0
    for lo in range(0, o.numel(), chunk):
        ex = e[lo:lo + chunk].double()
        err_new = (o[lo:lo + chunk].double() - ex).abs().nan_to_num(1e30)
        err_low = (c[lo:lo + chunk].double() - ex).abs().nan_to_num(0.0)
        err_ref = (r[lo:lo + chunk].double() - ex).abs().nan_to_num(1e30)
        new_max, low_max = max(new_max, float(err_new.max())), max(low_max, float(err_low.max()))
        ref_max = max(ref_max, float(err_ref.max()))
        new_sum, low_sum = new_sum + float(err_new.sum()), low_sum + float(err_low.sum())
        over += int((err_new > err_low / k + atol).sum())
    n = max(1, o.numel())
    return {"new_max": new_max, "low_max": low_max, "ref_max": ref_max,
            "new_mean": new_sum / n, "low_mean": low_sum / n, "mismatch_frac": over / n}


def against_fp64(model: Any, inputs: list[Any], ref: Any, out: Any, atol: float,
                 chunk: int = CHUNK) -> dict[str, Any] | None:
    """Second opinion on an fp32 mismatch, calibrated per task: is `out` fp32-accurate?

    Long reductions (a matmul with K = 8192, long scans) differ from torch by more than 1e-4 in
    any other summation order, and torch's own error differs between devices (its CPU cumsum
    accumulates in double), so neither the tolerance nor torch's error is the yardstick. The
    task's sensitivity is: fp64 outputs from inputs rounded to a 10-bit mantissa against fp64
    outputs from the inputs. `ok` when the candidate's max and mean errors against fp64 are both
    LOW_PRECISION_MARGIN times smaller than that (or within atol). None when no fp64 reference
    can be made (no fp64 kernel for some op) or the output is not one fp32 tensor. The error
    figures are summed in chunks (the fp64 model's two outputs are whole: no chunking makes an
    arbitrary module's forward smaller)."""
    import torch

    if not (type(ref) is torch.Tensor and ref.dtype == torch.float32
            and type(out) is torch.Tensor and out.shape == ref.shape):
        return None
    floats = [isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in inputs]
    try:
        model64 = copy.deepcopy(model).double()
        with torch.no_grad():
            exact = model64(*[x.double() if f else x for x, f in zip(inputs, floats, strict=True)])
            coarse = model64(*[round_mantissa(x).double() if f else x
                               for x, f in zip(inputs, floats, strict=True)])
    except Exception:  # some op has no fp64 kernel (or no room for it): the fp32 verdict stands
        return None
    if type(exact) is not torch.Tensor or exact.shape != ref.shape:
        return None
    s = _err_stats(out, exact, coarse, ref, atol, chunk)
    del exact, coarse, model64
    k = LOW_PRECISION_MARGIN
    ok = (s["new_max"] <= max(s["low_max"] / k, atol)
          and s["new_mean"] <= max(s["low_mean"] / k, atol))
    return {"ok": ok, "max_abs_diff": s["new_max"], "mean_abs_diff": s["new_mean"],
            "ref_max_abs_err": s["ref_max"], "low_precision_max_abs_err": s["low_max"],
            "mismatch_frac": s["mismatch_frac"]}


def judge(model: Any, inputs: list[Any] | Callable[[], list[Any]], ref_out: Any, new_out: Any,
          tol: tuple[float, float, float, float], chunk: int = CHUNK, fp64: bool = True
          ) -> tuple[str, str, dict[str, float], bool]:
    """`compare` at the tolerances; a numbers-only miss then gets the fp64 second opinion:
    (verdict, message, stats, whether the fp64 reference accepted the output). `fp64` False: no second opinion (the device has no
    room for an fp64 copy of the model's outputs: a values miss stands). `inputs` may be a
    function that makes them again (only the second opinion needs them: no copy is kept)."""
    verdict, msg, stats = compare(ref_out, new_out, *tol, chunk=chunk)
    if verdict != "values":
        return verdict, msg, stats, False
    second = None
    if fp64:
        second = against_fp64(model, inputs() if callable(inputs) else inputs, ref_out, new_out,
                              tol[0], chunk)
    if second and second["ok"]:
        return "ok", "", {k: second[k] for k in ("max_abs_diff", "mean_abs_diff")}, True
    if second:
        msg += (f" (against an fp64 reference too: error {second['max_abs_diff']:.3g}; "
                f"torch's own fp32 error {second['ref_max_abs_err']:.3g}, fp16-precision "
                f"inputs would give {second['low_precision_max_abs_err']:.3g})")
    return verdict, msg, stats, False
