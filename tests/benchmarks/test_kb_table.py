"""benchmarks/kb_table.py: timing noise between runs, issue 29's targets, calls merged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.kb_table import markdown, merge, timing_noise

ROOT = Path(__file__).parents[2]


def _v(cid: str, status: str, speedup: float | None = None, error: str = "") -> dict:
    return {"candidate_id": cid, "status": status, "speedup": speedup, "error": error}


def _summary(ran_per_hour: int, per_hour: int, deaths: list[str] | None = None) -> dict:
    return {"decided": 4, "of": 4, "wall_s": 100.0, "cut": False, "ran": 3,
            "ran_per_gpu_hour": ran_per_hour, "per_gpu_hour": per_hour, "cores": 16,
            "statuses": {"correct_fast": 2}, "memory_deaths": deaths or [], "as_labelled": 4,
            "unexpected": []}


def test_timing_noise_names_flips_outside_the_measured_spread() -> None:
    a = [_v("a", "correct_fast", 2.0), _v("b", "correct_fast", 1.02), _v("c", "correct_fast", 3.0),
         _v("d", "correct_slow", 0.5), _v("e", "incorrect")]
    b = [_v("a", "correct_fast", 2.1), _v("b", "correct_slow", 0.99), _v("c", "correct_slow", 0.8),
         _v("d", "correct_slow", 0.5), _v("e", "incorrect")]
    n = timing_noise(a, b)
    assert n["both"] == 4 and n["flips"] == 2
    assert n["median_pct"] == 5.0  # |log| sorted: 0, 0.03, 0.049, 1.32: the third is 5%
    # p90 is the largest difference here (c's), so c's flip lies within it, as does b's
    assert n["outside"] == []
    tight = timing_noise(a + [_v(f"x{i}", "correct_fast", 1.5) for i in range(20)],
                         b + [_v(f"x{i}", "correct_fast", 1.5) for i in range(20)])
    assert tight["p90_pct"] < 5 and tight["outside"] == ["c: 3.000 vs 0.800"]
    assert timing_noise([], [])["both"] == 0


def test_targets_say_which_hold() -> None:
    report = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11", "cpus": 16, "n": 4,
              "problems": 2, "labels": {"correct": 4}, "command": "c1",
              "ours1": _summary(3100, 4000),
              "kb": {"precompile_s": 90.0, "evaluated": 16, "of": 16, "wall_s": 300.0,
                     "per_gpu_hour": 500, "agree": 16, "compared": 16, "differ": []},
              "multi": {"gpus": 2, "both": 4, "agree": 3, "differ": ["d: incorrect vs timeout"],
                        "speedup": 1.5, "noise": timing_noise([], []),
                        "summary": _summary(2800, 3400, ["z"])}}
    md = markdown(report)
    assert "| compiled-and-run per GPU-hour, cold, 1 GPU (>= 3,000) | 3100 | yes |" in md
    assert "| ratio to KernelBench's harness (>= 6x) | 8.0x | yes |" in md
    assert "| memory deaths of honest kernels (0) | 1 | **no** |" in md  # the 2-GPU run's
    assert "| speed-up 1 -> 2 GPUs (>= 1.8x) | 1.50x | **no** |" in md
    assert "| agreement, 1 vs 2 GPUs (all; fast/slow only within noise) | 3/4 | **no** |" in md
    assert "- d: incorrect vs timeout" in md and "ours cold, 1 GPU (16 cores)" in md


def test_merge_compares_two_calls_cold_runs(tmp_path: Path) -> None:
    first = [_v("a", "correct_fast", 2.0), _v("b", "incorrect"), _v("c", "correct_slow", 0.5)]
    second = [_v("a", "correct_fast", 2.1), _v("b", "incorrect"), _v("c", "timeout")]
    base = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11", "cpus": 16, "n": 3,
            "problems": 2, "labels": {"correct": 2, "wrong": 1}, "ours1": _summary(3100, 4000)}
    for name, verdicts, extra in (("one", first, {"command": "call one", "kb": {
            "precompile_s": 90.0, "evaluated": 16, "of": 16, "wall_s": 300.0,
            "per_gpu_hour": 500, "agree": 16, "compared": 16, "differ": []}}),
                                  ("two", second, {"command": "call two", "multi": {
            "gpus": 2, "both": 3, "agree": 3, "differ": [], "speedup": 1.9,
            "summary": _summary(3000, 3900)}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({**base, **extra}))
        (tmp_path / name / "ours1.jsonl").write_text("".join(json.dumps(v) + "\n"
                                                             for v in verdicts))
    report = merge([tmp_path / "one", tmp_path / "two"])
    assert report["kb"]["per_gpu_hour"] == 500 and report["multi"]["speedup"] == 1.9
    assert (report["repeat"]["both"], report["repeat"]["agree"]) == (3, 2)
    assert report["repeat"]["differ"] == ["c: correct vs timeout"]
    res = tmp_path / "res"
    res.mkdir()
    p = subprocess.run([sys.executable, "-m", "benchmarks.verify_kernelbench", "--merge",
                        str(tmp_path / "one"), str(tmp_path / "two"), "--results-dir", str(res)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    md = (res / "verify_kernelbench_h100.md").read_text()
    assert "`call one` and `call two`" in md
    assert "| agreement, two runs (two cold runs, in two calls) | 2/3 |" in md
    assert "| speed-up 1 -> 2 GPUs (>= 1.8x) | 1.90x | yes |" in md
