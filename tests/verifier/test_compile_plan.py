"""Compile scheduling (verifier.compile.compile_plan): units sized from the cost model, longest first on
a dynamic pool, and a failed unit's rebuilds run on any free worker with the same per-candidate
outcomes as building each candidate alone (cpu backend: g++ with torch's headers)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from verifier.backends import get_backend
from verifier.checks.extspec import ExtensionSpec
from verifier.compile.builder import BuildContext, Builder, BuildResult
from verifier.compile.compile_plan import (
    CompilePool,
    CostModel,
    compile_all,
    contended,
    makespan,
    plan_units,
)

SHARED = Path.home() / ".cache" / "kernelsynth-tests" / "compile-plan"


def spec(body: str, fn: str = "f", cflags: list[str] | None = None) -> ExtensionSpec:
    return ExtensionSpec(name="ext", cpp_sources=[body], functions=[fn],
                         extra_cflags=cflags or [])


def good(i: int) -> ExtensionSpec:
    return spec(f"torch::Tensor f(torch::Tensor x) {{ return x * {i + 2}; }}")


BAD = spec("torch::Tensor f(torch::Tensor x) { return x * undeclared_name; }")


def test_makespan_is_longest_first_on_the_workers() -> None:
    assert makespan([5, 3, 3, 2], 2) == 7  # 5+2 | 3+3
    assert makespan([4, 4, 4], 1) == 12
    assert makespan([], 3) == 0


def free(**kw: float) -> CostModel:
    """A cost model whose concurrent units do not slow each other (4 workers, 64 cores)."""
    return CostModel(**kw, parallel_eff=1.0, cores=64)


def test_units_follow_the_cost_model_not_a_fixed_count() -> None:
    specs = [good(i) for i in range(64)]
    heavy = plan_units(specs, 4, 64, free(unit_s=100, spec_s=0.1, fail_p=0.1))
    light = plan_units(specs, 4, 64, free(unit_s=1, spec_s=5, fail_p=0.1))
    assert len(heavy) == 4  # headers dominate: one unit per worker
    # kernels dominate: small units, so a failing spec's rebuild repeats little work
    assert len(light) >= 16 and max(map(len, light)) <= 4
    for plan in (heavy, light):
        assert sorted(s.key for u in plan for s in u) == sorted(s.key for s in specs)
    # no failures, linear cost: more units than workers only add headers
    assert len(plan_units(specs, 4, 64, free(unit_s=1, spec_s=5, fail_p=0))) == 4
    assert len(plan_units(specs, 4, 8)) >= 8  # never over `most`
    assert len(plan_units(specs[:3], 8, 16, free())) == 3  # idle workers anyway: one each


def test_contending_units_are_fewer_and_larger() -> None:
    """Units that share the cores slow each other (CostModel.parallel_eff): a batch no larger
    than the workers is not cut into one unit a spec, and a large batch gets fewer units; with
    cores to spare (fewer workers than parallel_eff * cores) nothing changes."""
    specs = [good(i) for i in range(149)]
    for n, workers in ((12, 16), (149, 16), (149, 32)):
        apart = plan_units(specs[:n], workers, 16, free())
        shared = plan_units(specs[:n], workers, 16, CostModel(cores=workers))
        assert len(shared) < len(apart), (n, workers)
        assert sorted(s.key for u in shared for s in u) == sorted(s.key for s in specs[:n])
        cost = CostModel(cores=workers)
        assert max(contended([cost.unit(len(u)) for u in shared], workers, cost)) < max(
            contended([cost.unit(len(u)) for u in apart], workers, cost))
    assert [len(u) for u in plan_units(specs[:12], 16, 16, free())] == [1] * 12
    assert max(map(len, plan_units(specs[:12], 16, 16, CostModel(cores=16)))) >= 2
    wide = CostModel(cores=64)  # 4 workers on 64 cores: 0.45 * 64 > 4, no contention
    assert [len(u) for u in plan_units(specs[:4], 4, 16, wide)] == [1] * 4


def test_units_never_mix_flags_and_come_longest_first() -> None:
    a = [good(i) for i in range(10)]
    b = [spec(f"torch::Tensor f(torch::Tensor x) {{ return x + {i}; }}", cflags=["-O3"])
         for i in range(3)]
    module = ExtensionSpec(name="m", cpp_sources=["PYBIND11_MODULE(m, m) {}"], functions=None)
    units = plan_units([*b, *a, module], 16, 16)
    for u in units:
        assert len({tuple(s.extra_cflags) for s in u}) == 1
        assert all(s.batchable for s in u) or len(u) == 1
    sizes = [len(u) for u in units]
    assert sizes == sorted(sizes, reverse=True)


class _FakeBuilder(Builder):
    """Compiles nothing: a unit takes a little time and fails when it holds a spec of `bad`,
    blamed by key (as a #line-mapped compiler error is) unless `unmapped`."""

    def __init__(self, tmp: Path, bad: set[str], unmapped: bool = False) -> None:
        super().__init__(BuildContext(get_backend("cpu"), tmp, check_import=False,
                                      use_pch=False))
        self.bad, self.unmapped = bad, unmapped

    def _build_batch(self, specs):
        time.sleep(0.05 + 0.005 * len(specs))
        hit = [s.key for s in specs if s.key in self.bad]
        log = "\n".join("host.cpp:2: fatal error: x.h: No such file" if self.unmapped else
                        f"{k}/candidate.py:1:1: error: bad" for k in hit)
        return not hit, log, Path("/nonexistent.so"), "m", 0.01

    def _store(self, res: BuildResult) -> None:  # no objects to hash
        pass


def _pool(b: Builder, workers: int, units: list) -> tuple[dict[str, BuildResult], list]:
    landed: dict[str, BuildResult] = {}
    records = CompilePool(b, workers, landed.update).run(units)
    return landed, records


def test_rebuilds_run_on_free_workers_not_after_the_failed_units_share(tmp_path: Path) -> None:
    specs = [good(i) for i in range(12)]
    bad = {specs[0].key, specs[1].key}  # two blamed in the first unit: rest + each alone
    landed, records = _pool(_FakeBuilder(tmp_path, bad), 3, [specs[:4], specs[4:8], specs[8:]])
    assert {k for k, r in landed.items() if not r.ok} == bad
    assert sorted(landed) == sorted(s.key for s in specs)
    rebuilds = [r for r in records if r.rebuild]
    assert sorted(r.n for r in rebuilds) == [1, 1, 2]  # the rest, then the blamed alone
    # the three rebuilds ran side by side on the three workers, not one after another
    assert len({r.worker for r in rebuilds}) == 3
    assert max(r.start for r in rebuilds) < min(r.end for r in rebuilds)


def test_unmapped_errors_bisect_in_parallel_to_the_bad_spec(tmp_path: Path) -> None:
    specs = [good(i) for i in range(8)]
    landed, records = _pool(_FakeBuilder(tmp_path, {specs[5].key}, unmapped=True), 4, [specs])
    assert {k for k, r in landed.items() if not r.ok} == {specs[5].key}
    assert sorted(landed) == sorted(s.key for s in specs)
    # 8 -> 4 + 4 -> (4 ok) 2 + 2 -> (2 ok) 1 + 1: seven units, halves built side by side
    assert [r.n for r in records][0] == 8 and len(records) == 7
    halves = [r for r in records if r.n == 4]
    assert halves[0].start < halves[1].end and halves[1].start < halves[0].end
    assert landed[specs[5].key].seconds > 0  # failed attempts charged to the bad spec


def test_compile_all_plans_the_uncached_specs(tmp_path: Path) -> None:
    b = _FakeBuilder(tmp_path, set())
    specs = [good(i) for i in range(4)]
    landed: dict[str, BuildResult] = {}
    gone = BuildResult(specs[3].key, False, log="cached failure")
    b.cached = lambda s: gone if s.key == specs[3].key else None  # type: ignore[method-assign]
    units, records = compile_all(b, specs + specs[:1], 2, 16, landed.update, CostModel())
    assert sorted(s.key for u in units for s in u) == sorted(s.key for s in specs[:3])
    assert sum(r.n for r in records) == 3 and not any(r.rebuild for r in records)
    assert landed[specs[3].key] is gone and all(landed[s.key].ok for s in specs[:3])


def test_a_unit_that_raises_fails_its_specs_and_the_pool_ends(tmp_path: Path) -> None:
    specs = [good(i) for i in range(5)]
    stored: list[str] = []

    class Broken(_FakeBuilder):
        def _build_batch(self, unit):
            if unit == specs[:2]:
                raise OSError("disk full")
            return super()._build_batch(unit)

        def _store(self, res: BuildResult) -> None:
            stored.append(res.key)

    landed, records = _pool(Broken(tmp_path, {specs[2].key}), 2, [specs[2:], specs[:2]])
    assert "build error: disk full" in landed[specs[0].key].log and not landed[specs[1].key].ok
    assert not landed[specs[2].key].ok and all(landed[s.key].ok for s in specs[3:])
    assert sorted(stored) == sorted(s.key for s in specs[2:])  # a build error is not cached
    # the 3-spec unit, its 2-spec rest, the blamed spec alone (only its own build fails it),
    # the unit that raised
    assert len(records) == 4


@pytest.mark.slow
def test_a_failing_candidate_fails_alone_with_its_own_error(tmp_path: Path) -> None:
    """Real builds (cpu backend, g++): a batch with one compile error gives every candidate
    the outcome, and the failing one the first error line, it has when built alone."""
    shared = BuildContext(get_backend("cpu"), SHARED, check_import=False)
    Builder(shared).prepare_pch([good(100 + i) for i in range(3)])  # cached across runs

    def ctx(name: str) -> BuildContext:
        c = BuildContext(get_backend("cpu"), tmp_path / name, check_import=False)
        c.root.mkdir(parents=True)
        shutil.copytree(shared.root / "pch", c.root / "pch")  # (the compiler sees only tmp)
        return c

    goods = [good(i) for i in range(3)]
    batch = [goods[0], BAD, goods[1], goods[2]]
    landed: dict[str, BuildResult] = {}
    units, records = compile_all(Builder(ctx("batched")), batch, 1, 16, landed.update,
                                 CostModel(unit_s=30, spec_s=1, fail_p=0))  # one unit
    assert [len(u) for u in units] == [4]
    assert sorted(landed) == sorted(s.key for s in batch)
    assert all(landed[s.key].ok for s in goods) and not landed[BAD.key].ok
    # the rest, then the blamed candidate alone: a batch-mate's log never fails it
    assert sorted(r.n for r in records) == [1, 3, 4] and records[1].rebuild
    alone = ctx("alone")
    for s in batch:
        res = Builder(alone).build([s])[s.key]
        assert res.ok == landed[s.key].ok, s.cpp_sources
        errs = [[ln for ln in r.log.splitlines() if "error" in ln][:1] for r in (res, landed[s.key])]
        assert errs[0] == errs[1]
    assert "undeclared_name" in landed[BAD.key].log


def test_the_first_units_compile_ahead_of_the_rest(tmp_path: Path, monkeypatch) -> None:
    """The GPU waits for the first candidates to land: the first `lead_units` units taken run
    their compilers at the PCH's niceness, the others at the compilers' own."""
    import subprocess

    import verifier.backends as backends

    levels: list[tuple[int, str]] = []

    def record(argv: list[str], **kwargs):
        levels.append((len(argv), argv[argv.index("-n") + 1] if "-n" in argv else "0"))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(backends.subprocess, "run", record)

    class Niced(_FakeBuilder):
        def _build_batch(self, specs):
            assert backends.run_tool(["true", str(len(specs))], [], 10)
            return super()._build_batch(specs)

    specs = [good(i) for i in range(10)]
    units = [specs[:4], specs[4:7], specs[7:9], specs[9:]]  # taken in this order by one worker
    landed, records = _pool(Niced(tmp_path, set()), 1, units)
    assert all(r.ok for r in landed.values()) and [r.n for r in records] == [4, 3, 2, 1]
    lead, rest = str(backends.PCH_NICE), str(backends.COMPILE_NICE)
    assert [lvl for _, lvl in levels] == [lead, lead, rest, rest]
    assert backends.run_tool(["true"], [], 10) and levels[-1][1] == rest  # outside a pool
