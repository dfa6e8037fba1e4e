"""Torch's copy and fill kernels are no work of the task (verifier.judge.library_work), named
from the symbol tables of the objects the run mapped (verifier.judge.elf_symbols).

The sampled tests run a real worker serving the sampling clock's windows (as
tests/verifier/test_ip_sampler.py does): the same calls, one with torch copying and one with
torch computing, each followed by the run's own object spinning for 30% of that time."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verifier.judge import ip_sampler as ips
from verifier.judge.elf_symbols import Symbols, symbols_of
from verifier.judge.library_work import is_movement, no_work, torch_lib

sys.path.insert(0, str(Path(__file__).parent))
from sampled_child import end, spawn, tasks_of  # noqa: E402
from sampler_cases import (  # noqa: E402
    CHILD_ENV,
    NEEDS_PTRACE,
    WORKER,
    NoCheckJudge,
    build_spin,
    pad_to,
)


def _mapping(addr: int) -> tuple[str, int, int]:
    """(path, inode, file offset) of address `addr` in this process."""
    for ln in Path("/proc/self/maps").read_text().splitlines():
        parts = ln.split(None, 5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= addr < hi:
            return parts[5].strip(), int(parts[4]), addr - lo + int(parts[2], 16)
    raise AssertionError(f"{addr:#x} is not mapped")


def _offset_of(path: str, fragment: bytes) -> int:
    """The file offset of the first function of `path` whose name contains `fragment`."""
    syms = Symbols(path)
    strtab, size = syms._strtab  # noqa: SLF001 (the test reads the table it checks against)
    at = syms._mm.find(fragment, strtab, strtab + size)  # noqa: SLF001
    assert at >= 0, fragment
    start = syms._mm.rfind(b"\0", strtab, at) + 1 - strtab  # noqa: SLF001
    i = syms.names.index(start)
    off, vaddr, _ = next(ld for ld in syms.loads if ld[1] <= syms.starts[i] < ld[1] + ld[2])
    return syms.starts[i] - vaddr + off


def test_a_function_is_named_at_its_address(tmp_path: Path) -> None:
    (tmp_path / "f.c").write_text("int ks_first(int a){return a*3;}\n"
                                  "static int helper(int a){return a+1;}\n"
                                  "int ks_second(int a){return helper(a)*helper(a+2);}\n")
    so = tmp_path / "libf.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(so), str(tmp_path / "f.c")],
                   check=True)
    lib = ctypes.CDLL(str(so))
    for name in ("ks_first", "ks_second"):
        addr = ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
        path, _, off = _mapping(addr)
        syms = symbols_of(path)
        assert syms is not None and syms.name_at(off) == name
        assert syms.name_at(off + 1) == name  # inside it, not only at its start
    assert symbols_of(str(tmp_path / "missing.so")) is None


def test_mangled_names_of_copy_and_fill_kernels_are_movement() -> None:
    assert is_movement("_ZN3c1012function_refIFvPPcPKlllEE11callback_fnIN2at6native4AVX216"
                       "VectorizedLoop2dIZZZNSA_18direct_copy_kernelERNS8_18TensorIteratorBase")
    assert is_movement("_ZN2at6native4AVX211copy_kernelERNS_14TensorIteratorEb")
    assert is_movement("_ZN2at6native6AVX51211fill_kernelERNS_14TensorIteratorERKN3c106ScalarE")
    assert is_movement("_ZN2at6nativeL9copy_implERNS_6TensorERKS1_b.isra.0")
    for compute in ("_ZN2at6native12_GLOBAL__N_118masked_fill_kernelERNS_14TensorIteratorE",
                    "_ZN2at6native12_GLOBAL__N_117index_copy_kernelERNS_14TensorIteratorE",
                    "_ZN2at6native12_GLOBAL__N_115copysign_kernelERNS_18TensorIteratorBaseE",
                    "_ZN4dnnl4impl3cpu3x6420direct_copy_kernelEv",  # oneDNN's, not aten's
                    "_ZN2at6native4AVX215clamp_min_kernelERNS_18TensorIteratorBaseE",
                    "_ZN2at4_ops15copysign_Tensor4callEv", ""):
        assert not is_movement(compute), compute


def test_only_torchs_own_copy_kernels_count_for_nothing(tmp_path: Path) -> None:
    """The copy kernel in the file the judge's torch loaded is no work; the same offset in a
    file of the same name anywhere else, or of another inode, is library arithmetic."""
    lib = torch_lib()
    path = os.path.join(lib, "libtorch_cpu.so")
    inode = os.stat(path).st_ino
    copy_at = _offset_of(path, b"18direct_copy_kernel")
    exp_at = _offset_of(path, b"10exp_kernel")
    assert no_work(path, inode, copy_at)
    assert not no_work(path, inode, exp_at)
    assert not no_work(path, inode + 1, copy_at)
    elsewhere = tmp_path / "lib" / "libtorch_cpu.so"  # a link: the same bytes, same symbols
    elsewhere.parent.mkdir()
    elsewhere.symlink_to(path)
    assert not no_work(str(elsewhere), inode, copy_at)


# the call: `work`, then the run's own object spinning for 30% of its cpu time
SETUP = """
import time
torch.set_num_threads(1)
lib = ctypes.CDLL({spin!r})
lib.spin.argtypes, lib.spin.restype = [ctypes.c_long], ctypes.c_double
src, dst = torch.randn(2048, 2048), torch.empty(2048, 2048)
work = {work}
""" + pad_to("work", 0.3) + """

def call(x):
    work()
    lib.spin(pad)
"""


@pytest.fixture(scope="module")
def spin_so(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_spin(tmp_path_factory.mktemp("spinlw"), "libks_ownlw.so")


def _sampled(tmp_path: Path, work: str, spin: Path) -> dict:
    clock = ips.SamplingClock(NoCheckJudge(), workdir=tmp_path, wait_s=60.0)
    setup = SETUP.format(spin=str(spin), work=work)
    child, worker = spawn(WORKER.format(setup=setup), cwd=tmp_path, env=CHILD_ENV)
    clock.own = {spin.name}
    clock.tasks = lambda: tasks_of(worker)
    try:
        assert child.wait(timeout=180) == 0
    finally:
        end(child, worker)
    return clock.result()


@NEEDS_PTRACE
def test_torch_copying_is_no_work_and_torch_computing_is_library(tmp_path: Path,
                                                                  spin_so: Path) -> None:
    """The same shape of call, each run three times: torch copies a 16 MB tensor (what the
    harness does with every output) then the own object spins for 30% of that time: never a
    finding, the copy's samples `movement`; torch computes exp of it instead: found (77%
    library) in every run. With copies counted as library both were ~77% library."""
    for i in range(3):
        (tmp_path / f"copy{i}").mkdir()
        res = _sampled(tmp_path / f"copy{i}", "lambda: dst.copy_(src)", spin_so)
        kinds = res["ip_samples"].get("kinds", {})
        assert res["failure"] == "", (res["failure"], res["ip_samples"])
        assert kinds.get("movement", 0) > kinds.get("torch", 0), res["ip_samples"]
        (tmp_path / f"exp{i}").mkdir()
        res = _sampled(tmp_path / f"exp{i}", "lambda: torch.exp(src, out=dst)", spin_so)
        assert res["failure"].startswith("library_time"), (res["failure"], res["ip_samples"])
        assert "libtorch_cpu.so" in res["failure"], res["failure"]
