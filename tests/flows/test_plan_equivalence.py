"""One plan, two executors: the step commands run in order and `build_dataset` on the same config
give the same tasks, candidates, verdicts, rows and manifest (timing fields and run ids aside).

The slow stages are the deterministic fakes of flows_fake_stages (real records, real workspace,
real local runner and Prefect flows); selection, dataset rows and publishing are the real ones.
The config turns on everything whose semantics once differed between the two paths: mutation
rounds, several repair turns (with early stop), a non-default selection method.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.datasets.versions import read_version
from pipeline.plan import STEPS
from pipeline.workspace import Workspace
from schemas import Candidate, RawModule, Rejection, Task, Verdict

pytestmark = pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)

FAKES = "flows_fake_stages:STAGES"
CONFIG = {"generate": {"variants_per_task": 2, "mutations_per_kernel": 1, "mutation_rounds": 2,
                       "import_file": ""},
          "repair": {"turns": 3}, "select": {"method": "top_k", "k": 2},
          "flows": {"batch_size": 3}, "publish": {"name": "kseq"}}
# the commands of the plan's steps, in its order
COMMANDS = {"ingest": ["ingest"], "tasks": ["tasks", "build"], "generate": ["generate"],
            "verify": ["verify"], "mutate": ["mutate"], "repair": ["repair"],
            "publish": ["publish"]}
VOLATILE = {"created_at", "runs", "workspace"}  # when and where, not what


def _records(ws: Workspace, cls: type) -> list[dict[str, Any]]:
    rows = ws.read_table(cls).to_pylist()
    return sorted(rows, key=lambda r: r[cls.KEY])


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _version(path: Path) -> tuple[dict[str, Any], dict[str, pa.Table]]:
    manifest = json.loads((path / "manifest.json").read_text())
    # the card names the version's folder (another workspace), so its hash differs
    manifest["files"].pop("README.md")
    return _strip(manifest), read_version(path)


def test_step_commands_and_build_make_the_same_dataset(prefect_api: str, tmp_path: Path
                                                       ) -> None:
    from flows.build import build_dataset

    config = tmp_path / "ks.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    assert list(COMMANDS) == list(STEPS)

    steps_ws = tmp_path / "steps"
    runner = CliRunner()
    outputs = {}
    for step, command in COMMANDS.items():
        res = runner.invoke(app, [*command, "--workspace", str(steps_ws), "--config", str(config),
                                  "--stages", FAKES, "--json"])
        assert res.exit_code == 0, f"{step}: {res.output}"
        outputs[step] = json.loads(res.stdout.strip().splitlines()[-1])
    summary = build_dataset(workspace=str(tmp_path / "build"), config=str(config), stages=FAKES)

    a, b = Workspace(steps_ws), Workspace(tmp_path / "build")
    for cls in (RawModule, Task, Candidate, Verdict, Rejection):
        assert _records(a, cls) == _records(b, cls), cls.TABLE
    cands = a.read(Candidate)
    # the config's every part ran: mutants, repairs over more than one turn, verdicts for all
    assert any(c.generator.startswith("mutate:") for c in cands)
    assert max(c.turn for c in cands) >= 2
    assert {v.candidate_id for v in a.read(Verdict)} == {c.candidate_id for c in cands}
    # drops are counted one way: rejected:<reason>
    assert outputs["generate"]["rejected:no_template"] == 1

    manifest_a, rows_a = _version(Path(outputs["publish"]["path"]))
    manifest_b, rows_b = _version(Path(summary["path"]))
    assert manifest_a == manifest_b
    assert manifest_a["config"]["select"]["method"] == "top_k"
    assert manifest_a["lineage"]["code_commit"] and manifest_a["lineage"]["verifier_versions"]
    assert manifest_a["lineage"]["host"]["python"]
    assert rows_a.keys() == rows_b.keys() and rows_a
    for name in rows_a:
        assert rows_a[name].equals(rows_b[name]), name

    # unchanged inputs: both paths keep the latest version the same way
    again = runner.invoke(app, ["publish", "--workspace", str(steps_ws), "--config", str(config),
                                "--stages", FAKES, "--json"])
    assert json.loads(again.stdout.strip().splitlines()[-1])["published"] is False
    rebuilt = build_dataset(workspace=str(tmp_path / "build"), config=str(config), stages=FAKES)
    assert rebuilt["published"] is False and rebuilt["version"] == summary["version"]
