"""Compile scheduling: build units sized from a cost estimate, run longest first on a dynamic pool.

A unit (one translation unit per kind, `verifier.compile.builder`) costs about `unit_s` (torch's headers
parsed, the object linked) plus `spec_s` per spec in it, and a unit holding a failing spec is
built again without it, so its expected cost is `(unit_s + n * spec_s) * (2 - (1 - fail_p)**n)`.
`plan_units` groups specs that may share a unit (same flags and headers), then splits the group
whose split lowers the estimated makespan most on `workers` (longest-processing-time order),
until no split helps: few large units when headers dominate, more and smaller ones when
kernels do, never more than `most` specs a unit. Compilers running side by side slow each other
(memory bandwidth, SMT siblings): concurrent units progress like at most `parallel_eff * cores`
of them, so the estimate is never under the total cost spread over that many (or the workers,
when fewer), and a small batch is not cut into one unit per spec when the units would only
contend for the cores.
`CompilePool` runs units longest first on `workers` threads, the first `lead_units` of them at
the PCH's priority (their candidates land while the rest compile, so the GPU starts sooner);
the rebuilds a failed unit asks for (the rest without the blamed specs, each blamed spec alone,
or two halves: `Builder.build_unit`) go to the front of the same queue, so they run on
whichever worker is free instead of after the rest of that worker's share.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from verifier.backends import PCH_NICE, compile_priority
from verifier.checks.extspec import ExtensionSpec
from verifier.compile.builder import Builder, BuildResult, flags_key
from verifier.compile.landing import Landing


@dataclass
class CostModel:
    """Seconds a build unit takes, for planning only (the ratios matter, not the scale).
    Defaults: a unit ~30 s (nvcc on torch's headers, the host unit on the PCH, the link) and
    ~1 s a kernel (H100 node, benchmarks/results/gpu_diag.txt; a loaded 2-core node measured
    157 s for one spec, 185 s for four); 8% failing as in benchmarks/kernel_corpus.py.
    `parallel_eff`: the same H100 node (16 CPUs) built 16 one-spec units side by side in 89 s
    and 9 in 53 s where one alone took 40 s: either way about 7 units' progress (0.45 x 16)."""

    unit_s: float = 30.0
    spec_s: float = 1.0
    fail_p: float = 0.08  # share of candidates that fail to compile (their unit is rebuilt)
    parallel_eff: float = 0.45  # concurrent units progress like parallel_eff * cores at most
    cores: int = 0  # CPUs the compilers share (0: this process's CPU affinity)

    def parallel(self, workers: int) -> float:
        """How many units' progress `workers` concurrent units make on these cores."""
        cores = self.cores or len(os.sched_getaffinity(0))
        return max(1.0, min(float(max(1, workers)), self.parallel_eff * cores))

    def unit(self, n: int) -> float:
        return (self.unit_s + self.spec_s * n) * (2.0 - (1.0 - self.fail_p) ** n)


def _split(group: list, k: int) -> list[list]:
    return [group[i * len(group) // k:(i + 1) * len(group) // k] for i in range(k)]


def loads(costs: list[float], workers: int) -> tuple[float, ...]:
    """Each worker's busy seconds, highest first, with `costs` scheduled longest first (LPT)."""
    busy = [0.0] * max(1, workers)
    for c in sorted(costs, reverse=True):
        heapq.heapreplace(busy, busy[0] + c)
    return tuple(sorted(busy, reverse=True))


def contended(costs: list[float], workers: int, cost: CostModel) -> tuple[float, ...]:
    """The estimated finish time (LPT makespan, never under the total cost over the workers'
    effective parallelism), then each worker's busy seconds highest first."""
    busy = loads(costs, workers)
    floor = sum(costs) / cost.parallel(workers)
    return (max(busy[0], floor), *busy)


def makespan(costs: list[float], workers: int) -> float:
    """Finish time of `costs` scheduled longest first on `workers`."""
    return loads(costs, workers)[0]


def plan_units(specs: list[ExtensionSpec], workers: int, most: int,
               cost: CostModel | None = None) -> list[list[ExtensionSpec]]:
    """Build units for `specs`, longest (estimated) first; see the module docstring."""
    cost = cost or CostModel()
    most = max(1, most)
    groups: dict[tuple, list[ExtensionSpec]] = {}
    for s in specs:  # a spec that is not batchable is a unit of its own (its own module)
        key = (True, flags_key(s)) if s.batchable else (False, s.key)
        groups.setdefault(key, []).append(s)
    glist = list(groups.values())
    parts = [-(-len(g) // most) for g in glist]

    def costs(ks: list[int]) -> list[float]:
        return [cost.unit(len(u)) for g, k in zip(glist, ks, strict=True) for u in _split(g, k)]

    # Greedy splits, judged two ways (the better end wins, both are local searches): by the
    # contended makespan alone, and by it then the loads highest first (a split that keeps the
    # makespan but unloads the next busiest worker is taken). Splitting a group by one more
    # unit can make things worse (a worker gets two units) where a round more helps: steps up
    # to a worker count are tried.
    w = max(1, workers)
    steps = sorted({*range(1, min(w, 16) + 1), w // 2, w, 2 * w} - {0})
    ends = []
    for judge in (lambda ld: ld[:1], lambda ld: ld):
        ks, best = list(parts), judge(contended(costs(parts), workers, cost))
        while True:
            tries = [(judge(contended(costs(t), workers, cost)), step, t)
                     for i, g in enumerate(glist)
                     for step in steps if ks[i] + step <= len(g)
                     for t in [ks[:i] + [ks[i] + step] + ks[i + 1:]]]
            if not tries or min(tries)[0] >= best:
                break
            best, _, ks = min(tries)
        ends.append((contended(costs(ks), workers, cost), ks))
    parts = min(ends)[1]
    units = [u for g, k in zip(glist, parts, strict=True) for u in _split(g, k)]
    return sorted(units, key=lambda u: -cost.unit(len(u)))


@dataclass
class UnitRecord:
    """One unit build: when (time.monotonic), on which worker, what came of it."""

    n: int
    start: float
    end: float
    worker: str
    ok: bool
    rebuild: bool  # a rebuild asked for by a failed unit (not in the plan)
    followups: int = 0


@dataclass
class CompilePool:
    """Runs units on `workers` threads, longest first, rebuilds first (see module docstring)."""

    builder: Builder
    workers: int
    on_ready: Callable[[dict[str, BuildResult]], None] | None = None
    cost: CostModel = field(default_factory=CostModel)
    records: list[UnitRecord] = field(default_factory=list)
    # the first units taken run their compilers at the PCH's priority, ahead of the others:
    # the GPU idles until candidates land (an H100 node: nothing ran before 79 s, with every
    # unit of the first wave ending together), and this lands the first ones sooner for the
    # same compiler time
    lead_units: int = 2

    def run(self, units: list[list[ExtensionSpec]]) -> list[UnitRecord]:
        self.heap: list[tuple[int, float, int, list[ExtensionSpec], float]] = []
        self.seq, self.busy, self.taken = 0, 0, 0
        self.cond = threading.Condition()
        for u in units:
            self._push(u, 0.0, rebuild=False)
        threads = [threading.Thread(target=self._loop, name=f"compile_{i}", daemon=True)
                   for i in range(max(1, self.workers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return self.records

    def _push(self, unit: list[ExtensionSpec], carried: float, rebuild: bool) -> None:
        self.seq += 1  # rebuilds first (their specs already waited one build), then longest
        heapq.heappush(self.heap, (0 if rebuild else 1, -self.cost.unit(len(unit)), self.seq,
                                   unit, carried))

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.heap and self.busy:
                    self.cond.wait()
                if not self.heap:
                    self.cond.notify_all()
                    return
                first, _, _, unit, carried = heapq.heappop(self.heap)
                self.busy += 1
                lead = self.taken < self.lead_units
                self.taken += 1
            start, more = time.monotonic(), []
            results = Landing(self.builder._store, self.on_ready)
            try:
                with compile_priority(PCH_NICE) if lead else contextlib.nullcontext():
                    more = self.builder.build_unit(unit, results, carried)
            except Exception as exc:  # keep the batch going; these specs fail with the reason
                failed = {s.key: BuildResult(s.key, False, log=f"build error: {exc}")
                          for s in unit if s.key not in results}  # not stored: tried again
                dict.update(results, failed)
                if self.on_ready is not None and failed:
                    self.on_ready(failed)
            finally:  # the other workers wait for this one's rebuilds until it is done
                with self.cond:
                    for u, c in more:
                        self._push(u, c, rebuild=True)
                    ok = all(s.key in results and results[s.key].ok for s in unit)
                    self.records.append(UnitRecord(len(unit), start, time.monotonic(),
                                                   threading.current_thread().name, ok,
                                                   first == 0, len(more)))
                    self.busy -= 1
                    self.cond.notify_all()


def compile_all(builder: Builder, specs: list[ExtensionSpec], workers: int, most: int,
                on_ready: Callable[[dict[str, BuildResult]], None] | None = None,
                cost: CostModel | None = None,
                pch_span: Callable[[float, float], None] | None = None
                ) -> tuple[list[list[ExtensionSpec]], list[UnitRecord]]:
    """Build every spec (cached, unsupported and impossible ones land at once); the planned
    units and the record of every unit built. The PCH builds beside the first units (they
    compile their device code first, then wait for it)."""
    try:
        todo = builder.triage(specs, Landing(builder._store, on_ready))
    except Exception as exc:  # keep the batch going; these specs fail with the reason
        if on_ready is not None:
            on_ready({s.key: BuildResult(s.key, False, log=f"build error: {exc}") for s in specs})
        return [], []
    cost = cost or CostModel()
    units = plan_units(todo, workers, most, cost)
    if not units:
        return units, []

    def pch() -> None:
        t = time.monotonic()
        builder.prepare_pch(todo)
        if pch_span is not None:
            pch_span(t, time.monotonic())

    pch_thread = threading.Thread(target=pch, daemon=True)
    pch_thread.start()
    records = CompilePool(builder, workers, on_ready, cost).run(units)
    pch_thread.join()
    return units, records
