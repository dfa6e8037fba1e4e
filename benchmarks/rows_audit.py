"""Audit a published dataset version against issue 18's Done-when: rows worth training on.

Checks, each counted pass/fail over the rows (or kernels) it applies to:
- `generalised`: every SFT/RFT answer's and preference chosen side's verdict records a passed
  generalisation check (a `generalised` finding, no `variant_skipped`).
- `no_switches`: no preprocessor switch (`#if`, `#ifdef`, `#elif`, `#else`, `#endif`, `#undef`),
  no macro defined but unused and no struct field never read (`g.divisor`; g++ does not warn on
  those) in any published kernel (SFT, RFT, preference chosen sides).
- `builds_clean`: the CPU kernels of those answers build with `-Wall -Wextra
  -Werror=unused-variable -Werror=unused-function` (one translation unit, each in a namespace;
  `-fsyntax-only`); CUDA kernels are counted as not built.
- `sizes_agree`: in every row that shows a reference (all configs), the `# inputs:`/`# returns`
  annotations, every shape in a comment, the stated constructor arguments, the stated input
  shapes and every shape in the answer's reasoning are the reference's own (run on the meta
  device in the verifier's sandbox).
- `init_named`: no row names a constructor value `get_init_inputs()[i]`.
- `pair_margin` / `pair_distinct`: every preference pair is correct over incorrect or >= 1.2x
  faster on the same device, and its two programs are at most 0.9 similar.
- `review_fix_verified`: applying each review row's labelled fix to its kernel gives a program
  the verifier passed.
- `review_kinds_spread` / `repair_kinds_spread`: no bug kind holds more than 30% of the review
  rows (of the repair rows whose chain starts from a mutant), and casts and off-by-ones together
  under 40% (counted once per version; fewer than 4 rows pass); the table notes each
  distribution and its number of kinds.
- `answer_format`: every assistant turn (SFT, RFT, repair, the history in RL repair prompts,
  both preference sides) answers in the form its user turn asked for: an explanation before the
  code when the prompt asks for one, one code block alone when it says "code block only".
- issue 31's speed checks (`benchmarks/speed_audit.py`): numbers by name, sft and chosen sides
  at least `select.min_speedup`, a third speed pairs, timings that repeat, one analysis per
  kernel without shared advice, validation splits, rl input_specs as the prompt shows them.
- `backend_named`: the card's tags are exactly those of the backends in the rows, every row
  names its backend, a cpu row's system prompt names no GPU, and the card's text says which
  backend made and checked the kernels.

    python -m benchmarks.rows_audit --workspace WS [--name kernelsynth] [--version vN]
        [--out table.md] [--min-sft 10]

Exit status 1 when any check has a failure.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from benchmarks.speed_audit import check_speed
from pipeline.datasets import published
from pipeline.datasets.analysis_rows import fix_source
from pipeline.datasets.card import backend_tags
from pipeline.datasets.pairs import (
    MAX_KIND_SHARE,
    MAX_SHALLOW_SHARE,
    MAX_SIMILARITY,
    MIN_SPEEDUP,
    SHALLOW_KINDS,
    apply_label,
    code_similarity,
    fix_label,
    has_margin,
    mutant_kind,
    normalise_code,
    verified_codes,
)
from pipeline.datasets.rows import generalisation_checked
from pipeline.prompts import answer_format_problems
from pipeline.workspace import Workspace
from schemas import Candidate, Message, Verdict
from verifier.extspec import specs_from_source

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
CODE = re.compile(r"```(?:python)?\n(.*?)```", re.S)


class Audit:
    """Pass/fail counts per check and the first few failures of each."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter] = {}
        self.examples: dict[str, list[str]] = {}
        self.notes: list[str] = []

    def record(self, check: str, ok: bool, where: str = "", why: str = "") -> None:
        self.counts.setdefault(check, Counter())["pass" if ok else "fail"] += 1
        if not ok and len(self.examples.setdefault(check, [])) < 5:
            self.examples[check].append(f"{where}: {why}"[:300])

    def skip(self, check: str, n: int = 1) -> None:
        self.counts.setdefault(check, Counter())["skipped"] += n

    def failed(self) -> bool:
        return any(c["fail"] for c in self.counts.values())

    def table(self) -> str:
        lines = ["| check | pass | fail | skipped |", "| --- | ---: | ---: | ---: |"]
        for check, c in self.counts.items():
            lines.append(f"| {check} | {c['pass']} | {c['fail']} | {c['skipped']} |")
        for check, ex in self.examples.items():
            lines += ["", f"{check} failures (first {len(ex)}):", *[f"- {e}" for e in ex]]
        lines += ["", *self.notes] if self.notes else []
        return "\n".join(lines) + "\n"


def read_config(version_dir: Path, config: str) -> list[dict]:
    """Every row of one config of a published version (all splits)."""
    rows: list[dict] = []
    for path in sorted((version_dir / config).rglob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


def answer_code(content: str) -> str:
    m = CODE.findall(content or "")
    return m[-1] if m else ""


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


def _shape_lists(text: str) -> list[list[int]]:
    return [[int(d) for d in m.split(",")] for m in re.findall(r"\[(\d+(?:, \d+)*)\]", text)]


def row_views(rows: dict[str, list[dict]]) -> list[tuple[str, str, str]]:
    """(where, user text that shows a reference, answer text before its code) per row."""
    out = []
    for config in ("sft", "rft", "repair", "review"):
        for r in rows.get(config, []):
            msgs = r["messages"]
            user = next((m["content"] for m in msgs if m["role"] == "user"), "")
            answer = msgs[-1]["content"].split("```")[0] if config in ("sft", "rft") else ""
            out.append((f"{config} {r['row_id'][:12]}", user, answer))
    for r in rows.get("preference", []):
        user = next((m["content"] for m in r["prompt"] if m["role"] == "user"), "")
        out.append((f"preference {r['row_id'][:12]}", user, ""))
    for r in rows.get("rl", []):
        user = next((m["content"] for m in r["prompt"] if m["role"] == "user"), "")
        out.append((f"rl {r['row_id'][:12]}", user, ""))
    return out


def reference_of(user: str) -> str:
    m = re.search(r"```python\n(.*?)```", user, re.S)
    return m.group(1) if m and "def get_inputs" in m.group(1) else ""


def reference_facts(sources: list[str], timeout_s: float = 900.0) -> list[dict]:
    """Shape facts of each reference, computed in the verifier's sandbox (meta device)."""
    from pipeline.tasks.annotate import shape_facts
    from verifier.sandbox import SandboxLimits, run_sandboxed

    script = Path(shape_facts.__file__)
    res = run_sandboxed([sys.executable, "facts.py"],
                        limits=SandboxLimits(timeout_s=timeout_s, memory_mb=8192),
                        input_files={"facts.py": script.read_text(encoding="utf-8"),
                                     "sources.json": json.dumps(sources)})
    facts = (res.payload or {}).get("facts")
    if facts is None:
        raise RuntimeError(f"reference facts: {res.describe_failure()}")
    return facts


def size_problems(user: str, answer: str, f: dict) -> list[str]:
    """Where a row's text disagrees with its reference's own sizes."""
    ref = reference_of(user)
    dims, bad = set(f["dims"]), []
    sig = re.search(r"# inputs: (.*)", ref)
    if sig and _shape_lists(sig.group(1)) != f["inputs"]:
        bad.append(f"{sig.group(0)} vs inputs {f['inputs']}")
    ret = re.search(r"# returns (.*)", ref)
    if ret and _shape_lists(ret.group(1)) != f["outputs"]:
        bad.append(f"{ret.group(0)} vs outputs {f['outputs']}")
    for shape in _shape_lists("\n".join(re.findall(r"#[^\n]*", ref))):
        if not set(shape) <= dims | {1}:
            bad.append(f"comment shape {shape}")
    stated = re.search(r"Constructor arguments \(from `get_init_inputs\(\)`\): (.*)", user)
    if stated and stated.group(1) != "none":
        named = re.findall(r"\w+=(.+?)(?=, \w+=|$)", stated.group(1))
        try:
            values = [json.loads(v) for v in named] if named else json.loads(stated.group(1))
        except json.JSONDecodeError:
            values = None
        if values != f["init"]:
            bad.append(f"constructor arguments {stated.group(1)} vs {f['init']}")
    shown = [[int(d) for d in m.split(", ")] for m in
             re.findall(r"of shape \((\d+(?:, \d+)*)\)", user)]
    if shown and shown != f["inputs"]:
        bad.append(f"stated input shapes {shown} vs {f['inputs']}")
    # window geometry (kernel [1, 4]) and operand strides (A [64, 1]) are not tensor shapes
    text = re.sub(r"(kernel|stride|padding|dilation)=? ?\[[^\]]*\]|\b[AB] \[[^\]]*\]", "",
                  answer)
    for shape in _shape_lists(text):
        if not set(shape) <= dims | {1}:
            bad.append(f"reasoning shape {shape}")
    return bad


def check_sizes(audit: Audit, rows: dict[str, list[dict]]) -> None:
    views = row_views(rows)
    refs = sorted({reference_of(u) for _, u, _ in views} - {""})
    facts = dict(zip(refs, reference_facts(refs), strict=True)) if refs else {}
    for where, user, answer in views:
        ref = reference_of(user)
        if not ref:
            audit.skip("sizes_agree")
            continue
        f = facts[ref]
        if not f.get("ok"):
            audit.record("sizes_agree", False, where, f"reference does not run: {f.get('error')}")
            continue
        bad = size_problems(user, answer, f)
        audit.record("sizes_agree", not bad, where, "; ".join(bad[:3]))
        everything = user + answer
        audit.record("init_named", "get_init_inputs()[" not in everything, where,
                     "names a constructor value by position")


def _side_verdict(code: str, task_id: str, reward: float, by_code: dict,
                  verdicts: dict[str, Verdict]) -> Verdict | None:
    """The verdict of the candidate a pair side is: same program, and (when one program was
    verified more than once) the reward the row records."""
    found = [verdicts[c.candidate_id] for c in by_code.get((task_id, normalise_code(code)), [])
             if c.candidate_id in verdicts]
    return min(found, key=lambda v: abs(v.reward - reward), default=None)


def check_pairs(audit: Audit, rows: dict[str, list[dict]], cands: list[Candidate],
                verdicts: dict[str, Verdict]) -> None:
    by_code: dict[tuple[str, str], list[Candidate]] = {}
    for c in cands:
        by_code.setdefault((c.task_id, normalise_code(c.code)), []).append(c)
    for r in rows.get("preference", []):
        where = f"preference {r['row_id'][:12]}"
        a, b = answer_code(r["chosen"][-1]["content"]), answer_code(r["rejected"][-1]["content"])
        sim = code_similarity(a, b)
        audit.record("pair_distinct", sim <= MAX_SIMILARITY, where, f"similarity {sim:.3f}")
        va = _side_verdict(a, r["task_id"], r["chosen_reward"], by_code, verdicts)
        vb = _side_verdict(b, r["task_id"], r["rejected_reward"], by_code, verdicts)
        if va is None or vb is None:
            audit.record("pair_margin", False, where, "a side has no verdict in the workspace")
            continue
        audit.record("pair_margin", has_margin(va, vb, MIN_SPEEDUP), where,
                     f"{va.status} {va.runtime_us} us vs {vb.status} {vb.runtime_us} us")
        # the chosen side is taught as correct: it must have generalised too
        audit.record("generalised", generalisation_checked(va), where + " chosen",
                     "no passed generalisation check recorded")


def check_reviews(audit: Audit, rows: dict[str, list[dict]], cands: list[Candidate],
                  verdicts: dict[str, Verdict]) -> None:
    by_id = {c.candidate_id: c for c in cands}
    passed = verified_codes(cands, verdicts)
    for r in rows.get("review", []):
        where = f"review {r['row_id'][:12]}"
        c = by_id.get(r["candidate_id"])
        fix = fix_source(c, by_id) if c else None
        label = fix_label(c.code, fix) if c and fix else None
        if label is None or label[0] != r["bug_line"]:
            audit.record("review_fix_verified", False, where, "no one-edit label at the row's line")
            continue
        fixed = normalise_code(apply_label(c.code, *label))
        audit.record("review_fix_verified", fixed in passed.get((c.task_id, c.backend), set()),
                     where, "the labelled fix was never verified correct")
    check_kind_spread(audit, "review", Counter(r["bug_kind"] for r in rows.get("review", [])))
    by_code = {(c.task_id, normalise_code(c.code)): c for c in cands}
    repair: Counter[str] = Counter()
    for r in rows.get("repair", []):
        first = next((m["content"] for m in r["messages"] if m["role"] == "assistant"), "")
        c = by_code.get((r["task_id"], normalise_code(answer_code(first))))
        if c is not None and c.generator.startswith("mutate:"):
            repair[mutant_kind(c)] += 1
    check_kind_spread(audit, "repair", repair, len(rows.get("repair", [])))


def check_kind_spread(audit: Audit, config: str, kinds: Counter[str],
                      total: int | None = None) -> None:
    """No bug kind over MAX_KIND_SHARE of a config's mutant rows, casts and bounds together
    under MAX_SHALLOW_SHARE; noted with the distribution. Fewer rows than 1 / MAX_KIND_SHARE
    cannot spread and pass."""
    n = sum(kinds.values())
    if not n:
        return
    spread = ", ".join(f"{k} {c}" for k, c in kinds.most_common())
    of = f" of {total}" if total is not None else ""
    audit.notes.append(f"{config} bug kinds ({n}{of} rows, {len(kinds)} kinds): {spread}")
    top = kinds.most_common(1)[0][1]
    shallow = sum(kinds[k] for k in SHALLOW_KINDS)
    ok = n * MAX_KIND_SHARE < 1 or (top <= MAX_KIND_SHARE * n
                                    and shallow < MAX_SHALLOW_SHARE * n)
    audit.record(f"{config}_kinds_spread", ok, config,
                 f"a kind over {MAX_KIND_SHARE:.0%} or {' + '.join(SHALLOW_KINDS)} at "
                 f"{MAX_SHALLOW_SHARE:.0%} or more: {spread}")


def check_backend(audit: Audit, version_dir: Path, rows: dict[str, list[dict]]) -> None:
    backends = sorted({r["backend"] for rs in rows.values() for r in rs if "backend" in r})
    for config, rs in rows.items():
        for r in rs:
            if "backend" in r:
                audit.record("backend_named", bool(r["backend"]), f"{config} {r['row_id'][:12]}",
                             "empty backend")
            if r.get("backend") == "cpu":  # a CPU row's prompts must not claim a GPU
                said = " ".join(m["content"] for m in r.get("messages") or []
                                if m.get("role") == "system")
                audit.record("backend_named", not re.search(r"\bGPU\b|\bCUDA\b", said),
                             f"{config} {r['row_id'][:12]} system prompt",
                             f"a cpu row's system prompt says GPU: {said[:80]!r}")
    card = (version_dir / "README.md").read_text(encoding="utf-8")
    front = card.split("---")[1] if card.startswith("---") else ""
    tags = (yaml.safe_load(front) or {}).get("tags", []) if front else []
    audit.record("backend_named", tags == backend_tags(backends), "card tags",
                 f"{tags} for backends {backends}")
    audit.record("backend_named", "Kernels in this version:" in card, "card text",
                 "no sentence naming the backend")


def check_answer_format(audit: Audit, rows: dict[str, list[dict]]) -> None:
    def msgs(ms: list[dict]) -> list[Message]:
        return [Message(m["role"], m["content"]) for m in ms or []]

    for config, rs in rows.items():
        for r in rs:
            if config == "preference":
                convs = [msgs(r["prompt"]) + msgs(r[side]) for side in ("chosen", "rejected")]
            elif config == "rl":
                convs = [msgs(r["prompt"])]
            elif config in ("sft", "rft", "repair"):
                convs = [msgs(r["messages"])]
            else:
                continue
            problems = [p for conv in convs for p in answer_format_problems(conv)]
            audit.record("answer_format", not problems, f"{config} {r['row_id'][:12]}",
                         "; ".join(problems))


def latest_version(ws: Workspace, name: str) -> Path:
    """The folder of the latest version (the pipeline's one notion of "latest")."""
    latest = published.latest_version(ws, name)
    if latest is None:
        raise SystemExit(f"{ws.datasets_dir / name}: no published version")
    return latest.path


def audit_version(ws: Workspace, version_dir: Path, min_sft: int | None = None) -> Audit:
    manifest = json.loads((version_dir / "manifest.json").read_text(encoding="utf-8"))
    rows = {c: read_config(version_dir, c) for c in manifest["configs"] if c != "tasks"}
    cands = ws.read(Candidate)
    verdicts = {v.candidate_id: v for v in ws.read(Verdict)}
    audit = Audit()
    check_generalised(audit, rows, verdicts)
    kernels = published_kernels(rows)
    check_switches(audit, kernels)
    with tempfile.TemporaryDirectory() as tmp:
        check_builds(audit, kernels, Path(tmp))
    check_sizes(audit, rows)
    check_pairs(audit, rows, cands, verdicts)
    check_reviews(audit, rows, cands, verdicts)
    check_backend(audit, version_dir, rows)
    check_answer_format(audit, rows)
    check_speed(audit, manifest, rows, read_config(version_dir, "tasks"), cands, verdicts,
                min_sft)
    return audit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", required=True, type=Path)
    ap.add_argument("--name", default="kernelsynth")
    ap.add_argument("--version", default=None, help="vN (default: the latest)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    ap.add_argument("--min-sft", type=int, default=None, help="fail below this many sft rows")
    args = ap.parse_args(argv)
    ws = Workspace(args.workspace)
    version_dir = (ws.datasets_dir / args.name / args.version if args.version
                   else latest_version(ws, args.name))
    audit = audit_version(ws, version_dir, args.min_sft)
    text = f"rows audit of {version_dir}\n\n" + audit.table()
    print(text, end="")
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 1 if audit.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
