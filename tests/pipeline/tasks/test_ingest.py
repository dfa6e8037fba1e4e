"""The plan's ingest step and `kernelsynth ingest`: all default sources into Parquet, re-runs skip."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.config import Config
from pipeline.plan import run_step
from pipeline.runner import local_executor
from pipeline.stages.ingest import sources_for_run
from pipeline.workspace import Workspace
from schemas import RawModule, Rejection

MIT = "Permission is hereby granted, free of charge, to any person obtaining a copy\n"
MODEL = "import torch.nn as nn\n\n\nclass Gate(nn.Module):\n    def forward(self, x):\n" \
        "        return x.sigmoid() * x\n"


def _repo(path: Path) -> Path:
    path.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}
    (path / "LICENSE").write_text(MIT)
    (path / "gate.py").write_text(MODEL)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
        subprocess.run(["git", *args], cwd=path, env=env, check=True, capture_output=True)
    return path


def _config(**sources) -> Config:
    return Config.model_validate({"sources": {"transformers_sample": 2, "seed_sample": 0,
                                              "nnsmith": {"count": 1, "target_numel": 2048},
                                              **sources}})


def test_default_sources_then_rerun_skips(workspace: Workspace, tmp_path: Path):
    manifest = tmp_path / "repos.yaml"
    repo = _repo(tmp_path / "repo")
    manifest.write_text(yaml.safe_dump({"repos": [{"url": repo.as_uri()},
                                                  {"url": (tmp_path / "gone").as_uri()}]}))
    cfg = _config(manifest=str(manifest))
    cfg = cfg.model_copy(update={"flows": cfg.flows.model_copy(update={"batch_size": 16})})
    counts = run_step(local_executor(workspace, cfg), "ingest")
    con = workspace.duckdb(["raw_modules", "rejections"])
    kinds = dict(con.sql("select source_kind, count(*) from raw_modules group by 1").fetchall())
    assert kinds["transformers"] == 2 and kinds["nnsmith"] == 1 and kinds["git"] == 1
    assert kinds["seed"] >= 60
    assert counts["modules"] == sum(kinds.values()) and counts["existing"] == 0
    assert counts["kind:seed"] == kinds["seed"]
    reasons = [r.reason for r in workspace.read(Rejection)]
    assert "unreachable" in reasons and counts["rejected:unreachable"] == 1
    # written in several parts (batches), readable back with the schema
    assert len(workspace.part_paths("raw_modules")) > 1
    # the same ingest again writes nothing new
    again = run_step(local_executor(workspace, cfg), "ingest")
    assert again["modules"] == 0 and again["rejections"] == 0
    assert again["existing"] == counts["modules"]
    assert len(workspace.read(RawModule)) == counts["modules"]


def test_overrides_for_a_run():
    cfg = _config().sources
    only_nn = sources_for_run(cfg, nnsmith=5, seed=9, default=False)
    assert (only_nn.seed_corpus, only_nn.transformers_sample) == (False, 0)
    assert (only_nn.nnsmith.count, only_nn.nnsmith.seed) == (5, 9)
    assert sources_for_run(cfg, default=False).nnsmith.count == 0
    assert sources_for_run(cfg).transformers_sample == 2


def test_cli_ingest_manifest_only_and_sql(tmp_path: Path):
    repo = _repo(tmp_path / "repo")
    manifest = tmp_path / "repos.yaml"
    manifest.write_text(yaml.safe_dump({"repos": [{"url": str(repo)}]}))
    ws = tmp_path / "ws"
    runner = CliRunner()
    res = runner.invoke(app, ["ingest", "--no-default", "--manifest", str(manifest),
                              "--workspace", str(ws), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["command"] == "ingest" and summary["modules"] == 1
    res = runner.invoke(app, ["sql", "select source_kind, module_name from raw_modules",
                              "--workspace", str(ws), "--json"])
    assert json.loads(res.stdout.strip()) == {"source_kind": "git", "module_name": "Gate"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("repos: 3\n")
    res = runner.invoke(app, ["ingest", "--manifest", str(bad), "--workspace", str(ws)])
    assert res.exit_code == 2 and "bad.yaml" in res.output
