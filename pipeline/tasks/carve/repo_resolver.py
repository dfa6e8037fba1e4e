"""Resolve imports between files of one git repository, so helpers and constants of sibling
modules can be inlined into a carved task (`from .utils import exists`, `from pkg.attend import
Attend`).

Files are read at the module's pinned commit (`git show COMMIT:PATH`), never from whatever the
work tree holds now. The repository is the module's URL when that is a local clone, else its
clone in the ingest cache.
"""

from __future__ import annotations

import ast
import copy
import functools
import subprocess
from collections.abc import Callable
from pathlib import Path

from sources.git_repos import normalize_url, repo_cache_dir

Resolver = Callable[[str, str, int], "tuple[str, str] | None"]


def _git(root: Path, *args: str) -> str | None:
    try:
        res = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=30,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    try:
        return res.stdout.decode("utf-8")
    except UnicodeDecodeError:
        return None


def repo_root(repo_url: str, cache_dir: str | Path | None) -> Path | None:
    """The local git repository holding `repo_url`'s files, or None."""
    local = Path(repo_url.removeprefix("file://")) if repo_url else None
    if local is not None and local.is_absolute() and (local / ".git").exists():
        return local
    if cache_dir and repo_url:
        cached = repo_cache_dir(Path(cache_dir), normalize_url(repo_url))
        if (cached / ".git").exists():
            return cached
    return None


@functools.lru_cache(maxsize=32)
def _files(root: Path, commit: str) -> frozenset[str]:
    listing = _git(root, "ls-tree", "-r", "--name-only", commit or "HEAD")
    return frozenset(listing.splitlines()) if listing else frozenset()


@functools.lru_cache(maxsize=512)
def _read(root: Path, commit: str, path: str) -> str | None:
    return _git(root, "show", f"{commit or 'HEAD'}:{path}")


def _candidates(importer: str, module: str, level: int) -> list[list[str]]:
    """Module paths (as parts) an import may name, the most likely first."""
    parts = module.split(".") if module else []
    here = importer.replace("\\", "/").split("/")[:-1]
    if level:
        if level - 1 > len(here):
            return []
        return [here[:len(here) - (level - 1)] + parts]
    # an absolute import: from the repository root, `src/`, then each folder above the file
    roots = [[], ["src"]] + [here[:i] for i in range(1, len(here) + 1)]
    return [r + parts for r in roots]


def repo_resolver(repo_url: str, commit: str, cache_dir: str | Path | None = None
                  ) -> Resolver | None:
    """A cst_extract resolver over the repository's files at `commit`, or None."""
    root = repo_root(repo_url, cache_dir)
    if root is None:
        return None
    files = _files(root, commit)
    if not files:
        return None

    def resolve(importer: str, module: str, level: int) -> tuple[str, str] | None:
        for parts in _candidates(importer, module, level):
            if not parts:
                continue
            for path in ("/".join(parts) + ".py", "/".join([*parts, "__init__.py"])):
                if path in files and path != importer:
                    text = _read(root, commit, path)
                    return (path, text) if text is not None else None
        return None

    return resolve


def same_definition(a: ast.stmt, b: ast.stmt) -> bool:
    """True when two top-level statements define the same thing up to argument names: research
    repositories copy `def exists(val)` / `def exists(x)` into every file."""
    return _canonical(a) == _canonical(b)


def _canonical(node: ast.stmt) -> str:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return ast.dump(node)
    node = copy.deepcopy(node)
    args = node.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    names = {a.arg: f"_arg{i}" for i, a in enumerate(every) if a is not None}
    for sub in ast.walk(node):
        if isinstance(sub, ast.arg) and sub.arg in names:
            sub.arg = names[sub.arg]
        elif isinstance(sub, ast.Name) and sub.id in names:
            sub.id = names[sub.id]
    return ast.dump(node)
