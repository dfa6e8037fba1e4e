"""Task runners from the config (local threads/processes or Ray), and stages placed on them.

Ray is reached only through prefect-ray's RayTaskRunner; what a batch asks for is the resources
its stage declares (`pipeline.stage.Stage.resources`), passed as Ray `remote` options with
`prefect_ray.context.remote_options` around the submission, so the same flow code runs on a
laptop and on a GPU cluster.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from pipeline.config import Config
from pipeline.stage import Stage, is_transient


def ray_runner(cfg: Config) -> TaskRunner:
    """A RayTaskRunner on `flows.ray_address`, or on a local Ray instance it starts."""
    from prefect_ray import RayTaskRunner

    init: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if cfg.flows.ray_num_cpus is not None:
        init["num_cpus"] = cfg.flows.ray_num_cpus
    if cfg.flows.ray_num_gpus is not None:
        init["num_gpus"] = cfg.flows.ray_num_gpus
    if cfg.flows.ray_address is not None:
        init = {}  # an existing cluster's resources are its own
    return RayTaskRunner(address=cfg.flows.ray_address, init_kwargs=init)


def io_runner(cfg: Config) -> TaskRunner:
    """Runner for I/O-bound stages (sources, publishing): threads."""
    return ThreadPoolTaskRunner(max_workers=max(1, cfg.flows.io_workers))


def cpu_runner(cfg: Config) -> TaskRunner:
    """Runner for CPU-bound Python stages (generation, mutation, repair rounds)."""
    if cfg.flows.runner == "ray":
        return ray_runner(cfg)
    if cfg.flows.cpu_pool == "process":
        return ProcessPoolTaskRunner(max_workers=max(1, cfg.flows.cpu_workers))
    return ThreadPoolTaskRunner(max_workers=max(1, cfg.flows.cpu_workers))


def verify_runner(cfg: Config) -> TaskRunner:
    """Runner for stages whose work runs in worker processes they start (the verifier's
    sandboxes) or on a GPU: threads locally, Ray placing each batch on a cluster."""
    if cfg.flows.runner == "ray":
        return ray_runner(cfg)
    return ThreadPoolTaskRunner(max_workers=max(1, cfg.flows.verify_in_flight))


def runner_for(stage: Stage, cfg: Config, backend: str) -> TaskRunner | None:
    """The task runner of `stage`'s Prefect tasks, from what the stage declares.

    I/O (reading sources): threads here. Sequential (batches depend on earlier ones): none of
    its own, so its one task runs in the flow's process. Work in the stage's own worker processes
    or on a GPU (verification): the verify runner. Python compute (generate, mutate, repair): the
    CPU runner.
    """
    declared = stage.resources(cfg, backend)
    if declared.io:
        return io_runner(cfg)
    if stage.sequential:
        return None
    if declared.gpus or declared.subprocesses:
        return verify_runner(cfg)
    return cpu_runner(cfg)


def ray_options(stage: Stage, cfg: Config, backend: str) -> dict[str, Any]:
    """Ray remote options of one batch of `stage`: the resources the stage declares."""
    return stage.resources(cfg, backend).ray_options()


def placed(stage: Stage, cfg: Config, backend: str) -> AbstractContextManager:
    """Submissions inside this block ask Ray for `stage`'s declared resources (no-op locally)."""
    if cfg.flows.runner != "ray":
        return nullcontext()
    from prefect_ray.context import remote_options

    return remote_options(**ray_options(stage, cfg, backend))


def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect `retry_condition_fn`: retry only when the failure is transient."""
    try:
        state.result()
    except Exception as exc:  # the task's own exception, re-raised by the state
        return is_transient(exc)
    return False
