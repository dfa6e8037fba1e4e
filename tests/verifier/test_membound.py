"""Host memory bound of the GPU worker (`verifier.isolation.membound`): RLIMIT_AS cannot be used on CUDA,
so a memory cgroup or, where none is writable, RLIMIT_DATA bounds what it can touch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from verifier.isolation import membound
from verifier.isolation.sandbox import SandboxLimits, sandboxed_argv

_ALLOC = ("import sys\nb = bytearray(int(sys.argv[1]) << 20)\n"
          "for i in range(0, len(b), 4096):\n    b[i] = 1\nprint('ALLOCATED')\n")


def test_without_a_memory_cgroup_rlimit_data_applies(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(membound, "V1_ROOT", tmp_path / "no-memory-hierarchy")
    cgroup, data_mb, how = membound.host_memory_bound(300, None)
    assert (cgroup, data_mb) == (None, 300) and how.startswith("RLIMIT_DATA 300 MB"), how
    assert membound.host_memory_bound(0, None)[:2] == (None, 0)
    limits = SandboxLimits(memory_mb=0, isolate=False, isolate_network=False, processes=0)

    def run(mb: int) -> subprocess.CompletedProcess:
        argv = sandboxed_argv([sys.executable, "-c", _ALLOC, str(mb)], limits, None,
                              cgroup, data_mb)
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    small, big = run(50), run(600)  # no address-space limit: only RLIMIT_DATA stops it
    assert small.returncode == 0 and "ALLOCATED" in small.stdout, small.stderr
    assert big.returncode != 0 and "MemoryError" in big.stderr, (big.stdout, big.stderr)
