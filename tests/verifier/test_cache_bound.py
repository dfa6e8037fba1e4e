"""Build cache size bound (verifier.compile.cache_bound): least recently used entries go first, never
one a running build (a live lease) or a precompiled header being built may use."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from verifier.api import verify_batch
from verifier.backends import get_backend
from verifier.checks.extspec import ExtensionSpec
from verifier.compile.builder import BuildContext, Builder
from verifier.compile.cache_bound import LEASES, build_lease, entries, oldest_lease, trim
from verifier.protocol import VerifyOptions, VerifyRequest

DAY = 86400.0


def _entry(path: Path, size: int, age_s: float, file: str = "obj.so") -> Path:
    """A cache entry of `size` bytes last used `age_s` seconds ago (a folder, or a file)."""
    target = path / file if not path.suffix else path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"x" * size)
    when = time.time() - age_s
    for p in {target, path}:
        os.utime(p, (when, when))
    return path


def test_least_recently_used_go_first_until_under_the_bound(tmp_path: Path) -> None:
    old_root = tmp_path / "cpu-000000000000"  # a toolchain no build uses any more
    new_root = tmp_path / "cpu-111111111111"
    oldest = _entry(old_root / "builds" / "a", 1000, 3 * DAY)
    pch = _entry(old_root / "pch" / "p", 2000, 2 * DAY, "ks_pch.h.gch")
    index = _entry(old_root / "index" / "k.json", 10, 2.5 * DAY)
    recent = _entry(new_root / "builds" / "b", 1000, 1 * DAY)
    kept = _entry(new_root / "index" / "j.json", 10, 1.5 * DAY)
    assert sum(e.size for e in entries(tmp_path)) == 4020
    assert trim([tmp_path], 4020, grace_s=0) == []  # at the bound: nothing to do
    assert trim([tmp_path], 1500, grace_s=0) == [oldest, index, pch]
    assert not old_root.exists()  # an emptied toolchain root goes too
    assert recent.exists() and kept.exists()
    assert trim([tmp_path], 0, grace_s=2 * DAY) == []  # used within the grace period: kept


def test_a_live_lease_keeps_what_was_used_since_it_began(tmp_path: Path) -> None:
    root = tmp_path / "cpu-000000000000"
    before = _entry(root / "builds" / "before", 100, 1 * DAY)
    with build_lease(tmp_path):
        assert oldest_lease(tmp_path) is not None
        time.sleep(0.05)
        during = _entry(root / "builds" / "during", 100, 0)  # used by the running build
        building = _entry(root / "pch" / "q", 100, 2 * DAY, ".lock")  # a PCH being built
        assert trim([tmp_path], 0, grace_s=0) == [before]
        assert during.exists() and building.exists()
    assert oldest_lease(tmp_path) is None and not list((tmp_path / LEASES).iterdir())
    assert trim([tmp_path], 0, grace_s=0) == [during]  # its build ended: it may go now
    assert building.exists()


def test_a_dead_build_s_lease_holds_nothing(tmp_path: Path) -> None:
    (tmp_path / LEASES).mkdir()
    (tmp_path / LEASES / "99999999-0").write_text("")  # its owner died: no lock on it
    gone = _entry(tmp_path / "cpu-000000000000" / "builds" / "a", 100, 10.0)
    assert oldest_lease(tmp_path) is None and not (tmp_path / LEASES / "99999999-0").exists()
    assert trim([tmp_path], 0, grace_s=0) == [gone]


def test_a_cache_hit_makes_the_entry_most_recently_used(tmp_path: Path) -> None:
    builder = Builder(BuildContext(get_backend("cpu"), tmp_path, check_import=False))
    specs = [ExtensionSpec("e", [f"int f{i}();"], functions=[f"f{i}"]) for i in range(2)]
    for i, s in enumerate(specs):  # two cached failures, the first one older
        data = {"key": s.key, "ok": False, "log": "cpp_sources[0]:1:1: error: x",
                "unit_log": True}
        _entry(builder.root / "index" / f"{s.key}.json", 0, (2 - i) * DAY)
        (builder.root / "index" / f"{s.key}.json").write_text(json.dumps(data))
        os.utime(builder.root / "index" / f"{s.key}.json", (time.time() - (2 - i) * DAY,) * 2)
    assert builder.cached(specs[0]) is not None  # a use
    total = sum(e.size for e in entries(tmp_path))
    (removed,) = trim([tmp_path], total - 1, grace_s=0)
    assert removed.name == f"{specs[1].key}.json"


def test_verify_batch_bounds_its_cache(tmp_path: Path) -> None:
    cache = tmp_path / "builds"
    stale = _entry(cache / "cpu-000000000000" / "pch" / "p", 5000, 30 * DAY, "ks_pch.h.gch")
    stats: dict = {}
    opts = VerifyOptions(backend="cpu", build_cache_dir=str(cache), build_cache_max_gb=1e-6,
                         fork_server=False)
    (v,) = verify_batch([VerifyRequest("c", "t", "x = 1\n", "no code", "cpu")], opts,
                        stats=stats)
    assert v.status == "format_error"
    assert not stale.exists() and stats["counters"]["build_cache_evicted"] == 1
    _entry(stale, 5000, 30 * DAY, "ks_pch.h.gch")
    verify_batch([VerifyRequest("c", "t", "x = 1\n", "no code", "cpu")],
                 VerifyOptions(backend="cpu", build_cache_dir=str(cache), build_cache_max_gb=0,
                               fork_server=False))
    assert stale.exists()  # 0: no bound
