"""pipeline/stages/verify.py, the plan's verify step and `kernelsynth verify`: workspace in,
verdict parts out, re-runs skip."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.config import Config, VerifyConfig
from pipeline.plan import run_step
from pipeline.runner import local_executor
from pipeline.stages.verify import verify_candidates
from pipeline.workspace import Workspace
from schemas import Candidate, Rejection, Task, Verdict

sys.path.insert(0, str(Path(__file__).parents[2] / "verifier"))
from verifier_cases import RELU_TASK, relu_ok  # noqa: E402

CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"


def _cfg(tmp: Path) -> VerifyConfig:
    return VerifyConfig(backend="cpu", build_cache_dir=str(CACHE), run_timeout_s=30,
                        perf_trials=3, perf_warmup=1, baseline_cache_dir=str(tmp / "bl"),
                        write_batch=2)


def _task() -> Task:
    return Task(task_id="t_relu", name="relu", source=RELU_TASK.replace("1024", "4096"),
                cpu_source=RELU_TASK)


def _cands() -> list[Candidate]:
    good = relu_ok()
    bad = good.replace("return ext.relu_fwd(x)", "return torch.relu(x)")
    return [Candidate(Candidate.make_id("t_relu", "cpu", c), "t_relu", "cpu", "test", c)
            for c in (good, bad, "no code here")]


def test_verify_candidates_uses_cpu_source(tmp_path: Path) -> None:
    verdicts = verify_candidates({"t_relu": _task()}, _cands(), _cfg(tmp_path), tmp_path)
    assert [v.status[:7] for v in verdicts] == ["correct", "static_", "format_"]
    assert all(isinstance(v, Verdict) for v in verdicts)
    assert verdicts[0].eager_us and verdicts[0].speedup


def test_verify_step_writes_parts_and_skips_done(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    run = ws.new_run("r1")
    run.write([_task()])
    orphan = Candidate("orphan", "no_such_task", "cpu", "test", relu_ok())
    run.write([*_cands(), orphan])
    cfg = Config(verify=_cfg(tmp_path))
    ex = local_executor(ws, cfg)
    counts = run_step(ex, "verify")
    assert counts["verified"] == counts["verdicts"] == 3 and counts["pending"] == 3
    assert counts["rejections"] == counts["rejected:missing_task"] == 1
    assert len(list((ws.root / "runs" / ex.run_id / "verdicts").glob("part-*.parquet"))) == 2
    rej = ws.read(Rejection)
    assert rej[0].reason == "missing_task" and "no_such_task" in rej[0].detail
    again = run_step(local_executor(ws, cfg), "verify")
    assert again["pending"] == 0 and again["verified"] == 0 and again["rejections"] == 0
    assert len(ws.read(Verdict)) == 3


def test_cli_verify_json(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    run = ws.new_run("r1")
    run.write([_task()])
    run.write(_cands()[1:])
    conf = tmp_path / "k.yaml"
    conf.write_text(json.dumps({"verify": _cfg(tmp_path).model_dump(mode="json")}))
    res = CliRunner().invoke(app, ["verify", "--workspace", str(ws.root), "--config", str(conf),
                                   "--json"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert {ln["status"] for ln in lines if "status" in ln} == {"static_reject", "format_error"}
    assert lines[-1]["verified"] == 2
