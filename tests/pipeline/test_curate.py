"""curate_tasks: exact and near dedup, decontamination against a benchmark directory."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import TasksConfig
from pipeline.tasks.curate.curate import curate_tasks
from pipeline.tasks.curate.fingerprint import exact_hash, op_signature
from pipeline.tasks.taskfile import task_id_of
from schemas import Task
from tests.conftest import LINEAR_TASK, RELU_TASK

# LINEAR_TASK with other names and sizes: the same computation
LINEAR_RENAMED = '''import torch
import torch.nn as nn

n = 4
fin = 128
fout = 16


class Model(nn.Module):
    """A docstring that does not matter."""

    def __init__(self, a, b):
        super().__init__()
        self.layer = nn.Linear(a, b)

    def forward(self, inp):
        return torch.relu(self.layer(inp))  # a comment


def get_inputs():
    return [torch.randn(n, fin)]


def get_init_inputs():
    return [fin, fout]
'''

CONV_TASK = '''import torch
import torch.nn as nn

batch_size = 8
channels = 16


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = self.conv(x)
        y = self.bn(y)
        y = torch.sigmoid(y) * x
        return torch.mean(y, dim=1)


def get_inputs():
    return [torch.randn(batch_size, channels, 32, 32)]


def get_init_inputs():
    return [channels]
'''

GELU_SCALE = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return F.gelu(x) * self.scale


def get_inputs():
    return [torch.randn(64, 4096)]


def get_init_inputs():
    return [2.0]
'''


def _dedup_only(threshold: float) -> TasksConfig:
    return TasksConfig(near_dup_threshold=threshold, decontaminate_against=[])


def _task(source: str, name: str, module_id: str = "") -> Task:
    tid = task_id_of(source)
    return Task(task_id=tid, name=name, source=source, cpu_source=source,
                module_id=module_id or f"m-{name}", path=f"src/{name}.py")


def test_exact_dedup_ignores_names_sizes_comments() -> None:
    assert exact_hash(LINEAR_TASK) == exact_hash(LINEAR_RENAMED)
    assert exact_hash(LINEAR_TASK) != exact_hash(RELU_TASK)
    cfg = TasksConfig(decontaminate_against=[])  # dedup alone
    tasks = [_task(LINEAR_TASK, "lin"), _task(LINEAR_RENAMED, "lin2"), _task(RELU_TASK, "relu")]
    kept, rej = curate_tasks(tasks, cfg, [])
    assert [t.name for t in kept] == ["lin", "relu"]
    assert [(r.reason, r.item_id) for r in rej] == [("duplicate", "m-lin2")]
    assert kept[0].task_id in rej[0].detail or "lin" in rej[0].detail
    # against existing tasks too (a re-run of the stage)
    kept2, rej2 = curate_tasks([_task(LINEAR_RENAMED, "again")], cfg, kept)
    assert kept2 == [] and rej2[0].reason == "duplicate"


def test_near_duplicates_by_minhash() -> None:
    near = CONV_TASK.replace("return torch.mean(y, dim=1)", "return torch.mean(y, dim=1) + 1")
    near = near.replace("y = torch.sigmoid(y) * x", "y = torch.sigmoid(y) * x\n        y = y")
    assert exact_hash(near) != exact_hash(CONV_TASK)
    kept, rej = curate_tasks([_task(CONV_TASK, "conv"), _task(near, "conv_near"),
                              _task(RELU_TASK, "relu")], _dedup_only(0.7), [])
    assert [t.name for t in kept] == ["conv", "relu"]
    assert [r.reason for r in rej] == ["near_duplicate"]
    # a high threshold keeps both
    kept_hi, _ = curate_tasks([_task(CONV_TASK, "conv"), _task(near, "conv_near")],
                              _dedup_only(0.99), [])
    assert len(kept_hi) == 2


def test_decontamination_against_benchmark_dir(tmp_path: Path) -> None:
    bench = tmp_path / "KernelBench" / "level2"
    bench.mkdir(parents=True)
    # a verbatim copy (n-gram overlap) and a differently written same-op file (op signature)
    (bench / "17_Conv2d_BN_Sigmoid_Mean.py").write_text(CONV_TASK)
    (bench / "3_GELU_Scale.py").write_text(
        "import torch\nfrom torch import nn\n\n\n"
        "class Model(nn.Module):\n    def __init__(self, s):\n        super().__init__()\n"
        "        self.act = nn.GELU()\n        self.s = s\n\n"
        "    def forward(self, inp):\n        hidden = self.act(inp)\n"
        "        return self.s * hidden\n")
    (bench / "notes.txt").write_text(GELU_SCALE)  # only .py files count
    cfg = TasksConfig(decontaminate_against=[str(tmp_path / "KernelBench")], ngram=5)
    assert op_signature(GELU_SCALE) == ("gelu",)
    tasks = [_task(CONV_TASK, "conv"), _task(GELU_SCALE, "gelu"), _task(RELU_TASK, "relu")]
    kept, rej = curate_tasks(tasks, cfg, [])
    # gelu's only match is one generic op (by AST: no traced ops here): kept, marked overlap
    assert [t.name for t in kept] == ["gelu", "relu"]
    assert kept[0].decontamination == "overlap:KernelBench/level2/3_GELU_Scale.py"
    assert kept[1].decontamination == "clean"
    (conv,) = rej
    assert (conv.item_id, conv.reason) == ("m-conv", "contaminated")
    assert conv.ref.endswith("17_Conv2d_BN_Sigmoid_Mean.py") and "ngram" in conv.detail
    strict = cfg.model_copy(update={"decontaminate_generic": "reject"})
    _, rej_strict = curate_tasks(tasks, strict, [])
    by = {r.item_id: r for r in rej_strict}
    assert by["m-gelu"].ref.endswith("3_GELU_Scale.py") and "opseq" in by["m-gelu"].detail
    # without any benchmark nothing is removed
    kept_all, _ = curate_tasks(tasks, TasksConfig(decontaminate_against=[]), [])
    assert len(kept_all) == 3


def test_max_tasks_records_the_rest() -> None:
    tasks = [_task(RELU_TASK, "relu"), _task(CONV_TASK, "conv"), _task(GELU_SCALE, "gelu")]
    kept, rej = curate_tasks(tasks, TasksConfig(max_tasks=2, decontaminate_against=[]), [])
    assert len(kept) == 2 and [r.reason for r in rej] == ["max_tasks"]


def test_one_token_op_change_is_not_a_near_duplicate() -> None:
    conv = _task(CONV_TASK, "conv")
    conv.op_inventory = ["aten.convolution", "aten.batch_norm", "aten.sigmoid", "aten.mean"]
    tanh = _task(CONV_TASK.replace("torch.sigmoid", "torch.tanh"), "tanh")
    tanh.op_inventory = ["aten.convolution", "aten.batch_norm", "aten.tanh", "aten.mean"]
    cfg = _dedup_only(0.5)
    kept, rej = curate_tasks([conv, tanh], cfg, [])
    assert len(kept) == 2 and rej == []
    tanh.op_inventory = list(conv.op_inventory)  # same ops and similar text: near-duplicate
    kept2, rej2 = curate_tasks([conv, tanh], cfg, [])
    assert len(kept2) == 1 and rej2[0].reason == "near_duplicate"
