"""KernelBench task files: every form KernelBench uses loads; every bad file gets a reason."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.tasks.taskfile import (
    inspect_task_source,
    substitute_constants,
    task_id_of,
    validate_task_files,
)

FORMS = {
    # int/float/tuple/bool init args, module constants
    "conv_forms.py": '''
        import torch
        import torch.nn as nn

        batch_size = 2
        in_channels = 3
        out_channels = 4
        kernel_size = (3, 5)
        height, width = 16, 20

        class Model(nn.Module):
            def __init__(self, in_channels, out_channels, kernel_size, bias: bool = False,
                         scale: float = 1.0):
                super().__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, bias=bias)
                self.scale = scale

            def forward(self, x):
                return self.conv(x) * self.scale

        def get_inputs():
            return [torch.randn(batch_size, in_channels, height, width)]

        def get_init_inputs():
            return [in_channels, out_channels, kernel_size, True, 0.5]
    ''',
    # several inputs, rand, an int tensor from randint, a python scalar input
    "gather_forms.py": '''
        import torch
        import torch.nn as nn

        N = 64
        C = 10

        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, logits, target, weight, dim):
                return torch.nn.functional.cross_entropy(logits * weight, target) + dim

        def get_inputs():
            return [torch.randn(N, C), torch.randint(0, C, (N,)), torch.rand(N, C), 1]

        def get_init_inputs():
            return []
    ''',
    # tuple output
    "tuple_out.py": '''
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                return torch.max(x, dim=1)

        def get_inputs():
            return [torch.randn(8, 32)]

        def get_init_inputs():
            return []
    ''',
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_kernelbench_forms_load(tmp_path):
    paths = [_write(tmp_path, n, t) for n, t in FORMS.items()]
    reports = {Path(r.path).name: r for r in validate_task_files(paths, workers=2)}
    assert all(r.valid for r in reports.values()), [r.reason for r in reports.values()]
    conv = reports["conv_forms.py"]
    assert conv.init_inputs == [3, 4, [3, 5], True, 0.5]
    assert conv.outputs[0].shape == [2, 4, 14, 16] and conv.outputs[0].dtype == "float32"
    g = reports["gather_forms.py"]
    assert [s.name for s in g.inputs] == ["logits", "target", "weight", "dim"]
    assert g.inputs[1].dtype == "int64" and g.inputs[1].init == "randint"
    assert 0 <= g.inputs[1].low and g.inputs[1].high <= 10
    assert g.inputs[2].init == "rand" and g.inputs[3].init == "given"
    assert g.outputs[0].shape == []
    assert [s.name for s in reports["tuple_out.py"].outputs] == ["out0", "out1"]
    assert reports["tuple_out.py"].outputs[1].dtype == "int64"


def test_large_dims_scale_down_for_cpu(relu_task_source):
    big = relu_task_source.replace("batch_size = 16", "batch_size = 4096").replace(
        "dim = 1024", "dim = 65536")
    rep = inspect_task_source(big, scale=True, cpu_max_numel=1 << 16)
    assert rep.valid, rep.reason
    numel = rep.inputs[0].shape[0] * rep.inputs[0].shape[1]
    assert numel <= 1 << 16
    assert rep.scaled_constants and "batch_size = " in rep.cpu_source
    assert f"dim = {rep.scaled_constants.get('dim', 65536)}" in rep.cpu_source
    # the scaled copy is itself a valid task with the scaled shapes
    again = inspect_task_source(rep.cpu_source)
    assert again.valid and again.inputs[0].shape == rep.inputs[0].shape


def test_task_id_ignores_comments_and_formatting(relu_task_source):
    annotated = relu_task_source.replace(
        "return torch.relu(x)", "return torch.relu(x)  # out: [16, 1024] float32")
    assert task_id_of(annotated) == task_id_of(relu_task_source)
    assert task_id_of(relu_task_source.replace("relu", "sigmoid")) != task_id_of(relu_task_source)


def test_substitute_constants_keeps_other_text():
    src = "a = 4096  # rows\nb = 7\nc = a * 2\n"
    assert substitute_constants(src, {"a": 64}) == "a = 64  # rows\nb = 7\nc = a * 2\n"


BAD = {
    "syntax.py": ("def broken(:\n", "syntax error at line 1"),
    "no_inputs.py": ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                     "        return x\ndef get_init_inputs():\n    return []\n",
                     "missing function get_inputs()"),
    "raises.py": ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                  "        raise ValueError('bad shape')\n"
                  "def get_inputs():\n    return [torch.randn(2)]\n"
                  "def get_init_inputs():\n    return []\n",
                  "reference raised ValueError (line 4): bad shape"),
    "loops.py": ("while True:\n    pass\n", "timed out"),
    "huge.py": ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                "        return x\n"
                "def get_inputs():\n    return [torch.empty(100 * 1024**3 // 4)]\n"
                "def get_init_inputs():\n    return []\n", "too_large_for_host"),
    "no_model.py": ("def get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n",
                    "no class Model(nn.Module)"),
}


def test_bad_files_get_one_line_reasons_and_others_still_validate(tmp_path, relu_task_source):
    paths = [_write(tmp_path, n, t) for n, (t, _) in BAD.items()]
    latin = tmp_path / "latin1.py"
    latin.write_bytes("# caf\xe9\n".encode("latin-1"))
    good = _write(tmp_path, "good.py", relu_task_source)
    reports = validate_task_files([*paths, latin, good], workers=2, timeout_s=8)
    by_name = {Path(r.path).name: r for r in reports}
    for name, (_, expected) in BAD.items():
        assert not by_name[name].valid
        assert expected in by_name[name].reason, (name, by_name[name].reason)
        assert "\n" not in by_name[name].reason
    assert not by_name["latin1.py"].valid and "not UTF-8" in by_name["latin1.py"].reason
    assert by_name["good.py"].valid


def test_cli_validate_json_and_exit_code(tmp_path, relu_task_source):
    good = _write(tmp_path, "good.py", relu_task_source)
    bad = _write(tmp_path, "bad.py", "x = (\n")
    cmd = [sys.executable, "-m", "pipeline.cli.__main__"]
    proc = subprocess.run([*cmd, "tasks", "validate", str(good), str(bad), "--json",
                           "--workspace", str(tmp_path / "ws")], capture_output=True, text=True)
    lines = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert proc.returncode == 1
    assert [(ln["valid"], bool(ln["task_id"])) for ln in lines] == [(True, True), (False, False)]
    assert lines[1]["reason"].startswith("syntax error")
    ok = subprocess.run([*cmd, "tasks", "validate", str(good), "--json"], capture_output=True,
                        text=True, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("query,expected", [
    ("select count(*) as n from candidates", "1"),
    ("select backend from candidates", "cpu"),
])
def test_cli_sql_over_workspace(tmp_path, query, expected):
    from pipeline.workspace import Workspace
    from schemas import Candidate

    Workspace(tmp_path / "ws").new_run().write([Candidate("c", "t", "cpu", "g", "code")])
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli.__main__", "sql", query,
                           "--workspace", str(tmp_path / "ws"), "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert expected in list(json.loads(proc.stdout.splitlines()[0]).values())[0].__str__()
    bad = subprocess.run([sys.executable, "-m", "pipeline.cli.__main__", "sql", "selec x",
                          "--workspace", str(tmp_path / "ws")], capture_output=True, text=True)
    assert bad.returncode == 1 and "SQL error" in bad.stderr
