"""Small deterministic stand-ins for the slow stages (sources, extraction, generation, verifier).

They are `Stage`s (pipeline/stage.py) over the stand-in functions below, with real records, the
real workspace, the real runner and the real stages' declared resources, so the flows' batching,
skipping, resuming, scheduling and Ray placement are exercised in seconds.
Selection, dataset building and publishing are the real ones. Knobs come from the environment
because these run in subprocesses too (the SIGKILL test, the served deployment):
KS_FAKE_VERIFY_SLEEP (seconds per candidate) and KS_FAKE_MODULES (modules ingested).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.plan import run_step
from pipeline.runner import LocalExecutor
from pipeline.stage import Stage, StageContext, StageOutput
from pipeline.stages import builtin_stages
from pipeline.stages.compile import compile_stage
from pipeline.stages.generate import generate_stage
from pipeline.stages.mutate import mutate_stage
from pipeline.stages.repair import repair_stage
from pipeline.stages.verify import verify_stage
from schemas import Candidate, RawModule, Rejection, Task, Verdict, content_hash

SOURCE = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x) * {scale}

def get_inputs():
    return [torch.randn(16, {dim})]

def get_init_inputs():
    return []
'''

def read_sources(cfg: Any, cache_dir: Path, *, manifest: Path | None = None
                 ) -> Iterator[RawModule]:
    """KS_FAKE_MODULES seed modules, whatever the sources config says."""
    for i in range(int(os.environ.get("KS_FAKE_MODULES", "6"))):
        code = SOURCE.format(scale=i + 1, dim=64 * (i + 1))
        mid = RawModule.make_id("seed", "builtin://seed", "0", f"m{i}.py", "Model", code)
        yield RawModule(mid, "seed", "builtin://seed", "0", f"m{i}.py", "MIT", "Model", code)


def _tasks_batch(batch: list[RawModule], ctx: StageContext) -> StageOutput:
    new = [Task(task_id=content_hash("task", m.code), name=f"relu_{m.path[:-3]}",
                source=m.code, cpu_source=m.code, module_id=m.module_id,
                source_kind=m.source_kind, op_inventory=["aten.relu", "aten.mul"],
                op_families=["activation"], level=2, dedup_cluster=m.module_id) for m in batch]
    return StageOutput(new, [], Counter())


TASKS = Stage("tasks", RawModule, Task, _tasks_batch, sequential=True)


def ingest(ws: Any, run: Any, cfg: Any) -> dict[str, int]:
    """Fill a workspace's raw_modules as the plan's ingest step does (the real local executor)."""
    return run_step(LocalExecutor(ws, cfg, "cpu", STAGES, run), "ingest")


def tasks(ws: Any, run: Any, cfg: Any) -> dict[str, int]:
    """Turn its pending raw_modules into tasks through the plan's tasks step."""
    return run_step(LocalExecutor(ws, cfg, "cpu", STAGES, run), "tasks")


def generate(task_list: list[Task], cfg: Any, backend: str) -> tuple[list, list]:
    cands, rejs = [], []
    if "template" not in cfg.generators:  # the stand-in is a template teacher only
        return cands, rejs
    for t in task_list:
        if t.name.endswith("m5"):  # one task no template covers
            rejs.append(Rejection.make("generate", t.task_id, t.name, "no_template", "fake"))
            continue
        for v in range(cfg.variants_per_task):
            code = f"# relu kernel for {t.task_id} variant {v}\nclass ModelNew: pass\n"
            cands.append(Candidate(Candidate.make_id(t.task_id, backend, code), t.task_id,
                                   backend, f"template:activation/v{v}", code))
    return cands, rejs

def _status(code: str) -> str:
    if "# bug" in code and "# fix" not in code:
        return "incorrect"
    h = int(content_hash(code)[:4], 16) % 4
    return ("correct_fast", "correct_slow", "incorrect", "compile_error")[h]

def _placement() -> str:
    """Where this call ran: the Ray resources it holds (or 'fake-cpu' outside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            res = ray.get_runtime_context().get_assigned_resources()
            return json.dumps({k: res[k] for k in sorted(res)})
    except ImportError:
        pass
    return "fake-cpu"


def verify(task_map: dict, candidates: list[Candidate], cfg: Any, cache_dir: Path,
           progress: Any = None) -> tuple[list, list]:
    pause = float(os.environ.get("KS_FAKE_VERIFY_SLEEP", "0"))
    device = _placement()
    if cfg.compile_only:
        log = os.environ.get("KS_FAKE_COMPILE_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"n": len(candidates), "device": device}) + "\n")
    out = []
    for c in candidates:
        time.sleep(pause)
        status = _status(c.code)
        ok = status.startswith("correct")
        speedup = (1.5 if status == "correct_fast" else 0.8) if ok else None
        out.append(Verdict(
            candidate_id=c.candidate_id, task_id=c.task_id, status=status,
            stage="done" if ok else ("compile" if status == "compile_error" else "correctness"),
            backend=c.backend, device=device, verifier_version="fake-1",
            trials=5 if ok else 0, runtime_us=10.0 if ok else None,
            eager_us=15.0 if ok else None, speedup=speedup, faster=status == "correct_fast",
            reward=1.0 + (speedup or 0) if ok else 0.1,
            feedback="" if ok else f"{status}: output mismatch at index 3"))
        if progress is not None:
            progress(out[-1])
    return out, []

def mutate(task_list: list, candidates: list[Candidate], verdicts: list, cfg: Any) -> list:
    ok = {v.candidate_id for v in verdicts if v.status.startswith("correct")}
    out = []
    for c in candidates:
        if c.candidate_id in ok and c.turn == 0 and not c.generator.startswith("mutate:"):
            code = c.code + "# bug: off by one\n"
            out.append(Candidate(Candidate.make_id(c.task_id, c.backend, code), c.task_id,
                                 c.backend, "mutate:off_by_one", code, parent_id=c.candidate_id,
                                 meta=json.dumps({"kind": "off_by_one", "fix": c.code})))
    return out

def repair(task_list: list, candidates: list[Candidate], verdicts: list, cfg: Any,
           turn: int) -> tuple[list, list]:
    vmap = {v.candidate_id: v for v in verdicts}
    parents = {c.parent_id for c in candidates if c.parent_id}
    out = []
    for c in candidates:
        v = vmap.get(c.candidate_id)
        if (v is None or v.status.startswith("correct") or c.turn != turn - 1
                or c.candidate_id in parents):
            continue
        code = c.code + f"# fix {turn}\n"
        out.append(replace(c, candidate_id=Candidate.make_id(c.task_id, c.backend, code),
                           code=code, generator=f"repair:{turn}", parent_id=c.candidate_id,
                           turn=turn, meta="{}"))
    return out, []

STAGES = replace(builtin_stages(), read_sources=read_sources, tasks=TASKS,
                 generate=generate_stage(generate), verify=verify_stage(verify),
                 compile=compile_stage(verify), mutate=mutate_stage(mutate),
                 repair=repair_stage(repair), resolve_backend=lambda requested: "cpu")

# The same, but verification "needs a GPU" so the flows place it with num_gpus on Ray.
GPU_STAGES = replace(STAGES, resolve_backend=lambda requested: "cuda")
