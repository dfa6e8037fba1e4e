"""The ingest stage: every configured source as one stream of RawModules and Rejections.

Default (no network): the seed corpus, a seeded sample of the installed transformers, and
NNSmith graphs. A repo manifest adds git repositories.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path

from schemas import RawModule, Rejection
from sources.config import SourcesConfig
from sources.git_repos import iter_manifest_modules
from sources.nnsmith_graphs import iter_nnsmith_modules
from sources.scan import ScanError, find_module_classes
from sources.seed import sample_seed_files, seed_families
from sources.transformers_src import iter_transformers_modules

# the seed corpus ships inside this package, so its provenance is the package itself
SEED_REPO = "builtin:kernelsynth/sources/seed"


def _seed_commit() -> str:
    try:
        return f"kernelsynth-{package_version('kernelsynth')}"
    except PackageNotFoundError:
        return "kernelsynth-dev"


def iter_seed_modules(sample: int = 0, seed: int = 0) -> Iterator[RawModule | Rejection]:
    """The built-in seed task files (all, or a family-stratified sample), one RawModule each."""
    commit = _seed_commit()
    for path in sample_seed_files(sample, seed):
        rel = f"sources/seed/{path.name}"
        code = path.read_text(encoding="utf-8")
        try:
            classes = [c for c in find_module_classes(code, rel) if c.name == "Model"]
        except ScanError as exc:
            yield Rejection.make("ingest", rel, rel, "syntax", str(exc))
            continue
        if not classes:
            yield Rejection.make("ingest", rel, rel, "no_model", f"{rel}: no class Model")
            continue
        families, level = seed_families(code)
        meta = json.dumps({"families": families, "level": level, "task_file": True},
                          sort_keys=True)
        yield RawModule(
            module_id=RawModule.make_id("seed", SEED_REPO, commit, rel, "Model", code),
            source_kind="seed", repo_url=SEED_REPO, commit=commit, path=rel,
            license="Apache-2.0", module_name="Model", code=code,
            line_start=classes[0].line_start, line_end=classes[0].line_end, meta=meta)


def iter_modules(cfg: SourcesConfig, cache_dir: Path, *, manifest: Path | None = None
                 ) -> Iterator[RawModule | Rejection]:
    """All modules the config asks for (seed, transformers, nnsmith, then git repos)."""
    if cfg.seed_corpus:
        yield from iter_seed_modules(cfg.seed_sample, cfg.sample_seed)
    if cfg.transformers_sample > 0:
        yield from iter_transformers_modules(
            cfg.transformers_sample, models=cfg.transformers_models, seed=cfg.sample_seed,
            max_file_bytes=cfg.max_file_bytes)
    if cfg.nnsmith.count > 0:
        yield from iter_nnsmith_modules(cfg.nnsmith)
    manifest = manifest if manifest is not None else cfg.manifest
    if manifest:
        yield from iter_manifest_modules(
            manifest, Path(cache_dir), allowlist=cfg.license_allowlist,
            max_file_bytes=cfg.max_file_bytes, timeout=cfg.clone_timeout_s)
