"""benchmarks.card_audit: a card that claims only what was measured, repair explanations that
match their diff. Each check sees a true version and one with a false claim."""

from __future__ import annotations

from pathlib import Path

from benchmarks.audit_table import Audit
from benchmarks.card_audit import check_card
from pipeline.candidates.repair import fix_explanation
from pipeline.prompts import fence
from schemas import Candidate, Verdict

CARD = """# kernelsynth v1

| config | train | validation | description |
| --- | ---: | ---: | --- |
| `tasks` | 3 | 1 | tasks |
| `sft` | 2 | 1 | sft rows |

staged verifier (extract, timing against eager {compiled}) keeps what is correct.
{metrics}"""

BUGGY = "import torch\nx = 1\nfor i in range(n + 1):\n    y = i\n"
FIXED = "import torch\nx = 1\nfor i in range(n):\n    y = i\n"


def _version(tmp: Path, compiled: str, metrics: str = "") -> Path:
    (tmp / "README.md").write_text(CARD.format(compiled=compiled, metrics=metrics))
    return tmp


def _rows(train: int, valid: int) -> list[dict]:
    return ([{"row_id": f"t{i}", "split": "train"} for i in range(train)]
            + [{"row_id": f"v{i}", "split": "validation"} for i in range(valid)])


def _cand(gen: str, i: int) -> Candidate:
    return Candidate(candidate_id=f"c{i}", task_id="t", backend="cpu", generator=gen,
                     code=f"x = {i}\n")


def _verdict(c: Candidate, compiled: float | None = None) -> Verdict:
    return Verdict(candidate_id=c.candidate_id, task_id="t", status="correct_fast", stage="done",
                   backend="cpu", compiled_us=compiled)


def test_counts_and_compile_claims_match_the_measurements(tmp_path: Path) -> None:
    c = _cand("template:x/y", 0)
    good, bad = Audit(), Audit()
    check_card(good, _version(tmp_path, "PyTorch; torch.compile was not timed"),
               {"sft": _rows(2, 1)}, [c], {"c0": _verdict(c)})
    assert good.counts["card_counts"]["pass"] == 1 and not good.failed()
    check_card(bad, _version(tmp_path, "and torch.compile"), {"sft": _rows(3, 0)}, [c],
               {"c0": _verdict(c)})
    assert bad.counts["card_counts"]["fail"] == 1 and bad.counts["card_compile"]["fail"] == 1
    timed = Audit()
    check_card(timed, _version(tmp_path, "and torch.compile"), {"sft": _rows(2, 1)}, [c],
               {"c0": _verdict(c, compiled=12.0)})
    assert not timed.failed()


def test_pass_at_k_needs_model_samples_not_template_variants(tmp_path: Path) -> None:
    metrics = "| pass@1 | 0.9 | unbiased pass@k |\n"
    tpl, llm = _cand("template:x/y", 0), _cand("llm:m", 1)
    only_tpl, with_llm = Audit(), Audit()
    check_card(only_tpl, _version(tmp_path, "", metrics), {}, [tpl], {"c0": _verdict(tpl)})
    assert only_tpl.counts["card_samples"]["fail"] == 1
    check_card(with_llm, _version(tmp_path, "", metrics), {}, [tpl, llm],
               {"c0": _verdict(tpl), "c1": _verdict(llm)})
    assert with_llm.counts["card_samples"]["pass"] == 1


def _repair_row(explanation: str, fixed: str) -> dict:
    return {"row_id": "r0", "messages": [
        {"role": "user", "content": "write it"},
        {"role": "assistant", "content": fence(BUGGY)},
        {"role": "user", "content": "incorrect"},
        {"role": "assistant", "content": fence(fixed, explanation)}]}


def test_repair_explanations_name_the_changed_line(tmp_path: Path) -> None:
    version = _version(tmp_path, "")
    meta = {"bug_description": "the loop runs one past the end (`n + 1`)"}
    right = Audit()
    check_card(right, version, {"repair": [_repair_row(fix_explanation(BUGGY, FIXED, meta),
                                                        FIXED)]}, [], {})
    assert right.counts["repair_explained"]["pass"] == 1
    # an explanation that quotes the correct line as the faulty one reads backwards
    backwards = ("The bug is on line 3: wrong bound.\nThe faulty line is\n```\n"
                 "for i in range(n):\n```\nand it should read\n```\nfor i in range(n + 1):\n"
                 "```\nHere is the corrected kernel.")
    wrong = Audit()
    check_card(wrong, version, {"repair": [_repair_row(backwards, FIXED)]}, [], {})
    assert wrong.counts["repair_explained"]["fail"] == 1


def test_a_missing_line_is_explained_as_missing_never_as_an_identical_edit() -> None:
    """A mutant that dropped a line once got "the faulty line is X, it should read X" (the
    mutation's own text); the explanation now quotes the line the fix inserts."""
    buggy = "a = 1\nb = 2\nprint(a)\n"
    fixed = "a = 1\n#pragma omp parallel for\nb = 2\nprint(a)\n"
    text = fix_explanation(buggy, fixed, {"bug_before": "b = 2", "bug_after": "b = 2",
                                          "mutation": "dropped_pragma"})
    assert "missing line before line 2" in text and "#pragma omp parallel for" in text
    assert "The faulty line is" not in text
    joined = fix_explanation("x\nfor a: b\ny\n", "x\nfor a:\n    b\ny\n", {})
    assert "line 2 (an injected bug)" in joined and "for a: b" in joined and "    b" in joined


def test_a_moved_line_is_explained_as_a_move_and_the_audit_checks_both_ends(tmp_path: Path
                                                                            ) -> None:
    """A hoisted accumulator's fix deletes a line and inserts it inside the loop: the CI build's
    row read "the faulty line is X, it should read X"; now it names where X is and where it goes."""
    buggy = "a = 1\ns = 0\nfor i in r:\n    t = i\n"
    fixed = "a = 1\nfor i in r:\n    s = 0\n    t = i\n"
    meta = {"bug_description": "accumulator `s` initialised once outside the loop",
            "bug_before": "s = 0", "bug_after": "s = 0"}
    text = fix_explanation(buggy, fixed, meta)
    assert "The faulty line is" not in text
    assert "The bug is on line 2" in text and "belongs at line 3" in text
    assert "right after\n```\nfor i in r:\n```" in text
    version = _version(tmp_path, "")

    def row(explanation: str) -> dict:
        return {"row_id": "r1", "messages": [
            {"role": "user", "content": "write it"},
            {"role": "assistant", "content": fence(buggy)},
            {"role": "user", "content": "incorrect"},
            {"role": "assistant", "content": fence(fixed, explanation)}]}

    right, wrong = Audit(), Audit()
    check_card(right, version, {"repair": [row(text)]}, [], {})
    assert right.counts["repair_explained"]["pass"] == 1
    check_card(wrong, version, {"repair": [row(text.replace("belongs at line 3",
                                                            "belongs at line 4"))]}, [], {})
    assert wrong.counts["repair_explained"]["fail"] == 1
