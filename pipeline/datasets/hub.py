"""Push a published version to the Hugging Face Hub: one atomic commit, then a tag.

Every file of the version folder becomes a `CommitOperationAdd` at the repo root (so the card's
YAML `configs:` resolves), committed with one `HfApi.create_commit` call and tagged with the
version through `create_tag`. The token comes from the CLI edge (HF_TOKEN or the saved login).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from pipeline.datasets.versions import MANIFEST, verify_version


class HubError(RuntimeError):
    """A push cannot start or failed; the message says what is needed."""


@dataclass
class PushPlan:
    """What a push does: the repo, the files (path in repo -> local file) and the tag."""

    repo_id: str
    version: str
    private: bool
    files: list[tuple[str, Path]] = field(default_factory=list)
    commit_url: str = ""

    def describe(self) -> list[str]:
        """One line per Hub operation, in the order a push makes them."""
        lines = [f"create_repo {self.repo_id} (dataset, private={self.private}, exist_ok)"]
        lines += [f"add {path_in_repo} ({local.stat().st_size} bytes)"
                  for path_in_repo, local in self.files]
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


def push_version(version_dir: Path, repo_id: str, *, token: str | None, private: bool = True,
                 dry_run: bool = False, api: HfApi | None = None) -> PushPlan:
    """Upload `version_dir` as one commit to the dataset repo and tag it with the version."""
    plan = plan_push(Path(version_dir), repo_id, private)
    if dry_run:
        return plan
    if not token:
        raise HubError("no Hugging Face token: set HF_TOKEN or run `hf auth login` "
                       "(pushing needs write access to the dataset repo)")
    api = api or HfApi()
    try:
        api.create_repo(repo_id, token=token, private=private, repo_type="dataset",
                        exist_ok=True)
        ops = [CommitOperationAdd(path_in_repo=rel, path_or_fileobj=str(local))
               for rel, local in plan.files]
        info = api.create_commit(repo_id, ops, commit_message=f"kernelsynth {plan.version}",
                                 commit_description=f"Dataset version {plan.version} "
                                 "published by kernelsynth.", token=token,
                                 repo_type="dataset")
        api.create_tag(repo_id, tag=plan.version, tag_message=f"kernelsynth {plan.version}",
                       revision=getattr(info, "oid", None), token=token, repo_type="dataset")
    except HubError:
        raise
    except Exception as exc:  # network, auth and API errors all end the push with one line
        raise HubError(f"push of {plan.version} to {repo_id} failed: "
                       f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                       ) from exc
    plan.commit_url = str(getattr(info, "commit_url", "") or "")
    return plan
