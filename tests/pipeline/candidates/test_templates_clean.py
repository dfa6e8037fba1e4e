"""Template candidates for the seed corpus are clean C++ and generalise.

Every candidate builds warning-free with `-Wall -Wextra -Werror=unused-variable
-Werror=unused-function` and carries no preprocessor switch, unused macro or duplicate kernel;
built at one size set, it is still correct at another size set and another set of constructor
values of the same task (sizes read from tensors, scalars from the module).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from pipeline.candidates.templates import NoTemplate, TaskView, template_kernels
from pipeline.candidates.templates.analysis import trace_sources
from pipeline.candidates.templates.elementwise import CPU_CHUNK
from pipeline.candidates.templates.program import CPU_HEADER
from pipeline.candidates.templates.selfcheck import _split, check_cpu_candidates
from pipeline.candidates.templates.symbolic import top_level_functions
from sources.seed import seed_files
from verifier.judge.variants import other_scalar, other_size, rewrite_literals, shrink

KNOWN_GAPS: set[str] = set()


def _small(src: str) -> str:
    return rewrite_literals(src, lambda v: shrink(v, 16), lambda f: f)


def _other(src: str) -> str:
    """The same task at other sizes and other constructor floats."""
    return rewrite_literals(src, lambda v: other_size(shrink(v, 16)), other_scalar)


@pytest.fixture(scope="module")
def seed_kernels() -> dict[str, dict[str, list]]:
    """backend -> seed task name -> template kernels built at the small size set."""
    views = {}
    for path in seed_files():
        src = _small(path.read_text(encoding="utf-8"))
        views[path.stem] = TaskView(path.stem, path.stem, src, src)
    trace_sources([v.source for v in views.values()], timeout_s=900)
    out: dict[str, dict[str, list]] = {"cpu": {}, "cuda": {}}
    for backend in out:
        for name, view in views.items():
            try:
                out[backend][name] = template_kernels(view, backend, 2)
            except NoTemplate:
                continue
    return out


def _functions(kernels: str) -> list[str]:
    """Names of the top-level function definitions."""
    return [f[0] for f in top_level_functions(kernels)]


def _kernels_text(code: str) -> str:
    return re.search(r'KERNELS = r"""(.*?)"""', code, re.S).group(1)


@pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)
def test_no_switches_unused_macros_helpers_or_duplicate_kernels(seed_kernels) -> None:
    assert len(seed_kernels["cpu"]) >= 110, len(seed_kernels["cpu"])
    problems = []
    for backend, tasks in seed_kernels.items():
        for name, kernels in tasks.items():
            for k in kernels:
                text = _kernels_text(k.code)
                label = f"{backend}:{name}:{k.variant}"
                for line in text.splitlines():
                    if re.match(r"\s*#\s*(if|ifdef|ifndef|elif|else|endif|undef)\b", line):
                        problems.append(f"{label}: preprocessor switch {line.strip()!r}")
                for macro in re.findall(r"^\s*#define\s+(\w+)", text, re.M):
                    if len(re.findall(rf"\b{macro}\b", text)) < 2:
                        problems.append(f"{label}: unused macro {macro}")
                hosts = set(re.findall(r"functions=\[([^\]]*)\]", k.code)[0]
                            .replace("'", "").replace('"', "").replace(" ", "").split(","))
                funcs = _functions(text)
                for fn in funcs:
                    if fn not in hosts and len(re.findall(rf"\b{fn}\b", text)) < 2:
                        problems.append(f"{label}: helper {fn} is never called")
                bodies = [re.sub(r"\b(\w+?)\d+(_\w+)?\b", r"\1\2", b) for b in
                          re.split(r"\n(?=// )", text) if "{" in b]
                if len(bodies) != len(set(bodies)):
                    problems.append(f"{label}: two kernels with the same text")
                code = re.sub(r"//[^\n]*", "", text)
                for lit in re.findall(r"(?<![.\w])\d{3,}\b(?!\.)", code):
                    # tuning constants (threads per block, the CPU elementwise chunk) are not sizes
                    if (int(lit) not in (128, 256, 512, 1024, 65535, CPU_CHUNK)
                            and "__shared__" not in text):
                        problems.append(f"{label}: size literal {lit} in the C++")
                        break
    assert not problems, "\n".join(problems[:40])


def _compile_flags() -> tuple[list[str], list[str]]:
    import torch.utils.cpp_extension as cpp

    inc = Path(cpp.__file__).resolve().parent.parent / "include"
    system = [inc, inc / "torch" / "csrc" / "api" / "include",
              Path(sysconfig.get_paths()["include"])]
    flags = ["-std=c++17", "-fopenmp", "-Wall", "-Wextra", "-Werror=unused-variable",
             "-Werror=unused-function", "-DTORCH_EXTENSION_NAME=ks_clean"]
    return flags, [a for p in system for a in ("-isystem", str(p))]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_cpu_sources_build_warning_free(seed_kernels, tmp_path) -> None:
    # One translation unit, each candidate in its own namespace (torch headers parse once).
    parts = [CPU_HEADER]
    for i, (_name, kernels) in enumerate(sorted(seed_kernels["cpu"].items())):
        for j, k in enumerate(kernels):
            body, _ = _split(k.code)
            parts.append(f"namespace c{i}_{j} {{\n{body}\n}}\n")
    src = tmp_path / "all.cpp"
    src.write_text("\n".join(parts), encoding="utf-8")
    flags, system = _compile_flags()
    proc = subprocess.run(["g++", "-fsyntax-only", *flags, *system, str(src)],
                          capture_output=True, text=True, timeout=900)
    # scan's per-kernel OP and ST (store) macros are redefined across this test's namespaces
    # (one per file in a real build), so that warning is the test's own making.
    known = ('_OP" redefined', '_ST" redefined')
    warnings = [ln for ln in proc.stderr.splitlines() if ("warning:" in ln or "error:" in ln)
                and not any(k in ln for k in known)]
    assert proc.returncode == 0 and not warnings, "\n".join(warnings[:30]) or proc.stderr[-3000:]


@pytest.mark.slow
def test_cpu_candidates_generalise_to_other_sizes_and_constructor_values(seed_kernels) -> None:
    cases, labels = [], []
    for path in seed_files():
        kernels = seed_kernels["cpu"].get(path.stem)
        if not kernels:
            continue
        text = path.read_text(encoding="utf-8")
        small, other = _small(text), _other(text)
        for ref, tag in ((small, "same"), (other, "other")):
            cases.append({"code": kernels[0].code, "reference": ref})
            labels.append(f"{path.stem}:{tag}")
    results = check_cpu_candidates(cases, timeout_s=1500)
    bad = {lab: r.get("error") for lab, r in zip(labels, results, strict=True) if not r["ok"]}
    same_ok = sum(r["ok"] for lab, r in zip(labels, results, strict=True) if lab.endswith("same"))
    detail = f"{same_ok} correct at the built sizes; failing:\n" + "\n".join(
        f"{lab}: {err}" for lab, err in sorted(bad.items()))
    assert not any(lab.endswith(":same") for lab in bad), detail
    assert set(bad) <= KNOWN_GAPS, detail


def test_copied_constants_and_imports_are_only_the_ones_modelnew_reads() -> None:
    from pipeline.candidates.templates.program import _binds_used, _globals_read

    names = _globals_read("class ModelNew:\n    def __init__(self, dim, eps):\n"
                          "        self.w = nn.Parameter(torch.ones(dim)) * EPS_SCALE\n"
                          "    def forward(self, x):\n        y = x.size(0)\n"
                          "        return F.relu(y)\n")
    assert names >= {"nn", "torch", "EPS_SCALE", "F"} and not names & {"dim", "eps", "x", "y"}
    assert not _binds_used("batch_size = 512", names)
    assert not _binds_used("dim = 64", names)  # a constructor parameter's name is no use
    assert _binds_used("EPS_SCALE = 2.0", names)
    assert _binds_used("import torch.nn.functional as F", names)
    assert not _binds_used("import math", names)
    assert _binds_used("from torch import nn, Tensor", names)


def test_a_candidate_keeps_the_helpers_its_constructor_reads() -> None:
    """A carved transformers module builds its config stand-in and reads an activation table:
    the candidate carries both (and what they read), not the reference's unused sizes."""
    from pipeline.candidates.templates.program import _globals_read, _preamble

    pre = ("import math\nimport torch\nbatch_size = 2\nclass _Table(dict):\n    pass\n"
           "ACT = _Table({'relu': nn.ReLU})\n"
           "def scale_of(c):\n    return math.sqrt(c.hidden)\n"
           "class ModelConfig:\n    hidden = 16\n    act = 'relu'\n")
    used = _globals_read("class ModelNew:\n    def __init__(self):\n        config = "
                         "ModelConfig()\n        self.act = ACT[config.act]()\n"
                         "        self.s = scale_of(config)\n")
    kept = _preamble(pre, used, {"import torch"})
    assert "class ModelConfig" in kept and "ACT = _Table(" in kept and "def scale_of" in kept
    assert "class _Table" in kept  # read by the kept table
    assert "import math" in kept  # read by the kept helper, not by ModelNew itself
    assert "batch_size" not in kept


def test_fused_is_said_only_of_kernels_that_compute_several_ops(
        seed_kernels: dict[str, dict[str, list]]) -> None:
    """A one-op pass is not called fused (a trainer reading "Fused ... for [relu]" learns a
    word for something the code does not do)."""
    claims = 0
    for backend, by_task in seed_kernels.items():
        for name, kernels in by_task.items():
            for k in kernels:
                for text in (k.code, k.reasoning):
                    for ops in re.findall(r"Fused elementwise kernel for \[([^\]]*)\]", text):
                        claims += 1
                        assert "," in ops, (backend, name, ops)
    assert claims  # the seed corpus has fused multi-op kernels, and they still say so


# a size expression run into an "x"-joined shape: `1xx0.size(1)`, `x.size(0)xx.size(0)`
_RUN_TOGETHER = re.compile(r"(?:[\w)])x(?:self\.|[A-Za-z_]\w*\.size\()|\.size\(\d+\)x\w")


def test_kernel_comments_read_as_text_once_sizes_are_expressions(seed_kernels) -> None:
    """The comment over each kernel names sizes as forward's expressions; none runs together."""
    problems, expressions = [], 0
    for backend, tasks in seed_kernels.items():
        for name, kernels in tasks.items():
            for k in kernels:
                comments = "\n".join(ln for ln in _kernels_text(k.code).splitlines()
                                     if ln.lstrip().startswith("//"))
                expressions += len(re.findall(r"\.size\(\d+\)", comments))
                problems += [f"{backend}:{name}:{k.variant}: {m.group(0)!r} in {ln.strip()!r}"
                             for ln in comments.splitlines() for m in _RUN_TOGETHER.finditer(ln)]
    assert expressions > 100  # the comments do carry size expressions
    assert not problems, "\n".join(problems[:10])
