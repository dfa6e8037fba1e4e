"""Git repositories as sources: a YAML manifest, cached shallow clones, one RawModule per class.

Manifest (`repos.yaml`)::

    repos:
      - url: https://github.com/owner/name    # or file:///path, or a local path
        ref: main                              # branch, tag or commit (default: HEAD)
        paths: ["src/**/*.py"]                 # globs relative to the repo (default: all .py)
        license: MIT                           # override the detected license

Every repository is pinned to the commit SHA its ref resolves to and cached under
`<cache>/repos/`, so a re-run of the same manifest reads the cache instead of the network.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from schemas import RawModule, Rejection
from sources.license import detect_license
from sources.scan import ScanError, find_module_classes

_SHA = re.compile(r"^[0-9a-f]{40}$")
_MANIFEST_KEYS = {"url", "ref", "paths", "license", "stars", "description"}


class ManifestError(ValueError):
    """The manifest is unreadable or malformed; the message names the file and entry."""


class GitError(RuntimeError):
    """A git command failed; `reason` is the rejection class, the message the one-line detail."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class RepoSpec:
    """One manifest entry."""

    url: str
    ref: str | None = None
    paths: list[str] = field(default_factory=lambda: ["**/*.py"])
    license: str | None = None


def load_manifest(path: str | Path) -> list[RepoSpec]:
    """Read a repo manifest (a `repos:` list or a bare list); raise ManifestError naming the entry."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ManifestError(f"{p}: cannot read manifest ({exc})") from None
    if isinstance(data, dict):
        data = data.get("repos")
    if not isinstance(data, list):
        raise ManifestError(f"{p}: expected a list of repos (or a `repos:` list)")
    specs = []
    for i, entry in enumerate(data):
        if isinstance(entry, str):
            entry = {"url": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
            raise ManifestError(f"{p}: entry {i}: needs a `url` string")
        unknown = set(entry) - _MANIFEST_KEYS
        if unknown:
            raise ManifestError(f"{p}: entry {i}: unknown keys {sorted(unknown)}")
        paths = entry.get("paths") or ["**/*.py"]
        if isinstance(paths, str):
            paths = [paths]
        ref = entry.get("ref")
        specs.append(RepoSpec(url=entry["url"], ref=None if ref is None else str(ref),
                              paths=[str(x) for x in paths], license=entry.get("license")))
    return specs


def normalize_url(url: str) -> str:
    """A local directory becomes an absolute path git accepts; URLs pass through."""
    if "://" in url or re.match(r"^[\w.-]+@[\w.-]+:", url):
        return url
    return str(Path(url).expanduser().resolve())


def _git(args: list[str], cwd: Path | None, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}
    try:
        return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise GitError("timeout", f"git {args[0]} took more than {timeout:.0f}s") from None
    except FileNotFoundError:
        raise GitError("git_missing", "the `git` executable is not on PATH") from None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def resolve_ref(url: str, ref: str | None, timeout: float = 60.0) -> str:
    """The commit SHA `ref` (default HEAD) points to in the remote; raise GitError."""
    res = _git(["ls-remote", url], None, timeout)
    if res.returncode != 0:
        raise GitError("unreachable", f"{url}: cannot list refs ({_last_line(res.stderr)})")
    refs: dict[str, str] = {}
    for line in res.stdout.splitlines():
        sha, _, name = line.partition("\t")
        refs[name.strip()] = sha.strip()
    if not refs:
        raise GitError("empty_repo", f"{url}: the repository has no commits")
    if ref is None:
        if "HEAD" in refs:
            return refs["HEAD"]
        raise GitError("unknown_ref", f"{url}: no HEAD; name a ref in the manifest")
    if _SHA.match(ref.lower()):
        return ref.lower()  # checked when fetched
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
        if name in refs:
            return refs[name]
    raise GitError("unknown_ref", f"{url}: ref {ref!r} not found")


def repo_cache_dir(cache_dir: Path, url: str) -> Path:
    """Where `url`'s clone lives in the cache: a readable name plus a hash of the URL."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", url.rstrip("/").split("/")[-1] or "repo")[:40]
    return cache_dir / "repos" / f"{stem}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


def checkout_commit(url: str, sha: str, cache_dir: Path, timeout: float = 300.0) -> tuple[Path, bool]:
    """A work tree of `url` at `sha` in the cache: (dir, fetched) with fetched False on a hit."""
    repo = repo_cache_dir(cache_dir, url)
    repo.mkdir(parents=True, exist_ok=True)
    if not (repo / ".git").exists():
        res = _git(["init", "-q"], repo, timeout)
        if res.returncode != 0:
            raise GitError("git_init", f"{repo}: git init failed ({_last_line(res.stderr)})")
    have = _git(["cat-file", "-e", f"{sha}^{{commit}}"], repo, timeout).returncode == 0
    if not have:
        # shallow fetch of exactly the pinned commit; servers that refuse a SHA want get a full
        # fetch of all refs instead
        res = _git(["fetch", "-q", "--depth", "1", url, sha], repo, timeout)
        if res.returncode != 0:
            res = _git(["fetch", "-q", url, "+refs/heads/*:refs/remotes/src/*",
                        "+refs/tags/*:refs/tags/*"], repo, timeout)
            if res.returncode != 0:
                raise GitError("fetch_failed", f"{url}: fetch failed ({_last_line(res.stderr)})")
        if _git(["cat-file", "-e", f"{sha}^{{commit}}"], repo, timeout).returncode != 0:
            raise GitError("unknown_ref", f"{url}: commit {sha} not found after fetch")
    res = _git(["-c", "advice.detachedHead=false", "checkout", "-q", "--force", sha], repo, timeout)
    if res.returncode != 0:
        raise GitError("checkout_failed", f"{url}@{sha[:12]}: checkout failed "
                                          f"({_last_line(res.stderr)})")
    _git(["clean", "-q", "-fdx"], repo, timeout)
    return repo, not have


def _matches(rel: str, patterns: list[str]) -> bool:
    for pat in patterns:
        if fnmatch.fnmatch(rel, pat) or (pat.startswith("**/") and fnmatch.fnmatch(rel, pat[3:])):
            return True
    return False


def walk_python_files(repo: Path, patterns: list[str], ref: str
                      ) -> Iterator[Path | Rejection]:
    """Python files under `repo` matching `patterns`; symlinks are never followed (loops and
    escapes become Rejections)."""
    for dirpath, dirnames, filenames in os.walk(repo, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in list(dirnames) + sorted(filenames):
            path = here / name
            rel = path.relative_to(repo).as_posix()
            if path.is_symlink():
                try:
                    target = path.resolve(strict=True)
                except (RuntimeError, OSError) as exc:
                    loop = isinstance(exc, RuntimeError) or "symbolic links" in str(exc)
                    reason = "symlink_loop" if loop else "broken_symlink"
                    yield Rejection.make("ingest", f"{ref}:{rel}", f"{ref}:{rel}", reason,
                                         f"{ref}:{rel}: {reason.replace('_', ' ')}; not followed")
                    continue
                if target.is_dir() or name.endswith(".py"):
                    where = "inside" if target.is_relative_to(repo.resolve()) else "outside"
                    yield Rejection.make("ingest", f"{ref}:{rel}", f"{ref}:{rel}", "symlink",
                                         f"{ref}:{rel}: symlink to a path {where} the repo; "
                                         "not followed")
                continue
            if name in dirnames or not name.endswith(".py"):
                continue
            if _matches(rel, patterns):
                yield path


def read_python_file(path: Path, rel: str, max_bytes: int) -> str:
    """The file's text; raise GitError('too_large' | 'binary' | 'not_utf8') otherwise."""
    size = path.stat().st_size
    if size > max_bytes:
        raise GitError("too_large", f"{rel}: {size} bytes > max_file_bytes {max_bytes}")
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        raise GitError("binary", f"{rel}: binary content (NUL byte)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GitError("not_utf8", f"{rel}: not UTF-8 (byte {exc.start})") from None


def iter_repo_modules(spec: RepoSpec, cache_dir: Path, *, allowlist: list[str],
                      max_file_bytes: int = 1_000_000, timeout: float = 300.0
                      ) -> Iterator[RawModule | Rejection]:
    """Every nn.Module class of one manifest repository, or Rejections saying what was skipped."""
    url = normalize_url(spec.url)
    try:
        sha = resolve_ref(url, spec.ref, timeout)
        repo, fetched = checkout_commit(url, sha, cache_dir, timeout)
    except GitError as exc:
        yield Rejection.make("ingest", spec.url, f"{spec.url}@{spec.ref or 'HEAD'}", exc.reason,
                             str(exc))
        return
    ref = f"{spec.url}@{sha[:12]}"
    if spec.license:
        spdx, origin = spec.license, "manifest"
    else:
        spdx, origin = detect_license(repo)
    if spdx is None:
        yield Rejection.make("ingest", spec.url, ref, "no_license", f"{spec.url}: {origin}")
        return
    allowed = {a.lower() for a in allowlist}
    if spdx.lower() not in allowed:
        yield Rejection.make("ingest", spec.url, ref, "license",
                             f"{spec.url}: license {spdx} ({origin}) is not in the allowlist")
        return
    for item in walk_python_files(repo, spec.paths, ref):
        if isinstance(item, Rejection):
            yield item
            continue
        rel = item.relative_to(repo).as_posix()
        try:
            code = read_python_file(item, rel, max_file_bytes)
            classes = find_module_classes(code, rel)
        except GitError as exc:
            yield Rejection.make("ingest", f"{ref}:{rel}", f"{ref}:{rel}", exc.reason, str(exc))
            continue
        except ScanError as exc:
            yield Rejection.make("ingest", f"{ref}:{rel}", f"{ref}:{rel}", "syntax",
                                 f"{exc} (Python 2 or invalid syntax)")
            continue
        except OSError as exc:
            yield Rejection.make("ingest", f"{ref}:{rel}", f"{ref}:{rel}", "unreadable",
                                 f"{rel}: {exc.strerror}")
            continue
        for cls in classes:
            meta = json.dumps({"ref": spec.ref, "bases": cls.bases, "license_from": origin,
                               "fetched": fetched}, sort_keys=True)
            yield RawModule(
                module_id=RawModule.make_id("git", spec.url, sha, rel, cls.name, code),
                source_kind="git", repo_url=spec.url, commit=sha, path=rel, license=spdx,
                module_name=cls.name, code=code, line_start=cls.line_start,
                line_end=cls.line_end, meta=meta)


def iter_manifest_modules(manifest: str | Path, cache_dir: Path, *, allowlist: list[str],
                          max_file_bytes: int = 1_000_000, timeout: float = 300.0
                          ) -> Iterator[RawModule | Rejection]:
    """All repositories of a manifest, one after another; a bad repo never stops the rest."""
    try:
        specs = load_manifest(manifest)
    except ManifestError as exc:
        yield Rejection.make("ingest", str(manifest), str(manifest), "manifest", str(exc))
        return
    for spec in specs:
        yield from iter_repo_modules(spec, cache_dir, allowlist=allowlist,
                                     max_file_bytes=max_file_bytes, timeout=timeout)
