"""A client of GitHub's REST repository search that writes a repo manifest.

GET /search/repositories with `q` (query + `language:` + `stars:` + `topic:` qualifiers),
pagination through the `Link: <...>; rel="next"` header, and rate limits respected: when
`X-RateLimit-Remaining` reaches 0 (or a 403/429 says so), wait until `X-RateLimit-Reset` (or
`Retry-After`) before the next request. The token is passed in by the caller (the CLI reads
GITHUB_TOKEN); without one GitHub allows 10 search requests a minute.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

GITHUB_API = "https://api.github.com"
_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="next"')


class GitHubError(RuntimeError):
    """The search API failed for good; the message names the URL and status."""


@dataclass
class SearchResult:
    """One repository from the search, with what the manifest needs."""

    full_name: str
    clone_url: str
    default_branch: str
    stars: int
    license: str | None
    description: str


def build_query(query: str, *, language: str | None = "python", min_stars: int | None = None,
                topics: list[str] | None = None) -> str:
    """GitHub search syntax: free text plus qualifiers."""
    parts = [query.strip()] if query.strip() else []
    if language:
        parts.append(f"language:{language}")
    if min_stars is not None:
        parts.append(f"stars:>={min_stars}")
    parts.extend(f"topic:{t}" for t in topics or [])
    return " ".join(parts)


def next_link(link_header: str | None) -> str | None:
    """The rel="next" URL of a Link header, if any."""
    if not link_header:
        return None
    match = _NEXT.search(link_header)
    return match.group(1) if match else None


def _rate_wait(headers, now: float) -> float | None:
    """Seconds to wait before the next request, from GitHub's rate-limit headers (None: no wait)."""
    retry_after = headers.get("Retry-After")
    if retry_after and retry_after.strip().isdigit():
        return float(retry_after)
    if headers.get("X-RateLimit-Remaining") == "0":
        reset = headers.get("X-RateLimit-Reset")
        if reset and reset.strip().isdigit():
            return max(0.0, float(reset) - now) + 1.0
        return 60.0
    return None


def search_repositories(
    query: str,
    *,
    token: str | None = None,
    language: str | None = "python",
    min_stars: int | None = None,
    topics: list[str] | None = None,
    max_results: int = 100,
    per_page: int = 100,
    api_url: str = GITHUB_API,
    timeout_s: float = 30.0,
    max_wait_s: float = 3600.0,
    retries: int = 3,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> list[SearchResult]:
    """Repositories matching the query, most-starred first, following pagination."""
    params = {"q": build_query(query, language=language, min_stars=min_stars, topics=topics),
              "sort": "stars", "order": "desc", "per_page": str(min(100, max(1, per_page)))}
    url: str | None = f"{api_url.rstrip('/')}/search/repositories?{urllib.parse.urlencode(params)}"
    headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28",
               "User-Agent": "kernelsynth"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    results: list[SearchResult] = []
    pending_wait = 0.0
    while url and len(results) < max_results:
        if pending_wait > 0:
            if pending_wait > max_wait_s:
                raise GitHubError(f"{url}: rate limited for {pending_wait:.0f}s "
                                  f"(> max_wait_s {max_wait_s:.0f}); set GITHUB_TOKEN")
            sleep(pending_wait)
            pending_wait = 0.0
        req = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                body = json.loads(resp.read().decode("utf-8"))
                resp_headers = resp.headers
        except urllib.error.HTTPError as exc:
            wait = _rate_wait(exc.headers, clock())
            if exc.code in (403, 429) and wait is not None and retries > 0:
                retries -= 1
                pending_wait = wait
                continue
            detail = exc.read().decode("utf-8", "replace")[:200]
            raise GitHubError(f"{url}: HTTP {exc.code} ({detail})") from None
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as exc:
            raise GitHubError(f"{url}: {exc}") from None
        for item in body.get("items", []):
            lic = (item.get("license") or {}).get("spdx_id")
            results.append(SearchResult(
                full_name=item["full_name"], clone_url=item.get("clone_url") or item["html_url"],
                default_branch=item.get("default_branch") or "main",
                stars=int(item.get("stargazers_count") or 0),
                license=None if lic in (None, "NOASSERTION") else lic,
                description=(item.get("description") or "")[:200]))
        url = next_link(resp_headers.get("Link"))
        pending_wait = _rate_wait(resp_headers, clock()) or 0.0
    return results[:max_results]


def write_manifest(results: list[SearchResult], path: str | Path,
                   paths: list[str] | None = None) -> Path:
    """Write search results as a repo manifest (sources.git_repos format); returns the path.

    GitHub's reported license is not copied as an override: detection from the cloned
    LICENSE file decides, so the allowlist sees what the repository really says.
    """
    repos = []
    for r in results:
        entry: dict = {"url": r.clone_url, "ref": r.default_branch, "stars": r.stars,
                       "description": r.description}
        if paths:
            entry["paths"] = paths
        repos.append(entry)
    p = Path(path)
    p.write_text(yaml.safe_dump({"repos": repos}, sort_keys=False), encoding="utf-8")
    return p
