"""Push a published version to the Hugging Face Hub: one commit that makes `main` the version.

A push reads what `main` holds (its files and its `manifest.json`), then makes ONE
`HfApi.create_commit` on top of exactly that commit (`parent_commit`, so a concurrent push fails
instead of mixing): a `CommitOperationAdd` for every file of the version (unchanged files are
skipped by huggingface_hub) and a `CommitOperationDelete` for every file on `main` the version
does not have (a shard of another shard count, a config the version dropped). Only
`.gitattributes`, the Hub's own file, is kept. Then the version's tag. So `main` and every tag
each load as exactly one version: no stale shard is matched by the card's `*/train-*.parquet`.

Which of two versions is older is decided by lineage, not by the clock: every manifest names its
`parent_version`, so the versions a version descends from are its parent, the parent's parent, ...
read from the version folders of the workspace and from `manifest.json` at the repo's tags.
- `main` holds an ancestor of the pushed version (or nothing yet): the push moves `main` forward.
- `main` holds the pushed version with the same manifest: nothing is committed, the tag is ensured.
- the pushed version is an ancestor of `main`'s (an older version): refused without `force`,
  because it would rewind `main` and every user loading the default revision.
- the chain cannot be walked to its root (a manifest is in neither place): the version numbers
  decide, as `publish` numbers a dataset's versions parent + 1 (older = lower number).
- same version number with another manifest, another dataset name, or files on `main` that no
  kernelsynth version put there: refused without `force`.
A tag that already names other content is refused too; `force` moves it.
The token comes from the CLI edge (HF_TOKEN or the saved login).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from pipeline.datasets.versions import MANIFEST, verify_version

HUB_OWN_FILES = frozenset({".gitattributes"})  # kept on main: the Hub's LFS rules, not data


class HubError(RuntimeError):
    """A push cannot start or failed; the message says what is needed."""


@dataclass
class PushPlan:
    """What a push does: the repo, the files (path in repo -> local file), deletions and tag."""

    repo_id: str
    version: str
    private: bool
    files: list[tuple[str, Path]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)  # known once main has been read
    relation: str = ""  # first | newer | same | forced-<why> (after a push)
    commit_url: str = ""
    commit_oid: str = ""

    def describe(self) -> list[str]:
        """One line per Hub operation, in the order a push makes them."""
        lines = [f"create_repo {self.repo_id} (dataset, private={self.private}, exist_ok)"]
        lines += [f"add {path_in_repo} ({local.stat().st_size} bytes)"
                  for path_in_repo, local in self.files]
        if self.relation:
            lines += [f"delete {path}" for path in self.deletes]
        else:
            lines.append("delete every file on main that the version does not have")
        lines += [f"create_commit {self.repo_id}: {len(self.files)} files in one commit",
                  f"create_tag {self.repo_id} {self.version}"]
        return lines


def check_repo_id(repo_id: str) -> str:
    """Return `repo_id` if it is a valid ORG/NAME Hub id, else raise HubError saying why."""
    if repo_id.count("/") != 1:
        raise HubError(f"invalid repo name {repo_id!r}: expected ORG/NAME")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise HubError(f"invalid repo name {repo_id!r}: {exc}") from None
    return repo_id


def plan_push(version_dir: Path, repo_id: str, private: bool = True) -> PushPlan:
    """Check the repo id and the version's hashes; list the files to upload."""
    check_repo_id(repo_id)
    manifest = verify_version(version_dir)
    files = [(rel, version_dir / rel) for rel in sorted(manifest["files"])]
    files.append((MANIFEST, version_dir / MANIFEST))
    return PushPlan(repo_id, manifest["version"], private, files)


@dataclass
class RemoteState:
    """What the repo holds before a push: main's commit, files and manifest, and the tags."""

    main_sha: str
    files: list[str]
    manifest: dict[str, Any] | None
    tags: dict[str, str]  # tag -> commit
    read_manifest: Callable[[str], dict[str, Any] | None]  # revision -> manifest or None


def read_remote(api: HfApi, repo_id: str, token: str, cache_dir: str) -> RemoteState:
    """Read main and the tags of a dataset repo (the repo must exist); downloads go to cache_dir."""
    refs = api.list_repo_refs(repo_id, repo_type="dataset", token=token)
    main = next((b.target_commit for b in refs.branches if b.name == "main"), None)
    if main is None:
        raise HubError(f"{repo_id} has no main branch")
    files = sorted(api.list_repo_files(repo_id, repo_type="dataset", revision=main, token=token))

    def read_manifest(revision: str) -> dict[str, Any] | None:
        if revision == main and MANIFEST not in files:
            return None
        try:
            path = api.hf_hub_download(repo_id, MANIFEST, repo_type="dataset", revision=revision,
                                       token=token, cache_dir=cache_dir)
        except Exception as exc:  # a tag without a manifest is not a kernelsynth version
            if type(exc).__name__ in ("EntryNotFoundError", "RemoteEntryNotFoundError",
                                      "RevisionNotFoundError"):
                return None
            raise
        return json.loads(Path(path).read_text(encoding="utf-8"))

    return RemoteState(main, files, read_manifest(main),
                       {t.name: t.target_commit for t in refs.tags}, read_manifest)


def _number(version: str) -> int:
    m = re.fullmatch(r"v(\d+)", version)
    return int(m.group(1)) if m else -1


def ancestors(manifest: dict[str, Any],
              lookup: Callable[[str], dict[str, Any] | None]) -> tuple[list[str], bool]:
    """(parent, grandparent, ...) of a version and whether the chain reached its root."""
    chain: list[str] = []
    current: dict[str, Any] | None = manifest
    while current is not None and current.get("parent_version"):
        parent = current["parent_version"]
        if parent in chain or parent == manifest["version"]:
            break  # a cycle is a broken chain, not an endless walk
        chain.append(parent)
        current = lookup(parent)
        if current is None:
            return chain, False
    return chain, True


def relation(local: dict[str, Any], remote: RemoteState, local_lookup: Callable[
        [str], dict[str, Any] | None]) -> str:
    """How the pushed version stands to main: first, same, newer, older, diverged or foreign."""
    theirs = remote.manifest
    if theirs is None:
        return "first" if set(remote.files) <= HUB_OWN_FILES else "foreign"
    if theirs.get("name") != local.get("name"):
        return "foreign"
    if theirs.get("version") == local["version"]:
        return "same" if theirs == local else "diverged"

    def remote_lookup(version: str) -> dict[str, Any] | None:
        found = remote.read_manifest(version) if version in remote.tags else None
        return found or local_lookup(version)

    ours, ours_complete = ancestors(local, lambda v: local_lookup(v) or remote_lookup(v))
    if theirs["version"] in ours:
        return "newer"
    their_chain, theirs_complete = ancestors(theirs, remote_lookup)
    if local["version"] in their_chain:
        return "older"
    if not (ours_complete and theirs_complete):
        return "newer" if _number(local["version"]) > _number(theirs["version"]) else "older"
    return "diverged"


_REFUSALS = {
    "older": "main holds {theirs}, which descends from {ours}: pushing {ours} would rewind main",
    "diverged": "main holds {theirs}, which is not in the lineage of {ours} (or another "
                "{ours} was published there)",
    "foreign": "main holds files that are not this dataset's kernelsynth versions "
               "({what})",
}


def _local_lookup(version_dir: Path) -> Callable[[str], dict[str, Any] | None]:
    def lookup(version: str) -> dict[str, Any] | None:
        path = version_dir.parent / version / MANIFEST
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    return lookup


def _judge(plan: PushPlan, local: dict[str, Any], remote: RemoteState, version_dir: Path,
           force: bool) -> tuple[str, str | None, bool]:
    """(relation, the version's existing tag commit, whether that tag already holds it)."""
    rel = relation(local, remote, _local_lookup(version_dir))
    if rel in _REFUSALS:
        what = ", ".join(f for f in remote.files if f not in HUB_OWN_FILES)[:200]
        reason = _REFUSALS[rel].format(ours=plan.version, what=what,
                                       theirs=(remote.manifest or {}).get("version", "?"))
        if not force:
            raise HubError(f"push of {plan.version} to {plan.repo_id} refused: {reason}; "
                           "pass --force to replace main")
        rel = f"forced-{rel}"
    tag_sha = remote.tags.get(plan.version)
    tag_ok = tag_sha is not None and remote.read_manifest(tag_sha) == local
    if tag_sha is not None and not tag_ok and not force:
        raise HubError(f"push of {plan.version} to {plan.repo_id} refused: tag {plan.version} "
                       "on the Hub holds other content; pass --force to move it")
    return rel, tag_sha, tag_ok


def push_version(version_dir: Path, repo_id: str, *, token: str | None, private: bool = True,
                 dry_run: bool = False, force: bool = False,
                 api: HfApi | None = None) -> PushPlan:
    """Make the dataset repo's main exactly `version_dir` in one commit, then tag it.

    Refuses (HubError) to rewind main to an older version, or to replace a diverged or foreign
    main, unless `force`; see the module docstring for how "older" is decided.
    """
    version_dir = Path(version_dir)
    plan = plan_push(version_dir, repo_id, private)
    if dry_run:
        return plan
    if not token:
        raise HubError("no Hugging Face token: set HF_TOKEN or run `hf auth login` "
                       "(pushing needs write access to the dataset repo)")
    api = api or HfApi()
    local = json.loads((version_dir / MANIFEST).read_text(encoding="utf-8"))
    try:
        api.create_repo(repo_id, token=token, private=private, repo_type="dataset",
                        exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="ks-hub-") as tmp:
            remote = read_remote(api, repo_id, token, tmp)
            rel, tag_sha, tag_ok = _judge(plan, local, remote, version_dir, force)
        ours = {rel_path for rel_path, _ in plan.files}
        plan.deletes = [f for f in remote.files if f not in ours and f not in HUB_OWN_FILES]
        plan.relation = rel
        sha = remote.main_sha
        if rel != "same" or plan.deletes:
            ops: list[CommitOperationAdd | CommitOperationDelete] = [
                CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(f)) for p, f in plan.files]
            ops += [CommitOperationDelete(path_in_repo=p) for p in plan.deletes]
            info = api.create_commit(
                repo_id, ops, commit_message=f"kernelsynth {plan.version}",
                commit_description=f"Dataset version {plan.version} published by kernelsynth "
                f"({len(plan.files)} files, {len(plan.deletes)} removed).",
                token=token, repo_type="dataset", parent_commit=remote.main_sha)
            sha = str(info.oid)
            plan.commit_url = str(getattr(info, "commit_url", "") or "")
        plan.commit_oid = sha
        if not tag_ok:
            if tag_sha is not None:
                api.delete_tag(repo_id, tag=plan.version, token=token, repo_type="dataset")
            api.create_tag(repo_id, tag=plan.version, tag_message=f"kernelsynth {plan.version}",
                           revision=sha, token=token, repo_type="dataset")
    except HubError:
        raise
    except Exception as exc:  # network, auth and API errors all end the push with one line
        raise HubError(f"push of {plan.version} to {repo_id} failed: "
                       f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                       ) from exc
    return plan
