"""What a job can leave in `sys.path_importer_cache` for a later job's imports, and what an
honest import leaves there (part of `verifier.run.tamper.process_state`).

The path finder consults the cache at every import of a module not yet loaded: a finder a job
put in an entry answers a later job's import (a job's own finder for the standard library's
directory ran its code in the next job's `import tabnanny`: tests/verifier/test_redteam_round12).
An entry whose finder was there before the job is compared by identity (a replaced finder is
residue). New entries cannot be: every honest import of a package from a directory not looked
at yet adds one, and `importlib.invalidate_caches` drops the None ones. So a new entry is
judged by what it holds:
- a finder the interpreter's own path hooks make (`FileFinder`, `zipimporter`: exactly those
  classes, their instance state of plain types, a FileFinder's loaders the stock ones) is what
  an import adds, and harmless: its code is the interpreter's, and the classes' attributes
  (`IMPORT_CLASSES` and their bases) are compared for every job, so a method rebound on them
  is residue too;
- None for a directory that exists hides that directory from every later import (a negative
  cache no import makes: the FileFinder hook takes any directory), so a later honest sibling's
  import fails: residue; None for a path that is not a directory is what an import caches;
- anything else is the job's own object: residue.
A None entry for a directory that was there before the job stays as it was (a directory made
after the path was first looked at); an entry dropped is no residue (the hooks make it again).
A finder that stays is compared by what it holds too (`held`): a job that rewrote the standard
library's FileFinder's `_loaders` list in place (its own loader class for ".py") ran its code
at the next job's `import tabnanny` with the finder's identity unchanged
(tests/verifier/test_redteam_round13.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from verifier.run.c_identity import namespace

PREFIX = "sys.path_importer_cache "
NONE_DIR = " (None for a directory)"  # a snapshot key that marks such an entry, not compared
# the classes behind every finder the stock path hooks make and every loader they hand out
IMPORT_CLASSES = (("importlib.machinery", "PathFinder"), ("importlib.machinery", "FileFinder"),
                  ("importlib.machinery", "SourceFileLoader"),
                  ("importlib.machinery", "SourcelessFileLoader"),
                  ("importlib.machinery", "ExtensionFileLoader"), ("zipimport", "zipimporter"))


def snapshot(identity: Callable[[Any], int]) -> dict[str, int]:
    """Each finder of the cache by identity, each None entry of a directory as a mark, and the
    attributes of the import classes (with their bases) by `identity` (`tamper.identity`, passed
    in: tamper imports this module)."""
    out = {}
    for path, finder in list(sys.path_importer_cache.items()):
        if finder is not None:
            out[f"{PREFIX}{path}"] = hash((id(finder), held(finder)))
        elif _is_dir(path):
            out[f"{PREFIX}{path}{NONE_DIR}"] = 0
    for cls in _import_classes():
        out[f"{cls.__module__}.{cls.__qualname__} attributes (import)"] = hash(frozenset(
            (a, identity(b)) for a, b in list(namespace(cls).items())))
    return out


# what a stock finder refreshes itself (a directory's listing and its time, at a change or at
# `invalidate_caches`; a zip archive's table): not compared. A listing a job edits in place
# hides or misplaces a module, which only fails a later import (the worker's word: run again)
REFRESHED = ("_path_cache", "_relaxed_path_cache", "_path_mtime", "_files")


def held(finder: Any) -> int:
    """What a finder holds that decides what an import runs, by identity: its instance state
    but what it refreshes itself (REFRESHED), a list's items each (FileFinder's `_loaders`:
    (suffix, loader class) pairs, a list that can be changed in place)."""
    state = getattr(finder, "__dict__", None)
    if type(state) is not dict:
        return 0
    return hash(tuple(sorted((str(k), tuple(map(id, v)) if type(v) is list else id(v))
                             for k, v in list(state.items()) if k not in REFRESHED)))


def compared(key: str, now: dict[str, int]) -> bool:
    """Whether a snapshot key is compared by value: not a mark of a None entry (judged by
    `added`), nor an entry gone since (`invalidate_caches` drops the relative ones, as the
    editable install's `__editable__...__path_hook__`): the path hooks, compared themselves,
    make a dropped entry again at the next import."""
    return not key.startswith(PREFIX) or (key in now and not key.endswith(NONE_DIR))


def added(before: dict[str, int]) -> list[str]:
    """The entries of the cache made since `before` (`snapshot`) that no honest import makes."""
    out = []
    for path, finder in list(sys.path_importer_cache.items()):
        if type(path) is not str:
            out.append(f"{PREFIX}entry of no str path")
        elif finder is None:
            if _is_dir(path) and f"{PREFIX}{path}{NONE_DIR}" not in before:
                out.append(f"{PREFIX}{path} (None: the directory hidden from imports)")
        elif f"{PREFIX}{path}" not in before and not stock_finder(finder, path):
            out.append(f"{PREFIX}{path} (a finder no path hook makes: "
                       f"{type(finder).__name__})")
    return out


def stock_finder(finder: Any, path: str) -> bool:
    """Whether `finder` is what the stock path hooks make for `path`, holding plain values."""
    import zipimport
    from importlib import machinery

    state = getattr(finder, "__dict__", None)
    if type(state) is not dict:
        return False
    if type(finder) is zipimport.zipimporter:
        return _stock_zip(state, path)
    return type(finder) is machinery.FileFinder and _stock_files(state, path)


def _stock_zip(state: dict[str, Any], path: str) -> bool:
    """A zipimporter's state as made for `path`: its archive and prefix make the path, its
    table of files is zipimport's own for that archive."""
    import zipimport

    archive, prefix = state.get("archive"), state.get("prefix")
    return set(state) == {"archive", "prefix", "_files"} and type(archive) is str and \
        type(prefix) is str and os.path.join(archive, prefix).rstrip(os.sep) == \
        path.rstrip(os.sep) and state["_files"] is zipimport._zip_directory_cache.get(archive)


def _stock_files(state: dict[str, Any], path: str) -> bool:
    """A FileFinder's state as its hook makes it for `path`: that directory (a relative path
    is joined to the cwd of its day), the stock loaders, its listing of plain names; a listing
    of the directory's current mtime that leaves out a name older than that mtime (it hides a
    module from later imports until the directory changes) is not."""
    where, mtime = state.get("path"), state.get("_path_mtime")
    if set(state) != {"path", "_loaders", "_path_mtime", "_path_cache", "_relaxed_path_cache"} \
            or type(where) is not str or type(mtime) not in (int, float) or not (
            where == path or not os.path.isabs(path) and where.endswith(os.sep + path)):
        return False
    stock = [(suffix, loader) for loader, suffixes in _stock_loaders() for suffix in suffixes]
    loaders = state["_loaders"]
    if type(loaders) is not list or len(loaders) != len(stock) or not all(
            type(x) is tuple and len(x) == 2 and type(x[0]) is str and x[0] == s and x[1] is c
            for x, (s, c) in zip(loaders, stock, strict=True)):
        return False
    caches = (state["_path_cache"], state["_relaxed_path_cache"])
    if not all(type(c) is set and all(type(n) is str for n in c) for c in caches):
        return False
    try:
        now = os.stat(where).st_mtime
    except OSError:
        return True  # gone: nothing to find there, whatever it lists
    # a name created in the listing's tick, after it, is the interpreter's own race (the
    # directory's mtime is coarse); one older than the directory's last change was left out
    missing = set(os.listdir(where)) - state["_path_cache"]
    return mtime != now or not any(_changed_before(os.path.join(where, n), now)
                                   for n in missing)


def _changed_before(path: str, when: float) -> bool:
    try:
        return os.lstat(path).st_ctime < when
    except OSError:  # gone since
        return False


def _stock_loaders() -> list[tuple[type, list[str]]]:
    from importlib import _bootstrap_external

    return _bootstrap_external._get_supported_file_loaders()


def _import_classes() -> list[type]:
    """IMPORT_CLASSES and their bases (but `object`), as loaded now."""
    out: list[type] = []
    for module, name in IMPORT_CLASSES:
        cls = getattr(sys.modules.get(module), name, None)
        for base in cls.__mro__[:-1] if isinstance(cls, type) else ():
            if base not in out:
                out.append(base)
    return out


def _is_dir(path: Any) -> bool:
    try:
        return os.path.isdir(path)
    except (TypeError, ValueError):  # not a path (a job's own key)
        return False
