"""build_dataset against a real Prefect server: incremental re-runs, SIGKILL and resume, Ray.

The slow stages are the deterministic fakes of flows_fake_stages (real records, real workspace);
selection, dataset building, publishing and the catalog are the real ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
import yaml
from flows_harness import child_env

from pipeline.workspace import Workspace
from schemas import Candidate, RawModule, Rejection, Task, Verdict

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

FAKES = "flows_fake_stages:STAGES"
CONFIG = {"generate": {"variants_per_task": 2}, "repair": {"turns": 1},
          "flows": {"batch_size": 3}, "publish": {"name": "kstest"}}


def _write_config(path: Path, **flows: object) -> Path:
    data = json.loads(json.dumps(CONFIG))
    data["flows"].update(flows)
    path.write_text(yaml.safe_dump(data))
    return path


def _manifest(version_dir: str | Path) -> dict:
    return json.loads((Path(version_dir) / "manifest.json").read_text())


def _no_duplicates(ws: Workspace) -> None:
    for cls in (RawModule, Task, Candidate, Verdict, Rejection):
        raw = ws.read_table(cls, dedupe=False)
        assert raw.num_rows == len(set(raw.column(cls.KEY).to_pylist())), cls.TABLE


@pytest.fixture(scope="module")
def reference(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One uninterrupted build with the fake stages, shared by the tests below."""
    from flows.build import build_dataset

    root = tmp_path_factory.mktemp("reference")
    cfg = _write_config(root / "ks.yaml")
    summary = build_dataset(workspace=str(root / "ws"), config=str(cfg), stages=FAKES)
    return {"summary": summary, "root": root, "config": cfg}


def test_build_publishes_a_version_with_the_funnel(reference: dict) -> None:
    s = reference["summary"]
    assert s["published"] and s["version"] == "v1" and s["parent"] is None
    stages = {r["stage"]: r for r in s["stages"]}
    # every mutant failed, so the retry round (mutate:2) makes none and verifies nothing
    # the plan's order: per-task generators, then the sample import (the whole file at once)
    assert list(stages) == ["ingest", "tasks", "generate", "generate:import", "verify", "mutate",
                            "verify:mutants", "mutate:2", "repair:1", "verify:repair1",
                            "publish"]
    assert stages["mutate:2"]["candidates"] == 0
    # 6 modules -> 6 tasks; 5 with templates x 2 variants; one rejected (no template)
    assert stages["generate"]["candidates"] == 10 and stages["generate"]["rejections"] == 1
    ws = Workspace(s["workspace"])
    verdicts = ws.read(Verdict)
    assert len(verdicts) == len(ws.read(Candidate)) == s["funnel"]["candidates"]
    correct = [v for v in verdicts if v.status.startswith("correct")]
    assert s["funnel"]["correct"] == len(correct)
    assert s["funnel"]["pass_rate"] == round(len(correct) / len(verdicts), 4)
    # every mutant of a correct first attempt failed and got a repair turn
    mutants = [c for c in ws.read(Candidate) if c.generator.startswith("mutate:")]
    assert mutants and stages["verify:mutants"]["verdicts"] == len(mutants)
    # the version is on disk, loads, and is registered in the catalog
    manifest = _manifest(s["path"])
    assert manifest["version"] == "v1" and manifest["parent_version"] is None
    assert manifest["counts"]["tasks"]["train"] + manifest["counts"]["tasks"].get(
        "validation", 0) == 6
    con = duckdb.connect(str(ws.catalog_path), read_only=True)
    assert con.execute("select version, parent_version from versions").fetchall() == [("v1", None)]
    con.close()
    _no_duplicates(ws)


def test_second_run_with_nothing_new_keeps_the_version(reference: dict) -> None:
    from flows.build import build_dataset

    s = reference["summary"]
    t0 = time.perf_counter()
    again = build_dataset(workspace=s["workspace"], config=str(reference["config"]),
                          stages=FAKES)
    wall = time.perf_counter() - t0
    assert not again["published"] and again["version"] == "v1"
    new = {r["stage"]: r for r in again["stages"]}
    assert new["ingest"]["raw_modules"] == 0 and new["ingest"]["existing"] == 6
    assert new["tasks"]["items"] == 0 and new["tasks"].get("tasks", 0) == 0
    # a mutate round or repair turn that makes nothing ends its step: nothing to verify after
    assert [n for n in new if n not in ("ingest", "tasks", "publish")] == [
        "generate", "generate:import", "verify", "mutate", "repair:1"]
    for name in ("generate", "generate:import", "verify", "mutate", "repair:1"):
        assert new[name].get("candidates", 0) == 0 and new[name].get("verdicts", 0) == 0, name
    assert again["funnel"] == s["funnel"]
    assert wall < 60
    assert sorted(p.name for p in (Path(s["workspace"]) / "datasets" / "kstest").iterdir()) == [
        "v1"]


def _verdict_rows(ws_root: Path) -> int:
    return sum(pq.ParquetFile(p).metadata.num_rows
               for p in ws_root.glob("runs/*/verdicts/part-*.parquet"))


def test_sigkill_during_verification_then_resume_gives_the_same_dataset(
        reference: dict, prefect_api: str, tmp_path: Path) -> None:
    from flows.build import build_dataset

    ws_root = tmp_path / "ws"
    cfg = _write_config(tmp_path / "ks.yaml", batch_size=2)
    data = yaml.safe_load(cfg.read_text())
    data["verify"] = {"write_batch": 2}  # verify batches are the stage's own size
    cfg.write_text(yaml.safe_dump(data))
    code = ("import sys; from flows.build import build_dataset; "
            "build_dataset(workspace=sys.argv[1], config=sys.argv[2], stages=sys.argv[3])")
    proc = subprocess.Popen([sys.executable, "-c", code, str(ws_root), str(cfg), FAKES],
                            env=child_env(prefect_api, KS_FAKE_VERIFY_SLEEP="0.5"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        # Kill as soon as some first-attempt verdicts are written, but not all of them.
        while _verdict_rows(ws_root) < 2:
            assert proc.poll() is None, proc.stderr.read().decode(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "verification never started"
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    killed_at = _verdict_rows(ws_root)
    assert 2 <= killed_at < 10  # mid-verification: 10 first attempts to verify
    assert not (ws_root / "datasets").exists()

    resumed = build_dataset(workspace=str(ws_root), config=str(cfg), stages=FAKES)
    first = {r["stage"]: r for r in resumed["stages"]}
    assert first["generate"]["candidates"] == 0  # generated before the kill, not again
    assert first["verify"]["verdicts"] == 10 - killed_at  # only what was lost
    ws = Workspace(ws_root)
    _no_duplicates(ws)
    ref = _manifest(reference["summary"]["path"])
    got = _manifest(resumed["path"])
    assert got["content_hash"] == ref["content_hash"]
    assert got["counts"] == ref["counts"]
    assert resumed["funnel"] == reference["summary"]["funnel"]


@pytest.mark.slow  # a local Ray instance costs 15-40 s to start here
def test_ray_runs_the_verify_step_with_gpu_and_cpu_placement(prefect_api: str,
                                                               tmp_path: Path) -> None:
    import flows_fake_stages as fake

    from flows.build import PrefectExecutor, ray_session, step_flow
    from pipeline.config import load_config
    from pipeline.plan import pin_backend

    cfg = load_config(_write_config(tmp_path / "ks.yaml", runner="ray", ray_num_cpus=2,
                                    ray_num_gpus=1, batch_size=4), tmp_path / "ws")
    cfg = cfg.model_copy(update={"verify": cfg.verify.model_copy(update={"write_batch": 4})})
    ws = Workspace(cfg.workspace)
    run = ws.new_run("seed")
    fake.ingest(ws, run, cfg)
    fake.tasks(ws, run, cfg)
    cands, _ = fake.generate(ws.read(Task), cfg.generate, "cuda")
    run.write(cands)
    compile_log = tmp_path / "compiles.jsonl"
    os.environ["KS_FAKE_COMPILE_LOG"] = str(compile_log)  # Ray workers inherit it at start
    cfg, backend = pin_backend(cfg, fake.GPU_STAGES)
    ex = PrefectExecutor(ws, cfg, backend, fake.GPU_STAGES, "flows_fake_stages:GPU_STAGES",
                         "r-ray")
    try:
        with ray_session(cfg):
            counts = step_flow("verify", ex)
    finally:
        os.environ.pop("KS_FAKE_COMPILE_LOG", None)
    assert counts["verdicts"] == len(cands) == 10, counts
    verdicts = ws.read(Verdict)
    assert {v.candidate_id for v in verdicts} == {c.candidate_id for c in cands}
    # every GPU batch ran in a Ray task holding one GPU; compiles ran on CPUs only
    assert {json.loads(v.device).get("GPU") for v in verdicts} == {1.0}
    compiles = [json.loads(line) for line in compile_log.read_text().splitlines()]
    assert sum(c["n"] for c in compiles) == 10
    assert all("GPU" not in json.loads(c["device"]) for c in compiles)
