"""The rows audit's kernel hygiene: published kernels generalised, free of switches and unused
macros or fields, and building clean under -Wall -Wextra (see `benchmarks.rows_audit`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from benchmarks.audit_table import Audit, answer_code
from pipeline.datasets.rows import generalisation_checked
from schemas import Verdict
from verifier.checks.extspec import specs_from_source

SWITCH = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|else|endif|undef)\b[^\n]*", re.M)
STRUCT = re.compile(r"\bstruct\s+(\w+)\s*\{([^{}]*)\}\s*;")
# a data member declaration: `int64_t D, H, W;`, `bool include_pad;`, `float v = 0.f;`
MEMBER = re.compile(r"^\s*(?:const\s+)?[\w:<>]+[\s*&]+([\w\s,*\[\]=.+-]+);", re.M)


def unused_fields(text: str) -> list[str]:
    """`Geom.divisor` for each data member of a struct in `text` that no `.x`/`->x` reads."""
    out = []
    for m in STRUCT.finditer(text):
        rest = text[:m.start()] + text[m.end():]
        for decl in MEMBER.finditer(m.group(2)):
            for item in decl.group(1).split(","):
                name = re.match(r"\s*\**\s*(\w+)", item)
                if name and not re.search(rf"(\.|->)\s*{name.group(1)}\b", rest):
                    out.append(f"unused field {m.group(1)}.{name.group(1)}")
    return out

def kernel_texts(code: str) -> list[tuple[str, str]]:
    """(backend language, C++ text) of every load_inline source of a candidate file."""
    out = []
    for spec in specs_from_source(code) or []:
        out += [("cpp", s) for s in spec.cpp_sources] + [("cuda", s) for s in spec.cuda_sources]
    return out


def check_generalised(audit: Audit, rows: dict[str, list[dict]],
                      verdicts: dict[str, Verdict]) -> None:
    for config in ("sft", "rft"):
        for r in rows.get(config, []):
            v = verdicts.get(r["candidate_id"])
            if v is None:
                audit.record("generalised", False, f"{config} {r['row_id'][:12]}", "no verdict")
                continue
            audit.record("generalised", generalisation_checked(v), f"{config} {r['row_id'][:12]}",
                         "no passed generalisation check recorded: "
                         + ", ".join(f.rule for f in v.findings or []))


def published_kernels(rows: dict[str, list[dict]]) -> list[tuple[str, str]]:
    """(where, candidate code) of every answer a trainer imitates."""
    out = []
    for config in ("sft", "rft"):
        for r in rows.get(config, []):
            out.append((f"{config} {r['row_id'][:12]}", answer_code(r["messages"][-1]["content"])))
    for r in rows.get("preference", []):
        out.append((f"preference {r['row_id'][:12]} chosen",
                    answer_code(r["chosen"][-1]["content"])))
    return out


def check_switches(audit: Audit, kernels: list[tuple[str, str]]) -> None:
    for where, code in kernels:
        texts = kernel_texts(code)
        bad = []
        for _, text in texts:
            bad += [m.group(0).strip() for m in SWITCH.finditer(text)]
            for macro in re.findall(r"^\s*#define\s+(\w+)", text, re.M):
                if len(re.findall(rf"\b{macro}\b", text)) < 2:
                    bad.append(f"unused macro {macro}")
            bad += unused_fields(text)
        audit.record("no_switches", not bad, where, "; ".join(bad[:3]))


def check_builds(audit: Audit, kernels: list[tuple[str, str]], tmp: Path) -> None:
    """One -fsyntax-only g++ run over every CPU kernel, each in its own namespace."""
    if shutil.which("g++") is None:
        audit.skip("builds_clean", len(kernels))
        return
    import sysconfig

    import torch.utils.cpp_extension as cpp

    parts, spans = ["#include <torch/extension.h>\n"], []
    line = 2
    for i, (where, code) in enumerate(kernels):
        cpu = [t for lang, t in kernel_texts(code) if lang == "cpp"]
        if not cpu or any(lang == "cuda" for lang, _ in kernel_texts(code)):
            audit.skip("builds_clean")
            continue
        body = "\n".join(cpu)
        undef = "".join(f"#undef {m}\n" for m in re.findall(r"^\s*#define\s+(\w+)", body, re.M))
        block = f"namespace k{i} {{\n{body}\n}}\n{undef}"
        spans.append((where, line, line + block.count("\n")))
        line += block.count("\n")
        parts.append(block)
    if not spans:
        return
    src = tmp / "kernels.cpp"
    src.write_text("".join(parts), encoding="utf-8")
    inc = Path(cpp.__file__).resolve().parent.parent / "include"
    system = [inc, inc / "torch" / "csrc" / "api" / "include",
              Path(sysconfig.get_paths()["include"])]
    cmd = ["g++", "-fsyntax-only", "-std=c++17", "-fopenmp", "-Wall", "-Wextra",
           "-Werror=unused-variable", "-Werror=unused-function",
           "-DTORCH_EXTENSION_NAME=ks_audit", *[a for p in system for a in ("-isystem", str(p))],
           str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    problems: dict[str, list[str]] = {}
    for msg in proc.stderr.splitlines():
        m = re.match(rf"{re.escape(str(src))}:(\d+):\d+: (warning|error): (.*)", msg)
        if not m:
            continue
        at = int(m.group(1))
        where = next((w for w, a, b in spans if a <= at < b), "header")
        problems.setdefault(where, []).append(f"{m.group(2)}: {m.group(3)}")
    for where, _, _ in spans:
        found = problems.get(where, [])
        audit.record("builds_clean", not found, where, "; ".join(found[:2]))
