"""Decontamination against benchmark fingerprints: renamed copies rejected, generic ops kept."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipeline.config import TasksConfig
from pipeline.tasks.curate.curate import curate_tasks
from pipeline.tasks.curate.kernelbench_index import (
    SHIPPED_INDEX,
    BenchmarkIndexError,
    fetch_kernelbench,
    folder_index,
    load_index_file,
    resolve_indexes,
    trace_files,
)
from pipeline.tasks.taskfile import task_id_of
from schemas import Task, TensorSpec

# Written in KernelBench's own file shape (level 2 style): conv, ReLU, bias add.
KB_CONV_RELU_BIAS = '''import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Simple model that performs a convolution, applies ReLU, and adds a bias term.
    """
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super(Model, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.conv(x)
        x = torch.relu(x)
        x = x + self.bias
        return x

batch_size = 128
in_channels  = 3
out_channels = 16
height, width = 32, 32
kernel_size = 3
bias_shape = (out_channels, 1, 1)

def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size, bias_shape]
'''

# The same model renamed and reformatted: other names, functional calls, other layout.
RENAMED = '''import torch
from torch import nn
import torch.nn.functional as F


class ConvActShift(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, shift_shape: tuple) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels=cin, out_channels=cout, kernel_size=k)
        self.shift = nn.Parameter(torch.randn(shift_shape))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.add(F.relu(self.proj(images)), self.shift)


Model = ConvActShift
N, C_IN, C_OUT, SIDE, K = 128, 3, 16, 32, 3


def get_inputs():
    return [torch.rand(N, C_IN, SIDE, SIDE)]


def get_init_inputs():
    return [C_IN, C_OUT, K, (C_OUT, 1, 1)]
'''

KB_RELU = '''import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Simple model that performs a ReLU activation.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)

batch_size = 16
dim = 16384

def get_inputs():
    return [torch.rand(batch_size, dim)]

def get_init_inputs():
    return []
'''

LONE_RELU = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU()

    def forward(self, inp):
        return self.act(inp)


def get_inputs():
    return [torch.randn(64, 1024)]


def get_init_inputs():
    return []
'''

UNRELATED = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return torch.cumsum(self.norm(x), dim=1).tanh()


def get_inputs():
    return [torch.randn(8, 512)]


def get_init_inputs():
    return [512]
'''


def _traced_tasks(sources: dict[str, str]) -> list[Task]:
    """Tasks as the probe leaves them: op inventory and input shapes from a real trace."""
    traces = trace_files(sources)
    tasks = []
    for name, source in sources.items():
        traced = traces[name]
        assert traced["trace"] == "meta", traced
        specs = [TensorSpec(f"x{i}", s, "float32") for i, s in enumerate(traced["shapes"])]
        tasks.append(Task(task_id=task_id_of(source), name=name, source=source,
                          cpu_source=source, module_id=f"m-{name}", path=f"src/{name}.py",
                          op_inventory=traced["ops"], input_specs=specs))
    return tasks


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench") / "MyBench"
    (root / "level1").mkdir(parents=True)
    (root / "level2").mkdir()
    (root / "level1" / "19_ReLU.py").write_text(KB_RELU)
    (root / "level2" / "1_Conv2D_ReLU_BiasAdd.py").write_text(KB_CONV_RELU_BIAS)
    return root


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    return {t.name: t for t in _traced_tasks({"renamed": RENAMED, "relu": LONE_RELU,
                                              "unrelated": UNRELATED})}


def test_folder_index_keeps_no_source_text(bench: Path) -> None:
    index = folder_index(bench, 5)
    by = {e.name: e for e in index.entries}
    assert set(by) == {"level1/19_ReLU.py", "level2/1_Conv2D_ReLU_BiasAdd.py"}
    conv = by["level2/1_Conv2D_ReLU_BiasAdd.py"]
    assert conv.trace == "meta" and conv.shapes == [[128, 3, 32, 32]]
    assert conv.ops[:1] == ["aten.convolution"] and "aten.relu" in conv.ops
    text = index.to_json()
    assert "Conv2d" not in text and "def forward" not in text and "bias" not in text


def test_renamed_model_is_contaminated_generic_op_kept(bench: Path, tasks: dict) -> None:
    cfg = TasksConfig(decontaminate_against=[str(bench)])
    kept, rej = curate_tasks(list(tasks.values()), cfg, [])
    assert sorted(t.name for t in kept) == ["relu", "unrelated"]
    assert [(r.item_id, r.reason) for r in rej] == [("m-renamed", "contaminated")]
    assert rej[0].ref == "MyBench/level2/1_Conv2D_ReLU_BiasAdd.py"
    assert "aten match" in rej[0].detail  # the n-grams differ; the traced ops do not
    by = {t.name: t for t in kept}
    assert by["relu"].decontamination == "overlap:MyBench/level1/19_ReLU.py"
    assert by["unrelated"].decontamination == "clean"


def test_generic_overlap_rejected_when_configured(bench: Path, tasks: dict) -> None:
    cfg = TasksConfig(decontaminate_against=[str(bench)], decontaminate_generic="reject")
    kept, rej = curate_tasks([tasks["relu"], tasks["unrelated"]], cfg, [])
    assert [t.name for t in kept] == ["unrelated"]
    assert [r.reason for r in rej] == ["contaminated"] and "19_ReLU.py" in rej[0].ref


def test_off_when_empty_and_bad_entry_named(tasks: dict, tmp_path: Path) -> None:
    kept, rej = curate_tasks(list(tasks.values()), TasksConfig(decontaminate_against=[]), [])
    assert len(kept) == 3 and not rej
    with pytest.raises(BenchmarkIndexError, match="nowhere"):
        resolve_indexes([str(tmp_path / "nowhere")], 5)


def test_shipped_kernelbench_index_is_on_by_default(tasks: dict) -> None:
    index = load_index_file(SHIPPED_INDEX)
    levels = {e.level for e in index.entries}
    assert levels == {"level1", "level2", "level3", "level4"} and len(index.entries) >= 250
    assert index.source.endswith("@423217d9fda91e0c2d67e4a43bf62f96f6d104f1")
    assert "class Model" not in SHIPPED_INDEX.read_text()
    assert TasksConfig().decontaminate_against == ["kernelbench"]
    # KernelBench level 2 #1 (conv, ReLU, bias add) renamed and reformatted
    kept, rej = curate_tasks(list(tasks.values()), TasksConfig(), [])
    assert [(r.item_id, r.reason) for r in rej] == [("m-renamed", "contaminated")]
    assert rej[0].ref.startswith("kernelbench/level2/")
    by = {t.name: t for t in kept}
    assert by["relu"].decontamination.startswith("overlap:kernelbench/level1/")
    assert by["unrelated"].decontamination == "clean"


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_fetch_from_git_repo_at_pinned_commit(tmp_path: Path, tasks: dict) -> None:
    repo = tmp_path / "kb"
    (repo / "KernelBench" / "level2").mkdir(parents=True)
    (repo / "KernelBench" / "level2" / "1_Conv2D_ReLU_BiasAdd.py").write_text(KB_CONV_RELU_BIAS)
    (repo / "KernelBench" / "level5").mkdir()
    (repo / "KernelBench" / "level5" / "x.py").write_text(KB_RELU)  # not a level we index
    _git("init", "-q", cwd=repo)
    _git("add", "-A", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v1", cwd=repo)
    pinned = _git("rev-parse", "HEAD", cwd=repo)
    (repo / "KernelBench" / "level2" / "1_Conv2D_ReLU_BiasAdd.py").unlink()
    (repo / "KernelBench" / "level1").mkdir()
    (repo / "KernelBench" / "level1" / "19_ReLU.py").write_text(KB_RELU)
    _git("add", "-A", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v2", cwd=repo)
    bench_dir = tmp_path / "ws" / "benchmarks"
    index = fetch_kernelbench(bench_dir / "kernelbench.json", f"file://{repo}", pinned)
    assert [e.name for e in index.entries] == ["level2/1_Conv2D_ReLU_BiasAdd.py"]
    assert json.loads((bench_dir / "kernelbench.json").read_text())["source"].endswith(pinned)
    # `kernelbench` now means the fetched index: the lone ReLU of v2 is not in it
    kept, rej = curate_tasks(list(tasks.values()), TasksConfig(), [], bench_dir)
    assert [r.item_id for r in rej] == ["m-renamed"]
    assert {t.name: t.decontamination for t in kept} == {"relu": "clean", "unrelated": "clean"}
    with pytest.raises(BenchmarkIndexError, match="git checkout failed"):
        fetch_kernelbench(tmp_path / "x.json", str(repo), "0" * 40)
