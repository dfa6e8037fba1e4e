"""What a job leaves in `sys.path_importer_cache` (verifier.run.import_residue, through
`tamper.left_in_process`): the entries honest imports add are no residue, a finder or a None
that hides a directory is; in this process, and on the persistent cpu worker's real path."""

from __future__ import annotations

import importlib
import os
import sys
import time
import zipfile
from collections.abc import Iterator
from importlib import machinery
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from redteam_round7_cases import NUMPY_RELU  # noqa: E402
from test_redteam_round9 import _jobs, _said  # noqa: E402

from verifier.run import import_residue  # noqa: E402
from verifier.run.tamper import left_in_process, process_state  # noqa: E402


@pytest.fixture
def cache_restored() -> Iterator[None]:
    """sys.path, sys.modules and the importer cache as they were, after the test."""
    path, modules, cache = list(sys.path), dict(sys.modules), dict(sys.path_importer_cache)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - set(modules):
        del sys.modules[name]
    sys.path_importer_cache.clear()
    sys.path_importer_cache.update(cache)


def _cache_residue(before: dict[str, Any]) -> list[str]:
    return [k for k in left_in_process(before)
            if k.startswith(import_residue.PREFIX) or "(import)" in k]


def _package(root: Path, name: str) -> Path:
    """A package `name` with a submodule `sub` under `root`/site: the folder to put on sys.path."""
    site = root / "site"
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text("")
    (site / name / "sub.py").write_text("VALUE = 7\n")
    return site


@pytest.mark.usefixtures("cache_restored")
def test_an_honest_import_of_a_new_package_leaves_no_residue(tmp_path: Path) -> None:
    """An import from a directory no import looked at yet adds its FileFinder and the
    package's; a path that does not exist adds None; a zip adds its zipimporter; and
    `importlib.invalidate_caches` drops the None entries: none of it is residue."""
    site = _package(tmp_path, "ks_honest_pkg")
    with zipfile.ZipFile(tmp_path / "lib.zip", "w") as zf:
        zf.writestr("ks_zipped_mod.py", "VALUE = 8\n")
    before = process_state()
    sys.path[:0] = [str(tmp_path / "missing"), str(site), str(tmp_path / "lib.zip")]
    sub = importlib.import_module("ks_honest_pkg.sub")
    zipped = importlib.import_module("ks_zipped_mod")
    assert (sub.VALUE, zipped.VALUE) == (7, 8)
    cache = sys.path_importer_cache
    assert type(cache[str(site)]) is machinery.FileFinder  # the route is exercised:
    assert type(cache[str(site / "ks_honest_pkg")]) is machinery.FileFinder  # new entries
    assert cache[str(tmp_path / "missing")] is None
    assert _cache_residue(before) == []
    importlib.invalidate_caches()
    assert str(tmp_path / "missing") not in cache
    assert _cache_residue(before) == []


@pytest.mark.usefixtures("cache_restored")
def test_a_new_entry_that_hides_a_directory_is_residue(tmp_path: Path) -> None:
    """None for an existing directory: every later import from it fails (a negative cache no
    import makes); one that was there before the job is the job's no more than the directory."""
    hidden, old = tmp_path / "hidden", tmp_path / "old"
    hidden.mkdir()
    old.mkdir()
    sys.path_importer_cache[str(old)] = None
    before = process_state()
    sys.path_importer_cache[str(hidden)] = None
    left = _cache_residue(before)
    assert left == [f"{import_residue.PREFIX}{hidden} (None: the directory hidden from "
                    "imports)"], left
    del sys.path_importer_cache[str(hidden)]
    del sys.path_importer_cache[str(old)]  # dropped (invalidate_caches): no residue either
    assert _cache_residue(before) == []


class _OwnFinder:
    def find_spec(self, name: str, target: Any = None) -> None:
        return None


class _OwnLoader(machinery.SourceFileLoader):
    pass


class _Names(set):
    def __contains__(self, name: object) -> bool:
        return super().__contains__(name)


def _file_finder(path: Path, loader: type = machinery.SourceFileLoader) -> Any:
    return machinery.FileFinder(str(path), (loader, machinery.SOURCE_SUFFIXES))


@pytest.mark.usefixtures("cache_restored")
@pytest.mark.parametrize("planted", ["own_class", "own_loader", "own_cache", "own_method",
                                     "elsewhere", "stale_listing"])
def test_a_new_entry_with_the_jobs_own_code_is_residue(tmp_path: Path, planted: str) -> None:
    """A new entry's finder runs at every later import that reaches its path: only a stock
    finder as its hook makes it for that path, with plain state and a true listing, is what an
    import makes (a stock finder of the job's folder answers imports from the path's with the
    job's modules; a listing with names left out hides them)."""
    (tmp_path / "ks_listed.py").write_text("")
    time.sleep(0.05)  # past the coarse tick of file times: the module is older than the folder
    (tmp_path / "jobs").mkdir()
    before = process_state()
    key = str(tmp_path)
    stock_hook = machinery.FileFinder.path_hook(*import_residue._stock_loaders())
    if planted == "elsewhere":
        sys.path_importer_cache[key] = stock_hook(str(tmp_path / "jobs"))
    elif planted == "stale_listing":
        finder = stock_hook(key)
        assert finder.find_spec("ks_listed") is not None  # listed, at the folder's mtime
        finder._path_cache = set()
        sys.path_importer_cache[key] = finder
    elif planted == "own_class":
        sys.path_importer_cache[key] = _OwnFinder()
    elif planted == "own_loader":
        sys.path_importer_cache[key] = _file_finder(tmp_path, _OwnLoader)
    elif planted == "own_cache":
        finder = _file_finder(tmp_path)
        finder._path_cache = _Names()
        sys.path_importer_cache[key] = finder
    else:  # the stock type, a method of the job's own on the instance
        finder = _file_finder(tmp_path)
        finder.find_spec = lambda name, target=None: None
        sys.path_importer_cache[key] = finder
    left = _cache_residue(before)
    assert left and "a finder no path hook makes" in left[0] and key in left[0], left
    control = stock_hook(key)
    assert control.find_spec("ks_listed") is not None
    assert import_residue.stock_finder(control, key)  # as the hook makes it, listing and all


def test_a_method_rebound_on_a_stock_finder_class_is_residue() -> None:
    """Every FileFinder, those that were there too, would run it: the classes' attributes are
    compared."""
    before = process_state()
    find = machinery.FileFinder.find_spec
    try:
        machinery.FileFinder.find_spec = lambda self, *a, **k: find(self, *a, **k)
        left = _cache_residue(before)
    finally:
        machinery.FileFinder.find_spec = find
    assert any("FileFinder attributes (import)" in k for k in left), left
    assert _cache_residue(before) == []


# an honest numpy ReLU that imports a package of the standard library no job imported yet
# (its folder, and its subpackage's, are new entries of the worker's importer cache)
NEW_PACKAGE_RELU = NUMPY_RELU.replace(
    "        import numpy as np\n", "        import numpy as np\n        import wsgiref.headers\n")
assert NEW_PACKAGE_RELU != NUMPY_RELU


def test_an_honest_job_importing_a_new_package_keeps_its_worker() -> None:
    """On the persistent cpu worker: the importing job and the next are ok, with no residue
    finding, in one worker."""
    importer, after = _jobs([NEW_PACKAGE_RELU, NUMPY_RELU])
    for job in (importer, after):
        assert job["outcome"] == "ok" and not job["failure"], job
        assert not _said(job, "worker_replaced"), job
    assert importer["worker_pid"] == after["worker_pid"], (importer, after)


def test_a_name_made_in_the_listings_tick_is_the_interpreters_race_not_residue(
        tmp_path: Path) -> None:
    """File times are coarse: a module written in the same tick as, and after, a FileFinder's
    listing is missing from a listing of the folder's current mtime in an honest run too (what
    `importlib.invalidate_caches` is for); the module's change time is then the folder's."""
    finder = machinery.FileFinder.path_hook(*import_residue._stock_loaders())(str(tmp_path))
    assert finder.find_spec("ks_later") is None  # listed: an empty folder
    (tmp_path / "ks_later.py").write_text("")
    made = (tmp_path / "ks_later.py").stat().st_ctime_ns  # the folder's time: that same tick
    os.utime(tmp_path, ns=(made, made))
    finder._path_mtime = tmp_path.stat().st_mtime  # as if listed in that tick
    assert import_residue.stock_finder(finder, str(tmp_path))
