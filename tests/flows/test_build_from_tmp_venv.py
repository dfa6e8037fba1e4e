"""`kernelsynth build` from a virtualenv under /tmp (issue 28, item 6): the sandbox keeps the
interpreter visible, so the tiny real build (3 modules, cpu backend) gives the same funnel as
from the project's own venv. Before, every sandboxed child of the /tmp venv failed to start."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from flows_harness import VENV_BIN, child_env
from test_flows_real_build import toy_build_config
from verifier_cases import tmp_venv


def _build(python: Path, ws: Path, cfg: Path, api: str) -> dict:
    proc = subprocess.run([str(python), "-c", "from pipeline.cli import main; main()", "build",
                           "--workspace", str(ws), "--config", str(cfg), "--json"],
                          env=child_env(api), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_build_from_a_venv_under_tmp_has_the_same_funnel(prefect_api: str,
                                                        tmp_path: Path) -> None:
    cfg = toy_build_config(tmp_path)
    home = _build(VENV_BIN / "python", tmp_path / "ws-home", cfg, prefect_api)
    tmp = _build(tmp_venv(tmp_path) / "bin" / "python", tmp_path / "ws-tmp", cfg, prefect_api)
    assert home["funnel"]["tasks"] == 3 and home["funnel"]["correct"] >= 1
    keys = ("sourced_modules", "tasks", "candidates", "verified")
    assert {k: tmp["funnel"][k] for k in keys} == {k: home["funnel"][k] for k in keys}
    assert tmp["funnel"]["correct"] == home["funnel"]["correct"]
    assert tmp["published"] and home["published"]
