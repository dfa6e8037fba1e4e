"""No candidate's code runs in another candidate's process (issue 28, item 4; round 4's
batch-mate registration): a batch unit's objects carry no load-time code of a candidate
(`verifier.compile.load_code`, read from real g++/nvcc objects) and no candidate leaves its namespace
(`verifier.compile.containment`); a candidate that does either gets a shared object of its own."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_redteam_builds import RELU, _ctx, spec  # noqa: E402

from verifier.backends import get_backend  # noqa: E402
from verifier.checks.preprocess import scan_source  # noqa: E402
from verifier.compile.builder import BuildContext, Builder  # noqa: E402
from verifier.compile.compile_plan import CostModel, compile_all  # noqa: E402
from verifier.compile.containment import escapes  # noqa: E402
from verifier.compile.load_code import blamed_keys, load_code  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KEY = "00000000000000ab"
NS = f"namespace ks_{KEY} {{ {{body}} }}\n"

# Each runs something of the candidate's when the object is loaded.
LOAD_FORMS = {
    "dynamic_initializer": "#include <cstdlib>\n" + NS.replace(
        "{body}", "static int v = std::rand(); int f(int x) { return x + v; }"),
    "unused_initializer_calls_libc": "#include <cstdlib>\n" + NS.replace(
        "{body}", "static int v = (std::system(\"true\"), 0);"),
    "constructor_attribute": NS.replace(
        "{body}", "int g; __attribute__((constructor)) static void c() { g = 1; }"),
    "destructor_attribute": NS.replace(
        "{body}", "int g; __attribute__((destructor)) static void d() { g = 1; }"),
    "pointer_in_init_array": NS.replace(
        "{body}", "int g; static void c() { g = 1; } __attribute__((section(\".init_array\"), "
                  "used)) static void (*p)() = c;"),
    "object_with_a_constructor": "#include <iostream>\n" + NS.replace(
        "{body}", "int flag; struct W { W() { volatile int* p = &flag; p[0] = 7; } }; "
                  "static W w;"),
    "stack_only_spin": NS.replace(  # no memory but its stack: it would spin in every loader
        "{body}", "static int x = []{ volatile unsigned long h = 0; "
                  "for (unsigned long i = 0; i < 40000000000UL; ++i) h = h + i; return 0; }();"),
    "ifunc_resolver": NS.replace(
        "{body}", "extern \"C\" int impl() { return 1; } "
                  "extern \"C\" int (*resolve())() { return impl; }")
    + 'extern "C" int picked() __attribute__((ifunc("resolve")));\n',
}


def _object(tmp: Path, name: str, src: str, opt: str, compiler: str = "g++") -> Path:
    ext = ".cu" if compiler == "nvcc" else ".cpp"
    (tmp / f"{name}{ext}").write_text(src)
    obj = tmp / f"{name}.{opt}.o"
    flags = ["-Xcompiler", "-fPIC"] if compiler == "nvcc" else ["-fPIC"]
    subprocess.run([compiler, f"-{opt}", *flags, "-c", str(tmp / f"{name}{ext}"), "-o",
                    str(obj)], check=True, capture_output=True, timeout=300)
    return obj


@pytest.mark.parametrize("opt", ["O0", "O2"])
@pytest.mark.parametrize("name", list(LOAD_FORMS))
def test_load_time_code_of_a_candidate_is_found(tmp_path: Path, name: str, opt: str) -> None:
    why = load_code([_object(tmp_path, name, LOAD_FORMS[name], opt)])
    assert why, f"{name} at -{opt} passed"
    if name not in ("unused_initializer_calls_libc", "ifunc_resolver", "stack_only_spin"):
        assert blamed_keys(why) == {KEY}, why


@pytest.mark.parametrize("opt", ["O0", "O2"])
def test_the_compilers_own_load_time_work_is_allowed(tmp_path: Path, opt: str) -> None:
    """g++'s `std::ios_base::Init` of <iostream> (through __static_initialization_and_destruction_0
    at -O0) and nvcc's kernel registration are not a candidate's."""
    src = "#include <iostream>\n" + NS.replace("{body}", "int f(int x) { return x > 0 ? x : 0; }")
    assert load_code([_object(tmp_path, "idiom", src, opt)]) == ""
    if shutil.which("nvcc"):
        cu = NS.replace("{body}", "__global__ void k(float* x) { x[0] = 1; } "
                                  "void launch(float* x) { k<<<1, 1>>>(x); }")
        assert load_code([_object(tmp_path, "kernel", "#include <iostream>\n" + cu, opt,
                                  "nvcc")]) == ""


def test_code_that_cannot_be_read_counts_as_load_time_code(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """Without binutils the compilers' own entry cannot be read: the unit is split (each
    candidate in an object of its own), never passed unread."""
    # a dynamic initializer every g++ emits (g++ 13 no longer emits <iostream>'s per unit)
    src = "#include <cstdlib>\n" + NS.replace("{body}", "int g = std::rand();")
    obj = _object(tmp_path, "idiom", src, "O2")
    monkeypatch.setenv("PATH", str(tmp_path / "no-binutils"))
    assert "could not be disassembled" in load_code([obj])


def test_an_unreadable_object_is_load_time_code(tmp_path: Path) -> None:
    bad = tmp_path / "x.o"
    bad.write_bytes(b"not an object")
    assert "cannot be read" in load_code([bad])


ESCAPES = {
    "closing_brace": "} void fmaxf_hijack(float, int) {} namespace ks_again {",
    "digraph_brace": "%> void f() {} namespace ks_again <%",
    "macro_brace": "#define KS_CLOSE }\nKS_CLOSE void f() {} namespace ks_again {",
    "balanced_macros_used_twice": "#define KS_O {\n#define KS_C }\nKS_C KS_C",
    "skipped_branch_brace": "#if 0\n{\n#endif\n}\nvoid g() {} namespace ks_again {",
    "extern_c": 'extern "C" void* memcpy(void* d, const void* s, unsigned long n) { return d; }',
    "extern_c_macro": '#define KS_EXT extern\nKS_EXT "C" int puts(const char*) { return 0; }',
    "python_init_macro": "PyMODINIT_FUNC memcpy() { return nullptr; }",
    "symver": '__attribute__((symver("memcpy@GLIBC_2.2.5"))) void f() {}',
}
HONEST = r"""
#define KS_CHECK(x) do { if (!(x)) { return out; } } while (0)
extern __shared__ float ks_smem[];
extern template class std::vector<int>;
namespace helpers { struct Box { int v; }; inline int one() { return 1; } }
#ifdef __CUDA_ARCH__
__device__ float act(float v) { return v > 0.f ? v : 0.f; }
#else
float act(float v) { return v > 0.f ? v : 0.f; }
#endif
const char* ks_text = "} extern \"C\" {";
char ks_open = '{';
int ks_sep = 1'000;
"""


@pytest.mark.parametrize("name", list(ESCAPES))
def test_a_candidate_that_leaves_its_namespace_is_built_alone(name: str) -> None:
    assert escapes(scan_source(ESCAPES[name] + "\n").code), name


def test_honest_forms_stay_in_the_namespace() -> None:
    assert escapes(scan_source(HONEST + RELU).code) == []


def test_the_unit_planner_builds_an_escaping_candidate_alone(tmp_path: Path) -> None:
    b = Builder(BuildContext(get_backend("cpu"), tmp_path, check_import=False, use_pch=False))
    honest = spec(RELU)
    bad = spec(RELU.replace("relu_fwd", "relu_own") + ESCAPES["extern_c"] + "\n", fn="relu_own")
    blockers = b.batch_blockers([bad, honest])
    assert list(blockers) == [bad.key] and "C linkage" in blockers[bad.key], blockers


# --- a real unit: a batch-mate's aten registration ---------------------------------------------
OVERRIDE = RELU.replace("relu_fwd", "relu_own") + r"""
static at::Tensor ks_zero_relu(const at::Tensor& x) { return torch::zeros_like(x); }
TORCH_LIBRARY_IMPL(aten, CPU, m) { m.impl("relu", ks_zero_relu); }
"""
PROBE = r"""
import json, sys, torch
from verifier.checks.extspec import load_extension_module
mod = load_extension_module(sys.argv[1], sys.argv[2])
x = torch.randn(4097)
f = getattr(mod, sys.argv[3])
print(json.dumps({"torch_relu": bool(torch.equal(torch.relu(x), x.clamp(min=0))),
                  "own": bool(torch.equal(f(x), x.clamp(min=0)))}))
"""


@pytest.mark.slow  # three host units on torch's headers: minutes on 2 loaded cores
def test_a_batch_mates_registration_never_loads_with_the_honest_candidate(tmp_path: Path
                                                                         ) -> None:
    """Planned as one unit, the attacker's static registration is found in the unit's object:
    each is built again in its own, and the honest object, loaded in a fresh process, leaves
    torch.relu alone and computes its ReLU (in the batch and from the cache)."""
    honest, attacker = spec(RELU), spec(OVERRIDE, fn="relu_own")
    builder = Builder(_ctx(tmp_path))
    landed: dict = {}
    units, records = compile_all(builder, [attacker, honest], 1, 64, landed.update,
                                 CostModel(unit_s=30, spec_s=1, fail_p=0))
    assert [len(u) for u in units] == [2] and len(records) >= 2, records  # split after one
    mine, theirs = landed[honest.key], landed[attacker.key]
    assert mine.ok and theirs.ok and mine.path != theirs.path, (mine, theirs)
    assert mine.batch_size == 1 and theirs.batch_size == 1
    for res in (mine, builder.cached(honest)):
        assert res is not None
        out = subprocess.run([sys.executable, "-c", PROBE, res.module, res.path,
                              f"k{honest.key}__relu_fwd"], capture_output=True, text=True,
                             timeout=300, env={"PYTHONPATH": str(ROOT)})
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.splitlines()[-1]) == {"torch_relu": True, "own": True}
