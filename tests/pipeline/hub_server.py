"""A loopback Hub: the few endpoints `huggingface_hub.HfApi` calls to push and download a dataset.

Implemented (dataset and model repos, all in memory, every commit kept):
    POST /api/repos/create                         create_repo (409 when it exists)
    POST /api/validate-yaml                        create_commit's README.md check
    POST /api/{type}s/{repo}/preupload/{rev}       upload mode: always "regular" (no LFS, no xet),
                                                   with the stored blob's git oid (unchanged files
                                                   are skipped by the client, as on the Hub)
    POST /api/{type}s/{repo}/commit/{rev}          NDJSON: header (parentCommit -> 412 on a race),
                                                   file (base64), deletedFile, deletedFolder
    GET  /api/{type}s/{repo}[/revision/{rev}]      repo_info: sha, siblings
    GET  /api/{type}s/{repo}/tree/{rev}[/{path}]   list_repo_tree (recursive or one level)
    GET  /api/{type}s/{repo}/refs                  list_repo_refs
    POST|DELETE /api/{type}s/{repo}/tag/{rev|tag}  create_tag (409 when it exists) / delete_tag
    HEAD|GET /[{type}s/]{repo}/resolve/{rev}/{path} hf_hub_download / snapshot_download
Errors carry the Hub's `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound) so the
client raises the same exception types as against huggingface.co. Writes need a bearer token.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


def git_oid(data: bytes) -> str:
    """The git blob id of `data` (what the Hub reports as a regular file's oid and ETag)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    private: bool
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> files
    messages: dict[str, str] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, rev: str) -> str | None:
        if rev in self.branches:
            return self.branches[rev]
        if rev in self.tags:
            return self.tags[rev]
        return rev if rev in self.commits else None


class HubState:
    """Every repo of the loopback Hub; one lock makes each request atomic."""

    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []  # (method, path) in arrival order

    def new_commit(self, repo: Repo, files: dict[str, bytes], message: str, parent: str) -> str:
        sha = hashlib.sha1(json.dumps([parent, message, sorted(
            (p, git_oid(b)) for p, b in files.items())]).encode()
            + str(len(repo.commits)).encode()).hexdigest()
        repo.commits[sha] = files
        repo.messages[sha] = message
        return sha


class HttpError(Exception):
    def __init__(self, status: int, message: str, code: str = "",
                 extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra or {}


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HubServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test server
        pass

    # -- plumbing ---------------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", ctype: str = "application/json",
              headers: dict[str, str] | None = None, head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        self._send(status, json.dumps(data).encode())

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        state = self.server.state
        try:
            with state.lock:
                state.requests.append((method, url.path))
                self._route(method, parts, query)
        except HttpError as exc:
            headers = {"X-Error-Code": exc.code} if exc.code else {}
            headers["X-Error-Message"] = exc.message
            self._send(exc.status, json.dumps({"error": exc.message, **exc.extra}).encode(),
                       headers=headers, head=method == "HEAD")

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    # -- routing ----------------------------------------------------------------------------
    def _repo(self, kind: str, repo_id: str) -> Repo:
        repo = self.server.state.repos.get((kind, repo_id))
        if repo is None:
            raise HttpError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return repo

    def _need_token(self) -> None:
        if not (self.headers.get("Authorization") or "").startswith("Bearer "):
            raise HttpError(401, "Invalid credentials in Authorization header")

    def _route(self, method: str, parts: list[str], query: dict[str, str]) -> None:
        if parts[:2] == ["api", "repos"] and parts[2:] == ["create"] and method == "POST":
            return self._create_repo(json.loads(self._body()))
        if parts == ["api", "validate-yaml"] and method == "POST":
            self._body()
            return self._json(200, {"errors": [], "warnings": []})
        if parts[0] == "api" and len(parts) >= 4 and parts[1] in ("datasets", "models"):
            kind, repo_id, rest = parts[1][:-1], f"{parts[2]}/{parts[3]}", parts[4:]
            return self._api(method, kind, repo_id, rest, query)
        kind = "model"
        if parts and parts[0] in ("datasets", "spaces"):
            kind, parts = parts[0][:-1], parts[1:]
        if len(parts) >= 5 and parts[2] == "resolve" and method in ("GET", "HEAD"):
            return self._resolve(method, kind, f"{parts[0]}/{parts[1]}", parts[3],
                                 "/".join(parts[4:]))
        raise HttpError(404, f"no such endpoint: {method} {self.path}")

    def _api(self, method: str, kind: str, repo_id: str, rest: list[str],
             query: dict[str, str]) -> None:
        repo = self._repo(kind, repo_id)
        if method == "GET" and (not rest or rest[0] == "revision"):
            rev = rest[1] if len(rest) > 1 else "main"
            sha = self._sha(repo, rev)
            files = repo.commits[sha]
            return self._json(200, {"id": repo_id, "sha": sha, "private": repo.private,
                                    "siblings": [{"rfilename": p} for p in sorted(files)],
                                    "tags": [], "downloads": 0, "likes": 0})
        if method == "GET" and rest == ["refs"]:
            def ref(name: str, prefix: str, sha: str) -> dict[str, str]:
                return {"name": name, "ref": f"{prefix}{name}", "targetCommit": sha}
            data = {"branches": [ref(n, "refs/heads/", s) for n, s in repo.branches.items()],
                    "converts": [],
                    "tags": [ref(n, "refs/tags/", s) for n, s in repo.tags.items()]}
            if query.get("include_prs"):
                data["pullRequests"] = []
            return self._json(200, data)
        if method == "GET" and rest and rest[0] == "tree" and len(rest) >= 2:
            return self._tree(repo, rest[1], "/".join(rest[2:]),
                              query.get("recursive", "").lower() in ("1", "true"))
        if method == "POST" and rest and rest[0] == "preupload":
            return self._preupload(repo, rest[1], json.loads(self._body()))
        if method == "POST" and rest and rest[0] == "commit":
            self._need_token()
            return self._commit(repo, kind, repo_id, rest[1], self._body())
        if rest and rest[0] == "tag" and len(rest) == 2:
            self._need_token()
            if method == "POST":
                payload = json.loads(self._body())
                if payload["tag"] in repo.tags:
                    raise HttpError(409, f"Tag {payload['tag']} already exists")
                repo.tags[payload["tag"]] = self._sha(repo, rest[1])
                return self._json(200, {})
            if method == "DELETE":
                if repo.tags.pop(rest[1], None) is None:
                    raise HttpError(404, f"Tag {rest[1]} not found", "RevisionNotFound")
                return self._json(200, {})
        raise HttpError(404, f"no such endpoint: {method} {self.path}")

    def _sha(self, repo: Repo, rev: str) -> str:
        sha = repo.resolve(rev)
        if sha is None:
            raise HttpError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return sha

    # -- endpoints --------------------------------------------------------------------------
    def _create_repo(self, payload: dict[str, Any]) -> None:
        self._need_token()
        kind = payload.get("type") or "model"
        repo_id = f"{payload['organization']}/{payload['name']}" if payload.get(
            "organization") else payload["name"]
        state = self.server.state
        prefix = "" if kind == "model" else f"{kind}s/"
        url = f"{self.server.url}/{prefix}{repo_id}"
        if (kind, repo_id) in state.repos:  # the Hub answers 409 with the url (exist_ok reads it)
            raise HttpError(409, "You already created this dataset repo", extra={"url": url})
        repo = Repo(private=payload.get("visibility") == "private")
        # Like the Hub: a new repo has one commit holding .gitattributes.
        repo.branches["main"] = state.new_commit(
            repo, {".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"},
            "initial commit", "")
        state.repos[(kind, repo_id)] = repo
        self._json(200, {"url": url, "name": repo_id})

    def _preupload(self, repo: Repo, rev: str, payload: dict[str, Any]) -> None:
        files = repo.commits[self._sha(repo, rev)]
        out = []
        for f in payload["files"]:
            entry = {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
            if f["path"] in files:
                entry["oid"] = git_oid(files[f["path"]])
            out.append(entry)
        self._json(200, {"files": out, "commitOid": self._sha(repo, rev)})

    def _commit(self, repo: Repo, kind: str, repo_id: str, rev: str, body: bytes) -> None:
        if rev not in repo.branches:
            raise HttpError(404, f"Invalid rev id: {rev} (commits go to a branch)",
                            "RevisionNotFound")
        head = repo.branches[rev]
        files = dict(repo.commits[head])
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HttpError(400, "first NDJSON line must be the header")
        header = lines[0]["value"]
        if header.get("parentCommit") and header["parentCommit"] != head:
            raise HttpError(412, f"A commit has happened since. Parent commit "
                                 f"{header['parentCommit']} is not the head {head} of {rev}")
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            path = value["path"]
            if key == "file":
                files[path] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                if path not in files:
                    raise HttpError(404, f"A file with this name doesn't exist: {path}",
                                    "EntryNotFound")
                del files[path]
            elif key == "deletedFolder":
                prefix = path.rstrip("/") + "/"
                files = {p: b for p, b in files.items() if not p.startswith(prefix)}
            else:
                raise HttpError(400, f"unsupported commit operation {key!r} (this loopback "
                                     "Hub takes regular files only)")
        sha = self.server.state.new_commit(repo, files, header.get("summary", ""), head)
        repo.branches[rev] = sha
        prefix = "" if kind == "model" else f"{kind}s/"
        self._json(200, {"success": True, "commitOid": sha,
                         "commitUrl": f"{self.server.url}/{prefix}{repo_id}/commit/{sha}"})

    def _tree(self, repo: Repo, rev: str, path: str, recursive: bool) -> None:
        files = repo.commits[self._sha(repo, rev)]
        base = path.strip("/") + "/" if path.strip("/") else ""
        entries: dict[str, dict[str, Any]] = {}
        for p in sorted(files):
            if not p.startswith(base):
                continue
            parts = p[len(base):].split("/")
            for depth in range(1, len(parts)):
                folder = base + "/".join(parts[:depth])
                if recursive or depth == 1:
                    entries.setdefault(folder, {"type": "directory", "path": folder,
                                                "oid": git_oid(folder.encode()), "size": 0})
            if recursive or len(parts) == 1:
                entries[p] = {"type": "file", "path": p, "size": len(files[p]),
                              "oid": git_oid(files[p])}
        if base and not entries:
            raise HttpError(404, f"{path} does not exist at {rev}", "EntryNotFound")
        self._json(200, list(entries.values()))

    def _resolve(self, method: str, kind: str, repo_id: str, rev: str, path: str) -> None:
        repo = self._repo(kind, repo_id)
        sha = self._sha(repo, rev)
        data = repo.commits[sha].get(path)
        if data is None:
            raise HttpError(404, f"Entry not found: {path} at {rev}", "EntryNotFound")
        self._send(200, data, "application/octet-stream",
                   {"X-Repo-Commit": sha, "ETag": f'"{git_oid(data)}"'}, head=method == "HEAD")


class HubServer(ThreadingHTTPServer):
    """`with HubServer() as hub: HfApi(endpoint=hub.url)`; `hub.state` holds every repo."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), HubHandler)
        self.state = HubState()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)

    def files(self, repo_id: str, rev: str = "main", kind: str = "dataset") -> dict[str, bytes]:
        """The files of `repo_id` at `rev` (for assertions)."""
        repo = self.state.repos[(kind, repo_id)]
        sha = repo.resolve(rev)
        assert sha is not None, f"{repo_id}: no revision {rev}"
        return dict(repo.commits[sha])
