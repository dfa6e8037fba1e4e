"""Pushing versions to a loopback Hub (tests/pipeline/hub_server.py) through the real HfApi."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import datasets
import huggingface_hub
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from huggingface_hub import HfApi, snapshot_download
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.config import Config
from pipeline.datasets.hub import HubError, check_repo_id, push_version
from pipeline.datasets.publish import publish_workspace
from pipeline.datasets.versions import read_version
from pipeline.workspace import Workspace
from tests.pipeline.hub_server import HubServer
from tests.pipeline.ks_synthetic import fill_workspace, hf_offline

REPO = "kernel-org/kernelsynth"


@pytest.fixture
def hub():
    with HubServer() as server:
        yield server


def _publish(ws: Workspace, shard_rows: int, validation_fraction: float = 0.1) -> Path:
    cfg = Config(workspace=str(ws.root))
    cfg.publish.shard_rows = shard_rows
    cfg.publish.validation_fraction = validation_fraction
    return publish_workspace(ws, cfg)


@pytest.fixture
def two_versions(workspace: Workspace) -> tuple[Path, Path]:
    """v1: one shard per split; v2: other rows (validation fraction) in 2-row shards."""
    fill_workspace(workspace, n_tasks=4)
    v1 = _publish(workspace, shard_rows=100_000)
    v2 = _publish(workspace, shard_rows=2, validation_fraction=0.5)
    return v1, v2


def _shards(files: dict[str, bytes] | list[str]) -> set[str]:
    return {f for f in files if f.endswith(".parquet")}


def _rows(table: pa.Table) -> Counter:
    """Every row as canonical JSON, counted (a duplicate row counts twice)."""
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())


def _download(hub: HubServer, revision: str, cache: Path) -> Path:
    return Path(snapshot_download(REPO, repo_type="dataset", revision=revision,
                                  endpoint=hub.url, cache_dir=str(cache), token="hf_test"))


def test_each_push_is_exactly_its_version_and_tags_load_with_datasets(
        two_versions, hub: HubServer, monkeypatch, tmp_path) -> None:
    v1, v2 = two_versions
    api = HfApi(endpoint=hub.url)
    p1 = push_version(v1, REPO, token="hf_test", api=api)
    p2 = push_version(v2, REPO, token="hf_test", api=api)
    assert (p1.relation, p2.relation) == ("first", "newer")
    assert _shards(hub.files(REPO, "v1")) == _shards(json.loads((v1 / "manifest.json")
                                                                .read_text())["files"])
    # v2 shards most splits differently: every v1 shard that v2 does not have was deleted in
    # v2's one commit (a split small enough for one shard keeps its name and is overwritten).
    v1_shards, v2_shards = _shards(hub.files(REPO, "v1")), _shards(hub.files(REPO, "v2"))
    assert v1_shards and v2_shards and len(v1_shards - v2_shards) >= 4
    assert set(p2.deletes) == v1_shards - v2_shards
    v2_files = json.loads((v2 / "manifest.json").read_text())["files"]
    assert set(hub.files(REPO, "main")) == {".gitattributes", "manifest.json", *v2_files}
    commits = [m for m in hub.state.requests if m[1].endswith("/commit/main")]
    assert len(commits) == 2  # one commit per push
    refs = api.list_repo_refs(REPO, repo_type="dataset")
    tags = {t.name: t.target_commit for t in refs.tags}
    assert tags == {"v1": p1.commit_oid, "v2": p2.commit_oid}
    assert refs.branches[0].target_commit == p2.commit_oid

    snapshots = {rev: _download(hub, rev, tmp_path / "dl") for rev in ("main", "v1", "v2")}
    cache = hf_offline(monkeypatch, tmp_path)
    for rev, version in (("main", v2), ("v1", v1), ("v2", v2)):
        manifest = json.loads((snapshots[rev] / "manifest.json").read_text())
        assert manifest["version"] == version.name
        local = read_version(version)
        for config in manifest["configs"]:
            ds = datasets.load_dataset(str(snapshots[rev]), name=config, cache_dir=str(cache))
            for split in ds:
                want = local[config].filter(pc.equal(local[config]["split"], split))
                got = _rows(ds[split].data.table)
                assert got == _rows(want), f"{rev} {config}/{split}"
                assert max(got.values()) == 1, f"{rev} {config}/{split}: duplicate rows"
            assert {s: ds[s].num_rows for s in ds} == manifest["counts"][config]
    # v1 and v2 really differ, so the tag checks above are not the same check twice.
    assert (json.loads((v1 / "manifest.json").read_text())["counts"]
            != json.loads((v2 / "manifest.json").read_text())["counts"])


def test_older_version_never_rewinds_main_without_force(two_versions, hub: HubServer) -> None:
    v1, v2 = two_versions
    api = HfApi(endpoint=hub.url)
    push_version(v1, REPO, token="hf_test", api=api)
    p2 = push_version(v2, REPO, token="hf_test", api=api)
    with pytest.raises(HubError, match="main holds v2, which descends from v1: pushing v1 "
                                       "would rewind main; pass --force"):
        push_version(v1, REPO, token="hf_test", api=api)
    assert hub.state.repos[("dataset", REPO)].branches["main"] == p2.commit_oid
    # Pushing what main already holds commits nothing.
    again = push_version(v2, REPO, token="hf_test", api=api)
    assert again.relation == "same" and again.commit_oid == p2.commit_oid and not again.deletes
    forced = push_version(v1, REPO, token="hf_test", api=api, force=True)
    assert forced.relation == "forced-older"
    assert _shards(hub.files(REPO, "main")) == _shards(hub.files(REPO, "v1"))
    assert set(hub.files(REPO, "main")) == set(hub.files(REPO, "v1"))


def test_foreign_main_and_conflicting_tag_are_refused(two_versions, hub: HubServer,
                                                      tmp_path) -> None:
    v1, _ = two_versions
    api = HfApi(endpoint=hub.url)
    api.create_repo(REPO, repo_type="dataset", token="hf_test")
    (tmp_path / "notes.txt").write_text("someone else's file")
    api.upload_file(path_or_fileobj=str(tmp_path / "notes.txt"), path_in_repo="notes.txt",
                    repo_id=REPO, repo_type="dataset", token="hf_test")
    with pytest.raises(HubError, match=r"not this dataset's kernelsynth versions \(notes.txt\)"):
        push_version(v1, REPO, token="hf_test", api=api)
    plan = push_version(v1, REPO, token="hf_test", api=api, force=True)
    assert plan.deletes == ["notes.txt"] and "notes.txt" not in hub.files(REPO, "main")

    # A v1 published elsewhere (another manifest) is not silently taken for ours.
    other = Workspace(tmp_path / "other")
    fill_workspace(other, n_tasks=3)
    v1_other = _publish(other, shard_rows=100_000)
    with pytest.raises(HubError, match="another v1 was published there"):
        push_version(v1_other, REPO, token="hf_test", api=api)
    moved = push_version(v1_other, REPO, token="hf_test", api=api, force=True)
    assert moved.relation == "forced-diverged"
    assert hub.state.repos[("dataset", REPO)].tags["v1"] == moved.commit_oid != plan.commit_oid
    assert hub.files(REPO, "v1")["manifest.json"] == (v1_other / "manifest.json").read_bytes()


def test_dry_run_lists_operations_and_calls_nothing(two_versions, hub: HubServer) -> None:
    v1, _ = two_versions
    plan = push_version(v1, "org/name", token=None, dry_run=True,
                        api=HfApi(endpoint=hub.url))
    assert hub.state.requests == []
    lines = plan.describe()
    assert lines[0].startswith("create_repo org/name") and lines[-1] == "create_tag org/name v1"
    assert any(line.startswith("add sft/train-") for line in lines)
    assert "delete every file on main that the version does not have" in lines


@pytest.mark.parametrize("repo", ["noslash", "a/b/c", "org/bad name", "org/-x-", "", "org/"])
def test_invalid_repo_names(repo: str) -> None:
    with pytest.raises(HubError, match="invalid repo name"):
        check_repo_id(repo)
    assert check_repo_id("my-org/kernel_data.v2") == "my-org/kernel_data.v2"


def test_missing_token_and_api_failure_are_clear(two_versions, hub: HubServer) -> None:
    v1, _ = two_versions
    with pytest.raises(HubError, match="no Hugging Face token: set HF_TOKEN"):
        push_version(v1, "org/name", token=None, api=HfApi(endpoint=hub.url))
    assert hub.state.requests == []
    dead = HfApi(endpoint="http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(HubError, match="push of v1 to org/name failed: "):
        push_version(v1, "org/name", token="hf_x", api=dead)


def test_edited_version_is_not_pushed(two_versions, hub: HubServer) -> None:
    v1, _ = two_versions
    (v1 / "README.md").write_text("edited")
    from pipeline.datasets.versions import VersionIntegrityError

    with pytest.raises(VersionIntegrityError, match="README.md: content hash mismatch"):
        push_version(v1, "org/name", token="hf_x", api=HfApi(endpoint=hub.url))
    assert hub.state.requests == []


def test_cli_push_reads_token_at_the_edge(two_versions, workspace: Workspace, hub: HubServer,
                                          monkeypatch) -> None:
    # What HF_ENDPOINT sets at import: the API base and the download URL template.
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    runner = CliRunner()
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    ws = ["-w", str(workspace.root)]
    res = runner.invoke(app, ["push", "v1", "--repo", "org/name", *ws])
    assert res.exit_code == 1 and "no Hugging Face token" in res.output
    res = runner.invoke(app, ["push", "v1", "--repo", "bad", *ws])
    assert res.exit_code == 1 and "invalid repo name 'bad'" in res.output
    res = runner.invoke(app, ["push", "v1", "--repo", "org/name", "--dry-run", *ws])
    assert res.exit_code == 0 and "(dry run) create_tag org/name v1" in res.output
    assert hub.state.requests == []
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    res = runner.invoke(app, ["push", "v2", "--repo", "org/name", "--public", "--json", *ws])
    assert res.exit_code == 0, res.output
    assert hub.state.repos[("dataset", "org/name")].private is False
    assert json.loads(res.stdout.strip().splitlines()[-1])["version"] == "v2"
    res = runner.invoke(app, ["push", "v1", "--repo", "org/name", *ws])
    assert res.exit_code == 1 and "would rewind main" in res.output
    res = runner.invoke(app, ["push", "v1", "--repo", "org/name", "--force", *ws])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["push", "v9", "--repo", "org/name", *ws])
    assert res.exit_code == 1 and "version 'v9' not found" in res.output


def _m(version: str, parent: str | None, name: str = "ks", stamp: str = "a") -> dict:
    return {"name": name, "version": version, "parent_version": parent, "created_at": stamp,
            "files": {}}


def _remote(main: dict | None, tags: dict[str, dict], files: list[str] | None = None):
    from pipeline.datasets.hub import RemoteState

    default = [".gitattributes"] + (["manifest.json"] if main else [])
    return RemoteState("sha-main", files if files is not None else default, main,
                       {t: f"sha-{t}" for t in tags},
                       lambda rev: tags.get(rev.removeprefix("sha-")) if rev.startswith("sha-")
                       else tags.get(rev))


@pytest.mark.parametrize(("local", "main", "tags", "known", "want"), [
    (_m("v1", None), None, {}, {}, "first"),
    (_m("v2", "v1"), _m("v1", None), {"v1": _m("v1", None)}, {}, "newer"),
    (_m("v3", "v2"), _m("v1", None), {}, {"v2": _m("v2", "v1")}, "newer"),
    (_m("v1", None), _m("v3", "v2"), {"v2": _m("v2", "v1")}, {}, "older"),
    (_m("v2", "v1"), _m("v2", "v1"), {}, {}, "same"),
    (_m("v2", "v1"), _m("v2", "v1", stamp="b"), {}, {}, "diverged"),
    (_m("v2", "v1"), _m("v9", None, name="other"), {}, {}, "foreign"),
    # v4's chain breaks at v3 (in neither place): the numbers decide, both ways.
    (_m("v4", "v3"), _m("v2", "v1"), {}, {}, "newer"),
    (_m("v1", None), _m("v4", "v3"), {}, {}, "older"),
    # both chains complete and unrelated (two roots): not ordered.
    (_m("v2", "v1"), _m("v3", None), {}, {"v1": _m("v1", None)}, "diverged"),
])
def test_relation_follows_the_lineage(local, main, tags, known, want) -> None:
    from pipeline.datasets.hub import relation

    assert relation(local, _remote(main, tags), known.get) == want


def test_foreign_files_without_a_manifest() -> None:
    from pipeline.datasets.hub import relation

    assert relation(_m("v1", None), _remote(None, {}, [".gitattributes", "data.csv"]),
                    {}.get) == "foreign"


def test_a_commit_in_between_fails_the_push(two_versions, hub: HubServer, monkeypatch) -> None:
    v1, v2 = two_versions
    api = HfApi(endpoint=hub.url)
    push_version(v1, REPO, token="hf_test", api=api)
    original = HfApi.create_commit

    def racing(self, repo_id, operations, **kw):  # another writer commits after our read
        from huggingface_hub import CommitOperationAdd

        original(self, repo_id, [CommitOperationAdd("other.txt", b"x")],
                 commit_message="someone else", repo_type="dataset", token="hf_test")
        return original(self, repo_id, operations, **kw)

    monkeypatch.setattr(HfApi, "create_commit", racing)
    with pytest.raises(HubError, match="push of v2 to .* failed: .*412"):
        push_version(v2, REPO, token="hf_test", api=api)
    assert "v2" not in hub.state.repos[("dataset", REPO)].tags
