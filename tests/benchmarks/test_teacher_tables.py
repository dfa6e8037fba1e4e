"""The per-family teacher tables: medians of every variant, of the first and of the fastest."""

from __future__ import annotations

from types import SimpleNamespace as NS

from benchmarks.generate import teacher_table
from benchmarks.teacher_table import table

CORRECT = ("correct_fast", "correct_slow")


def test_generate_table_takes_the_fastest_correct_variant_per_task() -> None:
    kernels, verdicts = [], []
    for task, fam, speeds in (("a", "matmul", [0.2, 1.5, None]), ("b", "matmul", [0.4, 0.9, 0.1]),
                              ("c", "softmax", [2.0])):
        for sp in speeds:
            kernels.append((NS(name=task), fam, 1, None))
            verdicts.append(NS(status="incorrect" if sp is None else "correct_slow", speedup=sp))
    text = teacher_table(kernels, verdicts, CORRECT)
    rows = {ln.split()[0]: ln.split()[1:] for ln in text.splitlines()[3:]}
    # matmul: 2 tasks; all variants 0.2 0.4 0.9 1.5 0.1 -> 0.40x; first 0.2, 0.4 -> 0.30x;
    # fastest 1.5, 0.9 -> 1.20x; one task of two at >= 1.0x
    assert rows["matmul"][:4] == ["2", "0.40x", "0.30x", "1.20x"]
    assert rows["matmul"][4] == "50.0%"
    assert rows["all"][:4] == ["3", "0.65x", "0.40x", "1.50x"]


def test_two_build_table_compares_per_family() -> None:
    before = {"softmax": {"t1": [0.3], "t2": [0.5]}}
    after = {"softmax": {"t1": [0.3, 1.2, 0.9], "t2": [1.1]}}
    text = table(before, after)
    row = next(ln for ln in text.splitlines() if ln.startswith("| softmax"))
    assert row == "| softmax | 2 | 0.40x | 0.40x | 0/2 | 1.00x | 1.15x | 2/2 |"
