"""Check many CPU template candidates against their references with ONE C++ build.

A cold `load_inline` costs ~40 s here (torch headers), so checking a hundred candidates one by one
takes an hour. This harness wraps each candidate's C++ in its own namespace, compiles them all
into one extension, runs every candidate's `ModelNew` (its `load_inline` call answered from the
shared build) against the reference on seeded inputs, in train and eval mode, and reports max
abs diff per candidate. It is a development check; verification proper is the verifier's job.

Run as a script in a child process: `python selfcheck.py` with `cases.json` in the cwd.
"""

from __future__ import annotations

import ast
import json
import sys
import traceback
import types
from pathlib import Path

from verifier import pyast


def _body(kernels: str) -> str:
    """The C++ after the candidate's own includes and shared macros (the shared TU has them)."""
    lines = kernels.splitlines()
    last = max((i for i, ln in enumerate(lines) if ln.startswith("#include")), default=-1)
    rest = lines[last + 1:]
    while rest and (rest[0].startswith("#define HD ") or rest[0].startswith("#define KS_STREAM")
                    or not rest[0].strip()):
        rest = rest[1:]
    return "\n".join(rest) + "\n"


def _split(code: str) -> tuple[str, list[str]]:
    """(C++ body without the shared header, bound function names) from a candidate file."""
    tree = pyast.parse(code)
    kernels, names = None, []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "KERNELS"):
            kernels = node.value.value
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", "") == "load_inline"):
            for kw in node.value.keywords:
                if kw.arg == "functions":
                    names = [e.value for e in kw.value.elts]
    if kernels is None or "#include <torch/extension.h>" not in kernels:
        raise ValueError("not a CPU template candidate")
    return _body(kernels), names


def combined_source(codes: list[str]) -> tuple[str, list[list[str]]]:
    """One C++ translation unit holding every candidate in namespace c<i>, plus bindings."""
    from pipeline_header import CPU_HEADER  # injected by main(); keeps this file stdlib-only

    parts, binds, all_names = [CPU_HEADER], [], []
    for i, code in enumerate(codes):
        body, names = _split(code)
        parts.append(f"namespace c{i} {{\n{body}\n}}  // namespace c{i}\n")
        binds += [f'    m.def("c{i}_{n}", &c{i}::{n});' for n in names]
        all_names.append(names)
    parts.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n" + "\n".join(binds) + "\n}\n")
    return "\n".join(parts), all_names


def main() -> None:
    import hashlib

    import torch
    import torch.utils.cpp_extension as cpp

    cases = json.loads(Path("cases.json").read_text(encoding="utf-8"))
    header = cases["header"]
    sys.modules["pipeline_header"] = types.SimpleNamespace(CPU_HEADER=header)
    codes = [c["code"] for c in cases["cases"]]
    src, _ = combined_source(codes)
    name = "ks_selfcheck_" + hashlib.sha256(src.encode()).hexdigest()[:12]
    results = []
    try:
        # the sandbox runs as an unprivileged user with a private cwd: build there, not in ~
        build = Path("build").resolve()
        build.mkdir(exist_ok=True)
        ext = cpp.load_inline(name=name, cpp_sources=[src], extra_cflags=["-O1", "-fopenmp"],
                              extra_ldflags=["-fopenmp"], verbose=False,
                              build_directory=str(build))
    except Exception as exc:  # noqa: BLE001 - report the compiler's complaint
        Path("result.json").write_text(json.dumps({"build_error": str(exc)[-4000:]}))
        return
    torch.set_num_threads(2)
    for i, case in enumerate(cases["cases"]):
        results.append(_run_isolated(i, case, ext, cpp, torch))
    Path("result.json").write_text(json.dumps({"results": results}))


class _Ext:
    def __init__(self, ext, i: int) -> None:
        self._ext, self._i = ext, i

    def __getattr__(self, name: str):
        return getattr(self._ext, f"c{self._i}_{name}")


def _run_isolated(i: int, case: dict, ext, cpp, torch) -> dict:
    """`_run_case` in a forked child, so a kernel that crashes (SIGFPE, SIGSEGV) fails only itself.

    The parent never runs a kernel, so no OpenMP pool exists yet when it forks.
    """
    import os
    import signal

    out = Path(f"case{i}.json")
    pid = os.fork()
    if pid == 0:
        try:
            res = _run_case(i, case, ext, cpp, torch)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent as the result
            res = {"ok": False, "error": f"harness: {type(exc).__name__}: {exc}"}
        out.write_text(json.dumps(res))
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"ok": False, "error": f"crashed with {signal.Signals(os.WTERMSIG(status)).name}"}
    if not out.exists():
        return {"ok": False, "error": f"exited with status {os.waitstatus_to_exitcode(status)}"}
    return json.loads(out.read_text())


def _run_case(i: int, case: dict, ext, cpp, torch) -> dict:
    real = cpp.load_inline
    try:
        cpp.load_inline = lambda *a, **k: _Ext(ext, i)
        ref_ns: dict = {"__name__": f"ref{i}"}
        exec(compile(case["reference"], "reference.py", "exec"), ref_ns)
        cand_ns: dict = {"__name__": f"cand{i}"}
        exec(compile(case["code"], "candidate.py", "exec"), cand_ns)
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": f"load: {type(exc).__name__}: {exc}"}
    finally:
        cpp.load_inline = real
    worst = 0.0
    try:
        init = ref_ns["get_init_inputs"]()
        for mode in ("train", "eval"):
            for seed in (0, 1):
                torch.manual_seed(seed)
                ref = ref_ns["Model"](*init)
                torch.manual_seed(seed)
                new = cand_ns["ModelNew"](*init)
                if mode == "eval":
                    ref.eval()
                    new.eval()
                torch.manual_seed(100 + seed)
                inputs = ref_ns["get_inputs"]()
                with torch.no_grad():
                    want = ref(*[x.clone() if torch.is_tensor(x) else x for x in inputs])
                    got = new(*inputs)
                want = want if isinstance(want, tuple | list) else (want,)
                got = got if isinstance(got, tuple | list) else (got,)
                if len(want) != len(got):
                    return {"ok": False, "error": "output count differs"}
                for w, g in zip(want, got, strict=True):
                    if w.shape != g.shape or w.dtype != g.dtype:
                        return {"ok": False, "error": f"{mode}: shape/dtype {tuple(g.shape)} "
                                                      f"{g.dtype} vs {tuple(w.shape)} {w.dtype}"}
                    if w.is_floating_point():
                        diff = (w.double() - g.double()).abs()
                        tol = case.get("atol", 1e-4) + case.get("rtol", 1e-4) * w.double().abs()
                        bad = ~(diff <= tol) & ~(torch.isnan(w) & torch.isnan(g))
                        worst = max(worst, float(diff.nan_to_num(0).max()) if diff.numel() else 0)
                        if bool(bad.any()):
                            return {"ok": False, "error": f"{mode} seed {seed}: max abs diff "
                                                          f"{float(diff.max()):.3g}",
                                    "max_abs_diff": float(diff.max())}
                    elif not torch.equal(w, g):
                        return {"ok": False, "error": f"{mode}: integer outputs differ"}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": f"run: {type(exc).__name__}: {exc}",
                "trace": traceback.format_exc(limit=3)[-800:]}
    return {"ok": True, "max_abs_diff": worst}


def check_cpu_candidates(cases: list[dict], *, timeout_s: float = 900.0) -> list[dict]:
    """Run `cases` ({code, reference}) through one shared CPU build; one result per case."""
    from pipeline.candidates.templates.program import CPU_HEADER
    from verifier.isolation.sandbox import SandboxLimits, run_sandboxed

    if not cases:
        return []
    res = run_sandboxed([sys.executable, str(Path(__file__))],
                        limits=SandboxLimits(timeout_s=timeout_s, memory_mb=0, file_mb=512,
                                             isolate_network=False),
                        input_files={"cases.json": json.dumps({"header": CPU_HEADER,
                                                               "cases": cases})},
                        env={"OMP_NUM_THREADS": "2"})
    p = res.payload
    if p is None:
        reason = res.describe_failure()
        return [{"ok": False, "error": f"harness: {reason}"} for _ in cases]
    if "build_error" in p:
        return [{"ok": False, "error": "build: " + p["build_error"]} for _ in cases]
    return p["results"]


if __name__ == "__main__":
    main()


def cuda_translation_unit(codes: list[str]) -> str:
    """One .cu file holding every CUDA candidate's kernels in its own namespace."""
    from pipeline.candidates.templates.program import CUDA_HEADER

    parts = [CUDA_HEADER]
    for i, code in enumerate(codes):
        tree = pyast.parse(code)
        kernels = next(n.value.value for n in tree.body if isinstance(n, ast.Assign)
                       and isinstance(n.targets[0], ast.Name) and n.targets[0].id == "KERNELS")
        body = _body(kernels)
        parts.append(f"namespace c{i} {{\n{body}\n}}  // namespace c{i}\n")
    return "\n".join(parts)


def nvcc_compile(codes: list[str], workdir: Path, *, arch: str = "sm_90",
                 timeout_s: float = 600.0) -> tuple[bool, str]:
    """Compile CUDA candidates' kernels with `nvcc -c` (no GPU needed); (ok, log tail)."""
    import shutil
    import subprocess
    import sysconfig

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return False, "nvcc not found on PATH"
    import torch.utils.cpp_extension as cpp

    torch_inc = Path(cpp.__file__).resolve().parent.parent / "include"
    incs = [torch_inc, torch_inc / "torch" / "csrc" / "api" / "include",
            Path(sysconfig.get_paths()["include"])]
    # CPU-only torch wheels lack this generated header; its real content is one define.
    stub = workdir / "stub" / "c10" / "cuda" / "impl"
    if not (torch_inc / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").exists():
        stub.mkdir(parents=True, exist_ok=True)
        (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        incs.append(workdir / "stub")
    src = workdir / "candidates.cu"
    src.write_text(cuda_translation_unit(codes), encoding="utf-8")
    cmd = [nvcc, "-c", str(src), "-o", str(workdir / "candidates.o"), "-std=c++17",
           f"-arch={arch}", "-O1", "-DTORCH_EXTENSION_NAME=ks_check", "-Xcompiler", "-fPIC",
           "--expt-relaxed-constexpr", "-w", *[f"-I{p}" for p in incs]]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"nvcc timed out after {timeout_s:.0f}s"
    return proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
