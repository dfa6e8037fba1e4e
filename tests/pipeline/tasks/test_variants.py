"""The task probe's variants: derived, checked against the reference, stored, rebuilt for verify."""

from __future__ import annotations

import json

from pipeline.config import VerifyConfig
from pipeline.tasks.probe.variants import job_for, task_variants, validate, with_variants
from schemas import Task

# 3/4 of the sizes breaks what the reference needs (a power-of-two row), so the probe must fall
# back to 1/2; the temperature is a constructor float
TASK = '''import torch
import torch.nn as nn

batch_size = 16
features = 64


class Model(nn.Module):
    def __init__(self, temperature: float):
        super().__init__()
        self.temperature = temperature

    def forward(self, x):
        f = x.shape[-1]
        assert f & (f - 1) == 0, "features must be a power of two"
        return torch.softmax(x / self.temperature, -1)


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [0.5]
'''


def test_probe_keeps_the_first_variant_whose_reference_runs() -> None:
    result = validate({"cpu": TASK})
    kept = result["variants"]["cpu"]
    assert [v["label"] for v in kept] == ["sizes", "init"]
    # 3/4 (12, 48) fails the reference; 1/2 (8, 32) runs
    assert kept[0]["changes"] == {"batch_size": [16, 8], "features": [64, 32]}
    assert kept[1]["changes"] == {"temperature": [0.5, 0.625]}
    assert any(r.startswith("sizes:") and "power of two" in r for r in result["dropped"]["cpu"])


def test_task_carries_variants_the_verify_stage_rebuilds() -> None:
    task = Task(task_id="t", name="n", source=TASK, cpu_source=TASK)
    job = job_for(task, 30.0)
    assert job["kind"] == "variants" and list(job["sources"]) == ["gpu"]  # one file for both
    task = with_variants(task, validate(job["sources"]))
    assert set(json.loads(task.meta)["variants"]) == {"cpu", "gpu"}
    cpu = task_variants(task, "cpu")
    assert [v["label"] for v in cpu] == ["sizes", "init"]
    assert "features = 32" in cpu[0]["source"] and "batch_size = 8" in cpu[0]["source"]
    assert "return [0.625]" in cpu[1]["source"]
    # a task probed before variants existed: the verifier derives its own
    assert task_variants(Task(task_id="u", name="n", source=TASK, cpu_source=TASK), "cuda") is None


def test_dataset_builds_turn_the_check_on() -> None:
    assert VerifyConfig().generalize is True


def test_changes_the_reference_accepts_alone_are_kept_when_all_together_fail() -> None:
    # the hidden size is fixed inside the model (as in a carved transformers block); only the
    # batch may move
    fixed = TASK.replace('assert f & (f - 1) == 0, "features must be a power of two"',
                         'assert f == 64, "hidden size is fixed at 64"')
    kept = validate({"cpu": fixed})["variants"]["cpu"]
    assert kept[0] == {"label": "sizes", "changes": {"batch_size": [16, 12]}}
