"""--namespace isolated|kernelbench: the candidate's globals, the static stage, and the feedback
for a name only the reference defines; end to end on CPU candidates."""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

from verifier.api import verify_batch
from verifier.checks.namespace import (
    candidate_globals,
    free_names,
    name_error_hint,
    reference_names,
    reference_names_used,
)
from verifier.checks.static import check_python
from verifier.protocol import CORRECT_STATUSES, VerifyOptions, VerifyRequest

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_LOOP, relu_candidate  # noqa: E402

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"
# a KernelBench-style reference with sizes and a helper at module level
TASK = '''import os
import torch
import torch.nn as nn

batch_size = 16
dim = 256
shape = [batch_size, dim]


def flat_size(b, d):
    return b * d


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''
# the forms leaderboard kernels use: module-level sizes and a reference helper
USES_REFERENCE = relu_candidate(
    RELU_LOOP.format(fn="relu_fwd", pragma=""),
    forward="return ext.relu_fwd(x.reshape(flat_size(batch_size, dim))).view(shape[0], dim)")


def test_candidate_globals() -> None:
    ns: dict = {"__name__": "ks_reference"}
    exec(compile(TASK, "reference.py", "exec"), ns)
    assert candidate_globals(ns, "isolated") == {}
    got = candidate_globals(ns, "kernelbench")
    assert got["batch_size"] == 16 and got["flat_size"] is ns["flat_size"]
    assert got["torch"] is ns["torch"] and got["get_inputs"] is ns["get_inputs"]
    assert "Model" not in got and "os" not in got and "__name__" not in got
    got["shape"].append(99)  # the candidate's copy: the reference's data is untouched
    assert ns["shape"] == [16, 256]
    with pytest.raises(ValueError, match="isolated, kernelbench"):
        candidate_globals(ns, "shared")


def test_reference_and_free_names() -> None:
    assert {"batch_size", "dim", "shape", "flat_size", "Model", "get_inputs", "torch", "nn",
            "os"} <= reference_names(TASK)
    tree = ast.parse(USES_REFERENCE)
    assert set(free_names(tree)) == {"batch_size", "dim", "shape", "flat_size"}
    used = reference_names_used(tree, TASK)
    line = next(i for i, ln in enumerate(USES_REFERENCE.splitlines(), 1) if "flat_size" in ln)
    assert used == {"batch_size": line, "dim": line, "shape": line, "flat_size": line}
    # a star import could bind anything; a name bound anywhere in the module is not free
    assert free_names(ast.parse("from math import *\nprint(pi)\n")) == {}
    assert free_names(ast.parse("def f():\n    return g\ng = 1\n")) == {}
    assert free_names(ast.parse("try:\n    pass\nexcept E as e:\n    print(e)\n")) == {"E": 3}


def test_static_stage_warns_under_isolated_and_accepts_under_kernelbench() -> None:
    tree = ast.parse(USES_REFERENCE)
    isolated = check_python(tree, TASK)
    assert {f["rule"] for f in isolated} == {"reference_name"}
    assert all(f["severity"] == "warning" for f in isolated)
    assert any(f["message"].startswith("`batch_size` is defined in the reference file")
               for f in isolated)
    assert check_python(tree, TASK, "kernelbench") == []
    # Model stays the reference model: a candidate using it is rejected in both modes
    cheat = ast.parse(USES_REFERENCE.replace("return ext.relu_fwd(", "return Model()(x) or ("))
    for mode in ("isolated", "kernelbench"):
        assert any(f["rule"] == "reference_model" and f["severity"] == "error"
                   for f in check_python(cheat, TASK, mode))


def test_name_error_hint() -> None:
    found = [{"rule": "reference_name", "message": "`dim` is defined in the reference file",
              "line": 3, "severity": "warning"}]
    err = "candidate.py line 9: NameError: name 'dim' is not defined"
    assert "--namespace kernelbench" in name_error_hint(err, found)
    assert name_error_hint(err.replace("'dim'", "'other'"), found) == ""
    assert name_error_hint(err, []) == ""


def test_end_to_end_isolated_names_the_reference_and_kernelbench_runs() -> None:
    got = {}
    for mode in ("isolated", "kernelbench"):
        opts = VerifyOptions(backend="cpu", build_cache_dir=str(CACHE), namespace=mode,
                             trials=2, perf_trials=3, perf_warmup=1, perf_budget_s=0.3)
        (v,) = verify_batch([VerifyRequest(mode, "relu", TASK, USES_REFERENCE, "cpu")], opts)
        got[mode] = v
    iso, kb = got["isolated"], got["kernelbench"]
    assert iso.status == "runtime_error" and "NameError" in iso.error, iso.error
    assert "is defined in the reference file; candidates run in their own namespace (use " \
           "--namespace kernelbench for KernelBench's behaviour)" in iso.feedback, iso.feedback
    assert kb.status in CORRECT_STATUSES, (kb.status, kb.error)
    assert not [f for f in kb.findings if f["rule"] == "reference_name"]


def test_cli_namespace_flag(tmp_path: Path) -> None:
    import subprocess

    (tmp_path / "task.py").write_text(TASK)
    (tmp_path / "cand.py").write_text(USES_REFERENCE)
    root = Path(__file__).parents[2]
    cmd = [sys.executable, "-m", "verifier", "--task", str(tmp_path / "task.py"),
           "--candidate", str(tmp_path / "cand.py"), "--backend", "cpu", "--json",
           "--perf-trials", "3", "--trials", "2", "--cache-dir", str(CACHE)]
    env = {**os.environ, "PYTHONPATH": str(root)}
    bad = subprocess.run(cmd + ["--namespace", "shared"], capture_output=True, text=True,
                         cwd=root, env=env, timeout=600)
    assert bad.returncode == 2 and "invalid choice: 'shared'" in bad.stderr
    ok = subprocess.run(cmd + ["--namespace", "kernelbench"], capture_output=True, text=True,
                        cwd=root, env=env, timeout=600)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert '"status": "correct_' in ok.stdout, ok.stdout[-2000:]
