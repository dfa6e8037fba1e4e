"""Extension specs: literal extraction, keys, the recorder, batch source generation."""

from __future__ import annotations

from verifier.checks.extspec import ExtensionSpec, source_line, specs_from_source
from verifier.compile.builder import (
    batch_sources,
    candidate_log,
    flags_key,
    module_sources,
)

CODE = '''from torch.utils.cpp_extension import load_inline
src = """
#include <omp.h>
#define BLOCK 4
torch::Tensor f(torch::Tensor x) { return x; }
"""
ext = load_inline("e", [src], functions=["f"], extra_cflags=["-O3"])
'''


def test_literal_arguments_are_extracted() -> None:
    (spec,) = specs_from_source(CODE)
    assert spec.name == "e" and spec.functions == ["f"] and spec.extra_cflags == ["-O3"]
    assert spec.line == 7 and spec.batchable


def test_non_literal_sources_need_a_run() -> None:
    assert specs_from_source(CODE.replace('[src]', '[src.upper()]')) is None
    assert specs_from_source(CODE.replace('src = """', 'src = "x" if 1 else """')) is None
    assert specs_from_source(CODE + "src = 'other'\n") is None  # reassigned name


def test_key_ignores_name_and_line_but_not_sources() -> None:
    a = ExtensionSpec("a", ["int f();"], functions=["f"], line=3)
    b = ExtensionSpec("b", ["int f();"], functions=["f"], line=9)
    c = ExtensionSpec("a", ["int g();"], functions=["f"])
    assert a.key == b.key != c.key


def test_functions_dict_and_string() -> None:
    s = ExtensionSpec.from_call(("n", "src"), {"functions": {"f": "doc"}})
    assert s.functions == ["f"]
    assert ExtensionSpec.from_call(("n", "src", None, None, "g"), {}).functions == ["g"]
    assert ExtensionSpec.from_call(("n", "src"), {}).functions is None


def test_batch_source_namespaces_hoists_and_maps_lines() -> None:
    (spec,) = specs_from_source(CODE)
    other = ExtensionSpec("o", ["#include <omp.h>\nint h(int a) { return a; }"], functions=["h"])
    host, device = batch_sources([spec, other], "ks_bx", "")
    assert device == ""
    assert host.count("#include <omp.h>") == 1
    assert host.index("#include <omp.h>") < host.index(f"namespace ks_{spec.key}")
    assert f'#line 1 "{spec.key}/cpp0"' in host  # the source's own lines (cached per spec)
    assert "#undef BLOCK" in host
    assert f'm.def("k{spec.key}__f", torch::wrap_pybind_function(ks_{spec.key}::f)' in host
    assert f'"k{other.key}__h"' in host
    # the source starts on candidate line 2: its line 3 ("#define BLOCK 4") is line 4 there
    assert source_line(CODE, spec.cpp_sources[0]) == 2
    assert candidate_log("cpp_sources[0]:3:9: error: x", spec, CODE) == "candidate.py:4:9: error: x"


PB_CODE = '''from torch.utils.cpp_extension import load_inline
decl = "torch::Tensor f(torch::Tensor x);"
mod = "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\\"f\\", &f); }"
cu = """
__global__ void k(float* y) { y[0] = 0.f; }
torch::Tensor f(torch::Tensor x) { return x; }
"""
ext = load_inline("pb", cpp_sources=decl + "\\n" + mod, cuda_sources=[cu])
'''
PRELUDE = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"


def test_own_module_units_get_the_headers_torch_prepends() -> None:
    """functions=None: main.cpp and cuda.cu as torch's load_inline writes them (the device
    unit once lacked torch/types.h, so `torch::Tensor` was unknown in it)."""
    (spec,) = specs_from_source(PB_CODE)
    assert spec.functions is None and not spec.batchable
    host, device = module_sources(spec, PRELUDE)
    assert host.startswith("#include <torch/extension.h>\n") and "PYBIND11_MODULE" in host
    assert device.startswith(PRELUDE)
    assert f'#line 1 "{spec.key}/cuda0"\n\n__global__' in device
    bare = ExtensionSpec.from_call(("pb", PB_CODE), {"cuda_sources": "int g();",
                                                     "no_implicit_headers": True})
    host, device = module_sources(bare, PRELUDE)
    assert "torch/extension.h" not in host and device == f'#line 1 "{bare.key}/cuda0"\nint g();\n'
    assert module_sources(ExtensionSpec("c", ["int g();"]), PRELUDE)[1] == ""


def test_batched_device_unit_skips_the_prelude_only_without_implicit_headers() -> None:
    a = ExtensionSpec("a", ["int f();"], ["int f() { return 1; }"], functions=["f"])
    _, device = batch_sources([a], "ks_ba", PRELUDE)
    assert device.startswith(PRELUDE)
    b = ExtensionSpec("b", ["int f();"], ["int f() { return 1; }"], functions=["f"],
                      no_implicit_headers=True)
    _, device = batch_sources([b], "ks_bb", PRELUDE)
    assert "torch/types.h" not in device


def test_specs_with_different_headers_never_share_a_unit() -> None:
    """Hoisted includes are seen by every spec of a unit: a spec using at::cuda names without
    the header (torch fails it) must not compile because another spec included it."""
    stream = ExtensionSpec("a", ["int f();"], ["#include <c10/cuda/CUDAStream.h>\nint f();"],
                           functions=["f"])
    bare = ExtensionSpec("b", ["int f();"], ["int f();"], functions=["f"])
    same = ExtensionSpec("c", ["int g();"], ["#include <c10/cuda/CUDAStream.h>\nint g();"],
                         functions=["g"])
    assert flags_key(stream) != flags_key(bare)
    assert flags_key(stream) == flags_key(same)
