"""Red-team builds (issue 28, items 4, 5, 8): a candidate's preprocessor state never reaches a
batch-mate, a failure is never cached under a batch-mate's key, and a build reads nothing but
headers and the candidate's own sources. Each attack is checked by its effect: the honest
neighbour's extension computes a correct ReLU in the batch and from the cache in a later batch,
and no secret text appears in any log or verdict."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
import torch
from redteam_cases import RELU  # noqa: E402  (tests/verifier is on the path: tests/conftest.py)

from verifier.backends import get_backend
from verifier.checks.extspec import ExtensionSpec, load_extension_module
from verifier.checks.static import check_cpp
from verifier.compile.builder import BuildContext, Builder, BuildResult, batch_sources
from verifier.compile.compile_plan import CostModel, compile_all

SHARED = Path.home() / ".cache" / "kernelsynth-tests" / "redteam-builds"

# An honest neighbour that uses a macro of its own and one of torch's.
HONEST = "#define KS_CHECK(x) TORCH_CHECK((x).is_contiguous() || true, #x)\n" + RELU.replace(
    "auto xc", "KS_CHECK(x);\n    auto xc")


def spec(src: str, fn: str = "relu_fwd", **kw) -> ExtensionSpec:
    return ExtensionSpec(name="ext", cpp_sources=[src], functions=[fn], **kw)


def attacker(tail: str) -> ExtensionSpec:
    """A correct ReLU of its own whose source ends with `tail` (aimed at the next candidate)."""
    return spec(RELU.replace("relu_fwd", "relu_own") + tail, fn="relu_own")


# Each rewrites `numel()` for whatever follows it in the same translation unit.
MACRO_ATTACKS = {
    "digraph": "%:define numel() numel() / 2\n",
    "trigraph": "??=define numel() numel() / 2\n",
    "line_splice": "#\\\ndefine numel() numel() / 2\n",
    "splice_trailing_blank": "# \\  \n define numel() numel() / 2\n",
    "comment_in_directive": "# /*x*/ define numel() numel() / 2\n",
    "comment_before_hash": "/* a\n b */ # define numel() numel() / 2\n",
    "push_macro": '#define numel() numel() / 2\n#pragma push_macro("numel")\n#undef numel\n',
    "pragma_operator": "#define KS_P(x) _Pragma(#x)\nKS_P(push_macro(\"numel\"))\n",
    "pasted_pragma": "#define KS_C(a, b) a##b\n#define numel() numel() / 2\n",
    "redefine_torch_macro": "#undef TORCH_CHECK\n#define TORCH_CHECK(...) ((void)0)\n",
    "line_blames_neighbour": '#line 1 "{honest}/cpp0"\nint broken = undeclared_name;\n',
    "unbalanced_if": "#if 0\n",
    "optimize_pragma": '#pragma GCC optimize("O0")\n',
}


def test_directive_variants_are_seen_as_the_compiler_sees_them(tmp_path: Path) -> None:
    """Every variant either leaves its unit (built alone) or has each macro it defines undone
    before the next candidate; honest directives keep sharing a unit."""
    b = Builder(BuildContext(get_backend("cpu"), tmp_path, check_import=False, use_pch=False))
    honest = spec(HONEST)
    plain = [spec(RELU.replace("0.f ?", f"{i}.f - {i}.f ?")) for i in range(2)]
    undone = []
    for name, tail in MACRO_ATTACKS.items():
        bad = attacker(tail.replace("{honest}", honest.key))
        if name == "redefine_torch_macro":  # needs the headers' macros (the compiler's -dM)
            continue
        if bad.key in b.batch_blockers([bad, honest]):
            continue
        host, _ = batch_sources([bad, honest], "m", "")
        between = host[host.index(f"}}  // namespace ks_{bad.key}"):
                       host.index(f"namespace ks_{honest.key} {{")]
        assert "#undef numel" in between, name
        undone.append(name)
    assert set(undone) == {"line_splice", "splice_trailing_blank", "comment_in_directive",
                           "comment_before_hash"}
    assert b.batch_blockers([honest, *plain]) == {}
    # a reserved name (nvcc's own __CUDACC__ is in no -dM of the host compiler) leaves too
    reserved = attacker("#undef __CUDACC__\n")
    assert "reserved" in b.batch_blockers([reserved, honest])[reserved.key]
    # literals and comments are not directives
    quoted = spec(RELU + 'const char* ks_s = "#define numel() 0";\n// %:define numel() 0\n'
                  'auto ks_r = R"x(\n#define numel() 0\n)x";\n')
    assert b.batch_blockers([quoted, honest]) == {}


@pytest.mark.parametrize("src, why", [
    ('%:include "/proc/1/root/tmp/ks-secret"\n', "absolute"),
    ('#include "../../../../etc/shadow"\n', "absolute"),
    ('#define KS_P "/etc/shadow"\n#include KS_P\n', "literal"),
    ("#include __FILE__\n", "literal"),
    ('%:if __has_include("/proc/1/root/tmp/ks-secret")\n%:endif\n', "__has_include"),
    ("#embed \"/etc/shadow\"\n", "reads files"),
    ("#include_next <stdio.h>\n", "reads files"),
    ('__asm__(".incbin \\"/etc/shadow\\"");\n', "assembly"),
    ('asm (".incbin \\"/etc/shadow\\"");\n', "assembly"),
])
def test_file_reading_directives_are_static_rejects(src: str, why: str) -> None:
    code = f'cpp = r"""\n{src}{RELU}"""\n'
    findings = check_cpp([spec(src + RELU)], code, "")
    hits = [f for f in findings if f["rule"] == "build_file_access"]
    assert hits and why in hits[0]["message"], findings
    assert hits[0]["line"] == 2  # the source's first line in the candidate file


@pytest.mark.parametrize("flag", ["-include/etc/shadow", "-I/proc/1/root/tmp", "-fplugin=x.so",
                                  "-specs=x", "@flags.txt", "-B/tmp/x", "-wrapper", "-iquote/",
                                  "--sysroot=/proc/1/root", "-Xcompiler=-fplugin=x"])
def test_file_reading_flags_are_rejected(flag: str) -> None:
    findings = check_cpp([spec(RELU, extra_cflags=[flag])], "", "")
    assert any(f["rule"] == "compiler_flag" for f in findings), (flag, findings)
    paths = check_cpp([spec(RELU, extra_include_paths=["/proc/1/root/tmp"])], "", "")
    assert any("extra_include_paths" in f["message"] for f in paths)


# --- real builds (g++ with torch's headers) --------------------------------------------------
def _ctx(tmp: Path) -> BuildContext:
    shared = BuildContext(get_backend("cpu"), SHARED, check_import=False)
    Builder(shared).prepare_pch([spec(RELU.replace("0.f ?", f"{i}.f+0.f ?")) for i in range(3)])
    c = BuildContext(get_backend("cpu"), tmp, check_import=False)
    c.root.mkdir(parents=True, exist_ok=True)
    if not (c.root / "pch").exists():
        shutil.copytree(shared.root / "pch", c.root / "pch")
    return c


def _relu_ok(res: BuildResult, fn: str = "relu_fwd") -> bool:
    """Load the built object and call the honest function: is it a correct ReLU?"""
    mod = load_extension_module(res.module, res.path)
    f = getattr(mod, f"k{res.key}__{fn}") if res.mode == "batch" else getattr(mod, fn)
    x = torch.randn(4097)
    return bool(torch.equal(f(x), torch.relu(x)))


def _one_unit(builder: Builder, specs: list[ExtensionSpec]) -> dict[str, BuildResult]:
    landed: dict[str, BuildResult] = {}
    units, _ = compile_all(builder, specs, 1, 64, landed.update,
                           CostModel(unit_s=30, spec_s=1, fail_p=0))
    assert [len(u) for u in units] == [len(specs)]  # planned as one translation unit
    return landed


@pytest.mark.slow
def test_macro_attacks_leave_the_neighbour_and_the_cache_alone(tmp_path: Path) -> None:
    """Attackers first, the honest neighbour last, planned as one unit: the neighbour's build
    is a correct ReLU in the batch and, from the cache, in a later batch; no failure of the
    neighbour is ever cached."""
    honest = spec(HONEST)
    attacks = [attacker(t.replace("{honest}", honest.key)) for t in MACRO_ATTACKS.values()]
    ctx = _ctx(tmp_path)
    landed = _one_unit(Builder(ctx), [*attacks, honest])
    assert landed[honest.key].ok, landed[honest.key].log
    assert _relu_ok(landed[honest.key])
    assert not landed[honest.key].cached
    later = Builder(BuildContext(get_backend("cpu"), tmp_path, check_import=False))
    again = later.build([honest])[honest.key]
    assert again.cached and again.ok and _relu_ok(again)
    # the attackers that are valid C++ on their own built too (alone), and compute their ReLU
    fine = [a for a, name in zip(attacks, MACRO_ATTACKS, strict=True) if name in (
        "comment_in_directive", "digraph", "line_splice", "push_macro")]
    for a in fine:
        assert landed[a.key].ok, landed[a.key].log
    # the one whose #line names the neighbour failed alone, and only itself
    blamer = attacks[list(MACRO_ATTACKS).index("line_blames_neighbour")]
    assert not landed[blamer.key].ok and landed[honest.key].ok


@pytest.fixture
def secret_dir() -> Path:
    """A directory the build can see (not a hidden tree) holding a secret header."""
    d = Path(f"/var/lib/ks-redteam-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    d.mkdir(parents=True)
    token = f"KS_SECRET_{uuid.uuid4().hex}"
    (d / "secret.h").write_text(f"{token} leaked here\n")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
def test_reads_outside_the_allowlist_are_refused_without_their_text(tmp_path: Path,
                                                                    secret_dir: Path) -> None:
    """The compiler's own dependency list decides, not the scanner: an include path the
    candidate passes (extra_include_paths, which the static rules already reject) is no root
    of the allowlist, and the log of such a build holds no compiler output at all."""
    token = (secret_dir / "secret.h").read_text().split()[0]
    ctx = _ctx(tmp_path)
    sneaky = spec('#include "secret.h"\n' + RELU, extra_include_paths=[str(secret_dir)])
    proc = spec('#include "self/root/etc/hostname"\n' + RELU,
                extra_include_paths=["/proc/1/root/..", "/proc"])
    res = Builder(ctx).build([sneaky, proc])
    for s in (sneaky, proc):
        assert not res[s.key].ok and res[s.key].refused, res[s.key].log
        assert token not in res[s.key].log
    assert str(secret_dir / "secret.h") in res[sneaky.key].log  # names the path
    # the same header through the allowlisted toolchain is fine
    ok = Builder(ctx).build([spec("#include <vector>\n" + RELU)])
    assert all(r.ok for r in ok.values())


@pytest.mark.slow
def test_proc_of_the_host_is_not_reachable_from_the_compiler(tmp_path: Path) -> None:
    """The compiler's /proc is its own pid namespace's: `/proc/<pid>/root` of a host process
    does not exist there, whatever pid is tried (the driver's own pid included)."""
    secret = Path(f"/tmp/ks-secret-{uuid.uuid4().hex[:8]}")
    secret.write_text("KS_PROC_SECRET 1\n")
    try:
        probes = "".join(f'#if __has_include("/proc/{pid}/root{secret}")\n'
                         f"#error found via {pid}\n#endif\n"
                         for pid in [1, 2, os.getpid(), os.getppid(), *range(3, 40)])
        src = probes + RELU  # the scanner refuses __has_include: build the module directly
        from verifier.backends import run_tool

        unit = tmp_path / "probe.cpp"
        unit.write_text(src)
        log: list[str] = []
        assert run_tool(["g++", "-E", str(unit), "-o", str(tmp_path / "probe.i")], log, 120), log
        assert "found via" not in "\n".join(log)
    finally:
        secret.unlink()


@pytest.mark.slow
def test_incbin_through_pasted_asm_reads_nothing_of_the_host(tmp_path: Path,
                                                             secret_dir: Path) -> None:
    """`__asm__` formed by token pasting hides from every rule on the source text; the
    assembler then runs in the compiler's root, where the host's files do not exist."""
    token = (secret_dir / "secret.h").read_text().split()[0]
    blob = RELU.replace("torch::Tensor relu_fwd(torch::Tensor x) {", (
        "#define KS_CAT(a, b) a##b\n#define KS_ASM KS_CAT(__as, m__)\n"
        f'KS_ASM(".section .rodata\\n.global ks_blob\\nks_blob:\\n.incbin \\"{secret_dir}'
        '/secret.h\\"\\n.byte 0\\n.text\\n");\n'
        'extern "C" const char ks_blob[];\n'
        "torch::Tensor relu_fwd(torch::Tensor x) {\n"
        "    if (ks_blob[0]) throw std::runtime_error(ks_blob);"))
    s = spec(blob)
    assert check_cpp([s], "", "")  # the static rules see the .incbin string, but the build
    res = Builder(_ctx(tmp_path)).build([s])[s.key]  # is checked on its own here
    assert not res.ok and token not in res.log
    assert "secret.h" in res.log  # the assembler names the file it could not find


def test_a_broken_build_sandbox_is_never_cached(tmp_path: Path, monkeypatch) -> None:
    """The wrapper's own failure is no outcome of the candidate: it fails this batch only."""
    be = get_backend("cpu")

    def broken(unit, obj, flags, pch, log, timeout_s):
        log += ["$ g++ -c x.cpp", "[build sandbox] could not build the compiler's root: boom"]
        return False

    monkeypatch.setattr(be, "compile_unit", broken)
    b = Builder(BuildContext(be, tmp_path, check_import=False, use_pch=False))
    s = spec(RELU)
    landed: dict[str, BuildResult] = {}
    compile_all(b, [s], 1, 4, landed.update)
    assert not landed[s.key].ok and "sandbox failed" in landed[s.key].log
    assert b.cached(s) is None
