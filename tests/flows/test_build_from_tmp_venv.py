"""`kernelsynth build` from a virtualenv under /tmp (issue 28, item 6): the sandbox keeps the
interpreter visible, so the tiny real build (3 modules, cpu backend) gives the same funnel as
from the project's own venv. Before, every sandboxed child of the /tmp venv failed to start."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from flows_harness import VENV_BIN, child_env
from test_flows_real_build import BUILD_CACHE, _git_repo


def _tmp_venv(root: Path) -> Path:
    """A venv under /tmp whose site-packages reach the project's through a .pth."""
    assert str(root).startswith("/tmp/"), root
    venv = root / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "ks_parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _build(python: Path, ws: Path, cfg: Path, api: str) -> dict:
    proc = subprocess.run([str(python), "-c", "from pipeline.cli import main; main()", "build",
                           "--workspace", str(ws), "--config", str(cfg), "--json"],
                          env=child_env(api), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_build_from_a_venv_under_tmp_has_the_same_funnel(prefect_api: str,
                                                        tmp_path: Path) -> None:
    repo = _git_repo(tmp_path / "repo")
    manifest = tmp_path / "repos.yaml"
    manifest.write_text(yaml.safe_dump({"repos": [{"url": repo.as_uri(), "ref": "main",
                                                   "license": "MIT"}]}))
    cfg = tmp_path / "ks.yaml"
    cfg.write_text(yaml.safe_dump({
        "sources": {"seed_corpus": False, "transformers_sample": 0, "nnsmith": {"count": 0},
                    "manifest": str(manifest)},
        "generate": {"backend": "cpu", "variants_per_task": 1},
        "verify": {"backend": "cpu", "trials": 2, "perf_trials": 3, "perf_warmup": 1,
                   "build_cache_dir": str(BUILD_CACHE)},
        "repair": {"turns": 1},
    }))
    home = _build(VENV_BIN / "python", tmp_path / "ws-home", cfg, prefect_api)
    tmp = _build(_tmp_venv(tmp_path) / "bin" / "python", tmp_path / "ws-tmp", cfg, prefect_api)
    assert home["funnel"]["tasks"] == 3 and home["funnel"]["correct"] >= 1
    keys = ("sourced_modules", "tasks", "candidates", "verified")
    assert {k: tmp["funnel"][k] for k in keys} == {k: home["funnel"][k] for k in keys}
    assert tmp["funnel"]["correct"] == home["funnel"]["correct"]
    assert tmp["published"] and home["published"]
