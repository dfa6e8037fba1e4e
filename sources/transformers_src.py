"""The installed `transformers` package as a source of real PyTorch modules (no network).

Its `models/*/modeling_*.py` files are the upstream GitHub code of the installed release, so each
module is recorded with the upstream repository, the release tag and the in-repo path.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import random
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path

from schemas import RawModule, Rejection
from sources.scan import ScanError, find_module_classes

TRANSFORMERS_REPO = "https://github.com/huggingface/transformers"
TRANSFORMERS_LICENSE = "Apache-2.0"


class TransformersUnavailable(RuntimeError):
    """transformers is not installed where this process can find it."""


def transformers_root() -> tuple[Path, str]:
    """The installed package directory and version, found without importing transformers."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        raise TransformersUnavailable("transformers is not installed (pip install transformers)")
    try:
        version = package_version("transformers")
    except PackageNotFoundError:
        raise TransformersUnavailable("transformers has no package metadata") from None
    return Path(list(spec.submodule_search_locations)[0]), version


def modeling_files(root: Path, models: list[str] | None = None) -> dict[str, list[Path]]:
    """Model folder name -> its modeling_*.py files (optionally only the named folders)."""
    wanted = set(models or [])
    out: dict[str, list[Path]] = {}
    for path in sorted((root / "models").glob("*/modeling_*.py")):
        folder = path.parent.name
        if wanted and folder not in wanted:
            continue
        out.setdefault(folder, []).append(path)
    return out


def upstream_path(root: Path, path: Path) -> str:
    """The file's path in the GitHub repository (src/transformers/...)."""
    return "src/transformers/" + path.relative_to(root).as_posix()


def _module_record(root: Path, version: str, path: Path, code: str, cls) -> RawModule:
    rel = upstream_path(root, path)
    commit = f"v{version}"
    meta = json.dumps({"package": "transformers", "version": version, "bases": cls.bases,
                       "model_folder": path.parent.name}, sort_keys=True)
    return RawModule(
        module_id=RawModule.make_id("transformers", TRANSFORMERS_REPO, commit, rel, cls.name,
                                    code),
        source_kind="transformers", repo_url=TRANSFORMERS_REPO, commit=commit, path=rel,
        license=TRANSFORMERS_LICENSE, module_name=cls.name, code=code,
        line_start=cls.line_start, line_end=cls.line_end, meta=meta)


def iter_transformers_modules(sample: int, *, models: list[str] | None = None, seed: int = 0,
                              max_file_bytes: int = 1_000_000
                              ) -> Iterator[RawModule | Rejection]:
    """Sample `sample` module classes, seeded, round-robin over shuffled model folders.

    Classes that subclass torch.nn directly come first within a folder: they are the ones a
    task can be extracted from (a PreTrainedModel needs its config and checkpoint machinery).
    """
    if sample <= 0:
        return
    try:
        root, version = transformers_root()
    except TransformersUnavailable as exc:
        yield Rejection.make("ingest", "transformers", "transformers", "unavailable", str(exc))
        return
    rng = random.Random(seed)
    folders = modeling_files(root, models)
    order = sorted(folders)
    rng.shuffle(order)
    pools: dict[str, list[tuple[Path, str, object]]] = {}
    taken = 0
    while taken < sample and order:
        for folder in list(order):
            if taken >= sample:
                break
            if folder not in pools:
                pools[folder] = []
                for path in folders[folder]:
                    yield from _load_classes(root, path, max_file_bytes, pools[folder])
                direct = [c for c in pools[folder] if c[2].direct]
                rest = [c for c in pools[folder] if not c[2].direct]
                rng.shuffle(direct)
                rng.shuffle(rest)
                pools[folder] = rest + direct  # pop() from the end takes direct ones first
            if not pools[folder]:
                order.remove(folder)
                continue
            path, code, cls = pools[folder].pop()
            taken += 1
            yield _module_record(root, version, path, code, cls)


def _load_classes(root: Path, path: Path, max_file_bytes: int,
                  into: list) -> Iterator[Rejection]:
    rel = upstream_path(root, path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        yield Rejection.make("ingest", rel, rel, "unreadable", f"{rel}: {exc.strerror}")
        return
    if len(data) > max_file_bytes:
        yield Rejection.make("ingest", rel, rel, "too_large",
                             f"{rel}: {len(data)} bytes > max_file_bytes {max_file_bytes}")
        return
    try:
        code = data.decode("utf-8")
        classes = _classes_of(code, rel)
    except UnicodeDecodeError as exc:
        yield Rejection.make("ingest", rel, rel, "not_utf8", f"{rel}: not UTF-8 (byte {exc.start})")
        return
    except ScanError as exc:
        yield Rejection.make("ingest", rel, rel, "syntax", str(exc))
        return
    into.extend((path, code, cls) for cls in classes)


@functools.lru_cache(maxsize=128)
def _classes_of(code: str, rel: str) -> tuple:
    # libcst takes ~0.5 s on a large modeling file; a repeated sample in one process reuses it
    return tuple(find_module_classes(code, rel))
