"""CUDA backend: nvcc device units, events timing with L2 flush, profiler kernel names.

Device units are compiled with nvcc for the present architecture only (one `-gencode`, from
`TORCH_CUDA_ARCH_LIST`, else `nvidia-smi`'s compute capability, else sm_90), with torch's own
nvcc flags. The compile side needs nvcc and torch's headers, not a GPU: on a CPU node with a CPU
torch build the objects compile (the full check of the candidate's C++/CUDA; the one header
CMake generates for c10/cuda, missing from CPU wheels, is supplied by `cpu_torch_shim_dir`) but
cannot be linked, because the CPU build lacks libtorch_cuda; `link` says so in the log
(`--compile-only`).

Compile speed: torch's `torch/extension.h` (all of libtorch's C++ API plus pybind11) dominates a
device unit's compile time; `<torch/types.h>` (ATen and the torch:: factories) is enough for
nearly all kernels. `compile_unit` first tries the unit with `torch/extension.h` swapped for the
light header and retries with the original text when that fails, so what candidates may write
is unchanged.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from verifier.backends import (
    BuildUnit,
    DeviceBackend,
    ExecutionSlot,
    host_flags_common,
    link_flags_common,
    register,
    run_tool,
    tool_identity,
)

DEFAULT_ARCH = "9.0"
_EXT_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"]torch/(extension|all|torch)\.h[>\"]",
                          re.MULTILINE)
_LIGHT_HEADER = "#include <torch/types.h>"
# Symbols that live only in the full header: a unit using them skips the light attempt.
_NEEDS_FULL = re.compile(r"PYBIND11|pybind11|py::|torch::nn|torch::optim|torch::jit|torch::autograd")


@functools.cache
def cuda_home() -> str | None:
    """The CUDA toolkit root: $CUDA_HOME/$CUDA_PATH, else the toolkit that owns nvcc."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    roots = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(os.path.realpath(nvcc)).parent.parent)
    roots.append(Path("/usr/local/cuda"))
    for root in roots:  # /usr/local/bin/nvcc may be a wrapper: want the root with the headers
        if (root / "include" / "cuda_runtime.h").exists() and (root / "bin" / "nvcc").exists():
            return str(root)
    return str(roots[0]) if roots else None


def nvcc_path() -> str:
    """Path of nvcc, or a clear error naming what is missing."""
    home = cuda_home()
    candidates = [str(Path(home) / "bin" / "nvcc")] if home else []
    candidates.append(shutil.which("nvcc") or "")
    for cand in candidates:
        if cand and Path(cand).exists():
            return cand
    raise FileNotFoundError("nvcc not found: install the CUDA toolkit and put nvcc on PATH "
                            "or set CUDA_HOME")


@functools.cache
def cuda_arch() -> str:
    """Compute capability to build for, e.g. '9.0' (present architecture only)."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(";", " ").split()
    if env:
        return env[0].replace("+PTX", "")
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.split()
            if out and re.fullmatch(r"\d+\.\d+", out[0]):
                return out[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return DEFAULT_ARCH


def arch_flags(arch: str | None = None) -> list[str]:
    """One -gencode for `arch` ('9.0' -> sm_90); '9.0a' keeps the arch-specific suffix."""
    arch = arch or cuda_arch()
    num = arch.replace(".", "")
    return [f"-gencode=arch=compute_{num},code=sm_{num}"]


def nvcc_flags(arch: str | None = None) -> list[str]:
    """The nvcc flags torch's cpp_extension uses for an extension's .cu files."""
    from torch.utils import cpp_extension

    host = [f for f in host_flags_common() if f not in ("-fPIC", "-std=c++20")]
    flags = [*host, *cpp_extension.COMMON_NVCC_FLAGS, *arch_flags(arch),
             "--compiler-options", "-fPIC", "-std=c++20"]
    return flags + cuda_include_flags()


def cuda_include_flags() -> list[str]:
    """The toolkit's include folder (as torch adds it), and on a CPU torch the shim folder."""
    flags = []
    home = cuda_home()
    if home:
        flags += ["-isystem", str(Path(home) / "include")]
    shim = cpu_torch_shim_dir()
    if shim:
        flags += ["-I", shim]
    return flags


# A CPU torch wheel ships c10/cuda's headers but not the header CMake generates for them; the
# one macro it defines (shared-library build) is what every CUDA wheel sets.
_CMAKE_MACROS = ("#pragma once\n// kernelsynth: stands in for the header a CUDA torch build generates\n"
                 "#define C10_CUDA_BUILD_SHARED_LIBS\n")


@functools.cache
def cpu_torch_shim_dir() -> str | None:
    """Include dir with c10/cuda/impl/cuda_cmake_macros.h when torch lacks it (CPU build)."""
    import tempfile

    import torch
    from torch.utils import cpp_extension

    rel = Path("c10") / "cuda" / "impl" / "cuda_cmake_macros.h"
    if any((Path(p) / rel).exists() for p in cpp_extension.include_paths()):
        return None
    root = Path(tempfile.gettempdir()) / f"kernelsynth-cuda-shim-{torch.__version__}"
    target = root / rel
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(_CMAKE_MACROS, encoding="utf-8")
        tmp.replace(target)
    return str(root)


@functools.cache
def torch_has_cuda_libs() -> bool:
    """True when this torch build ships libtorch_cuda (linkable CUDA extensions)."""
    import torch

    lib = Path(torch.__file__).parent / "lib"
    return any(lib.glob("libtorch_cuda.so*"))


def light_header_text(text: str) -> str | None:
    """The unit with torch/extension.h swapped for torch/types.h, or None when not applicable."""
    if not _EXT_INCLUDE.search(text) or _NEEDS_FULL.search(text):
        return None
    return _EXT_INCLUDE.sub(_LIGHT_HEADER, text)


@register
class CudaBackend(DeviceBackend):
    """NVIDIA GPUs through torch.cuda and nvcc."""

    name = "cuda"
    device_type = "cuda"
    device_suffix = ".cu"
    device_prelude = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
    supports_device_sources = True
    light_header = True  # try torch/types.h before torch/extension.h in device units
    persistent_worker = True  # CUDA context + profiler start cost ~6 s per process (H100)
    visible_devices_env = "CUDA_VISIBLE_DEVICES"

    # --- parent side -------------------------------------------------------------------------
    @classmethod
    def is_available(cls) -> bool:
        import torch

        return bool(torch.cuda.is_available())

    @classmethod
    def unavailable_reason(cls) -> str:
        import torch

        if torch.version.cuda is None:
            return (f"torch {torch.__version__} is a CPU build; the cuda backend needs a CUDA "
                    "build of torch and an NVIDIA GPU (use --compile-only to only compile)")
        return "torch.cuda.is_available() is False: no NVIDIA GPU or driver visible"

    def execution_slots(self, workers: int) -> list[ExecutionSlot]:
        """One worker per visible GPU, pinned with CUDA_VISIBLE_DEVICES."""
        import torch

        visible = os.environ.get(self.visible_devices_env)
        ids = [v for v in visible.split(",") if v.strip()] if visible else [
            str(i) for i in range(torch.cuda.device_count())]
        if not ids:
            ids = ["0"]
        arch = os.environ.get("TORCH_CUDA_ARCH_LIST") or cuda_arch()
        return [ExecutionSlot(f"cuda:{gpu}", {self.visible_devices_env: gpu,
                                              "TORCH_CUDA_ARCH_LIST": arch}) for gpu in ids]

    def sandbox_memory_mb(self, requested_mb: int) -> int:
        return 0  # the CUDA driver maps terabytes of virtual address space

    # --- compile worker side -----------------------------------------------------------------
    def toolchain_id(self) -> str:
        """The host toolchain plus nvcc (its `--version`) and the device flags (the arch)."""
        try:
            nvcc = tool_identity(nvcc_path())
        except FileNotFoundError as exc:
            nvcc = f"nvcc missing: {exc}"
        return "\n".join([super().toolchain_id(), nvcc, *nvcc_flags()])

    def host_flags(self) -> list[str]:
        """torch builds a CUDA extension's C++ files with the toolkit's headers on the path too
        (`include_paths("cuda")`), so cpp_sources may include <cuda_runtime.h> or c10/cuda."""
        return host_flags_common() + cuda_include_flags()

    def link_flags(self) -> list[str]:
        flags = link_flags_common() + ["-lc10_cuda", "-ltorch_cuda"]
        home = cuda_home()
        if home:
            flags += [f"-L{Path(home) / 'lib64'}"]
        return flags + ["-lcudart"]

    def compile_unit(self, unit: BuildUnit, obj: Path, flags: list[str], pch_dir: Path | None,
                     log: list[str], timeout_s: float) -> bool:
        if unit.kind == "host":
            return super().compile_unit(unit, obj, flags, pch_dir, log, timeout_s)
        return self.compile_device_unit(unit.path, obj, flags, log, timeout_s)

    def compile_device_unit(self, src: Path, obj: Path, flags: list[str], log: list[str],
                            timeout_s: float) -> bool:
        """nvcc -c one .cu; diagnostics rewritten gcc-style (`file:line:1: error`)."""
        out: list[str] = []
        ok = self._compile_device_unit(src, obj, flags, out, timeout_s)
        log.extend(_NVCC_DIAG.sub(r"\1:\2:1: \3", chunk) for chunk in out)
        return ok

    def _compile_device_unit(self, src: Path, obj: Path, flags: list[str], log: list[str],
                             timeout_s: float) -> bool:
        """The light-header attempt first, the unit as written when torch symbols are missing."""
        base = [nvcc_path(), *nvcc_flags(), *_device_flags(flags)]
        text = src.read_text(encoding="utf-8", errors="replace")
        light = light_header_text(text) if self.light_header else None
        if light is not None:
            light_src = src.with_name(src.stem + ".light" + src.suffix)
            light_src.write_text(light, encoding="utf-8")
            trial: list[str] = []
            if run_tool([*base, "-c", str(light_src), "-o", str(obj)], trial, timeout_s):
                log.append("(device unit built with <torch/types.h> in place of "
                           "<torch/extension.h>)")
                log.extend(trial)
                return True
            if not _may_need_full_header(trial):
                # The errors are the candidate's own: the full header would not fix them.
                log.extend(line.replace(light_src.name, src.name) for line in trial)
                return False
            log.append("(light-header attempt failed on a torch symbol; building as written)")
        return run_tool([*base, "-c", str(src), "-o", str(obj)], log, timeout_s)

    def link(self, objs: list[Path], out: Path, ldflags: list[str], log: list[str],
             timeout_s: float) -> bool:
        if torch_has_cuda_libs():
            return super().link(objs, out, ldflags, log, timeout_s)
        import torch

        # Compile-only host (CPU torch): link against what exists; the CUDA parts of torch
        # (libc10_cuda, libtorch_cuda) stay undefined and resolve when loaded on a GPU node.
        log.append(f"compile-only host: torch {torch.__version__} has no libtorch_cuda; linked "
                   "without it (the extension loads only where torch has CUDA)")
        flags = [f for f in self.link_flags() if f not in ("-lc10_cuda", "-ltorch_cuda")]
        cmd = [self.host_compiler(), "-shared", *map(str, objs), *ldflags, *flags, "-o",
               str(out)]
        return run_tool(cmd, log, timeout_s)

    # --- execution worker side ---------------------------------------------------------------
    def device(self) -> str:
        return "cuda"

    def device_name(self) -> str:
        import torch

        return torch.cuda.get_device_name(0)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def torch_compile_supported(self) -> bool:
        return True


# nvcc/cudafe print `unit.cu(12): error: ...`; the core maps gcc's `unit.cu:12:1: error`.
_NVCC_DIAG = re.compile(r"^(\S[^\n(]*)\((\d+)\): (error|warning|remark)", re.MULTILINE)
_TORCH_ERROR = re.compile(r"torch|at::|c10|pybind|py::|namespace|THP", re.IGNORECASE)


def _may_need_full_header(log: list[str]) -> bool:
    """True when an error message mentions torch/pybind names (the light header may lack them)."""
    lines = [ln for chunk in log[1:] for ln in chunk.splitlines()]
    messages = [ln.split("error", 1)[1] for ln in lines if "error" in ln]
    if not messages:
        return True  # no diagnostics (killed, crashed): retry as written
    return any(_TORCH_ERROR.search(m) for m in messages)


def _device_flags(flags: list[str]) -> list[str]:
    """Candidate flags for nvcc: host-only gcc flags (-fopenmp, -march) go through -Xcompiler."""
    out: list[str] = []
    for flag in flags:
        if flag in ("-fopenmp",) or flag.startswith(("-march", "-mtune", "-W")):
            out += ["-Xcompiler", flag]
        else:
            out.append(flag)
    return out
