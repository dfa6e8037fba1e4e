"""Module discovery speed on the whole installed transformers tree: libcst vs plain ast.

    .venv/bin/python benchmarks/ingest.py [--models-only] [--limit N]

Rows: our libcst finder (`sources.scan.find_module_classes`, the one ingest uses: line spans
from libcst metadata), the same base-class rules on `ast` (baseline finder), and bare
`ast.parse` (the floor: parsing alone). All three read the same files in the same run.
"""

from __future__ import annotations

import argparse
import ast
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sources.scan import (
    FRAMEWORK_BASES,
    ScanError,
    _is_nn_base,
    find_module_classes,
)
from sources.transformers_src import transformers_root


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    if isinstance(node, ast.Subscript):
        return _dotted(node.value)
    return None


def ast_find_modules(code: str) -> list[str]:
    """The same rules as sources.scan, on the stdlib ast (the baseline)."""
    classes = [(n.name, [b for b in (_dotted(x) for x in n.bases) if b])
               for n in ast.parse(code).body if isinstance(n, ast.ClassDef)]
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, bases in classes:
            if name not in found and any(
                    _is_nn_base(b) or b.split(".")[-1] in FRAMEWORK_BASES or b in found
                    for b in bases):
                found.add(name)
                changed = True
    return [name for name, _ in classes if name in found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-only", action="store_true",
                        help="only models/*/modeling_*.py instead of every .py file")
    parser.add_argument("--limit", type=int, default=0, help="first N files only (0: all)")
    args = parser.parse_args()
    root, version = transformers_root()
    paths = sorted((root / "models").glob("*/modeling_*.py") if args.models_only
                   else root.rglob("*.py"))
    if args.limit:
        paths = paths[:args.limit]
    texts: list[tuple[Path, str]] = []
    for p in paths:
        try:
            texts.append((p, p.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    total_bytes = sum(len(t.encode()) for _, t in texts)

    rows = []
    start, cpu = time.perf_counter(), time.process_time()
    n_cst = errors = 0
    for p, text in texts:
        try:
            n_cst += len(find_module_classes(text, str(p)))
        except ScanError:
            errors += 1
    rows.append(("libcst finder (sources.scan)", time.perf_counter() - start,
                 time.process_time() - cpu, n_cst, errors))

    start, cpu = time.perf_counter(), time.process_time()
    n_ast = errors = 0
    for _, text in texts:
        try:
            n_ast += len(ast_find_modules(text))
        except SyntaxError:
            errors += 1
    rows.append(("ast finder, same rules (baseline)", time.perf_counter() - start,
                 time.process_time() - cpu, n_ast, errors))

    start, cpu = time.perf_counter(), time.process_time()
    errors = 0
    for _, text in texts:
        try:
            ast.parse(text)
        except SyntaxError:
            errors += 1
    rows.append(("ast.parse only (floor)", time.perf_counter() - start,
                 time.process_time() - cpu, None, errors))

    table = Table(title=f"module discovery on transformers {version}: {len(texts)} files, "
                        f"{total_bytes / 1e6:.1f} MB")
    # CPU seconds beside wall seconds: on a shared machine the wall clock includes waiting
    for col in ("method", "wall s", "cpu s", "files/s", "MB/s", "modules", "modules/s",
                "parse errors",
                "cpu vs ast.parse"):
        table.add_column(col, justify="right" if col != "method" else "left")
    floor = rows[-1][2]
    for name, wall, secs, mods, errs in rows:
        table.add_row(name, f"{wall:.2f}", f"{secs:.2f}", f"{len(texts) / secs:.0f}",
                      f"{total_bytes / 1e6 / secs:.2f}", "" if mods is None else str(mods),
                      "" if mods is None else f"{mods / secs:.0f}", str(errs),
                      f"{secs / floor:.1f}x")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
