"""`python -m verifier`: single-candidate JSON verdicts and JSONL batch mode, real subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from verifier.protocol import CORRECT_STATUSES

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_TASK, relu_ok  # noqa: E402

ROOT = Path(__file__).parents[2]
CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "verifier", *args, "--cache-dir", str(CACHE)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)


def test_single_candidate_json(tmp_path: Path) -> None:
    (tmp_path / "task.py").write_text(RELU_TASK)
    (tmp_path / "cand.md").write_text("```python\n" + relu_ok() + "```\n")
    p = _run("--task", str(tmp_path / "task.py"), "--candidate", str(tmp_path / "cand.md"),
             "--backend", "cpu", "--json", "--perf-trials", "3")
    assert p.returncode == 0, p.stderr
    v = json.loads(p.stdout)
    assert v["status"] in CORRECT_STATUSES
    for key in ("stage", "reward", "speedup", "feedback", "findings"):
        assert key in v
    assert v["speedup"] > 0 and v["reward"] >= 0.5


def test_batch_jsonl(tmp_path: Path) -> None:
    rows = [{"candidate_id": "a", "task_id": "relu", "task_source": RELU_TASK,
             "response": relu_ok().replace("return ext.relu_fwd(x)", "return torch.relu(x)")},
            {"candidate_id": "b", "task_id": "relu", "task_source": RELU_TASK,
             "response": "not code"}]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows))
    p = _run("--batch", str(src), "--out", str(tmp_path / "out.jsonl"), "--backend", "cpu")
    assert p.returncode == 0, p.stderr
    out = [json.loads(ln) for ln in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [v["status"] for v in out] == ["static_reject", "format_error"]


def test_unavailable_backend_exits_2(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        return
    (tmp_path / "t.py").write_text(RELU_TASK)
    p = _run("--task", str(tmp_path / "t.py"), "--candidate", str(tmp_path / "t.py"),
             "--backend", "cuda")
    assert p.returncode == 2 and "cuda" in p.stderr


def test_batch_parquet_round_trip(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"candidate_id": "p1", "task_id": "relu", "task_source": RELU_TASK,
             "response": relu_ok().replace("import torch\n", "import os\nimport torch\n", 1)}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    p = _run("--batch", str(tmp_path / "in.parquet"), "--out", str(tmp_path / "out.parquet"),
             "--backend", "cpu")
    assert p.returncode == 0, p.stderr
    out = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert out[0]["candidate_id"] == "p1" and out[0]["status"] == "static_reject"
    assert json.loads(out[0]["findings"])[0]["rule"] == "escape"
