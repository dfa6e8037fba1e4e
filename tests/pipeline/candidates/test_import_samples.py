"""Importing model responses (JSONL / Parquet) as candidates, and rows built from them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pipeline.candidates.import_samples import (
    DEMO_SAMPLES,
    SampleFileError,
    import_candidates,
    import_samples,
)
from pipeline.cli import app
from pipeline.config import Config, GenerateConfig
from pipeline.datasets.rows import build_datasets
from pipeline.prompts import build_prompt
from pipeline.workspace import Workspace
from schemas import Candidate, Finding, Rejection, Task, Verdict
from tests.conftest import LINEAR_TASK, RELU_TASK

CODE = ("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return x  # {tag}\n")


def _answer(tag: str) -> str:
    return f"Here is the kernel ({tag}).\n\n```python\n{CODE.format(tag=tag)}```\n"


def _tasks() -> list[Task]:
    return [Task(task_id=f"id_{n}", name=n, source=s, cpu_source=s, path=f"seed/{n}.py",
                 license="Apache-2.0")
            for n, s in (("relu", RELU_TASK), ("linear", LINEAR_TASK))]


def _user(task: Task) -> str:
    return build_prompt(task, "cpu", GenerateConfig())[1].content


def _rows(tasks: list[Task]) -> list[str]:
    relu, linear = tasks
    chat = f"<|im_start|>system\nYou write kernels.<|im_end|>\n<|im_start|>user\n{_user(linear)}" \
           "<|im_end|>\n<|im_start|>assistant\n"
    rows = [
        {"task_id": "id_relu", "response": _answer("by-id"), "model": "qwen-coder",
         "temperature": 0.7, "top_p": 0.9, "prompt_tokens": 812, "completion_tokens": 230},
        {"prompt": _user(relu), "response": _answer("exact"), "model": "qwen-coder"},
        {"prompt": "  " + _user(relu).upper().replace(" ", "   ") + "\n", "model": "qwen-coder",
         "response": _answer("normalized")},
        {"prompt": chat, "response": _answer("chat-template"), "model": "qwen-coder"},
        {"prompt": [{"role": "user", "content": _user(linear)}], "model": "qwen-coder",
         "response": "I cannot write this kernel."},  # kept: no code verifies as format_error
        {"task_id": "id_missing", "response": _answer("x"), "model": "qwen-coder"},
        {"prompt": "Write a softmax kernel.", "response": _answer("x"), "model": "qwen-coder"},
        {"task_id": "id_relu", "response": "   ", "model": "qwen-coder"},
        {"response": _answer("x"), "model": "qwen-coder"},
    ]
    return [json.dumps(r) for r in rows]


def test_jsonl_rows_match_tasks_and_bad_rows_are_named(tmp_path: Path) -> None:
    tasks = _tasks()
    path = tmp_path / "samples.jsonl"
    lines = _rows(tasks)
    path.write_text("\n".join(lines[:5] + ["{not json"] + lines[5:]) + "\n")
    cands, rejected = import_samples(path, tasks, "cpu", GenerateConfig())
    tags = {c.raw_response.split("(")[1].split(")")[0] if c.code else "prose": c for c in cands}
    assert set(tags) == {"by-id", "exact", "normalized", "chat-template", "prose"}
    assert [tags[t].task_id for t in ("by-id", "exact", "normalized")] == ["id_relu"] * 3
    assert tags["chat-template"].task_id == "id_linear" and tags["prose"].task_id == "id_linear"
    assert all(c.generator == "import:qwen-coder" and c.backend == "cpu" for c in cands)
    assert tags["by-id"].code == CODE.format(tag="by-id") and tags["prose"].code == ""
    assert [m.role for m in tags["exact"].prompt] == ["system", "user"]
    meta = json.loads(tags["by-id"].meta)
    assert meta["usage"] == {"prompt_tokens": 812, "completion_tokens": 230}
    assert (meta["temperature"], meta["top_p"], meta["source"]) == (0.7, 0.9, "samples.jsonl:1")
    got = [(r.reason, r.detail) for r in rejected]
    assert [r for r, _ in got] == ["bad_row", "unknown_task", "unknown_prompt",
                                   "empty_response", "unknown_prompt"]
    assert got[0][1].startswith(f"{path} row 6: not a JSON line")
    assert "row 7" in got[1][1] and "id_missing" in got[1][1]
    assert "row 8" in got[2][1] and "neither" in got[4][1]


def test_parquet_and_unreadable_files(tmp_path: Path) -> None:
    tasks = _tasks()
    table = pa.table({"task_id": ["id_relu", "id_linear"], "model": ["m", "m"],
                      "response": [_answer("a"), _answer("b")],
                      "completion_tokens": [10, 20]})
    pq.write_table(table, tmp_path / "s.parquet")
    cands, rejected = import_samples(tmp_path / "s.parquet", tasks, "cpu", GenerateConfig())
    assert sorted(c.task_id for c in cands) == ["id_linear", "id_relu"] and not rejected
    (tmp_path / "bad.parquet").write_text("nope")
    with pytest.raises(SampleFileError, match="bad.parquet: not a Parquet file"):
        import_samples(tmp_path / "bad.parquet", tasks, "cpu", GenerateConfig())
    with pytest.raises(SampleFileError, match="no such file"):
        import_samples(tmp_path / "none.jsonl", tasks, "cpu", GenerateConfig())


def test_cli_import_writes_candidates_and_rejections(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    tasks = _tasks()
    ws.new_run().write(tasks)
    path = tmp_path / "samples.jsonl"
    path.write_text("\n".join(_rows(tasks)) + "\n")
    args = ["generate", "--generator", "import", "--samples", str(path), "--backend", "cpu",
            "--workspace", str(ws.root), "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    counts = json.loads(res.output.strip().splitlines()[-1])
    assert counts["candidates"] == 5 and counts["rejections"] == 4
    assert counts["rejected:unknown_prompt"] == 2
    assert {c.generator for c in ws.read(Candidate)} == {"import:qwen-coder"}
    assert sorted(r.reason for r in ws.read(Rejection)) == [
        "empty_response", "unknown_prompt", "unknown_prompt", "unknown_task"]
    again = CliRunner().invoke(app, args)  # a re-run writes nothing new
    redo = json.loads(again.output.strip().splitlines()[-1])
    assert (redo["candidates"], redo["rejections"]) == (0, 0)
    missing = CliRunner().invoke(app, [*args[:4], str(tmp_path / "x.jsonl"), *args[5:]])
    assert missing.exit_code == 1 and "x.jsonl: no such file" in " ".join(missing.output.split())


def test_demo_set_is_used_only_without_a_local_model() -> None:
    relu = _tasks()[0]
    assert import_candidates([relu], GenerateConfig(), "cpu", report=True) == ([], [])
    assert DEMO_SAMPLES.is_file()
    with_hf = GenerateConfig(generators=["hf", "import"], hf_model="/models/coder")
    assert import_candidates([relu], with_hf, "cpu", report=True) == ([], [])
    off = GenerateConfig(import_file="")
    assert import_candidates([relu], off, "cpu", report=True) == ([], [])


def _verdict(cand: Candidate, status: str, reward: float) -> Verdict:
    return Verdict(candidate_id=cand.candidate_id, task_id=cand.task_id, verifier_version="t",
                   device="cpu", backend="cpu",
                   stage="performance" if status.startswith("correct") else "correctness",
                   status=status, reward=reward,
                   # what the verifier records when the generalisation check passed
                   findings=[Finding("generalised", "also correct at batch_size 16 -> 12", None,
                                     "info")] if status.startswith("correct") else [])


def _distinct_code(tag: str) -> str:
    """A response program of its own per tag (a pair of near-identical programs teaches nothing)."""
    steps = {"a": ["y = x.clamp(min=0)", "return y"],
             "b": ["out = torch.empty_like(x)", "out.copy_(x)", "out[out < 0] = 0", "return out"],
             "c": ["scale = 2.0", "return x * scale"],
             "d": ["w = x.t().contiguous()", "return w.sum(dim=0)"],
             "e": ["return undefined_name(x)"]}[tag]
    body = "".join(f"        {line}\n" for line in steps)
    return ("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
            f"    def forward(self, x):  # {tag}\n{body}")


def test_import_groups_feed_rft_rl_and_preference_rows() -> None:
    relu, linear = _tasks()
    cands = []
    for task, tags in ((relu, ("a", "b", "c")), (linear, ("d", "e"))):
        prompt = build_prompt(task, "cpu", GenerateConfig())
        for tag in tags:
            code = _distinct_code(tag)  # pairs need different programs, not a changed comment
            cands.append(Candidate(Candidate.make_id(task.task_id, "cpu", code), task.task_id,
                                   "cpu", "import:qwen-coder", code, _answer(tag), prompt))
    status = {"a": ("correct_fast", 1.5), "b": ("correct_slow", 1.0), "c": ("incorrect", 0.2),
              "d": ("incorrect", 0.3), "e": ("compile_error", 0.1)}
    verdicts = [_verdict(c, *status[c.code.split("# ")[1].split()[0]]) for c in cands]
    # these verdicts carry no timing: the speed gate (select.min_speedup) is tested elsewhere
    tables = build_datasets([relu, linear], cands, verdicts, [],
                            Config.model_validate({"select": {"min_speedup": 0.0}}))
    rft = tables["rft"].to_pylist()
    assert len(rft) == 2 and {r["generator"] for r in rft} == {"import:qwen-coder"}
    row = rft[0]
    assert (row["group_size"], row["group_pass_rate"]) == (3, pytest.approx(2 / 3))
    assert row["group_mean_reward"] == pytest.approx((1.5 + 1.0 + 0.2) / 3)
    assert row["group_std_reward"] > 0
    repair_prompts = [r for r in tables["rl"].to_pylist() if r["kind"] == "repair"]
    assert {r["task_id"] for r in repair_prompts} == {"id_linear"}  # the all-failed group
    assert tables["preference"].num_rows >= 1
