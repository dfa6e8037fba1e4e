"""Progress: one mechanism (pipeline.runner's sink) from the stage loops to `kernelsynth build`'s
rich bars (done/total, rate, ETA), silent under --json."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pipeline.cli import app, load_plugins
from pipeline.config import Config
from pipeline.runner import LocalExecutor, StageProgress, set_progress_sink
from pipeline.stage import Stage, StageContext, StageOutput
from pipeline.stages import builtin_stages
from pipeline.workspace import Workspace
from schemas import Candidate, Task

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

FAKES = "flows_fake_stages:STAGES"


class Recorder:
    """A ProgressSink that keeps every event."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def start(self, key: int, stage: str, total: int | None) -> None:
        self.events.append(("start", key, stage, total))

    def advance(self, key: int, n: int) -> None:
        self.events.append(("advance", key, n))

    def finish(self, key: int) -> None:
        self.events.append(("finish", key))

    def stages(self) -> dict[str, tuple[int | None, int, bool]]:
        """stage -> (total, items advanced, finished), summed over its bars."""
        names = {e[1]: e[2] for e in self.events if e[0] == "start"}
        out: dict[str, list] = {}
        for e in self.events:
            row = out.setdefault(names[e[1]], [0, 0, True])
            if e[0] == "start":
                row[0] += e[3] or 0
                row[2] = False
            elif e[0] == "advance":
                row[1] += e[2]
            else:
                row[2] = True
        return {k: tuple(v) for k, v in out.items()}


def _count(items: list[Task], ctx: StageContext) -> StageOutput:
    out = StageOutput()
    out.counts["seen"] += len(items)
    return out


def test_executor_batches_report_items_through_the_sink(tmp_path: Path) -> None:
    rec = Recorder()
    previous = set_progress_sink(rec)
    ws = Workspace(tmp_path / "ws")
    stages = replace(builtin_stages(), generate=Stage("generate", Task, Candidate, _count))
    ex = LocalExecutor(ws, Config(), "cpu", stages, ws.new_run("r"))
    tasks = [Task(task_id=f"t{i}", name=f"t{i}", source="", cpu_source="") for i in range(7)]
    try:
        counts = ex.map("double", "generate", [tasks[:3], tasks[3:6], tasks[6:]],
                        [StageContext(Config())] * 3)
        assert counts["seen"] == 7 and ex.rows[-1]["items"] == 7
    finally:
        assert set_progress_sink(previous) is rec
    assert [e[0] for e in rec.events] == ["start", "advance", "advance", "advance", "finish"]
    assert [e[2] for e in rec.events if e[0] == "advance"] == [3, 3, 1]
    assert rec.stages() == {"double": (7, 7, True)}
    # Without a sink nothing is reported and nothing fails.
    with StageProgress("quiet", 2) as progress:
        progress(2)
    assert len(rec.events) == 5


def _config(path: Path) -> Path:
    path.write_text(yaml.safe_dump({"generate": {"variants_per_task": 2}, "repair": {"turns": 1},
                                    "flows": {"batch_size": 3}, "publish": {"name": "kstest"}}))
    return path


def test_build_flows_report_every_item_of_every_batched_stage(prefect_api: str,
                                                              tmp_path: Path) -> None:
    from flows.build import build_dataset

    rec = Recorder()
    previous = set_progress_sink(rec)
    try:
        summary = build_dataset(workspace=str(tmp_path / "ws"), config=str(_config(
            tmp_path / "ks.yaml")), stages=FAKES)
    finally:
        set_progress_sink(previous)
    got = rec.stages()
    rows = {r["stage"]: r for r in summary["stages"]}
    assert got["generate"] == (rows["generate"]["items"], rows["generate"]["items"], True)
    assert rows["generate"]["items"] > 0
    verify = got["verify"]
    assert verify[0] == verify[1] and verify[2] and verify[0] >= rows["verify"]["verdicts"] > 0
    # sources are counted as they are read (no total ahead): the ingest bar ends at what it read
    assert got.pop("ingest") == (0, rows["ingest"]["kind:seed"], True)
    assert all(total == done and finished for total, done, finished in got.values()), got


def test_kernelsynth_build_draws_bars_and_is_quiet_under_json(prefect_api: str,
                                                              tmp_path: Path) -> None:
    if not any(c.name == "build" for c in app.registered_commands):
        load_plugins()  # `build` comes from the flows entry point, as `main()` loads it
    runner = CliRunner()
    cfg = _config(tmp_path / "ks.yaml")
    res = runner.invoke(app, ["build", "--workspace", str(tmp_path / "a"), "--config", str(cfg),
                              "--stages", FAKES, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["published"] is True
    assert "/s" not in res.stderr and "eta" not in res.stderr
    res = runner.invoke(app, ["build", "--workspace", str(tmp_path / "b"), "--config", str(cfg),
                              "--stages", FAKES])
    assert res.exit_code == 0, res.output
    bars = [line for line in res.stderr.splitlines() if "eta" in line]
    assert any(line.lstrip().startswith("generate") for line in bars), res.stderr
    gen = next(line for line in bars if line.lstrip().startswith("generate"))
    assert "/s" in gen and "/" in gen.split("/s")[0]
    assert any(line.lstrip().startswith("verify") for line in bars), res.stderr
    # the summary lists rows per config of the version it published, from its manifest
    manifest = json.loads(next((tmp_path / "b").glob("datasets/*/v1/manifest.json")).read_text())
    table = res.stdout.split("rows per config (v1)", 1)[1]
    for config, splits in manifest["counts"].items():
        cells = [c.strip() for line in table.splitlines() if f" {config} " in line
                 for c in line.split("│")[1:-1]]
        assert cells[:4] == [config, str(splits.get("train", 0)),
                             str(splits.get("validation", 0)), str(sum(splits.values()))], cells


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
