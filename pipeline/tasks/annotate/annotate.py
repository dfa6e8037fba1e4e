"""Shape annotations: a comment after every statement of `Model.forward` (libcst).

The probe records the tensor locals of `forward` before each line runs; the state after a
statement is the state before the next statement of the same block. Each simple statement gets
`# name: [16, 64, 32, 32] float32` for the names it assigns; a `return` gets the output shapes.
Where the trace has nothing (branches not taken, tracing failed), the statement stays as is and
the signature line carries the input shapes.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider


def _fmt(value: list) -> str:
    shape, dtype = value
    if dtype == "tuple":
        return "(" + ", ".join(str(list(s)) for s in shape) + ")"
    return f"{list(shape)} {dtype}"


def _targets(stmt: cst.BaseSmallStatement) -> list[str]:
    names: list[str] = []

    def collect(node: cst.BaseExpression) -> None:
        if isinstance(node, cst.Name):
            names.append(node.value)
        elif isinstance(node, cst.Tuple | cst.List):
            for el in node.elements:
                collect(el.value)
        elif isinstance(node, cst.StarredElement):
            collect(node.value)

    if isinstance(stmt, cst.Assign):
        for t in stmt.targets:
            collect(t.target)
    elif isinstance(stmt, cst.AnnAssign | cst.AugAssign):
        collect(stmt.target)
    return names


class _Annotator(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, before: dict[int, dict], outputs: list[dict], inputs: list[dict]):
        self.before = before
        self.outputs = outputs
        self.inputs = inputs
        self.class_depth = 0
        self.in_forward = 0
        self.count = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.class_depth += 1 if node.name.value == "Model" or self.class_depth else 0

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        if self.class_depth:
            self.class_depth -= 1
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if self.class_depth == 1 and node.name.value == "forward":
            self.in_forward += 1

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef
                          ) -> cst.FunctionDef:
        if not (self.class_depth == 1 and original.name.value == "forward"):
            return updated
        self.in_forward -= 1
        if not self.inputs:
            return updated
        text = "# inputs: " + ", ".join(f"{s['name']}: {s['shape']} {s['dtype']}"
                                        for s in self.inputs)
        body = updated.body
        if isinstance(body, cst.IndentedBlock):
            header = body.header.with_changes(whitespace=cst.SimpleWhitespace("  "),
                                              comment=cst.Comment(text))
            updated = updated.with_changes(body=body.with_changes(header=header))
        return updated

    def _after(self, stmts: list[cst.CSTNode], i: int) -> dict | None:
        for nxt in stmts[i + 1:]:
            line = self.get_metadata(PositionProvider, nxt).start.line
            if line in self.before:
                return self.before[line]
            return None
        return None

    def _annotate_block(self, stmts: list[cst.CSTNode], originals: list[cst.CSTNode]
                        ) -> list[cst.CSTNode]:
        out = []
        for i, (new, old) in enumerate(zip(stmts, originals, strict=True)):
            if isinstance(new, cst.SimpleStatementLine) and len(new.body) >= 1:
                comment = None
                small = new.body[-1]
                if isinstance(small, cst.Return) and self.outputs:
                    start = self.get_metadata(PositionProvider, old).start.line
                    if start in self.before or not self.before:  # untraced: outputs only
                        comment = "# returns " + ", ".join(
                            f"{o['shape']} {o['dtype']}" for o in self.outputs)
                else:
                    after = self._after(originals, i)
                    names = [n for s in new.body for n in _targets(s)]
                    parts = [f"{n}: {_fmt(after[n])}" for n in names if after and n in after]
                    if parts:
                        comment = "# " + ", ".join(parts)
                if comment and new.trailing_whitespace.comment is None:
                    new = new.with_changes(trailing_whitespace=cst.TrailingWhitespace(
                        whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(comment),
                        newline=new.trailing_whitespace.newline))
                    self.count += 1
            out.append(new)
        return out

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock
                            ) -> cst.IndentedBlock:
        if not self.in_forward:
            return updated
        return updated.with_changes(body=self._annotate_block(list(updated.body),
                                                              list(original.body)))


def annotate_forward(source: str, before: dict[str, dict], outputs: list[dict],
                     inputs: list[dict]) -> tuple[str, int]:
    """`source` with shape comments in `Model.forward`; returns (text, statements annotated)."""
    wrapper = MetadataWrapper(cst.parse_module(source))
    ann = _Annotator({int(k): v for k, v in before.items()}, outputs, inputs)
    out = wrapper.visit(ann)
    return out.code, ann.count


def forward_text(source: str) -> str:
    """The (annotated) `Model.forward` of a task file, for Task.shape_annotations."""
    module = cst.parse_module(source)
    for stmt in module.body:
        if isinstance(stmt, cst.ClassDef) and stmt.name.value == "Model":
            for item in stmt.body.body:
                if isinstance(item, cst.FunctionDef) and item.name.value == "forward":
                    return module.code_for_node(item).strip("\n")
    return ""
