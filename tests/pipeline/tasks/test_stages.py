"""The plan's tasks step over a real workspace, through the CLI: build, resume (skip), show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.config import Config
from pipeline.plan import done_module_ids, run_step
from pipeline.runner import local_executor
from pipeline.workspace import Workspace
from schemas import RawModule, Rejection, Task
from tests.conftest import LINEAR_TASK, RELU_TASK

TWO_CLASSES = '''import torch
import torch.nn as nn


class Scale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.w = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x * self.w
        return torch.softmax(y, dim=-1)


class Broken(nn.Module):
    def forward(self, x):
        return undefined_helper(x)
'''

# RELU_TASK with other names: curated out as a duplicate of the relu task
RELU_AGAIN = RELU_TASK.replace("dim", "width").replace("batch_size", "rows")


def _raw(kind: str, path: str, name: str, code: str) -> RawModule:
    return RawModule(RawModule.make_id(kind, "", "", path, name, code), kind, "", "", path,
                     "MIT", name, code)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("ws")
    ws = Workspace(root)
    run = ws.new_run("ingest")
    run.write([_raw("seed", "seed/relu.py", "Model", RELU_TASK),
               _raw("seed", "seed/linear.py", "Model", LINEAR_TASK),
               _raw("seed", "seed/relu_again.py", "Model", RELU_AGAIN),
               _raw("git", "repo/two.py", "Scale", TWO_CLASSES),
               _raw("git", "repo/two.py", "Broken", TWO_CLASSES)])
    res = CliRunner().invoke(app, ["tasks", "build", "--workspace", str(root), "--json",
                                   "--workers", "2"])
    assert res.exit_code == 0, res.output
    counts = json.loads(res.output.strip().splitlines()[-1])
    return root, counts


def test_build_writes_tasks_and_rejections(built) -> None:
    root, counts = built
    ws = Workspace(root)
    tasks = ws.read(Task)
    assert counts["modules"] == 5 and counts["tasks"] == 3 == len(tasks)
    assert counts["rejections"] == 2 and counts["curated_out"] == 1
    assert counts["rejected:duplicate"] == 1
    rej = ws.read(Rejection)
    assert any(r.stage == "extract" and "undefined_helper" in r.detail for r in rej)
    scale = next(t for t in tasks if t.original_name == "Scale")
    assert "class Model(nn.Module)" in scale.source and "class Broken" not in scale.source
    assert scale.op_families[-1] == "softmax"
    assert all(t.dedup_cluster for t in tasks)
    # KernelBench decontamination is on by default: the lone ReLU overlaps, and is kept
    deco = {t.name: t.decontamination for t in tasks}
    assert deco["relu"].startswith("overlap:kernelbench/level1/")
    assert all(d == "clean" or d.startswith("overlap:kernelbench/") for d in deco.values())


def test_rerun_skips_finished_modules(built) -> None:
    root, _ = built
    ws = Workspace(root)
    before = len(ws.part_paths("tasks"))
    assert len(done_module_ids(ws)) == 5
    counts = run_step(local_executor(ws, Config(workspace=str(root))), "tasks")
    assert counts["skipped"] == 5 and counts.get("tasks", 0) == 0
    assert len(ws.part_paths("tasks")) == before


def test_show_prints_annotated_source_and_reasoning(built) -> None:
    root, _ = built
    task = next(t for t in Workspace(root).read(Task) if t.original_name == "Scale")
    res = CliRunner().invoke(app, ["tasks", "show", task.task_id[:10], "--workspace", str(root)])
    assert res.exit_code == 0, res.output
    assert "# y: [" in res.output and "Roofline on H100" in res.output
    res_json = CliRunner().invoke(app, ["tasks", "show", task.task_id, "--workspace",
                                        str(root), "--json"])
    assert json.loads(res_json.output)["source"] == task.source
    missing = CliRunner().invoke(app, ["tasks", "show", "ffffffffff", "--workspace", str(root)])
    assert missing.exit_code == 1
