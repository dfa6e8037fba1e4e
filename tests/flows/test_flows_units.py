"""Flow building blocks without a Prefect server: runners, retries, batching, pending sets."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import flows_fake_stages as fake
import pytest
import yaml
from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner
from prefect_ray import RayTaskRunner

from flows.env import configure_prefect, prefect_environment
from flows.prefect_tasks import retrying_stage_batch, stage_batch
from flows.runners import (
    cpu_runner,
    is_transient,
    ray_options,
    retry_if_transient,
    runner_for,
    verify_runner,
)
from pipeline.candidates.generate import GenerateError
from pipeline.config import Config, FlowsConfig, GenerateConfig
from pipeline.datasets.published import latest_version
from pipeline.plan import batches, generate_pending, tasks_pending_generation
from pipeline.stage import StageContext
from pipeline.stages import StageSetError, builtin_stages, load_stages
from pipeline.stages.generate import generate_stage
from schemas import Candidate, Rejection, Task

REPO = Path(__file__).resolve().parents[2]


def _cfg(**flows: object) -> Config:
    return Config(flows=FlowsConfig(**flows))


def test_batches_cover_every_item_once() -> None:
    items = list(range(10))
    got = batches(items, 4)
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batches([], 3) == []
    assert batches(items, 0) == [[i] for i in items]


def test_runners_follow_the_config() -> None:
    assert isinstance(cpu_runner(_cfg()), ThreadPoolTaskRunner)
    assert isinstance(cpu_runner(_cfg(cpu_pool="process", cpu_workers=3)), ProcessPoolTaskRunner)
    local = verify_runner(_cfg(verify_in_flight=2))
    assert isinstance(local, ThreadPoolTaskRunner) and local._max_workers == 2
    ray = verify_runner(_cfg(runner="ray", ray_address="ray://head:10001"))
    assert isinstance(ray, RayTaskRunner) and ray.address == "ray://head:10001"
    assert ray.init_kwargs == {"namespace": "prefect"}  # a cluster keeps its own resources
    local_ray = cpu_runner(_cfg(runner="ray", ray_num_cpus=2))
    assert isinstance(local_ray, RayTaskRunner) and local_ray.address is None
    assert local_ray.init_kwargs["num_cpus"] == 2


def test_gpu_batches_ask_for_a_gpu_and_compiles_for_cpus() -> None:
    cfg = Config()
    st = load_stages(None)  # what the flows place: the stages' own declarations
    assert ray_options(st.verify, cfg, "cuda")["num_gpus"] == 1
    assert ray_options(st.verify, cfg, "musa")["num_gpus"] == 1
    assert "num_gpus" not in ray_options(st.verify, cfg, "cpu")
    assert ray_options(st.compile, cfg, "cuda") == {"num_cpus": cfg.verify.compile_workers}


def test_each_stage_gets_its_runner_from_what_it_declares() -> None:
    st = load_stages(None)
    local = _cfg(io_workers=3, cpu_workers=2, verify_in_flight=5)
    io = runner_for(st.ingest, local, "cpu")  # reads sources: threads
    assert isinstance(io, ThreadPoolTaskRunner) and io._max_workers == 3
    assert runner_for(st.tasks, local, "cpu") is None  # sequential: in the flow's own process
    for stage in (st.generate, st.mutate, st.repair):  # Python compute
        got = runner_for(stage, local, "cpu")
        assert isinstance(got, ThreadPoolTaskRunner) and got._max_workers == 2
    for backend in ("cpu", "cuda"):  # its own sandboxed workers, or a GPU
        got = runner_for(st.verify, local, backend)
        assert isinstance(got, ThreadPoolTaskRunner) and got._max_workers == 5
    ray = _cfg(runner="ray", io_workers=3)
    assert isinstance(runner_for(st.ingest, ray, "cuda"), ThreadPoolTaskRunner)
    assert runner_for(st.tasks, ray, "cuda") is None
    assert isinstance(runner_for(st.verify, ray, "cuda"), RayTaskRunner)
    assert isinstance(runner_for(st.generate, ray, "cuda"), RayTaskRunner)
    # a stand-in stage is placed by its own declaration, not by its name
    assert runner_for(fake.STAGES.tasks, local, "cpu") is None
    assert isinstance(runner_for(fake.STAGES.verify, ray, "cuda"), RayTaskRunner)


class _State:
    def __init__(self, exc: BaseException | None):
        self.exc = exc

    def result(self) -> None:
        if self.exc is not None:
            raise self.exc


def test_only_transient_failures_are_retried() -> None:
    git_fail = subprocess.CalledProcessError(128, ["git", "fetch"])
    assert retry_if_transient(None, None, _State(git_fail))
    assert retry_if_transient(None, None, _State(ConnectionResetError("peer reset")))
    assert retry_if_transient(None, None, _State(TimeoutError("read timed out")))
    assert not retry_if_transient(None, None, _State(ValueError("bad verdict")))
    assert not retry_if_transient(None, None, _State(AssertionError()))
    assert not retry_if_transient(None, None, _State(None))
    assert not is_transient(KeyError("x"))
    # the verifier's batches have no retries at all: a verdict is never re-rolled; only the
    # stages that declare `retry_transient` (LLM calls, git and HTTP) get them
    st = load_stages(None)
    assert stage_batch.retries == 0 and retrying_stage_batch.retries == 2
    assert not st.verify.retry_transient and not st.mutate.retry_transient
    assert st.generate.retry_transient and st.repair.retry_transient and st.ingest.retry_transient


def test_stage_sets_load_by_import_path() -> None:
    assert load_stages(None) is builtin_stages()
    assert load_stages("flows_fake_stages:STAGES") is fake.STAGES
    with pytest.raises(StageSetError, match="cannot import"):
        load_stages("no_such_module_xyz:STAGES")
    with pytest.raises(StageSetError, match="not a StageSet"):
        load_stages("flows_fake_stages:SOURCE")


def test_task_functions_run_directly(workspace) -> None:
    run = workspace.new_run("r1")
    fake.ingest(workspace, run, Config())
    fake.tasks(workspace, run, Config())
    tasks = workspace.read(Task)
    spec = "flows_fake_stages:STAGES"
    cands, rejs, counts = stage_batch.fn("generate", tasks, StageContext(Config()), spec)
    assert len(rejs) == 1 and rejs[0].reason == "no_template"
    assert counts["rejected:no_template"] == 1
    assert len(cands) == 5 * Config().generate.variants_per_task
    ctx = StageContext(Config(), cache_dir="/tmp", tasks={t.task_id: t for t in tasks})
    verdicts, _, counts = stage_batch.fn("verify", cands[:4], ctx, spec)
    assert [v.candidate_id for v in verdicts] == [c.candidate_id for c in cands[:4]]
    assert counts["verified"] == 4


def test_generator_errors_become_rejections(workspace) -> None:
    run = workspace.new_run("r1")
    fake.ingest(workspace, run, Config())
    fake.tasks(workspace, run, Config())
    tasks = workspace.read(Task)

    def crash(task_list: list, cfg: object, backend: str) -> tuple[list, list]:
        raise RuntimeError("template bug\nsecond line")

    out = generate_stage(crash).run(tasks, StageContext(Config()))
    assert out.records == [] and {r.item_id for r in out.rejections} == {t.task_id for t in tasks}
    assert all(r.reason == "generator_error" and r.detail == "RuntimeError: template bug"
               for r in out.rejections)
    assert out.counts["rejected:generator_error"] == len(tasks)
    # a configuration no batch can work with fails the step instead, naming the field
    cfg = Config.model_validate({"generate": {"generators": ["no-such-generator"]}})
    with pytest.raises(GenerateError, match="no-such-generator"):
        stage_batch.fn("generate", tasks, StageContext(cfg), None)  # the real stage


def test_pending_generation_skips_answered_tasks(workspace) -> None:
    run = workspace.new_run("r1")
    task_a = Task(task_id="a", name="a", source="", cpu_source="")
    task_b = Task(task_id="b", name="b", source="", cpu_source="")
    run.write([task_a, task_b])
    tasks = [task_a, task_b]

    def pending(backend: str, *gens: str, samples: int = 1, names=None) -> dict[str, list[str]]:
        cfg = GenerateConfig(generators=list(gens), samples=samples)
        return {g: [t.task_id for t in ts]
                for g, ts in generate_pending(workspace, tasks, backend, cfg, names).items()}

    assert pending("cpu", "template") == {"template": ["a", "b"]}
    run.write([Candidate("c1", "a", "cpu", "template:activation/v0", "code")])
    run.write([Rejection.make("generate", "b", "b", "no_template")])
    assert pending("cpu", "template", "mutate") == {"template": []}
    assert pending("cuda", "template") == {"template": ["a"]}
    # an LLM generator owes both until each task has its samples; its errors are no answer
    run.write([Rejection.make("generate", "a", "a", "llm_unavailable")])
    run.write([Candidate("l1", "a", "cpu", "llm:coder", "x"),
               Candidate("l2", "b", "cpu", "llm:coder", "y"),
               Candidate("l3", "b", "cpu", "llm:coder", "z")])
    assert pending("cpu", "template", "openai", samples=2) == {"template": [], "openai": ["a"]}
    assert pending("cpu", "openai", samples=2, names={"openai": "llm:other"}) == {
        "openai": ["a", "b"]}  # another model has not answered yet
    # the plan runs a batch for every task some per-task generator owes; the import owes all,
    # but reads its file whole in one batch of its own, so it adds no per-task batch
    both = generate_pending(workspace, tasks, "cpu", GenerateConfig(
        generators=["template", "import", "openai"], samples=2))
    assert [t.task_id for t in both["import"]] == ["a", "b"]
    assert [t.task_id for t in tasks_pending_generation(tasks, both)] == ["a"]
    only_import = generate_pending(workspace, tasks, "cpu", GenerateConfig(generators=["import"]))
    assert tasks_pending_generation(tasks, only_import) == []


def test_latest_version_is_the_highest_number(workspace) -> None:
    root = workspace.datasets_dir / "kernelsynth"
    for v in ("v2", "v10", "v9"):
        (root / v).mkdir(parents=True)
        (root / v / "manifest.json").write_text("{}")
    assert latest_version(workspace, "kernelsynth").name == "v10"
    assert latest_version(workspace, "other") is None


def test_prefect_environment_is_local_quiet_and_user_settings_win(tmp_path, monkeypatch) -> None:
    env = prefect_environment(tmp_path / "ws")
    assert env["PREFECT_HOME"] == str(tmp_path / "ws" / ".prefect")
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert env["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] == "WARNING"
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "mine"))
    monkeypatch.delenv("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", raising=False)
    configure_prefect(tmp_path / "ws", quiet=False)
    assert os.environ["PREFECT_HOME"] == str(tmp_path / "mine")
    assert (tmp_path / "mine").is_dir()
    assert os.environ["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] == "INFO"


def test_prefect_yaml_deploys_build_dataset_nightly() -> None:
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.flows import load_flow_from_entrypoint

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    (dep,) = spec["deployments"]
    flow = load_flow_from_entrypoint(str(REPO / dep["entrypoint"]))
    assert flow.name == "build_dataset"
    (sched,) = dep["schedules"]
    assert sched["cron"] == FlowsConfig().schedule_cron
    CronSchedule(cron=sched["cron"], timezone=sched["timezone"])  # validates the expression
    assert dep["parameters"]["always_publish"] is True
    assert set(dep["parameters"]) <= set(flow.parameters.properties)
