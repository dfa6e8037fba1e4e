"""The generate stage and its CLI: templates, a served LLM, mutations, workspace re-runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.candidates.generate import GenerateError, generate_candidates
from pipeline.cli import app
from pipeline.config import Config, FlowsConfig, GenerateConfig
from pipeline.plan import run_step
from pipeline.prompts import fence
from pipeline.runner import local_executor
from pipeline.workspace import Workspace
from schemas import Candidate, Rejection, Task, Verdict
from tests.conftest import RELU_TASK
from tests.pipeline.chat_server import chat_server

SVD_TASK = RELU_TASK.replace("torch.relu(x)", "torch.linalg.svd(x)[0]")


def _task(name: str, source: str) -> Task:
    return Task(task_id=f"id_{name}", name=name, source=source, cpu_source=source,
                path=f"seed/{name}.py")


def _code(tag: str) -> str:
    return f"import torch\n\nclass ModelNew(torch.nn.Module):\n    tag = {tag!r}\n"


def test_templates_fill_prompt_and_report_uncovered_tasks() -> None:
    tasks = [_task("relu", RELU_TASK), _task("svd", SVD_TASK)]
    cands, rejected = generate_candidates(tasks, GenerateConfig(variants_per_task=2), "cpu")
    assert cands and all(c.task_id == "id_relu" and c.backend == "cpu" for c in cands)
    for c in cands:
        assert c.generator.startswith("template:")
        assert [m.role for m in c.prompt] == ["system", "user"]
        assert "batch_size = 16" in c.prompt[1].content
        assert "class ModelNew" in c.code and "```python" in c.raw_response
    (rej,) = rejected
    assert (rej.stage, rej.item_id, rej.reason) == ("generate", "id_svd", "no_template")
    assert "seed/svd.py" in rej.detail and "svd" in rej.detail


def test_llm_samples_become_candidates_with_usage() -> None:
    tasks = [_task("a", RELU_TASK), _task("b", RELU_TASK.replace("16", "32"))]
    with chat_server() as (state, url):
        # sample 0 answers with code, sample 1 with prose only (kept: it verifies format_error)
        state.reply = lambda body, i: (fence(_code(body["messages"][1]["content"][-40:]))
                                       if i == 0 else "I am not sure how to do this.")
        cfg = GenerateConfig(generators=["openai"], openai_base_url=url, openai_model="coder",
                             samples=2, temperature=0.5)
        cands, rejected = generate_candidates(tasks, cfg, "cuda")
    assert rejected == [] and len(cands) == 4
    assert {r["n"] for r in state.requests} == {2}
    assert all(r["messages"][0]["role"] == "system" for r in state.requests)
    with_code = [c for c in cands if c.code]
    assert len(with_code) == 2 and all("class ModelNew" in c.code for c in with_code)
    prose = [c for c in cands if not c.code]
    assert all(c.raw_response == "I am not sure how to do this." for c in prose)
    assert len({c.candidate_id for c in prose}) == 2  # distinct per task
    meta = json.loads(cands[0].meta)
    assert cands[0].generator == "llm:coder" and meta["usage"]["prompt_tokens"] == 11
    assert meta["temperature"] == 0.5


def test_llm_errors_and_bad_config_are_reported() -> None:
    with chat_server() as (state, url):
        state.script = ["400"]
        cfg = GenerateConfig(generators=["openai"], openai_base_url=url, openai_model="m",
                             retries=0, samples=1)
        cands, rejected = generate_candidates([_task("a", RELU_TASK)], cfg, "cpu")
    assert cands == [] and [r.reason for r in rejected] == ["llm_error"]
    cands, rejected = generate_candidates([_task("a", RELU_TASK)],
                                          GenerateConfig(generators=["hf"]), "cpu")
    assert [r.reason for r in rejected] == ["llm_unavailable"]
    assert "hf_model is empty" in rejected[0].detail
    with pytest.raises(GenerateError, match="unknown"):
        generate_candidates([], GenerateConfig(generators=["magic"]), "cpu")


@pytest.mark.heavy  # out of the default run: CI runs it (-m heavy)
def test_generate_step_skips_done_work_and_mutate_step_mutates_verified(
        workspace: Workspace) -> None:
    tasks = [_task("a", RELU_TASK), _task("b", RELU_TASK.replace("16", "32"))]
    workspace.new_run("seed").write(tasks)
    with chat_server() as (state, url):
        state.reply = lambda body, i: fence(_code(f"{body['messages'][1]['content'][-30:]}{i}"))
        cfg = Config(generate=GenerateConfig(generators=["openai"], openai_base_url=url,
                                             openai_model="coder", samples=2, backend="cpu"),
                     flows=FlowsConfig(batch_size=1))
        first = run_step(local_executor(workspace, cfg), "generate")
        again = run_step(local_executor(workspace, cfg), "generate")
        assert len(state.requests) == 2  # the re-run asked nothing
    assert first["candidates"] == 4 and first["tasks"] == 2 and first["pending"] == 2
    assert again.get("candidates", 0) == 0 and again["pending"] == 0
    assert len(workspace.read(Candidate)) == 4
    assert len(list((workspace.root / "runs").glob("*/candidates/part-*.parquet"))) == 2

    # the mutate step works over verified-correct kernels already in the workspace, and
    # verifies its mutants (a kernel whose mutants failed is done)
    from tests.pipeline.test_mutate import CPU_CANDIDATE

    good = Candidate(candidate_id="good", task_id="id_a", backend="cpu",
                     generator="template:reduction/rows", code=CPU_CANDIDATE)
    run = workspace.new_run()
    run.write([good])
    run.write([Verdict(candidate_id="good", task_id="id_a", status="correct_fast", stage="done",
                       backend="cpu")])
    mcfg = Config(generate=GenerateConfig(mutations_per_kernel=2, mutation_rounds=2,
                                          backend="cpu"))
    counts = run_step(local_executor(workspace, mcfg), "mutate")
    mutants = [c for c in workspace.read(Candidate) if c.generator.startswith("mutate:")]
    assert counts["candidates"] == len(mutants) == 2
    assert {json.loads(m.meta)["fix_candidate_id"] for m in mutants} == {"good"}
    judged = {v.candidate_id: v.status for v in workspace.read(Verdict)}
    assert all(m.candidate_id in judged for m in mutants)
    assert all(judged[m.candidate_id] not in ("correct_fast", "correct_slow") for m in mutants)
    assert run_step(local_executor(workspace, mcfg), "mutate").get("candidates", 0) == 0


def test_cli_generate_and_repair(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    ws.new_run("seed").write([_task("relu", RELU_TASK), _task("svd", SVD_TASK)])
    runner = CliRunner()
    res = runner.invoke(app, ["generate", "--generator", "template", "--backend", "cpu",
                              "--variants", "1", "-w", str(ws.root), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["command"] == "generate" and summary["candidates"] >= 1
    assert summary["rejected:no_template"] == 1
    assert {r.reason for r in ws.read(Rejection)} == {"no_template"}
    # a re-run owes nothing: a task is answered by a template candidate or a rejection
    again = runner.invoke(app, ["generate", "--generator", "template", "--backend", "cpu",
                                "--variants", "1", "-w", str(ws.root), "--json"])
    redo = json.loads(again.stdout.strip().splitlines()[-1])
    assert redo["pending"] == 0 and redo.get("candidates", 0) == 0
    assert "rejected:no_template" not in redo and len(ws.read(Rejection)) == 1
    bad = runner.invoke(app, ["generate", "--generator", "nope", "-w", str(ws.root)])
    assert bad.exit_code == 2 and "unknown nope" in bad.output
    rep = runner.invoke(app, ["repair", "--turns", "1", "--no-verify", "-w", str(ws.root),
                              "--json"])
    assert rep.exit_code == 0, rep.output
    assert json.loads(rep.stdout.strip().splitlines()[-1])["command"] == "repair"
    empty = runner.invoke(app, ["generate", "-w", str(tmp_path / "empty")])
    assert empty.exit_code == 1 and "no tasks" in " ".join(empty.output.split())
