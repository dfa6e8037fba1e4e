"""The Stage shape, the plan's pending rules and the local runner: batches written as parts,
resume by key."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pyarrow.parquet as pq

from pipeline.config import Config, FlowsConfig, VerifyConfig
from pipeline.datasets.stats import backend_funnel
from pipeline.plan import batches, repair_pending, unverified, unverified_chain_ends
from pipeline.runner import LocalExecutor, run_stream, write_new
from pipeline.stage import Resources, Stage, StageContext, StageOutput, reject
from pipeline.stages import builtin_stages
from pipeline.stages.compile import compile_stage
from pipeline.stages.generate import GENERATE
from pipeline.stages.ingest import INGEST
from pipeline.stages.mutate import MUTATE
from pipeline.stages.repair import REPAIR
from pipeline.stages.tasks import TASKS
from pipeline.stages.verify import VERIFY, missing_task
from pipeline.workspace import Workspace
from schemas import Candidate, RawModule, Rejection, Task, Verdict


def _task(i: int) -> Task:
    return Task(task_id=f"t{i}", name=f"t{i}", source=f"# {i}", cpu_source=f"# {i}")


def _echo_stage() -> Stage:
    """Even tasks become a candidate, odd ones a rejection."""

    def run(batch: list[Task], ctx: StageContext) -> StageOutput:
        out = StageOutput()
        for t in batch:
            if int(t.task_id[1:]) % 2:
                reject(out, "echo", t.task_id, t.name, "odd", f"{t.task_id} is odd")
            else:
                code = f"class ModelNew: pass  # {t.task_id}"
                out.records.append(Candidate(Candidate.make_id(t.task_id, ctx.backend, code),
                                             t.task_id, ctx.backend, "template:x/y", code))
        out.counts["seen"] += len(batch)
        return out

    return Stage("echo", Task, Candidate, run)


def test_resources_map_to_ray_options() -> None:
    assert Resources(cpus=2).ray_options() == {"num_cpus": 2}
    opts = Resources(cpus=1, gpus=1, memory_gb=0.5).ray_options()
    assert opts == {"num_cpus": 1, "num_gpus": 1, "memory": 1 << 29}


def test_reject_builds_the_row_and_counts_it() -> None:
    out = StageOutput()
    row = reject(out, "verify", "c1", "task t1", "missing_task", "gone")
    assert out.rejections == [row] and isinstance(row, Rejection)
    assert row.rejection_id == Rejection.make("verify", "c1", "task t1", "missing_task").rejection_id
    assert out.counts == Counter({"rejected:missing_task": 1})


def test_stages_declare_what_a_batch_needs() -> None:
    cfg = Config(verify=VerifyConfig(workers=3, compile_workers=5),
                 flows=FlowsConfig(ray_num_cpus=4))
    assert VERIFY.resources(cfg, "cuda") == Resources(cpus=1, gpus=1, subprocesses=True)
    assert VERIFY.resources(cfg, "cpu") == Resources(cpus=3, subprocesses=True)
    # capped by the cluster
    assert compile_stage().resources(cfg, "cuda") == Resources(cpus=4, subprocesses=True)
    assert VERIFY.batch_size(cfg) == cfg.verify.write_batch
    assert {GENERATE.name, MUTATE.name, REPAIR.name} == {"generate", "mutate", "repair"}
    assert GENERATE.input is Task and GENERATE.output is Candidate
    assert VERIFY.input is Candidate and VERIFY.output is Verdict
    assert INGEST.output is RawModule and INGEST.resources(cfg) == Resources(cpus=1, io=True)
    tasks_cfg = Config(tasks={"workers": 2, "probe_memory_mb": 1536})
    assert TASKS.resources(tasks_cfg) == Resources(cpus=2, memory_gb=3.0, subprocesses=True)
    # batches that depend on earlier ones are never mapped; the rest are
    assert INGEST.sequential and TASKS.sequential
    assert not any(s.sequential for s in (GENERATE, MUTATE, REPAIR, VERIFY))


def test_stage_output_unpacks_as_records_rejections_counts() -> None:
    out = StageOutput([_task(0)])
    reject(out, "generate", "t1", "t1", "no_template")
    records, rejections, counts = out
    assert records == [_task(0)] and [r.reason for r in rejections] == ["no_template"]
    assert counts == Counter({"rejected:no_template": 1})


def test_local_executor_writes_one_part_per_batch_and_counts(tmp_path) -> None:
    ws = Workspace(tmp_path / "ws")
    tasks = [_task(i) for i in range(5)]
    stages = replace(builtin_stages(), generate=_echo_stage())
    ex = LocalExecutor(ws, Config(), "cpu", stages, ws.new_run("r1"))
    groups = batches(tasks, 2)
    counts = ex.map("echo", "generate", groups, [StageContext(Config())] * len(groups))
    assert counts == Counter({"seen": 5, "rejected:odd": 2, "candidates": 3, "rejections": 2})
    parts = ws.part_paths("candidates") + ws.part_paths("rejections")
    assert len(ws.part_paths("candidates")) == 3 and len(ws.part_paths("rejections")) == 2
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in parts) == 5
    assert {r.item_id for r in ws.read(Rejection)} == {"t1", "t3"}
    assert batches(tasks, 2)[-1] == [tasks[4]]
    # the same batches again write nothing: every key is already in the workspace
    again = LocalExecutor(ws, Config(), "cpu", stages, ws.new_run("r2"))
    assert again.map("echo", "generate", groups, [StageContext(Config())] * len(groups)) == \
        Counter({"seen": 5, "rejected:odd": 2, "candidates": 0, "rejections": 0})
    assert ex.rows == [{"stage": "echo", "seconds": ex.rows[0]["seconds"], "items": 5, **counts}]


def _module(i: int) -> RawModule:
    code = f"class Model: pass  # {i}"
    return RawModule(RawModule.make_id("seed", "r", "c", f"m{i}.py", "Model", code), "seed", "r",
                     "c", f"m{i}.py", "MIT", "Model", code)


def test_run_stream_resumes_a_source_stream_by_key(tmp_path) -> None:
    ws = Workspace(tmp_path / "ws")
    bad = Rejection.make("ingest", "x.py", "x.py", "syntax", "x.py: invalid syntax")
    stream = [_module(0), bad, _module(1), _module(2), _module(0)]  # m0 twice in one stream
    ctx = StageContext(Config())
    counts = run_stream(INGEST, iter(stream), ctx, ws.new_run("r1"), size=2,
                        done=ws.done_keys(RawModule), done_rejections=ws.done_keys(Rejection))
    assert (counts["written"], counts["existing"], counts["rejections"]) == (3, 1, 1)
    assert counts["kind:seed"] == 4 and counts["rejected:syntax"] == 1
    assert len(ws.part_paths("raw_modules")) == 2  # batches [m0, bad] [m1, m2] [m0]
    again = run_stream(INGEST, iter(stream), ctx, ws.new_run("r2"), size=2,
                       done=ws.done_keys(RawModule), done_rejections=ws.done_keys(Rejection))
    assert (again["written"], again["existing"], again["rejections"]) == (0, 4, 0)
    assert sorted(m.path for m in ws.read(RawModule)) == ["m0.py", "m1.py", "m2.py"]


def test_write_new_skips_keys_already_written(tmp_path) -> None:
    ws = Workspace(tmp_path / "ws")
    run = ws.new_run("r1")
    a = Candidate("a", "t0", "cpu", "template:x/y", "code a")
    b = Candidate("b", "t0", "cpu", "template:x/y", "code b")
    done = {"a"}
    assert write_new(run, [a, b, b], done, "candidate_id") == [b]
    assert done == {"a", "b"} and [c.candidate_id for c in ws.read(Candidate)] == ["b"]
    assert write_new(run, [a, b], done, "candidate_id") == []


def test_pending_verification_and_repair(tmp_path) -> None:
    ws = Workspace(tmp_path / "ws")
    run = ws.new_run("r1")
    t0 = _task(0)
    first = Candidate("c0", "t0", "cpu", "template:x/y", "code")
    mutant = Candidate("m0", "t0", "cpu", "mutate:off_by_one", "bug", parent_id="c0")
    orphan = Candidate("o0", "gone", "cpu", "template:x/y", "code")
    run.write([t0])
    run.write([first, mutant, orphan])
    run.write([Verdict("c0", "t0", "incorrect", "correctness", "cpu")])
    assert [c.candidate_id for c in unverified(ws)] == ["m0", "o0"]
    assert unverified(ws, "cuda") == []
    assert missing_task(orphan).reason == "missing_task"
    tasks = {"t0": t0}
    verdicts = ws.read(Verdict)
    # turn 1: the unjudged mutant (turn 0) is verified before the turn is planned
    ends = unverified_chain_ends(ws.read(Candidate), verdicts, tasks, 1)
    assert [c.candidate_id for c in ends] == ["m0"]
    by_task = {"t0": [first, mutant]}
    # c0 already has a follow-up (the mutant); m0, the only other end, has no verdict yet
    assert repair_pending(by_task, verdicts, 1) == {}
    verdicts.append(Verdict("m0", "t0", "incorrect", "correctness", "cpu"))
    todo = repair_pending(by_task, verdicts, 1)
    assert list(todo) == ["t0"]


def test_backend_funnel_counts_one_backend() -> None:
    tasks = [_task(0), _task(1)]
    cands = [Candidate("a", "t0", "cpu", "template:x/y", "a"),
             Candidate("b", "t1", "cpu", "template:x/y", "b"),
             Candidate("r", "t1", "cpu", "repair:1", "r", parent_id="b", turn=1),
             Candidate("g", "t1", "cuda", "template:x/y", "g")]
    verdicts = [Verdict("a", "t0", "correct_fast", "done", "cpu", speedup=2.0),
                Verdict("b", "t1", "compile_error", "compile", "cpu"),
                Verdict("r", "t1", "correct_slow", "done", "cpu", speedup=0.5)]
    f = backend_funnel(7, tasks, cands, verdicts, "cpu")
    assert (f["sourced_modules"], f["tasks"], f["candidates"], f["verified"]) == (7, 2, 3, 3)
    assert (f["compiled"], f["correct"], f["faster"], f["tasks_solved"]) == (2, 2, 1, 2)
    assert f["first_attempt_pass_rate"] == 0.5 and f["repair_pass_rate"] == 1.0
    assert f["median_speedup"] == 1.25 and f["max_speedup"] == 2.0
    assert backend_funnel(7, tasks, cands, verdicts, "cuda")["verified"] == 0
