"""Find `nn.Module` subclasses in Python source with libcst (no import, no execution).

A class counts as a module when a base is `nn.Module`/`torch.nn.Module`/`Module` (or another
`torch.nn` container), a known framework base such as transformers' `PreTrainedModel`, or a class
of the same file that already counts (transitively, in any order).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

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


class _ClassCollector(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.classes: list[tuple[str, list[str], int, int]] = []
        self._depth = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        # only top-level classes: a nested class cannot be extracted on its own
        if self._depth == 0:
            pos = self.get_metadata(PositionProvider, node)
            bases = [b for b in (_dotted(a.value) for a in node.bases) if b]
            self.classes.append((node.name.value, bases, pos.start.line, pos.end.line))
        self._depth += 1

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._depth -= 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._depth += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._depth -= 1


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
    collector = _ClassCollector()
    MetadataWrapper(tree, unsafe_skip_copy=True).visit(collector)
    modules: dict[str, bool] = {}  # name -> direct
    changed = True
    while changed:  # a local base may be defined after its subclass
        changed = False
        for name, bases, _, _ in collector.classes:
            if name in modules:
                continue
            direct = any(_is_nn_base(b) for b in bases)
            if direct or any(b.split(".")[-1] in FRAMEWORK_BASES or b in modules for b in bases):
                modules[name] = direct
                changed = True
    return [ModuleClass(name, start, end, bases, modules[name])
            for name, bases, start, end in collector.classes if name in modules]
