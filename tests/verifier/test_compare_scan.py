"""`device_compare.compare` against a plain whole-tensor statement of its rule.

The chunked scan (`device_compare._scan`) keeps its running figures on the tensors' device and
reads them once; this file states the rule at once over the whole tensor, in float64, and
checks that every verdict, message and figure agrees, for each dtype the judge meets, every
kind of mismatch (NaN where the reference has NaN, infinities equal and not, values off by
more than the tolerance) and chunk sizes that split the tensor unevenly."""

from __future__ import annotations

import math

import pytest
import torch

from verifier.judge.device_compare import MARGIN, _within, compare

TOL = (1e-4, 1e-4, 1e-2, 1e-2)
KINDS = ("same", "close", "far", "nan", "inf", "mixed", "allnan")
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32,
          torch.complex64)


def _case(dt: torch.dtype, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(hash((str(dt), kind)) % 1000)
    shape = (37, 129)
    if dt.is_complex:
        r = torch.randn(*shape, dtype=dt, generator=g)
    elif dt.is_floating_point:
        r = torch.randn(*shape, generator=g).to(dt)
    else:
        r = torch.randint(-5, 5, shape, generator=g, dtype=dt)
    n = r.clone()
    if kind == "close" and (dt.is_floating_point or dt.is_complex):
        n = r + (1e-6 * torch.randn(*shape, generator=g)).to(dt)
    if kind == "far":
        n.view(-1)[500] += 3
        n.view(-1)[4000] -= 2
    if dt.is_floating_point:
        flat_r, flat_n = r.view(-1), n.view(-1)
        if kind in ("nan", "mixed"):  # NaN in both (fine), NaN in the output only (a miss)
            flat_r[10], flat_n[10], flat_n[20] = math.nan, math.nan, math.nan
        if kind in ("inf", "mixed"):  # inf in both; -inf against 1.0; inf against a value
            flat_r[30] = flat_n[30] = math.inf
            flat_r[31], flat_n[31], flat_n[40] = -math.inf, 1.0, math.inf
        if kind == "allnan":
            r.fill_(math.nan)
            n.fill_(math.nan)
    return r, n


def _low(r: torch.Tensor) -> bool:
    return r.dtype in (torch.float16, torch.bfloat16)


def _real(r: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.view_as_real(r), torch.view_as_real(n)) if r.is_complex() else (r, n)


def _rule(r: torch.Tensor, n: torch.Tensor) -> tuple[str, dict[str, float], int | None]:
    """The rule at once: (verdict, figures, flat index of the first miss)."""
    low = r.dtype in (torch.float16, torch.bfloat16)
    a, rt = TOL[2:] if low else TOL[:2]
    if not r.is_floating_point() and not r.is_complex():
        a = rt = 0.0
    if r.is_complex():
        r, n = torch.view_as_real(r), torch.view_as_real(n)
    rd, nd = r.reshape(-1).double(), n.reshape(-1).double()
    diff = (nd - rd).abs()
    ok = (diff <= a + rt * rd.abs()) | (rd.isnan() & nd.isnan()) | (rd.isinf() & (nd == rd))
    fin = diff[torch.isfinite(diff)]
    figs = {"max_abs_diff": float(fin.max()) if fin.numel() else 0.0,
            "mean_abs_diff": float(fin.sum()) / rd.numel(),
            "mismatch_frac": float((~ok).sum()) / rd.numel()}
    ref = rd[torch.isfinite(rd)]
    figs["rel_norm"] = float(fin.square().sum()) ** 0.5 / max(
        float(ref.square().sum()) ** 0.5, 1e-300)
    bad = (~ok).nonzero()
    return ("values" if bad.numel() else "ok"), figs, (int(bad[0, 0]) if bad.numel() else None)


@pytest.mark.parametrize("chunk", [1 << 24, 1000, 7])
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_the_chunked_scan_states_the_rule(dt: torch.dtype, chunk: int) -> None:
    for kind in KINDS:
        r, n = _case(dt, kind)
        verdict, msg, stats = compare(r, n, *TOL, chunk=chunk)
        want, figs, first = _rule(r, n)
        assert verdict == want, (kind, verdict, msg)
        # an output the fast pass admits has fp32-accurate figures (`_within`); else exact
        fast = _within(*_real(r, n), *TOL[2:] if _low(r) else TOL[:2], chunk) is not None
        for key, value in figs.items():
            assert stats[key] == pytest.approx(value, rel=1e-5 if fast else 1e-9,
                                               abs=1e-300), (kind, key)
        if first is not None:
            rows = r.shape[1] * (2 if r.is_complex() else 1)
            assert f"first at index [{first // rows}, " in msg, (kind, msg, first)


def test_the_scan_leaves_a_float64_output_as_it_was() -> None:
    """The scan subtracts in place, on a copy: a float64 output is not the copy's source."""
    r = torch.randn(1000, dtype=torch.float64)
    n = r + 1.0
    kept = n.clone()
    assert compare(r, n, *TOL, chunk=64)[0] == "values"
    assert torch.equal(n, kept)


def _exact_ok(r: torch.Tensor, n: torch.Tensor, a: float, rt: float) -> torch.Tensor:
    rd, nd = r.double(), n.double()
    return (nd - rd).abs() <= a + rt * rd.abs()


@pytest.mark.parametrize("dt", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("tol", [(1e-4, 1e-4), (1e-2, 1e-2), (0.0, 1e-3), (1e-5, 0.0)],
                         ids=str)
def test_the_fast_pass_admits_nothing_the_fp64_rule_rejects(dt: torch.dtype,
                                                            tol: tuple[float, float]) -> None:
    """Outputs placed at the tolerance's edge, one ulp either side (and the magnitudes where
    fp32 rounds worst: subnormal, huge): wherever `_within` answers, every element passes the
    fp64 rule; an output well inside is answered (the fast pass runs at all)."""
    a, rt = tol
    g = torch.Generator().manual_seed(7)
    for scale in (1e-40, 1e-6, 1.0, 3e3, 1e18, 1e30):
        r = (torch.randn(4096, generator=g, dtype=torch.float64) * scale).to(dt)
        bound = a + rt * r.double().abs()
        for shift in (-4, -1, 0, 1, 4):  # the edge moved by a few ulps of the output's dtype
            edge = (r.double() + bound).to(dt)
            n = edge.clone()
            for _ in range(abs(shift)):
                n = torch.nextafter(n.float(), torch.full_like(n.float(), math.copysign(
                    math.inf, shift))).to(dt)
            fast = _within(r, n, a, rt, 1000)
            if fast is not None:
                assert bool(_exact_ok(r, n, a, rt).all()), (scale, shift)
        inside = (r.double() + bound * (1 - 1e-3 if dt == torch.float32 else 0.5)).to(dt)
        if (bool(_exact_ok(r, inside, a, rt).all()) and scale < 1e18 and (a > 0 or bool((r != 0).all()))
                and bool(((inside.double() - r.double()).abs() <= bound * (1 - 4 * MARGIN)).all())):
            assert _within(r, inside, a, rt, 1000) is not None, (scale, tol)


def test_the_fast_pass_leaves_specials_to_the_exact_scan() -> None:
    """NaN anywhere, an infinity (even one the rule accepts), a miss: `_within` says None."""
    r = torch.randn(100)
    for i, (x, y) in enumerate([(math.nan, math.nan), (math.inf, math.inf), (1.0, 2.0)]):
        rr, nn = r.clone(), r.clone()
        rr[i], nn[i] = x, y
        assert _within(rr, nn, 1e-4, 1e-4, 64) is None, (x, y)
    assert _within(r, r.clone(), 1e-4, 1e-4, 64) is not None
