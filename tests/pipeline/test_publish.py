"""Dataset versions: offline loading of every config, reproducible hashes, integrity, atomicity."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from huggingface_hub import DatasetCard
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.config import Config
from pipeline.datasets.publish import publish_version, publish_workspace
from pipeline.datasets.rows import build_datasets
from pipeline.datasets.versions import (
    PublishError,
    VersionIntegrityError,
    list_versions,
    read_stats,
    read_version,
    verify_version,
)
from pipeline.workspace import Workspace
from tests.pipeline.ks_synthetic import fill_workspace, hf_offline, pool


@pytest.fixture
def published(workspace: Workspace) -> tuple[Workspace, Path]:
    fill_workspace(workspace)
    cfg = Config(workspace=str(workspace.root))
    return workspace, publish_workspace(workspace, cfg)


def test_every_config_loads_offline_with_load_dataset(published, monkeypatch, tmp_path) -> None:
    _, path = published
    cache = hf_offline(monkeypatch, tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["configs"] == ["tasks", "sft", "rft", "rl", "repair", "preference", "review",
                                   "perf_analysis"]
    for config in manifest["configs"]:
        ds = datasets.load_dataset(str(path), name=config, cache_dir=str(cache))
        assert {s: ds[s].num_rows for s in ds} == manifest["counts"][config], config
    sft = datasets.load_dataset(str(path), name="sft", cache_dir=str(cache))["train"]
    assert "role" in str(sft.features["messages"])
    assert sft[0]["messages"][-1]["role"] == "assistant"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_every_config_loads_without_a_warning(published, monkeypatch, tmp_path) -> None:
    _, path = published
    cache = hf_offline(monkeypatch, tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    # the card's YAML is read by datasets and by huggingface_hub: a warning of either fails
    loggers = [logging.getLogger("datasets"), logging.getLogger("huggingface_hub")]
    handler = _Records()
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for config in manifest["configs"]:
                ds = datasets.load_dataset(str(path), name=config, cache_dir=str(cache))
                assert {s: ds[s].num_rows for s in ds} == manifest["counts"][config], config
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert [str(w.message) for w in caught] == []
    assert [r.getMessage() for r in handler.records] == []
    # and the metadata says what the files hold: rows and bytes per split, from the Parquet
    card = DatasetCard.load(path / "README.md").data.to_dict()
    info = {i["config_name"]: i for i in card["dataset_info"]}
    for config in manifest["configs"]:
        splits = {s["name"]: s for s in info[config]["splits"]}
        assert {k: s["num_examples"] for k, s in splits.items()} == manifest["counts"][config]
        assert all(s["num_bytes"] > 0 for s in splits.values())
        parquet = [f for f in manifest["files"] if f.startswith(f"{config}/")]
        assert info[config]["download_size"] == sum(manifest["files"][f]["bytes"]
                                                    for f in parquet)


def test_card_lists_every_config_with_data_files(published) -> None:
    _, path = published
    text = (path / "README.md").read_text()
    front = yaml.safe_load(text.split("---")[1])
    names = [c["config_name"] for c in front["configs"]]
    assert names == json.loads((path / "manifest.json").read_text())["configs"]
    for c in front["configs"]:
        for entry in c["data_files"]:
            assert list(path.glob(entry["path"])), entry
    assert "## Statistics" in text and "| correct |" in text and "## How it was made" in text
    # tags and card name exactly the backends of the rows (the synthetic workspace's)
    manifest = json.loads((path / "manifest.json").read_text())
    rows = pq.read_table(next((path / "sft").glob("*.parquet"))).column("backend").to_pylist()
    backends = manifest["lineage"]["backends"]
    assert set(rows) <= set(backends) and backends
    tags = front["tags"]
    assert ("cuda" in tags) == ("cuda" in backends)
    assert ("gpu-kernels" in tags) == bool({"cuda", "musa"} & set(backends))


def test_cpu_only_version_is_not_tagged_as_gpu_kernels() -> None:
    from pipeline.datasets.card import backend_sentence, backend_tags

    assert "cuda" not in backend_tags(["cpu"]) and "gpu-kernels" not in backend_tags(["cpu"])
    assert {"cpp", "cpu-kernels"} <= set(backend_tags(["cpu"]))
    assert {"cuda", "gpu-kernels", "cpp"} <= set(backend_tags(["cpu", "cuda"]))
    assert "checked on the CPU" in backend_sentence(["cpu"])


def test_publishing_twice_gives_same_hashes_and_a_parent(published) -> None:
    ws, first = published
    second = publish_workspace(ws, Config(workspace=str(ws.root)))
    m1 = json.loads((first / "manifest.json").read_text())
    m2 = json.loads((second / "manifest.json").read_text())
    assert (m1["version"], m2["version"], m2["parent_version"]) == ("v1", "v2", "v1")
    assert m1["content_hash"] == m2["content_hash"]
    data = {p: f["sha256"] for p, f in m1["files"].items() if p.endswith(".parquet")}
    assert data == {p: f["sha256"] for p, f in m2["files"].items() if p.endswith(".parquet")}
    assert list_versions(ws, "kernelsynth") == ["v1", "v2"]
    assert m2["lineage"]["verifier_versions"] == ["0.1.0"]
    assert m2["lineage"]["devices"] == ["NVIDIA H100 80GB HBM3"]
    assert len(m2["lineage"]["source_commits"]) == 6
    assert m2["config"]["select"]["k"] == 4


def test_hand_edited_version_is_a_hash_mismatch(published) -> None:
    _, path = published
    verify_version(path)
    shard = next(path.glob("sft/train-*.parquet"))
    table = pq.read_table(shard)
    pq.write_table(table.slice(0, 1), shard)
    with pytest.raises(VersionIntegrityError, match=r"sft/train-.*content hash mismatch"):
        read_version(path)


def test_added_or_removed_file_is_reported(published) -> None:
    _, path = published
    (path / "notes.txt").write_text("hand-written")
    with pytest.raises(VersionIntegrityError, match="notes.txt: file not in the manifest"):
        verify_version(path)
    (path / "notes.txt").unlink()
    (path / "README.md").unlink()
    with pytest.raises(VersionIntegrityError, match="README.md: listed in the manifest but"):
        verify_version(path)


def test_a_failed_publish_leaves_nothing_behind(workspace: Workspace, monkeypatch) -> None:
    tasks, cands, verdicts = pool(n_tasks=3)
    cfg = Config(workspace=str(workspace.root))
    tables = build_datasets(tasks, cands, verdicts, [], cfg)
    bad = dict(tables, sft=tables["sft"].drop_columns(["reward"]))
    with pytest.raises(PublishError, match="config 'sft': schema differs"):
        publish_version(workspace, bad, cfg, {})
    with pytest.raises(PublishError, match="nothing to publish"):
        publish_version(workspace, {k: t.slice(0, 0) for k, t in tables.items()}, cfg, {})
    import pipeline.datasets.publish as publish_mod

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(publish_mod, "render_card", crash)
    with pytest.raises(OSError, match="disk full"):
        publish_version(workspace, tables, cfg, {})
    root = workspace.datasets_dir / "kernelsynth"
    assert list(root.iterdir()) == []  # no version and no temp folder
    monkeypatch.undo()
    path = publish_version(workspace, tables, cfg, {})
    assert path.name == "v1"
    with pytest.raises(PublishError, match="already exists"):
        publish_version(workspace, tables, cfg, {}, version="v1")


def test_empty_config_is_left_out_and_the_rest_loads(workspace: Workspace, monkeypatch,
                                                     tmp_path) -> None:
    tasks, cands, verdicts = pool(n_tasks=2)
    cfg = Config(workspace=str(workspace.root))
    tables = build_datasets(tasks, [], [], [], cfg)
    assert tables["review"].num_rows == 0 and tables["tasks"].num_rows == 2
    path = publish_version(workspace, tables, cfg, {})
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["configs"] == ["tasks", "rl"]
    assert "review" in manifest["empty_configs"] and not (path / "review").exists()
    assert "`review`" in (path / "README.md").read_text()
    cache = hf_offline(monkeypatch, tmp_path)
    for config in manifest["configs"]:
        ds = datasets.load_dataset(str(path), name=config, cache_dir=str(cache))
        assert sum(d.num_rows for d in ds.values()) == 2


@pytest.mark.parametrize("kind", ["corrupt", "foreign"])
def test_bad_parquet_in_workspace_is_a_clear_cli_error(workspace: Workspace, kind: str) -> None:
    fill_workspace(workspace)
    part = workspace.root / "runs" / "r2" / "verdicts" / "part-00000-deadbeef.parquet"
    part.parent.mkdir(parents=True)
    if kind == "corrupt":
        part.write_bytes(b"PAR1 this is not parquet")
    else:
        pq.write_table(pa.table({"something": [1, 2]}), part)
    res = CliRunner().invoke(app, ["publish", "--workspace", str(workspace.root)])
    assert res.exit_code == 1
    assert "part-00000-deadbeef.parquet" in res.output
    assert ("not a readable Parquet" if kind == "corrupt" else "foreign schema") in res.output
    assert not (workspace.datasets_dir / "kernelsynth").exists()


def test_cli_publish_json(workspace: Workspace) -> None:
    fill_workspace(workspace, n_tasks=3)
    res = CliRunner().invoke(app, ["publish", "--workspace", str(workspace.root), "--json",
                                   "--name", "small"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout.strip().splitlines()[-1])
    assert info["version"] == "v1" and Path(info["path"]).parent.name == "small"
    assert info["counts"]["tasks"]["train"] + info["counts"]["tasks"].get("validation", 0) == 3


def test_publish_version_without_stats_stores_workspace_stats(workspace: Workspace) -> None:
    fill_workspace(workspace, n_tasks=3)
    cfg = Config(workspace=str(workspace.root))
    tasks, cands, verdicts = pool(n_tasks=3)
    path = publish_version(workspace, build_datasets(tasks, cands, verdicts, [], cfg), cfg,
                           {"source_commits": ["r@c"]})
    stats = read_stats(path)
    assert stats["funnel"]["deduped"] == 3 and stats["funnel"]["generated"] == len(cands)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["lineage"]["source_commits"] == ["r@c"]
    assert "stats.json" in manifest["files"]
