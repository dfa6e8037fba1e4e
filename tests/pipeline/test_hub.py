"""Pushing a version to the Hub, offline: HfApi patched to record calls and keep the upload."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import datasets
import huggingface_hub
import pytest
from huggingface_hub import HfApi
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.config import Config
from pipeline.datasets.hub import HubError, check_repo_id, push_version
from pipeline.datasets.publish import publish_workspace
from pipeline.workspace import Workspace
from tests.pipeline.ks_synthetic import fill_workspace, hf_offline


class RecordingHub:
    """Replaces HfApi's network methods; a commit's files land in `tree`."""

    def __init__(self, tree: Path, fail_commit: bool = False):
        self.tree = tree
        self.calls: list[tuple[str, dict]] = []
        self.fail_commit = fail_commit

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        hub = self

        def create_repo(self, repo_id, **kw):
            hub.calls.append(("create_repo", {"repo_id": repo_id, **kw}))
            return f"https://huggingface.co/datasets/{repo_id}"

        def create_commit(self, repo_id, operations, **kw):
            ops = list(operations)
            hub.calls.append(("create_commit", {"repo_id": repo_id, "operations": ops, **kw}))
            if hub.fail_commit:
                raise RuntimeError("403 Forbidden: you do not have write access")
            for op in ops:
                dest = hub.tree / op.path_in_repo
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(op.path_or_fileobj, dest)
            return SimpleNamespace(oid="abc123", commit_url=f"https://hf.co/{repo_id}/commit/abc")

        def create_tag(self, repo_id, **kw):
            hub.calls.append(("create_tag", {"repo_id": repo_id, **kw}))

        for name, fn in (("create_repo", create_repo), ("create_commit", create_commit),
                         ("create_tag", create_tag)):
            monkeypatch.setattr(HfApi, name, fn)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture
def version(workspace: Workspace) -> Path:
    fill_workspace(workspace, n_tasks=4)
    return publish_workspace(workspace, Config(workspace=str(workspace.root)))


def test_push_is_one_commit_then_a_tag_and_the_upload_loads(version: Path, monkeypatch,
                                                             tmp_path) -> None:
    hub = RecordingHub(tmp_path / "uploaded")
    hub.install(monkeypatch)
    plan = push_version(version, "kernel-org/kernelsynth", token="hf_test", private=True)
    assert hub.names() == ["create_repo", "create_commit", "create_tag"]
    repo = hub.calls[0][1]
    assert (repo["private"], repo["repo_type"], repo["exist_ok"], repo["token"]) == (
        True, "dataset", True, "hf_test")
    commit = hub.calls[1][1]
    uploaded = sorted(op.path_in_repo for op in commit["operations"])
    local = sorted(p.relative_to(version).as_posix() for p in version.rglob("*") if p.is_file())
    assert uploaded == local and "manifest.json" in uploaded and "README.md" in uploaded
    assert commit["repo_type"] == "dataset" and commit["commit_message"] == "kernelsynth v1"
    tag = hub.calls[2][1]
    assert (tag["tag"], tag["revision"], tag["repo_type"]) == ("v1", "abc123", "dataset")
    assert plan.commit_url.endswith("/commit/abc")

    cache = hf_offline(monkeypatch, tmp_path)
    manifest = json.loads((hub.tree / "manifest.json").read_text())
    for config in manifest["configs"]:
        ds = datasets.load_dataset(str(hub.tree), name=config, cache_dir=str(cache))
        assert {s: ds[s].num_rows for s in ds} == manifest["counts"][config]


def test_dry_run_lists_operations_and_calls_nothing(version: Path, monkeypatch, tmp_path) -> None:
    hub = RecordingHub(tmp_path / "uploaded")
    hub.install(monkeypatch)
    plan = push_version(version, "org/name", token=None, dry_run=True)
    assert hub.calls == []
    lines = plan.describe()
    assert lines[0].startswith("create_repo org/name") and lines[-1] == "create_tag org/name v1"
    assert any(line.startswith("add sft/train-") for line in lines)


@pytest.mark.parametrize("repo", ["noslash", "a/b/c", "org/bad name", "org/-x-", "", "org/"])
def test_invalid_repo_names(repo: str) -> None:
    with pytest.raises(HubError, match="invalid repo name"):
        check_repo_id(repo)
    assert check_repo_id("my-org/kernel_data.v2") == "my-org/kernel_data.v2"


def test_missing_token_and_api_failure_are_clear(version: Path, monkeypatch, tmp_path) -> None:
    hub = RecordingHub(tmp_path / "uploaded", fail_commit=True)
    hub.install(monkeypatch)
    with pytest.raises(HubError, match="no Hugging Face token: set HF_TOKEN"):
        push_version(version, "org/name", token=None)
    assert hub.calls == []
    with pytest.raises(HubError, match="failed: RuntimeError: 403 Forbidden"):
        push_version(version, "org/name", token="hf_x")
    assert hub.names() == ["create_repo", "create_commit"]  # never tagged


def test_edited_version_is_not_pushed(version: Path, monkeypatch, tmp_path) -> None:
    hub = RecordingHub(tmp_path / "uploaded")
    hub.install(monkeypatch)
    (version / "README.md").write_text("edited")
    from pipeline.datasets.versions import VersionIntegrityError

    with pytest.raises(VersionIntegrityError, match="README.md: content hash mismatch"):
        push_version(version, "org/name", token="hf_x")
    assert hub.calls == []


def test_cli_push_reads_token_at_the_edge(version: Path, workspace: Workspace, monkeypatch,
                                          tmp_path) -> None:
    hub = RecordingHub(tmp_path / "uploaded")
    hub.install(monkeypatch)
    runner = CliRunner()
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    res = runner.invoke(app, ["push", "v1", "--repo", "org/name", "-w", str(workspace.root)])
    assert res.exit_code == 1 and "no Hugging Face token" in res.output
    res = runner.invoke(app, ["push", "v1", "--repo", "bad", "-w", str(workspace.root)])
    assert res.exit_code == 1 and "invalid repo name 'bad'" in res.output
    res = runner.invoke(app, ["push", "v1", "--repo", "org/name", "--dry-run",
                              "-w", str(workspace.root)])
    assert res.exit_code == 0 and "(dry run) create_tag org/name v1" in res.output
    assert hub.calls == []
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    res = runner.invoke(app, ["push", "v1", "--repo", "org/name", "--public", "--json",
                              "-w", str(workspace.root)])
    assert res.exit_code == 0, res.output
    assert hub.calls[0][1]["token"] == "hf_from_env" and hub.calls[0][1]["private"] is False
    assert json.loads(res.stdout.strip().splitlines()[-1])["version"] == "v1"
    res = runner.invoke(app, ["push", "v9", "--repo", "org/name", "-w", str(workspace.root)])
    assert res.exit_code == 1 and "version 'v9' not found" in res.output
