"""Card facts: rft generators and distinct strategies kept, decontamination counts."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.datasets.card_facts import card_lines, decontamination_facts, rft_facts
from pipeline.datasets.tables import tasks_table
from pipeline.workspace import Workspace
from schemas import Message, Rejection, RftRow, Task

SERIAL = 'load_inline(name="a", cpp_sources=src, functions=["f"])\nsrc = r"""\nfor (;;) {}\n"""'
OMP = SERIAL.replace("for (;;)", "#pragma omp parallel for\nfor (;;)")


def _row(tid: str, code: str, gen: str = "import:demo") -> RftRow:
    answer = f"Plan.\n\n```python\n{code}\n```"
    return RftRow(f"r{tid}{hash(code)}", tid, "c", [Message("user", "q"),
                                                    Message("assistant", answer)],
                  "cpu", gen, 1.0, 1.2, 3, 0.66, 0.8, 0.1)


def test_rft_facts_count_distinct_strategies_per_task() -> None:
    table = RftRow.to_arrow([_row("a", SERIAL), _row("a", OMP), _row("b", SERIAL),
                             _row("b", SERIAL.replace("f", "g"), "import:qwen")])
    facts = rft_facts(table)
    assert facts["rows"] == 4 and facts["tasks"] == 2
    assert facts["generators"] == {"import:demo": 3, "import:qwen": 1}
    assert facts["distinct_strategies_per_task"] == 1.5  # a: serial + omp, b: serial twice
    text = "\n".join(card_lines({"rft": facts}))
    assert "`import:demo` (3)" in text and "1.5 distinct kernel strategies" in text
    assert "demo response set shipped with kernelsynth" in text
    assert rft_facts(None)["rows"] == 0 and card_lines({"rft": rft_facts(None)}) == []


def test_decontamination_facts_from_rejections_and_tasks(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    ws.new_run().write([
        Rejection.make("curate", "m1", "kernelbench/level2/1_x.py", "contaminated", "d"),
        Rejection.make("curate", "m2", "kernelbench/level3/5_y.py", "contaminated", "d"),
        Rejection.make("curate", "m3", "src/a.py", "duplicate", "d")])
    tasks = [Task(task_id="t1", name="relu", source="", cpu_source="",
                  decontamination="overlap:kb/l1/19.py"),
             Task(task_id="t2", name="other", source="", cpu_source="")]
    facts = decontamination_facts(ws, tasks_table(tasks, {"t1": "train", "t2": "train"}),
                                  Config())
    assert facts == {"against": ["kernelbench"], "contaminated_removed": 2,
                     "overlapping_kept": 1, "generic_policy": "keep"}
    text = "\n".join(card_lines({"decontamination": facts}))
    assert "2 tasks removed as contaminated; 1 tasks kept" in text
