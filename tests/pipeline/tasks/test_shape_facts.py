"""pipeline.tasks.annotate.shape_facts: the one tracer of a reference's sizes (rows audit, row-size test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pipeline.tasks.annotate import shape_facts

REF = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dims, out_features: int):
        super().__init__()
        self.up = nn.Linear(dims[0], dims[1])
        self.down = nn.Linear(dims[1], out_features)
        self.register_buffer("scale", torch.ones(7))

    def forward(self, x, k: int):
        return self.down(torch.relu(self.up(x))) * k, k


def get_inputs():
    return [torch.randn(8, 64), 2]


def get_init_inputs():
    return [(64, 96), 32]
'''


def test_facts_record_every_dim_the_forward_makes() -> None:
    f = shape_facts.facts(REF)
    assert f["ok"] and f["init"] == [[64, 96], 32]  # JSON values, as a prompt states them
    assert f["inputs"] == [[8, 64]] and f["outputs"] == [[8, 32]]  # non-tensors left out
    assert 96 in f["dims"]  # only the hidden activation (and the weights) have it
    assert 7 in f["dims"]  # a buffer
    assert f["dims"] == sorted(set(f["dims"]))


def test_script_answers_each_source_or_its_error(tmp_path: Path) -> None:
    """As `benchmarks.rows_audit` runs it (a file in the sandbox's work directory)."""
    (tmp_path / "facts.py").write_text(Path(shape_facts.__file__).read_text(encoding="utf-8"))
    (tmp_path / "sources.json").write_text(json.dumps([REF, REF.replace("(64, 96)", "(65, 96)")]))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "facts.py"], cwd=tmp_path, env=env, check=True, timeout=120)
    ok, bad = json.loads((tmp_path / "result.json").read_text())["facts"]
    assert ok == shape_facts.facts(REF)
    assert not bad["ok"] and "RuntimeError" in bad["error"] and "65" in bad["error"]
