"""`kernelsynth serve` against a real Prefect server: deploy, trigger, a new version per run."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import duckdb
import pytest
import yaml
from flows_harness import VENV_BIN, child_env

FAKES = "flows_fake_stages:STAGES"


@pytest.mark.slow
def test_served_deployment_publishes_a_new_version_per_run(prefect_api: str,
                                                           tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    cfg = tmp_path / "ks.yaml"
    cfg.write_text(yaml.safe_dump({"repair": {"turns": 1}, "publish": {"name": "nightly-test"},
                                   "flows": {"deployment_name": "nightly-test"}}))
    ws = tmp_path / "ws"
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([str(VENV_BIN / "kernelsynth"), "serve", "--workspace", str(ws),
                             "--config", str(cfg), "--stages", FAKES],
                            env=child_env(prefect_api), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        with get_client(sync_client=True) as client:
            while True:
                try:
                    dep = client.read_deployment_by_name("build_dataset/nightly-test")
                    break
                except Exception:
                    assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                    assert time.monotonic() < deadline, "deployment never appeared"
                    time.sleep(0.5)
        (sched,) = dep.schedules
        assert sched.schedule.cron == "0 3 * * *" and sched.active
        assert dep.parameters["always_publish"] is True

        for expected, parent in (("v1", None), ("v2", "v1")):
            run = run_deployment("build_dataset/nightly-test", timeout=300)
            assert run.state.is_completed(), (tmp_path / "serve.log").read_text()[-3000:]
            manifest = json.loads((ws / "datasets" / "nightly-test" / expected /
                                   "manifest.json").read_text())
            assert manifest["parent_version"] == parent
        con = duckdb.connect(str(ws / "catalog.duckdb"), read_only=True)
        rows = con.execute("select version, parent_version from versions order by version")
        assert rows.fetchall() == [("v1", None), ("v2", "v1")]
        con.close()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
