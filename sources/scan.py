"""Find `nn.Module` subclasses in Python source with libcst (no import, no execution).

A class counts as a module when a base is `nn.Module`/`torch.nn.Module`/`Module` (or another
`torch.nn` container), a known framework base such as transformers' `PreTrainedModel`, or a class
of the same file that already counts (transitively, in any order).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

# torch.nn classes people subclass; any dotted base ending in one of these counts
NN_BASES = frozenset({"Module", "Sequential", "ModuleList", "ModuleDict"})
# framework bases known to be nn.Module subclasses
FRAMEWORK_BASES = frozenset({"PreTrainedModel", "GradientCheckpointingLayer", "LightningModule"})


class ScanError(ValueError):
    """The source cannot be parsed; the message says where."""


@dataclass
class ModuleClass:
    """One nn.Module subclass found in a file."""

    name: str
    line_start: int
    line_end: int
    bases: list[str]
    direct: bool  # True when a base is torch.nn itself (not a framework or local base)


def _dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr.value}" if head else None
    if isinstance(node, cst.Subscript):  # e.g. Generic[...] bases
        return _dotted(node.value)
    return None


def _top_level_classes(tree: cst.Module) -> list[tuple[str, list[str], int, int]]:
    """(name, bases, first line, last line) of each top-level class.

    Lines come from generating each top-level statement's code and counting newlines: about
    six times cheaper than libcst's PositionProvider, which positions every node in the file.
    Only top-level classes count: a nested class cannot be extracted on its own.
    """
    out = []
    line = 1 + sum(tree.code_for_node(x).count("\n") for x in tree.header)
    for stmt in tree.body:
        text = tree.code_for_node(stmt)
        if isinstance(stmt, cst.ClassDef):
            lead = sum(tree.code_for_node(x).count("\n")
                       for x in (*stmt.leading_lines, *stmt.decorators))
            start = line + lead
            body_lines = text.rstrip().split("\n")
            # like ast's end_lineno: the last code line, not the block's trailing comments
            while len(body_lines) > 1 and body_lines[-1].strip().startswith("#") or (
                    body_lines and not body_lines[-1].strip()):
                body_lines.pop()
            end = line + len(body_lines) - 1
            bases = [b for b in (_dotted(a.value) for a in stmt.bases) if b]
            out.append((stmt.name.value, bases, start, end))
        line += text.count("\n")
    return out


def _is_nn_base(base: str) -> bool:
    parts = base.split(".")
    if parts[-1] not in NN_BASES:
        return False
    # bare `Module` (from torch.nn import Module) or `nn.X` / `torch.nn.X`
    return len(parts) == 1 or parts[-2] == "nn"


def find_module_classes(code: str, ref: str = "<source>") -> list[ModuleClass]:
    """All top-level nn.Module subclasses in `code`, in file order; raise ScanError."""
    try:
        tree = cst.parse_module(code)
    except cst.ParserSyntaxError as exc:
        raise ScanError(f"{ref}: syntax error at line {exc.raw_line}: {exc.message}") from None
    except (RecursionError, ValueError) as exc:
        raise ScanError(f"{ref}: cannot parse ({type(exc).__name__})") from None
    classes = _top_level_classes(tree)
    modules: dict[str, bool] = {}  # name -> direct
    changed = True
    while changed:  # a local base may be defined after its subclass
        changed = False
        for name, bases, _, _ in classes:
            if name in modules:
                continue
            direct = any(_is_nn_base(b) for b in bases)
            if direct or any(b.split(".")[-1] in FRAMEWORK_BASES or b in modules for b in bases):
                modules[name] = direct
                changed = True
    return [ModuleClass(name, start, end, bases, modules[name])
            for name, bases, start, end in classes if name in modules]
