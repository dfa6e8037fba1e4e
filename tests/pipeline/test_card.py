"""Licenses and provenance on every row, the publish license allowlist, and the dataset card."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub import DatasetCard

from pipeline.config import Config
from pipeline.datasets.publish import publish_workspace
from pipeline.datasets.stats import backend_funnel, compute_stats, metric_definition
from pipeline.datasets.tables import config_schema
from pipeline.datasets.versions import read_stats
from pipeline.tasks.extract import source_generator
from pipeline.workspace import Workspace
from schemas import PROVENANCE_FIELDS, RawModule, Rejection, Task
from tests.pipeline.ks_synthetic import pool, raw_modules, rejections
from verifier.protocol import CORRECT_STATUSES

GPL_TASK = "task000"


def _fill(ws: Workspace, gpl: bool = True) -> tuple[list[Task], list, list]:
    tasks, cands, verdicts = pool(6)
    if gpl:
        tasks = [replace(t, license="GPL-3.0") if t.task_id == GPL_TASK else t for t in tasks]
    run = ws.new_run("r1")
    for records in (raw_modules(tasks), tasks, cands, verdicts, rejections()):
        run.write(records)
    return tasks, cands, verdicts


def _config_rows(path: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in sorted(path.glob("*/*.parquet")):
        out.setdefault(f.parent.name, []).extend(pq.read_table(f).to_pylist())
    return out


@pytest.fixture
def published(workspace: Workspace) -> tuple[Workspace, Path, list[Task], list, list]:
    tasks, cands, verdicts = _fill(workspace)
    cfg = Config(workspace=str(workspace.root))
    cfg.publish.hub_repo = "kernel-org/kernelsynth-test"
    return workspace, publish_workspace(workspace, cfg), tasks, cands, verdicts


def test_every_row_carries_its_task_provenance_and_gpl_is_left_out(published) -> None:
    ws, path, tasks, _, _ = published
    by_id = {t.task_id: t for t in tasks}
    rows = _config_rows(path)
    assert {"tasks", "sft", "rft", "rl", "preference", "review", "perf_analysis"} <= set(rows)
    for config, items in rows.items():
        assert items, config
        for r in items:
            assert r["task_id"] != GPL_TASK, f"{config}: GPL row published"
            task = by_id[r["task_id"]]
            for f in PROVENANCE_FIELDS:
                assert r[f] == getattr(task, f), (config, f)
            assert r["license"] in ("MIT", "Apache-2.0", "BSD-3-Clause")
    nnsmith = [r for r in rows["tasks"] if r["source_kind"] == "nnsmith"]
    assert nnsmith and all(r["source_generator"].startswith("nnsmith@") for r in nnsmith)
    rej = [r for r in ws.read(Rejection) if r.stage == "publish"]
    assert [(r.item_id, r.reason) for r in rej] == [(GPL_TASK, "license_not_allowed: GPL-3.0")]
    # Publishing again records no second copy of the same rejection.
    publish_workspace(ws, Config(workspace=str(ws.root)))
    assert len([r for r in ws.read(Rejection) if r.stage == "publish"]) == 1


def test_card_metadata_parses_with_dataset_card(published) -> None:
    _, path, _, _, _ = published
    card = DatasetCard.load(path / "README.md")
    data = card.data.to_dict()
    manifest = json.loads((path / "manifest.json").read_text())
    assert data["license"] == ["apache-2.0", "bsd-3-clause", "mit"]
    assert data["task_categories"] == ["text-generation"]
    total = sum(sum(c.values()) for c in manifest["counts"].values())
    assert total < 1000 and data["size_categories"] == ["n<1K"]
    assert [c["config_name"] for c in data["configs"]] == manifest["configs"]
    for c in data["configs"]:
        assert {d["split"] for d in c["data_files"]} == set(manifest["counts"][c["config_name"]])
        for d in c["data_files"]:
            assert list(path.glob(d["path"])), d["path"]
    info = {i["config_name"]: i for i in data["dataset_info"]}
    assert set(info) == set(manifest["configs"])
    for name, i in info.items():
        assert [f["name"] for f in i["features"]] == config_schema(name).names
        assert {s["name"]: s["num_examples"] for s in i["splits"]} == manifest["counts"][name]
    text = card.text
    assert 'load_dataset("kernel-org/kernelsynth-test", name="sft")' in text
    assert "<ORG>" not in text and "<repo" not in text
    # Licenses with row counts: the counts are those of the published files.
    rows = _config_rows(path)
    for lic in ("MIT", "Apache-2.0", "BSD-3-Clause"):
        n_tasks = sum(r["license"] == lic for r in rows["tasks"])
        n_rows = sum(r["license"] == lic for items in rows.values() for r in items)
        assert f"| {lic} | {n_tasks} | {n_rows} |" in text
    assert "GPL-3.0 (1)" in text
    assert "- backend: cuda" in text and "- verifier version:" in text and "- torch:" in text


def test_card_metrics_equal_stats_and_are_defined(published) -> None:
    ws, path, tasks, cands, verdicts = published
    stats = read_stats(path)
    text = DatasetCard.load(path / "README.md").text
    table = dict(re.findall(r"^\| (\S+) \| (\S+) \| .+ \|$", text, re.M))
    for key, value in stats["metrics"].items():
        want = "n/a" if value is None else (f"{value:.4g}" if isinstance(value, float)
                                            else str(value))
        assert table[key] == want, key
        assert f"| {key} | {want} | {metric_definition(key)} |" in text
    # first_attempt_pass_rate by its definition, from the raw records.
    vmap = {v.candidate_id: v for v in verdicts}
    first = [c for c in cands if c.turn == 0 and not c.generator.startswith("mutate:")]
    ok = sum(vmap[c.candidate_id].status in CORRECT_STATUSES for c in first)
    assert stats["metrics"]["first_attempt_pass_rate"] == pytest.approx(ok / len(first))
    funnel = backend_funnel(7, tasks, cands, verdicts, "cuda")
    assert funnel["first_attempt_pass_rate"] == round(ok / len(first), 4)
    assert ok < len(first)  # the synthetic pool has failing first attempts


def test_card_without_repo_id_names_the_local_folder(workspace: Workspace) -> None:
    _fill(workspace, gpl=False)
    path = publish_workspace(workspace, Config(workspace=str(workspace.root)))
    assert f'load_dataset("{path}", name="sft")' in (path / "README.md").read_text()


def test_metric_definition_covers_every_computed_metric() -> None:
    tasks, cands, verdicts = pool(4)
    for key in compute_stats(tasks, cands, verdicts)["metrics"]:
        assert metric_definition(key)
    with pytest.raises(KeyError, match="no definition"):
        metric_definition("made_up")


def test_old_task_parts_are_upgraded_with_defaults(workspace: Workspace) -> None:
    tasks, _, _ = pool(2)
    table = Task.to_arrow(tasks).drop_columns(["license", "source_generator"])
    old = table.replace_schema_metadata({b"kernelsynth.table": b"tasks",
                                         b"kernelsynth.schema_version": b"1"})
    folder = workspace.root / "runs" / "old" / "tasks"
    folder.mkdir(parents=True)
    pq.write_table(old, folder / "part-00000-aaaaaaaa.parquet")
    got = workspace.read(Task)
    assert [t.task_id for t in got] == [t.task_id for t in tasks]
    assert all(t.license == "" and t.source_generator == "" for t in got)
    # A table claiming the current version but lacking columns is still an error.
    pq.write_table(old.replace_schema_metadata({b"kernelsynth.table": b"tasks",
                                                b"kernelsynth.schema_version": b"2"}),
                   folder / "part-00001-bbbbbbbb.parquet")
    with pytest.raises(Exception, match="license"):
        workspace.read(Task)
    assert isinstance(table, pa.Table)


def test_source_generator_names_nnsmith_seed_and_seed_corpus() -> None:
    nn = RawModule("m1", "nnsmith", "https://github.com/ise-uiuc/nnsmith", "v0.2", "g/1",
                   "Apache-2.0", "Model", "x", meta=json.dumps({"seed": 17}))
    seed = RawModule("m2", "seed", "builtin:kernelsynth/sources/seed", "abc", "a.py",
                     "Apache-2.0", "Model", "x")
    git = RawModule("m3", "git", "https://github.com/a/b", "abc", "a.py", "MIT", "M", "x")
    assert source_generator(nn) == "nnsmith@v0.2 seed=17"
    assert source_generator(seed) == "kernelsynth seed corpus@abc"
    assert source_generator(git) == ""


def test_tasks_without_a_license_take_their_modules_at_publish(workspace: Workspace) -> None:
    from pipeline.datasets.publish import publishable_tasks

    tasks, _, _ = pool(3)
    mods = raw_modules(tasks)
    mods[1] = replace(mods[1], license="GPL-2.0")
    unlicensed = [replace(t, license="", module_id=m.module_id) for t, m in zip(tasks, mods[:3],
                                                                                 strict=True)]
    run = workspace.new_run("r1")
    run.write(mods)
    run.write(unlicensed)
    cfg = Config(workspace=str(workspace.root))
    got = {t.task_id: t.license for t in publishable_tasks(workspace, cfg)}
    assert got == {t.task_id: m.license for t, m in zip(tasks, mods[:3], strict=True)}
    rej = [r for r in workspace.read(Rejection) if r.stage == "publish"]
    assert [(r.item_id, r.reason) for r in rej] == [(tasks[1].task_id,
                                                     "license_not_allowed: GPL-2.0")]


def test_card_claims_only_what_was_measured(workspace: Workspace) -> None:
    tasks, cands, verdicts = pool(6)
    for v in verdicts:  # this version timed no torch.compile baseline
        v.compiled_us = v.speedup_compiled = None
    run = workspace.new_run("r1")
    for records in (raw_modules(tasks), tasks, cands, verdicts, rejections()):
        run.write(records)
    path = publish_workspace(workspace, Config(workspace=str(workspace.root)))
    text = DatasetCard.load(path / "README.md").text
    assert "torch.compile was not timed for this version" in text
    assert "timing against eager and torch.compile" not in text
    assert "correct fast kernel (chosen)" not in text
    assert "`speed` pairs two correct kernels" in text
    # sample metrics say whose samples they are (the synthetic pool's are `llm:qwen`)
    assert re.search(r"pass@k, avg@k and fast_p are over the sampled responses \(`llm:qwen`\)",
                     text)
