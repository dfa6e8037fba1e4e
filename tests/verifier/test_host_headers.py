"""Host units try the light headers (and their PCH) first, and torch/extension.h when needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from verifier.backends import get_backend
from verifier.checks.extspec import ExtensionSpec
from verifier.compile.builder import BuildContext, Builder
from verifier.compile.host_headers import LIGHT_HOST_HEADERS, light_host_text, may_need_full_header
from verifier.compile.unit_sources import batch_sources


def test_every_full_include_is_swapped_for_the_light_set() -> None:
    host, _ = batch_sources([ExtensionSpec("e", ["#include <torch/extension.h>\n"
                                                 "torch::Tensor f(torch::Tensor x);"],
                                           functions=["f"])], "ks_m", "")
    light = light_host_text(host)
    assert light is not None and "torch/extension.h" not in light
    assert light.count(LIGHT_HOST_HEADERS.splitlines()[0]) == 2  # the unit's and the hoisted
    assert "PYBIND11_MODULE(ks_m, m)" in light and "torch::wrap_pybind_function" in light


def test_a_unit_naming_the_full_api_is_built_as_written() -> None:
    host, _ = batch_sources([ExtensionSpec("e", ["torch::Tensor f(torch::Tensor x) { "
                                                 "return torch::nn::functional::relu(x); }"],
                                           functions=["f"])], "ks_m", "")
    assert light_host_text(host) is None
    assert light_host_text("int f();\n") is None  # nothing to swap


def test_only_errors_about_torch_names_ask_for_the_full_header() -> None:
    own = "x.cpp:3:5: error: expected ';' before 'return'\n"
    torch_name = "x.cpp:3:5: error: 'cuda' is not a member of 'torch'\n"
    assert not may_need_full_header(own)
    assert may_need_full_header(own + torch_name)
    assert may_need_full_header("")  # killed: no diagnostics
    assert not may_need_full_header("$ g++ -c x.cpp error.cpp\n" + own)  # the command line


@pytest.mark.slow
def test_light_first_full_when_needed_own_errors_final(tmp_path: Path) -> None:
    """Real g++ builds (cpu backend): a plain unit on the light PCH; a unit calling a function
    only torch/extension.h declares (torch::cuda) built again as written; a typo fails once."""
    ctx = BuildContext(get_backend("cpu"), tmp_path, pch_min_specs=1, check_import=False)
    plain = ExtensionSpec("p", ["#include <torch/extension.h>\n"
                                "torch::Tensor twice(torch::Tensor x) { return x * 2; }"],
                          functions=["twice"])
    full = ExtensionSpec("f", ["#include <torch/extension.h>\n"
                               "bool has_gpu() { return torch::cuda::is_available(); }"],
                         functions=["has_gpu"])
    typo = ExtensionSpec("t", ["#include <torch/extension.h>\n"
                               "int broken() { return 1 }"], functions=["broken"])
    builder = Builder(ctx)
    builder.prepare_pch([plain])
    pchs = sorted(p.read_text() for p in (builder.root / "pch").glob("*/ks_pch.h"))
    assert pchs == [LIGHT_HOST_HEADERS]  # the light PCH only, until a unit needs the full one
    res = builder.build([plain, full, typo])
    assert res[plain.key].ok and res[full.key].ok and not res[typo.key].ok
    assert "error: expected" in res[typo.key].log and "cpp_sources[0]:2:" in res[typo.key].log
    pchs = sorted(p.read_text() for p in (builder.root / "pch").glob("*/ks_pch.h"))
    assert pchs == sorted([LIGHT_HOST_HEADERS, "#include <torch/extension.h>\n"])


def test_the_pch_compiles_ahead_of_the_units(tmp_path: Path, monkeypatch) -> None:
    """Every host unit waits for the PCH: it runs at a lower niceness than the unit compilers
    (both behind the GPU workers)."""
    import subprocess

    import verifier.backends as backends

    seen: list[list[str]] = []

    def record(argv: list[str], **kwargs):  # the command line as it would be run
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(backends.subprocess, "run", record)
    be = get_backend("cpu")
    header = tmp_path / "ks_pch.h"
    header.write_text(LIGHT_HOST_HEADERS)
    assert be.compile_pch(header, tmp_path / "x.gch", [], [], 60)
    assert be.compile_unit(backends.BuildUnit(header, "host"), tmp_path / "x.o", [], None, [], 60)
    levels = [argv[argv.index("-n") + 1] for argv in seen if "-n" in argv]
    assert levels == [str(backends.PCH_NICE), str(backends.COMPILE_NICE)]
    assert backends.PCH_NICE < backends.COMPILE_NICE


@pytest.mark.slow
def test_the_light_set_binds_as_the_full_header_does(tmp_path: Path) -> None:
    """A unit that compiles on the light set must behave as on torch/extension.h: the same
    pybind11 type casters are declared (a missing one would compile and fail at call time)."""
    import re
    import subprocess

    be = get_backend("cpu")
    casters = re.compile(r"(?:struct|class) (?:type_caster|move_only_holder_caster|"
                         r"copyable_holder_caster|polymorphic_type_hook|is_holder_type)<[^{;]*")
    found = []
    for name, text in (("light", LIGHT_HOST_HEADERS), ("full", "#include <torch/extension.h>\n")):
        src = tmp_path / f"{name}.h"
        src.write_text(text)
        out = subprocess.run([be.host_compiler(), "-E", "-P", "-x", "c++", *be.host_flags(),
                              str(src)], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        found.append({m.rstrip() for m in casters.findall(out.stdout)})
    assert len(found[0]) > 20 and found[0] == found[1]
