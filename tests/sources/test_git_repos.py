"""Git manifest ingest against real repositories created in tmp_path (file:// and paths)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from schemas import RawModule, Rejection
from sources.git_repos import (
    ManifestError,
    iter_manifest_modules,
    load_manifest,
    repo_cache_dir,
)

MIT = """MIT License

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction..."""
ALLOW = ["MIT", "Apache-2.0", "BSD-3-Clause"]
MODEL = '''import torch
from torch import nn


class Scale(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x * 2


class Twice(Scale):
    pass


def helper():
    return 1
'''


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    res = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True,
                         check=True)
    return res.stdout.strip()


def make_repo(path: Path, files: dict[str, str | bytes], tag: str | None = None) -> str:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "init")
    if tag:
        git(path, "tag", "-a", tag, "-m", tag)
    return git(path, "rev-parse", "HEAD")


def write_manifest(path: Path, entries: list[dict]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({"repos": entries}), encoding="utf-8")
    return path


def collect(manifest: Path, cache: Path, **kw) -> tuple[list[RawModule], list[Rejection]]:
    items = list(iter_manifest_modules(manifest, cache, allowlist=ALLOW, **kw))
    return ([i for i in items if isinstance(i, RawModule)],
            [i for i in items if isinstance(i, Rejection)])


def test_file_url_repo_with_bad_files(tmp_path: Path):
    src = tmp_path / "src_repo"
    sha = make_repo(src, {
        "LICENSE": MIT,
        "pkg/model.py": MODEL,
        "pkg/py2.py": 'print "hello"\n',
        "pkg/latin1.py": "# caf\xe9\n".encode("latin-1"),
        "pkg/blob.py": b"\x00\x01binary",
        "pkg/big.py": "x = 1\n" * 400,
        "docs/readme.md": "not python",
    }, tag="v1.0")
    os.symlink("loop_b", src / "pkg" / "loop_a")
    os.symlink("loop_a", src / "pkg" / "loop_b")
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "links")
    sha = git(src, "rev-parse", "HEAD")
    manifest = write_manifest(tmp_path / "repos.yaml", [{"url": src.as_uri(), "ref": "main"}])
    cache = tmp_path / "cache"
    mods, rejs = collect(manifest, cache, max_file_bytes=1000)
    assert sorted(m.module_name for m in mods) == ["Scale", "Twice"]
    scale = next(m for m in mods if m.module_name == "Scale")
    assert (scale.commit, scale.path, scale.license, scale.source_kind) == (
        sha, "pkg/model.py", "MIT", "git")
    assert scale.code == MODEL and (scale.line_start, scale.line_end) == (5, 10)
    assert json.loads(scale.meta)["fetched"] is True
    reasons = {r.ref.rsplit(":", 1)[1]: r.reason for r in rejs}
    assert reasons == {"pkg/py2.py": "syntax", "pkg/latin1.py": "not_utf8",
                       "pkg/blob.py": "binary", "pkg/big.py": "too_large",
                       "pkg/loop_a": "symlink_loop", "pkg/loop_b": "symlink_loop"}
    assert all(r.detail for r in rejs)
    # the clone is a shallow fetch of exactly that commit
    clone = repo_cache_dir(cache, src.as_uri())
    assert git(clone, "rev-parse", "HEAD") == sha
    assert git(clone, "rev-parse", "--is-shallow-repository") == "true"
    # a re-run reads the cache: same modules, no fetch
    mods2, _ = collect(manifest, cache, max_file_bytes=1000)
    assert {m.module_id for m in mods2} == {m.module_id for m in mods}
    assert all(json.loads(m.meta)["fetched"] is False for m in mods2)


def test_refs_paths_and_local_path(tmp_path: Path):
    src = tmp_path / "r"
    first = make_repo(src, {"LICENSE": MIT, "a/m.py": MODEL}, tag="v1")
    (src / "b").mkdir()
    (src / "b" / "n.py").write_text(MODEL.replace("Scale", "Other"))
    git(src, "add", "-A")
    git(src, "commit", "-q", "-m", "second")
    manifest = write_manifest(tmp_path / "m.yaml", [
        {"url": str(src), "ref": "v1"},  # annotated tag -> the tagged commit
        {"url": src.as_uri(), "paths": ["b/*.py"]},  # HEAD, only b/
        {"url": src.as_uri(), "ref": first},  # a commit SHA
    ])
    mods, rejs = collect(manifest, tmp_path / "cache")
    assert not rejs
    by_repo = [(m.repo_url, m.commit, m.path) for m in mods if m.module_name in ("Scale",
                                                                                  "Other")]
    head = git(src, "rev-parse", "HEAD")
    assert (str(src), first, "a/m.py") in by_repo
    assert (src.as_uri(), head, "b/n.py") in by_repo
    assert (src.as_uri(), first, "a/m.py") in by_repo
    assert not any(p == "a/m.py" and c == head for _, c, p in by_repo)


def test_bad_repositories_are_rejected_and_ingest_goes_on(tmp_path: Path):
    good = tmp_path / "good"
    make_repo(good, {"LICENSE": MIT, "m.py": MODEL})
    gpl = tmp_path / "gpl"
    make_repo(gpl, {"LICENSE": "GNU GENERAL PUBLIC LICENSE\nVersion 3", "m.py": MODEL})
    nolic = tmp_path / "nolic"
    make_repo(nolic, {"m.py": MODEL})
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    manifest = write_manifest(tmp_path / "m.yaml", [
        {"url": (tmp_path / "missing").as_uri()},
        {"url": good.as_uri(), "ref": "no-such-branch"},
        {"url": empty.as_uri()},
        {"url": gpl.as_uri()},
        {"url": nolic.as_uri()},
        {"url": nolic.as_uri(), "license": "MIT", "paths": ["*.py"]},  # manifest override
        {"url": good.as_uri()},
    ])
    mods, rejs = collect(manifest, tmp_path / "cache")
    assert [r.reason for r in rejs] == ["unreachable", "unknown_ref", "empty_repo", "license",
                                        "no_license"]
    assert "GPL-3.0" in rejs[3].detail and "no-such-branch" in rejs[1].detail
    assert sorted((m.repo_url, m.license) for m in mods if m.module_name == "Scale") == [
        (good.as_uri(), "MIT"), (nolic.as_uri(), "MIT")]


def test_manifest_errors(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("repos:\n  - ref: main\n")
    with pytest.raises(ManifestError, match="entry 0: needs a `url`"):
        load_manifest(bad)
    bad.write_text("repos:\n  - url: x\n    branch: main\n")
    with pytest.raises(ManifestError, match="unknown keys"):
        load_manifest(bad)
    items = list(iter_manifest_modules(tmp_path / "nope.yaml", tmp_path, allowlist=ALLOW))
    assert [i.reason for i in items] == ["manifest"]
    (tmp_path / "list.yaml").write_text("- https://example.com/a.git\n- url: b\n  paths: x/*.py\n")
    specs = load_manifest(tmp_path / "list.yaml")
    assert specs[0].url == "https://example.com/a.git" and specs[1].paths == ["x/*.py"]
