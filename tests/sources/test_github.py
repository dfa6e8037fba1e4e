"""GitHub search client against a loopback server answering in GitHub's JSON shape."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sources.git_repos import load_manifest
from sources.github import GitHubError, build_query, next_link, search_repositories, write_manifest


def _item(i: int) -> dict:
    return {"full_name": f"org/repo{i}", "html_url": f"https://github.com/org/repo{i}",
            "clone_url": f"https://github.com/org/repo{i}.git", "default_branch": "main",
            "stargazers_count": 1000 - i, "license": {"spdx_id": "MIT" if i % 2 else "NOASSERTION"},
            "description": f"repo {i}"}


class FakeGitHub(BaseHTTPRequestHandler):
    """Three pages of two repos; page 2 first answers 403 rate-limited once."""

    requests: list[tuple[str, dict, dict]] = []
    limited_once = False

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        url = urllib.parse.urlparse(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        type(self).requests.append((url.path, query, dict(self.headers)))
        page = int(query.get("page", "1"))
        if page == 2 and not type(self).limited_once:
            type(self).limited_once = True
            self._send(403, {"message": "API rate limit exceeded"},
                       {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1000030"})
            return
        base = f"http://{self.server.server_address[0]}:{self.server.server_address[1]}"
        headers = {"X-RateLimit-Remaining": "0" if page == 1 else "9",
                   "X-RateLimit-Reset": "1000005"}
        if page < 3:
            nxt = urllib.parse.urlencode({**query, "page": page + 1})
            headers["Link"] = (f'<{base}/search/repositories?{nxt}>; rel="next", '
                               f'<{base}/search/repositories?page=3>; rel="last"')
        items = [_item(2 * (page - 1)), _item(2 * (page - 1) + 1)]
        self._send(200, {"total_count": 6, "incomplete_results": False, "items": items}, headers)

    def _send(self, code: int, body: dict, headers: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    FakeGitHub.requests = []
    FakeGitHub.limited_once = False
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeGitHub)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_search_paginates_and_waits_on_rate_limits(server, tmp_path: Path):
    waits: list[float] = []
    results = search_repositories("attention", token="tok123", min_stars=50, topics=["pytorch"],
                                  max_results=10, api_url=server, sleep=waits.append,
                                  clock=lambda: 1000000.0)
    assert [r.full_name for r in results] == [f"org/repo{i}" for i in range(6)]
    assert results[1].license == "MIT" and results[0].license is None
    # page 1 said remaining=0 (reset in 5 s), then the 403 said reset in 30 s
    assert waits == [6.0, 31.0]
    paths = [r[0] for r in FakeGitHub.requests]
    assert paths == ["/search/repositories"] * 4
    first_query, first_headers = FakeGitHub.requests[0][1], FakeGitHub.requests[0][2]
    assert first_query["q"] == "attention language:python stars:>=50 topic:pytorch"
    assert first_query["per_page"] == "100" and first_query["sort"] == "stars"
    assert first_headers["Authorization"] == "Bearer tok123"
    assert first_headers["Accept"] == "application/vnd.github+json"
    manifest = write_manifest(results, tmp_path / "repos.yaml", paths=["src/**/*.py"])
    specs = load_manifest(manifest)
    assert [s.url for s in specs][:2] == ["https://github.com/org/repo0.git",
                                          "https://github.com/org/repo1.git"]
    assert specs[0].ref == "main" and specs[0].paths == ["src/**/*.py"] and specs[0].license is None


def test_max_results_stops_pagination(server):
    results = search_repositories("x", max_results=2, api_url=server, sleep=lambda s: None)
    assert len(results) == 2 and len(FakeGitHub.requests) == 1
    assert "Authorization" not in FakeGitHub.requests[0][2]


def test_errors_name_the_url(server):
    with pytest.raises(GitHubError, match="rate limited"):
        search_repositories("x", api_url=server, sleep=lambda s: None, clock=lambda: 1000000.0,
                            max_wait_s=10)
    with pytest.raises(GitHubError, match="127.0.0.1:9"):
        search_repositories("x", api_url="http://127.0.0.1:9", timeout_s=2)


def test_query_and_link_parsing():
    assert build_query("", language=None, min_stars=None) == ""
    assert next_link('<https://a/x?page=2>; rel="next", <https://a/x?page=9>; rel="last"') == (
        "https://a/x?page=2")
    assert next_link('<https://a/x?page=9>; rel="last"') is None


def test_cli_writes_manifest(server, tmp_path: Path, monkeypatch):
    from typer.testing import CliRunner

    from pipeline.cli import app

    monkeypatch.setenv("GITHUB_TOKEN", "envtoken")
    out = tmp_path / "repos.yaml"
    res = CliRunner().invoke(app, ["github-search", "kernels", "--api-url", server, "--limit",
                                   "2", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert [s.url for s in load_manifest(out)] == ["https://github.com/org/repo0.git",
                                                   "https://github.com/org/repo1.git"]
    assert FakeGitHub.requests[0][2]["Authorization"] == "Bearer envtoken"
