"""`kernelsynth build` end to end with the real stages on a tiny input (3 modules, cpu backend).

The sources are a real git repository in tmp_path ingested over file://; extraction, template
generation, the CPU verifier (C++ kernels compiled and run), mutation, repair, selection,
datasets, publishing and the catalog are all the real ones. The compile cache is shared across
test sessions (like TORCH_EXTENSIONS_DIR in tests/conftest.py) so torch's headers build once.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml
from flows_harness import VENV_BIN, child_env

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

# Three structurally different modules (curation dedups on a canonicalized AST).
MODULES = {
    "act/relu.py": "class Relu(nn.Module):\n    def forward(self, x):\n"
                   "        return torch.relu(x)\n",
    "act/affine.py": "class Affine(nn.Module):\n    def forward(self, x):\n"
                     "        return x * 2.0 + 1.0\n",
    "norm/softmax.py": "class Softmax(nn.Module):\n    def forward(self, x):\n"
                       "        return torch.softmax(x, dim=-1)\n",
}
BUILD_CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "builds"


def _git_repo(root: Path) -> Path:
    root.mkdir()
    for rel, body in MODULES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("import torch\nimport torch.nn as nn\n\n\n" + body)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(root)}
    for cmd in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "modules"]):
        subprocess.run(["git", *cmd], cwd=root, env=env, check=True)
    return root


def toy_build_config(root: Path, **sections: Any) -> Path:
    """ks.yaml (under `root`) of a tiny real build on the cpu backend: the toy repository made
    at `root`/repo, ingested over file://; `sections`: more sections of the config."""
    repo = _git_repo(root / "repo")
    manifest = root / "repos.yaml"
    manifest.write_text(yaml.safe_dump({"repos": [{"url": repo.as_uri(), "ref": "main",
                                                   "license": "MIT"}]}))
    cfg = root / "ks.yaml"
    cfg.write_text(yaml.safe_dump({
        "sources": {"seed_corpus": False, "transformers_sample": 0, "nnsmith": {"count": 0},
                    "manifest": str(manifest)},
        "generate": {"backend": "cpu", "variants_per_task": 1},
        "verify": {"backend": "cpu", "trials": 2, "perf_trials": 3, "perf_warmup": 1,
                   "build_cache_dir": str(BUILD_CACHE)},
        "repair": {"turns": 1},
        **sections,
    }))
    return cfg


def _build(ws: Path, cfg: Path, api: str) -> dict:
    proc = subprocess.run([str(VENV_BIN / "kernelsynth"), "build", "--workspace", str(ws),
                           "--config", str(cfg), "--json"], env=child_env(api),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kernelsynth_build_runs_the_real_pipeline_then_skips_when_nothing_is_new(
        prefect_api: str, tmp_path: Path) -> None:
    # three tiny tasks from a toy repository: no kernel need beat eager to be an sft row here
    # (the default gate, min_speedup 1.0, is the default build's); no repair turn: a turn that
    # restores a template kernel times the same program again, and on a 2-core host two
    # timings whose spreads miss each other leave every kernel out of sft (`timing_not_repeated`,
    # a CI run: the gate's work, not this test's subject)
    cfg = toy_build_config(tmp_path, select={"min_speedup": 0.0}, repair={"turns": 0})
    ws = tmp_path / "ws"
    first = _build(ws, cfg, prefect_api)
    f = first["funnel"]
    assert first["backend"] == "cpu" and first["published"] and first["version"] == "v1"
    assert f["sourced_modules"] == 3 and f["tasks"] == 3
    assert f["verified"] == f["candidates"] >= 3
    assert f["correct"] >= 1
    stages = {r["stage"]: r for r in first["stages"]}
    assert stages["verify"]["verdicts"] >= 3 and stages["verify"]["failed_batches"] == 0
    manifest_v1 = json.loads((Path(first["path"]) / "manifest.json").read_text())
    # three tasks: the one sft row may land in either split (a CI run put it in validation)
    assert sum(manifest_v1["counts"]["sft"].values()) >= 1
    con = duckdb.connect(str(ws / "catalog.duckdb"), read_only=True)
    assert con.execute("select version from versions").fetchall() == [("v1",)]
    con.close()

    again = _build(ws, cfg, prefect_api)
    assert not again["published"] and again["version"] == "v1"
    assert again["funnel"] == f
    assert again["wall_s"] < 60
