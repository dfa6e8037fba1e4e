"""Host side of the task probe: jobs run on the verifier's fork server (`verifier.run.forkserver`).

The server imports torch once (plus `pipeline.tasks.probe.warmup`) and forks one sandboxed child
per job, exactly the verifier's sandbox: own session, pids cgroup, rlimits entered in the child
(no `preexec_fn`), namespaces, private /tmp, scrubbed environment. The child runs
`pipeline.tasks.probe.probe` on the job's `job.json`; a job costs a fork, not an interpreter start, and
a hang, crash or hostile module costs only its child. The server's deadline for a job is its
budget's cap (see `pipeline.tasks.probe.budget`) plus a margin; the child's own timer reports
the budget's figures sooner.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from verifier.isolation.sandbox import (
    EnvironmentFailure,
    SandboxLimits,
    SandboxResult,
    common_failure,
)
from verifier.run.forkserver import ForkServer, ForkServerError

PROBE_ENTRY = "pipeline.tasks.probe.probe"
PRELOAD = ("pipeline.tasks.probe.warmup",)
_MARGIN_S = 10.0  # past the budget's cap: the child's timer answers first


def _failure(res: SandboxResult) -> dict:
    if res.timed_out:
        return {"ok": False, "valid": False, "reason": "timeout",
                "detail": f"analysis took longer than {res.wall_s:.0f}s"}
    why = res.describe_failure()
    memory = res.signal_name in ("SIGKILL", "SIGSEGV") or "MemoryError" in res.stderr
    return {"ok": False, "valid": False, "reason": "memory" if memory else "crash",
            "detail": why}


class ProbePool:
    """Probe jobs on one fork server, at most `workers` at a time; `map(jobs)` keeps job order."""

    def __init__(self, workers: int = 2, memory_mb: int = 6144):
        self.workers = max(1, workers)
        self.memory_mb = memory_mb
        self._server = ForkServer(preload=PRELOAD)
        self._slots = threading.Semaphore(self.workers)

    def analyze(self, job: dict) -> dict:
        """Run one job; every failure (timeout, crash, no server) is a result with a reason."""
        job = {**job, "budget_s": job.get("budget_s", job.get("timeout_s", 20.0))}
        deadline = float(job.get("max_budget_s", job["budget_s"])) + _MARGIN_S
        limits = SandboxLimits(timeout_s=deadline, memory_mb=self.memory_mb)
        start = time.monotonic()
        with self._slots:
            try:
                res = self._server.run_module(PROBE_ENTRY, limits=limits,
                                              input_files={"job.json": json.dumps(job)})
            except ForkServerError as exc:
                return {"ok": False, "valid": False, "reason": "probe_unavailable",
                        "detail": str(exc), "wall_s": time.monotonic() - start}
        out = res.payload if res.payload is not None else _failure(res)
        out.setdefault("wall_s", time.monotonic() - start)
        return out

    def map(self, jobs: Iterable[dict], on_result: Callable[[int, dict], None] | None = None
            ) -> list[dict]:
        jobs = list(jobs)
        results: list[dict] = [{}] * len(jobs)

        def one(i: int) -> None:
            results[i] = self.analyze(jobs[i])
            if on_result:
                on_result(i, results[i])

        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            list(pool.map(one, range(len(jobs))))
        # a sandbox that cannot start the probe fails every job alike: stop, do not reject all
        same = common_failure([r.get("detail", "") if r.get("reason") in (
            "crash", "probe_unavailable") else "" for r in results])
        if same:
            raise EnvironmentFailure(f"every one of {len(results)} task probes failed the same "
                                     f"way, so the environment is broken, not the tasks: {same}")
        return results

    def close(self) -> None:
        self._server.close()

    def __enter__(self) -> ProbePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
