"""Output judgement shared by the worker (its trials) and the parent (`verifier.decide`): types,
shapes, dtype-aware tolerances, and an fp64 second opinion for fp32 mismatches."""

from __future__ import annotations

import copy
from typing import Any


def _flatten(out: Any) -> list[Any]:
    if isinstance(out, tuple | list):
        return list(out)
    return [out]


def _compare(ref: Any, new: Any, atol: float, rtol: float, atol_low: float, rtol_low: float
             ) -> tuple[str, str, dict[str, float]]:
    """(verdict, message, stats): verdict ok | incorrect | cheat | values (numbers differ)."""
    import torch

    refs, news = _flatten(ref), _flatten(new)
    if type(new) is not type(ref) and not (isinstance(ref, tuple | list)
                                           and isinstance(new, tuple | list)):
        if isinstance(new, torch.Tensor) and type(new) is not torch.Tensor:
            return "cheat", f"output is a {type(new).__name__}, not a plain torch.Tensor", {}
        return "incorrect", f"output type {type(new).__name__}, expected {type(ref).__name__}", {}
    if len(refs) != len(news):
        return "incorrect", f"{len(news)} outputs, expected {len(refs)}", {}
    stats = {"max_abs_diff": 0.0, "mean_abs_diff": 0.0, "mismatch_frac": 0.0}
    total = 0
    for i, (r, n) in enumerate(zip(refs, news, strict=True)):
        if not isinstance(r, torch.Tensor):
            if r != n:
                return "incorrect", f"output {i}: {n!r} != {r!r}", stats
            continue
        if type(n) is not torch.Tensor:
            kind = "cheat" if isinstance(n, torch.Tensor) else "incorrect"
            return kind, f"output {i} is a {type(n).__name__}, not a plain torch.Tensor", stats
        if n.shape != r.shape:
            return "incorrect", f"output {i} shape {list(n.shape)}, expected {list(r.shape)}", stats
        if n.dtype != r.dtype:
            return "incorrect", f"output {i} dtype {n.dtype}, expected {r.dtype}", stats
        if n.device != r.device:
            return "incorrect", f"output {i} on {n.device}, expected {r.device}", stats
        if r.numel() == 0:
            continue
        low = r.dtype in (torch.float16, torch.bfloat16)
        a, rt = (atol_low, rtol_low) if low else (atol, rtol)
        if not r.is_floating_point() and not r.is_complex():
            a = rt = 0.0
        if r.is_complex():  # .double() of a complex tensor keeps only its real part
            r, n = torch.view_as_real(r.resolve_conj()), torch.view_as_real(n.resolve_conj())
        rd, nd = r.detach().double(), n.detach().double()
        diff = (nd - rd).abs()
        both_nan = rd.isnan() & nd.isnan()
        same_inf = rd.isinf() & (nd == rd)
        bad = ~(both_nan | same_inf) & ~(diff <= a + rt * rd.abs())
        finite = torch.isfinite(diff)
        if bool(finite.any()):
            stats["max_abs_diff"] = max(stats["max_abs_diff"], float(diff[finite].max()))
            stats["mean_abs_diff"] += float(diff[finite].sum())
        total += r.numel()
        nbad = int(bad.sum())
        if nbad:
            stats["mismatch_frac"] += nbad
            idx = tuple(int(x) for x in bad.nonzero()[0])
            msg = (f"output {i}: {nbad} of {r.numel()} elements differ beyond atol={a:g} "
                   f"rtol={rt:g}; first at index {list(idx)}: got {float(nd[idx]):.6g}, "
                   f"expected {float(rd[idx]):.6g}")
            stats["mean_abs_diff"] /= total
            stats["mismatch_frac"] /= total
            return "values", msg, stats
    if total:
        stats["mean_abs_diff"] /= total
        stats["mismatch_frac"] /= total
    return "ok", "", stats


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


def against_fp64(model: Any, inputs: list[Any], ref: Any, out: Any, atol: float
                 ) -> dict[str, Any] | None:
    """Second opinion on an fp32 mismatch, calibrated per task: is `out` fp32-accurate?

    Long reductions (a matmul with K = 8192, long scans) differ from torch by more than 1e-4 in
    any other summation order, and torch's own error differs between devices (its CPU cumsum
    accumulates in double), so neither the tolerance nor torch's error is the yardstick. The
    task's sensitivity is: fp64 outputs from inputs rounded to a 10-bit mantissa against fp64
    outputs from the inputs. `ok` when the candidate's max and mean errors against fp64 are both
    LOW_PRECISION_MARGIN times smaller than that (or within atol). None when no fp64 reference
    can be made (no fp64 kernel for some op) or the output is not one fp32 tensor.
    """
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
    except Exception:  # some op has no fp64 kernel: the fp32 verdict stands
        return None
    if type(exact) is not torch.Tensor or exact.shape != ref.shape:
        return None
    err_new = (out.double() - exact).abs().nan_to_num(1e30)
    err_low = (coarse.double() - exact).abs().nan_to_num(0.0)
    err_ref = (ref.double() - exact).abs().nan_to_num(1e30)
    k = LOW_PRECISION_MARGIN
    new_max, low_max = float(err_new.max()), float(err_low.max())
    ok = (new_max <= max(low_max / k, atol)
          and float(err_new.mean()) <= max(float(err_low.mean()) / k, atol))
    return {"ok": ok, "max_abs_diff": new_max, "mean_abs_diff": float(err_new.mean()),
            "ref_max_abs_err": float(err_ref.max()), "low_precision_max_abs_err": low_max,
            "mismatch_frac": float((err_new > err_low / k + atol).double().mean())}


def _judge(model: Any, inputs: list[Any], ref_out: Any, new_out: Any,
           tol: tuple[float, float, float, float]
           ) -> tuple[str, str, dict[str, float], bool]:
    """`_compare` at the tolerances; a numbers-only miss then gets the fp64 second opinion.
    (verdict ok | incorrect | cheat | values, message, stats, whether the fp64 reference
    accepted the output)."""
    verdict, msg, stats = _compare(ref_out, new_out, *tol)
    if verdict != "values":
        return verdict, msg, stats, False
    second = against_fp64(model, inputs, ref_out, new_out, tol[0])
    if second and second["ok"]:
        return "ok", "", {k: second[k] for k in ("max_abs_diff", "mean_abs_diff")}, True
    if second:
        msg += (f" (against an fp64 reference too: error {second['max_abs_diff']:.3g}; "
                f"torch's own fp32 error {second['ref_max_abs_err']:.3g}, fp16-precision "
                f"inputs would give {second['low_precision_max_abs_err']:.3g})")
    return verdict, msg, stats, False
