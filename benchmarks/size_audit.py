"""The rows audit's size checks: every size a row states is its reference's own (run on the meta
device in the verifier's sandbox), and no row names a constructor value by position."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from benchmarks.audit_table import Audit


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
    from verifier.isolation.sandbox import SandboxLimits, run_sandboxed

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
