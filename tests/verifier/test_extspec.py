"""Extension specs: literal extraction, keys, the recorder, batch source generation."""

from __future__ import annotations

from verifier.build import _source_line, batch_sources
from verifier.extspec import ExtensionSpec, specs_from_source

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
    host, device = batch_sources([spec, other], "ks_bx", {spec.key: CODE}, "")
    assert device == ""
    assert host.count("#include <omp.h>") == 1
    assert host.index("#include <omp.h>") < host.index(f"namespace ks_{spec.key}")
    assert f'#line 2 "{spec.key}/candidate.py"' in host
    assert "#undef BLOCK" in host
    assert f'm.def("k{spec.key}__f", torch::wrap_pybind_function(ks_{spec.key}::f)' in host
    assert f'"k{other.key}__h"' in host
    # after #line 2, the source's line 4 ("#define BLOCK 4") is candidate line 4
    assert _source_line(CODE, spec.cpp_sources[0]) == 2
