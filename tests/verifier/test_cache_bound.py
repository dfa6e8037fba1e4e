"""Build cache size bound (verifier.compile.cache_bound): least recently used entries go first, never
one a running build (a live lease) or a precompiled header being built may use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from verifier.api import verify_batch
from verifier.backends import get_backend
from verifier.checks.extspec import ExtensionSpec
from verifier.compile.builder import BuildContext, Builder
from verifier.compile.cache_bound import LEASES, build_lease, entries, hold, oldest_lease, trim
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


# a process that holds a precompiled header as a compile does (`Builder.held_pch`), says so,
# waits for a line, then compiles a unit on that header with the real g++
_COMPILER = """
import subprocess, sys
from pathlib import Path
from verifier.compile.cache_bound import hold
pch, unit = Path(sys.argv[1]), Path(sys.argv[2])
with hold(pch) as there:
    print(there, flush=True)
    sys.stdin.readline()
    proc = subprocess.run(["g++", "-c", str(unit), "-I", str(pch), "-include", "ks_pch.h",
                           "-Winvalid-pch", "-o", str(unit.with_suffix(".o"))],
                          capture_output=True, text=True)
print(proc.returncode, proc.stderr.strip().replace("\\n", " | "), flush=True)
"""
_TRIM = """
import sys
from pathlib import Path
from verifier.compile.cache_bound import trim
print([str(p) for p in trim([Path(sys.argv[1])], 0, grace_s=0)])
"""


def test_a_trim_in_another_process_never_removes_a_header_a_compile_holds(
        tmp_path: Path) -> None:
    """Two real processes on one cache: a compile holds its precompiled header (a real g++
    PCH) and, once it holds it, another process trims the cache to 0 bytes with no grace and
    no lease; the compile then runs on the header. Before: the trim removed the header's
    folder and the compile failed on `-include ks_pch.h` ("No such file or directory"), which
    writes no -MD list, so the build read as "the compiler left no complete record" (a CPU
    conformance test met it while a build ran beside the suite). The steps are ordered by the
    processes' own lines, not by sleeps."""
    cache = tmp_path / "cache"
    pch = cache / "cpu-000000000000" / "pch" / "p"
    pch.mkdir(parents=True)
    (pch / "ks_pch.h").write_text("#include <cstddef>\ninline int ks_one() { return 1; }\n")
    made = subprocess.run(["g++", "-x", "c++-header", str(pch / "ks_pch.h"), "-o",
                           str(pch / "ks_pch.h.gch")], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    other = _entry(cache / "cpu-000000000000" / "builds" / "m", 100, DAY)
    for p in (pch, pch / "ks_pch.h", pch / "ks_pch.h.gch"):
        os.utime(p, (time.time() - DAY,) * 2)
    unit = tmp_path / "unit.cpp"
    unit.write_text("int two() { return ks_one() + 1; }\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    compiler = subprocess.Popen([sys.executable, "-c", _COMPILER, str(pch), str(unit)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=env)
    try:
        assert compiler.stdout.readline().strip() == "True"  # it holds the header now
        trimmed = subprocess.run([sys.executable, "-c", _TRIM, str(cache)], capture_output=True,
                                 text=True, env=env, timeout=120)
        assert trimmed.returncode == 0, trimmed.stderr
        assert trimmed.stdout.strip() == repr([str(other)])  # it ran: the rest went
        compiler.stdin.write("go\n")
        compiler.stdin.flush()
        rc, _, why = compiler.stdout.readline().strip().partition(" ")
        assert rc == "0", why
    finally:
        if compiler.poll() is None:
            compiler.kill()
        compiler.wait()
    assert (pch / "ks_pch.h.gch").is_file()
    assert trim([cache], 0, grace_s=0) == [pch]  # its compile ended: it may go now
    with hold(pch) as there:  # and one that comes for it finds it gone
        assert there is False
