"""`verifier.judge.device_compare`: the comparison in small chunks gives the same verdicts, messages
and statistics as in one chunk that holds each tensor whole, on every kind of output; run here
on cpu tensors, with chunks small enough that every case spans several."""

from __future__ import annotations

import math

import pytest
import torch

from verifier.judge.device_compare import against_fp64, compare, judge

TOL = (1e-4, 1e-4, 1e-2, 1e-2)
WHOLE = 1 << 40  # one chunk holds any tensor here: the whole-tensor comparison


def _cases() -> dict[str, tuple]:
    g = torch.Generator().manual_seed(7)
    r = torch.randn(37, 29, generator=g)
    far = r.clone()
    far[3, 5] += 1.0
    far[30, 1] -= 2.0
    near = r + 3e-5 * torch.randn(37, 29, generator=g)
    nan_r, nan_n = r.clone(), r.clone()
    nan_r[0, 0] = nan_n[0, 0] = float("nan")
    nan_n[2, 2] = float("nan")
    inf_r = r.clone()
    inf_r[1, 1] = float("inf")
    inf_n = inf_r.clone()
    inf_bad = inf_r.clone()
    inf_bad[1, 1] = float("-inf")
    h = r.half()
    ints = torch.arange(1000).reshape(10, 100)
    ints_bad = ints.clone()
    ints_bad[9, 99] += 1
    return {
        "equal": (r, r.clone()), "near": (r, near), "far": (r, far), "nan": (nan_r, nan_n),
        "nan_both": (nan_r, nan_r.clone()), "inf": (inf_r, inf_n), "inf_sign": (inf_r, inf_bad),
        "half": (h, (r + 1e-3).half()), "half_far": (h, h + 0.5), "ints": (ints, ints.clone()),
        "ints_bad": (ints, ints_bad), "tuple": ((r, ints), (near, ints.clone())),
        "tuple_bad": ((r, ints), (r.clone(), ints_bad)), "list_tuple": ([r], (r.clone(),)),
        "plain": ((r, 3), (r.clone(), 3)), "plain_bad": ((r, 3), (r.clone(), 4)),
        "count": ((r, r), (r,)), "shape": (r, r.t().contiguous()), "dtype": (r, r.double()),
        "type": (r, [r]), "empty": (torch.empty(0, 3), torch.empty(0, 3)),
        "noncontig": (r.t(), far.t()), "scalar": (torch.tensor(2.0), torch.tensor(2.5)),
    }


@pytest.mark.parametrize("name", sorted(_cases()))
@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_chunked_comparison_matches_the_whole_tensor_one(name: str, chunk: int) -> None:
    ref, new = _cases()[name]
    want = compare(ref, new, *TOL, chunk=WHOLE)
    got = compare(ref, new, *TOL, chunk=chunk)
    assert got[:2] == want[:2], name
    assert set(got[2]) == set(want[2]), name
    for k, v in want[2].items():  # fp32 sums where the fast pass admits the output (1e-6)
        assert math.isclose(got[2][k], v, rel_tol=1e-5, abs_tol=1e-15), (name, k)


def test_the_relative_norm_is_the_errors_l2_over_the_references() -> None:
    ref, new = _cases()["far"]
    stats = compare(ref, new, *TOL, chunk=5)[2]
    want = float((new.double() - ref.double()).norm() / ref.double().norm())
    assert math.isclose(stats["rel_norm"], want, rel_tol=1e-9)
    assert stats["rel_norm"] > 1e-3


class _Cumsum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=-1)


class _Matmul(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


@pytest.mark.parametrize("chunk", [3, 1 << 20])
def test_the_fp64_second_opinion_matches_in_chunks(chunk: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 16384)
    model = _Cumsum()
    ref = model(x)
    exact = torch.cumsum(x.double(), -1).float()  # fp32-accurate: a miss the second opinion takes
    half = torch.cumsum(x.half().float(), -1)  # fp16-precision: a miss it does not take
    for out in (exact, half):
        want, got = (against_fp64(model, [x], ref, out, TOL[0], WHOLE),
                     against_fp64(model, [x], ref, out, TOL[0], chunk))
        assert want is not None and got is not None
        assert got["ok"] == want["ok"]
        for k in want:
            if k != "ok":
                assert math.isclose(got[k], want[k], rel_tol=1e-9, abs_tol=1e-15), k
        assert judge(model, [x], ref, out, TOL, WHOLE)[:2] == judge(
            model, [x], ref, out, TOL, chunk)[:2]
    a, b = torch.randn(64, 4096), torch.randn(4096, 32)
    m = _Matmul()
    ref = m(a, b)
    bad = ref + 0.1
    want, got = judge(m, [a, b], ref, bad, TOL, WHOLE), judge(m, [a, b], ref, bad, TOL, chunk)
    assert got[:2] == want[:2] and got[0] == "values"
    assert "against an fp64 reference too" in got[1]


def test_without_room_for_fp64_a_values_miss_stands() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(32, 8192) * 4, torch.randn(8192, 32) * 4
    model = _Matmul()
    ref = model(a, b)
    exact = (a.double() @ b.double()).float()  # misses 1e-4 (K = 8192), but fp32-accurate
    # no relative tolerance: whether torch's fp32 sum (its order set by the thread count) is
    # within 1e-4 * |ref| of fp64 must not decide what this test sees
    tol = (TOL[0], 0.0, *TOL[2:])
    assert judge(model, [a, b], ref, exact, tol, WHOLE)[::3] == ("ok", True)
    assert judge(model, [a, b], ref, exact, tol, chunk=100)[::3] == ("ok", True)
    verdict, msg, _, by64 = judge(model, [a, b], ref, exact, tol, fp64=False)
    assert (verdict, by64) == ("values", False) and "fp64" not in msg
