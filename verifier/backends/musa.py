"""MUSA backend (Moore Threads GPUs): torch_musa, mcc device units, torch.musa event timing.

Candidates are written for CUDA and ported with `verifier.backends.musa_port` (headers, runtime API,
at::cuda -> at::musa, `.cu` -> `.mu`). Device units are compiled by mcc (`-x musa
--offload-arch=mp_XY`, from `torch.musa.get_arch_list()`, else $MUSA_ARCH, else mp_22) against
torch's and torch_musa's headers and linked with musart and torch_musa's `musa_python`, the way
`torch_musa.utils.musa_extension.load_inline(..., musa_sources=...)` builds a JIT extension.
Without torch_musa (and a MUSA device) the backend is unavailable and says what it needs.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

from verifier.backends import (
    BackendUnavailable,
    BuildUnit,
    DeviceBackend,
    ExecutionSlot,
    host_flags_common,
    link_flags_common,
    register,
    run_tool,
    tool_identity,
)
from verifier.backends.musa_port import port_cuda_to_musa

DEFAULT_MUSA_ARCH = "mp_22"
NEEDS = ("the musa backend needs torch_musa (Moore Threads' PyTorch backend, "
         "`import torch_musa`), the MUSA toolkit (mcc under $MUSA_HOME, default /usr/local/musa) "
         "and a MUSA GPU")


def torch_musa_installed() -> bool:
    """True when `import torch_musa` can work (does not import it)."""
    return importlib.util.find_spec("torch_musa") is not None


def require_torch_musa() -> Any:
    """Import torch_musa (registers the 'musa' device and torch.musa) or raise what is needed."""
    if not torch_musa_installed():
        raise BackendUnavailable(f"torch_musa is not installed: {NEEDS}")
    import torch
    import torch_musa  # noqa: F401

    return torch.musa


@functools.cache
def musa_home() -> str:
    """$MUSA_HOME, else /usr/local/musa (the toolkit's default prefix)."""
    return os.environ.get("MUSA_HOME") or os.environ.get("MUSA_PATH") or "/usr/local/musa"


def mcc_path() -> str:
    """Path of mcc, or a clear error."""
    cand = Path(musa_home()) / "bin" / "mcc"
    if cand.exists():
        return str(cand)
    found = shutil.which("mcc")
    if found:
        return found
    raise FileNotFoundError(f"mcc not found under {musa_home()}/bin or on PATH: {NEEDS}")


def musa_arch() -> str:
    """Offload arch to build for, e.g. 'mp_22' (present architecture only)."""
    if os.environ.get("MUSA_ARCH"):
        return os.environ["MUSA_ARCH"]
    if torch_musa_installed():
        try:
            archs = require_torch_musa().get_arch_list()
            if archs:
                return archs[-1]
        except (AttributeError, RuntimeError):
            pass
    return DEFAULT_MUSA_ARCH


def torch_musa_include_dirs() -> list[str]:
    """torch_musa's include roots (its csrc headers and the generated CUDA-compatible ATen)."""
    spec = importlib.util.find_spec("torch_musa")
    if spec is None or not spec.origin:
        raise BackendUnavailable(f"torch_musa is not installed: {NEEDS}")
    pkg = Path(spec.origin).parent
    root = pkg.parent
    return [str(root), str(pkg / "share" / "generated_cuda_compatible" / "include"),
            str(pkg / "share" / "generated_cuda_compatible" / "aten" / "src"),
            str(Path(musa_home()) / "include")]


@register
class MusaBackend(DeviceBackend):
    """Moore Threads GPUs through torch_musa and mcc."""

    name = "musa"
    device_type = "musa"
    device_suffix = ".mu"
    device_prelude = "#include <torch/types.h>\n#include <musa.h>\n#include <musa_runtime.h>\n"
    supports_device_sources = True
    fork_safe = False  # unverified without MUSA hardware: a fresh interpreter per candidate
    visible_devices_env = "MUSA_VISIBLE_DEVICES"

    @classmethod
    def is_available(cls) -> bool:
        if not torch_musa_installed():
            return False
        try:
            return bool(require_torch_musa().is_available())
        except (ImportError, RuntimeError, BackendUnavailable):
            return False

    @classmethod
    def unavailable_reason(cls) -> str:
        if not torch_musa_installed():
            return f"torch_musa is not installed: {NEEDS}"
        return "torch.musa.is_available() is False: no MUSA device or driver visible"

    def execution_slots(self, workers: int) -> list[ExecutionSlot]:
        """One worker per visible MUSA GPU, pinned with MUSA_VISIBLE_DEVICES."""
        visible = os.environ.get(self.visible_devices_env)
        if visible:
            ids = [v for v in visible.split(",") if v.strip()]
        else:
            ids = [str(i) for i in range(require_torch_musa().device_count())]
        return [ExecutionSlot(f"musa:{d}", {self.visible_devices_env: d})
                for d in ids or ["0"]]

    def sandbox_memory_mb(self, requested_mb: int) -> int:
        return 0

    def host_flags(self) -> list[str]:
        return host_flags_common() + [f"-I{d}" for d in torch_musa_include_dirs()]

    def toolchain_id(self) -> str:
        """The host toolchain plus mcc (its `--version`) and the target arch."""
        try:
            mcc = tool_identity(mcc_path())
        except FileNotFoundError as exc:
            mcc = f"mcc missing: {exc}"
        return "\n".join([super().toolchain_id(), mcc, musa_arch()])

    def link_flags(self) -> list[str]:
        spec = importlib.util.find_spec("torch_musa")
        lib = Path(spec.origin).parent / "lib" if spec and spec.origin else None
        flags = link_flags_common()
        if lib:
            flags += [f"-L{lib}", f"-Wl,-rpath,{lib}"]
        mlib = Path(musa_home()) / "lib"
        return flags + ["-lmusa_python", f"-L{mlib}", f"-Wl,-rpath,{mlib}", "-lmusart"]

    def compile_unit(self, unit: BuildUnit, obj: Path, flags: list[str], pch_dir: Path | None,
                     log: list[str], timeout_s: float) -> bool:
        if unit.kind == "host":
            return super().compile_unit(unit, obj, flags, pch_dir, log, timeout_s)
        return self.compile_device_unit(unit.path, obj, flags, log, timeout_s)

    def compile_device_unit(self, src: Path, obj: Path, flags: list[str], log: list[str],
                            timeout_s: float) -> bool:
        """Port the unit to MUSA (writing `<name>.mu`) and compile it with mcc."""
        text = src.read_text(encoding="utf-8", errors="replace")
        mu = src.with_suffix(".mu") if src.suffix != ".mu" else src.with_name(src.stem + ".p.mu")
        mu.write_text(port_cuda_to_musa(text), encoding="utf-8")
        cmd = [mcc_path(), "-x", "musa", f"--offload-arch={musa_arch()}", "-fPIC", "-std=c++17",
               *host_flags_common_no_std(), *[f"-I{d}" for d in torch_musa_include_dirs()],
               *flags, "-c", str(mu), "-o", str(obj)]
        return run_tool(cmd, log, timeout_s)

    def device(self) -> str:
        return "musa"

    def device_name(self) -> str:
        return require_torch_musa().get_device_name(0)

    def synchronize(self) -> None:
        require_torch_musa().synchronize()



def host_flags_common_no_std() -> list[str]:
    """torch's host include/ABI flags without -std/-fPIC (mcc gets its own)."""
    return [f for f in host_flags_common() if f not in ("-fPIC", "-std=c++20")]
