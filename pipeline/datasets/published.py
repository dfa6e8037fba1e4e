"""Version bookkeeping: the latest version of a dataset, the fingerprint of the inputs each version
was built from (so an unchanged re-run keeps the latest), and the lineage a manifest records.

Every executor of the plan (the step commands, `kernelsynth build`) publishes through these, so
"latest" and "unchanged" mean one thing.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import Config
from pipeline.datasets.versions import dataset_dir, list_versions
from pipeline.workspace import Workspace
from schemas import Candidate, Task, Verdict, content_hash, dumps

STATE = "published.json"  # "<name>/<version>" -> inputs fingerprint, at the workspace root
DATA_CONFIG = {"select", "publish", "generate", "verify", "repair"}  # what shapes the rows


@dataclass
class VersionInfo:
    """The latest published version of a dataset name and the inputs it was built from."""

    name: str
    path: Path
    fingerprint: str | None


def _state(ws: Workspace) -> dict[str, str]:
    try:
        return json.loads((ws.root / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def latest_version(ws: Workspace, name: str) -> VersionInfo | None:
    """The highest-numbered published version of `name` (`versions.list_versions` order)."""
    versions = list_versions(ws, name)
    if not versions:
        return None
    latest = versions[-1]
    return VersionInfo(latest, dataset_dir(ws, name) / latest, _state(ws).get(f"{name}/{latest}"))


def remember(ws: Workspace, name: str, version: str, fingerprint: str) -> None:
    """Record that `version` of `name` was built from inputs with `fingerprint`."""
    state = _state(ws)
    state[f"{name}/{version}"] = fingerprint
    path = ws.root / STATE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(path)


def inputs_fingerprint(ws: Workspace, cfg: Config) -> str:
    """Content hash of everything a version is built from: record keys and the data config."""
    parts = []
    for cls in (Task, Candidate, Verdict):
        keys = ws.read_table(cls).column(cls.KEY).to_pylist()
        parts.append(f"{cls.TABLE}:" + ",".join(sorted(keys)))
    return content_hash(*parts, dumps(cfg.model_dump(mode="json", include=DATA_CONFIG)))


def version_lineage(ws: Workspace, tasks: list[Task], verdicts: list[Verdict],
                    code_commit: str) -> dict[str, Any]:
    """What a manifest records about a version's inputs: the source commits of its tasks, the
    verifier versions and devices of the verdicts, the code commit, the runs and the host."""
    commits = sorted({(t.repo_url, t.commit) for t in tasks if t.repo_url or t.commit})
    return {
        "source_commits": [{"repo_url": r, "commit": c} for r, c in commits],
        "verifier_versions": sorted({v.verifier_version for v in verdicts if v.verifier_version}),
        "devices": sorted({v.device for v in verdicts if v.device}),
        "code_commit": code_commit,
        "runs": ws.runs(),
        "host": {"platform": platform.platform(), "python": platform.python_version()},
    }
