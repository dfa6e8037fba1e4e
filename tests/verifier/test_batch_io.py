"""Streaming batches: verdicts land in --out as decided, a killed batch resumes, progress parses."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from verifier.protocol import VerdictData, VerifyRequest
from verifier.reward.batch_io import (
    BatchProgress,
    VerdictLog,
    parse_progress,
    profile_text,
    request_hash,
)

sys.path.insert(0, str(Path(__file__).parent))
from verifier_cases import RELU_TASK, relu_ok  # noqa: E402

ROOT = Path(__file__).parents[2]
CACHE = Path.home() / ".cache" / "kernelsynth-tests" / "verifier-builds"


def _req(cid: str, response: str = "x = 1") -> VerifyRequest:
    return VerifyRequest(candidate_id=cid, task_id="t", task_source=RELU_TASK, response=response)


def _verdict(cid: str, status: str = "incorrect") -> dict:
    return VerdictData(cid, "t", status, "correctness", "cpu").to_dict()


def test_resume_keeps_whole_verdicts_drops_torn_and_changed(tmp_path: Path) -> None:
    out = tmp_path / "v.jsonl"
    log = VerdictLog(out)
    a, b, c = _req("a"), _req("b"), _req("c")
    for r in (a, b, c):
        log.append(r, _verdict(r.candidate_id))
    log.close()
    with open(out, "a", encoding="utf-8") as fh:  # a kill in the middle of a fourth write
        fh.write('{"candidate_id": "d", "sta')
    b2 = _req("b", "x = 2")  # b's response changed since its verdict
    done, stale = VerdictLog(out).resume([a, b2, c, _req("d")])
    assert sorted(k[0] for k in done) == ["a", "c"] and stale == 1
    lines = out.read_text().splitlines()  # rewritten: no torn tail, no stale b
    assert [json.loads(ln)["candidate_id"] for ln in lines] == ["a", "c"]
    assert out.read_text().endswith("\n")
    keys = [json.loads(ln) for ln in (tmp_path / "v.jsonl.keys").read_text().splitlines()]
    assert [(k["candidate_id"], k["request_hash"]) for k in keys] == \
        [("a", request_hash(a)), ("c", request_hash(c))]


def test_verdict_without_its_key_line_is_verified_again(tmp_path: Path) -> None:
    out = tmp_path / "v.jsonl"
    log = VerdictLog(out)
    log.append(_req("a"), _verdict("a"))
    log.close()
    with open(out, "a", encoding="utf-8") as fh:  # killed between the verdict and its key
        fh.write(json.dumps(_verdict("b")) + "\n")
    done, stale = VerdictLog(out).resume([_req("a"), _req("b")])
    assert list(done) == [("a", request_hash(_req("a")))] and stale == 1


def test_a_hand_edited_verdict_is_not_trusted(tmp_path: Path) -> None:
    out = tmp_path / "v.jsonl"
    log = VerdictLog(out)
    log.append(_req("a"), _verdict("a", "incorrect"))
    log.close()
    out.write_text(out.read_text().replace('"incorrect"', '"correct_fast"'))
    done, _ = VerdictLog(out).resume([_req("a")])
    assert done == {}


def test_progress_lines_rate_eta_and_statuses() -> None:
    now = [100.0]
    buf = io.StringIO()
    p = BatchProgress(10, ["correct_fast", "incorrect"], stream=buf, interval_s=5.0,
                      verbose=True, clock=lambda: now[0])
    print(p.line(), file=buf)
    for i, st in enumerate(["incorrect", "compile_error", "incorrect"]):
        now[0] += 20.0  # one verdict every 20 s: 3/min
        p.verdict(VerdictData(f"c{i}", "t", st, "compile", "cpu"))
    parsed = [parse_progress(ln) for ln in buf.getvalue().splitlines()]
    summaries = [x for x in parsed if x]
    assert summaries[0]["done"] == 2 and summaries[0]["eta"] == "?"
    last = summaries[-1]
    assert last["done"] == 5 and last["total"] == 10 and last["resumed"] == 2
    assert abs(last["rate_per_min"] - 3.0) < 0.01 and last["eta"] == "1m40s"
    assert last["statuses"] == {"correct_fast": 1, "incorrect": 3, "compile_error": 1}
    verdict_lines = [ln for ln in buf.getvalue().splitlines() if " verdict " in ln]
    assert len(verdict_lines) == 3 and verdict_lines[1].startswith("[verifier] verdict c1: ")


def test_progress_prints_at_most_once_per_interval() -> None:
    now = [0.0]
    buf = io.StringIO()
    p = BatchProgress(100, [], stream=buf, interval_s=5.0, clock=lambda: now[0])
    for i in range(50):
        now[0] += 0.5
        p.verdict(VerdictData(f"c{i}", "t", "incorrect", "correctness", "cpu"))
    stamps = len(buf.getvalue().splitlines())
    assert stamps == 5  # 25 s of verdicts, one line per 5 s


def _batch_rows(tag: str = "") -> list[dict]:
    rows = [{"candidate_id": f"fmt{i}", "task_id": "relu", "task_source": RELU_TASK,
             "response": f"no code here {i}{tag}"} for i in range(3)]
    rows += [{"candidate_id": f"ok{i}", "task_id": "relu", "task_source": RELU_TASK,
              "response": relu_ok(f"relu_stream{i}")} for i in range(2)]
    return rows


def _cmd(src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "verifier", "--batch", str(src), "--out", str(out),
            "--backend", "cpu", "--progress", "verbose", "--perf-trials", "3",
            "--cache-dir", str(CACHE)]


def _verdict_lines(stderr: str) -> list[str]:
    return [ln.split()[2].rstrip(":") for ln in stderr.splitlines()
            if ln.startswith("[verifier] verdict ")]


def test_killed_batch_resumes_from_its_out(tmp_path: Path) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = _batch_rows()
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.Popen(_cmd(src, out), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    keys = out.with_name(out.name + ".keys")  # a verdict is kept once its key line is written
    while time.monotonic() < deadline:  # the three format errors land first, together
        if keys.exists() and len(keys.read_text().splitlines()) >= 3:
            break
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the verifier and every child it started
    proc.wait()
    keyed = {json.loads(ln)["candidate_id"] for ln in keys.read_text().splitlines()
             if ln.endswith("}")}  # a verdict the kill left without its key is decided again
    first = {json.loads(ln)["candidate_id"]: json.loads(ln)
             for ln in out.read_text().splitlines() if ln.endswith("}")}
    first = {k: v for k, v in first.items() if k in keyed}
    assert {"fmt0", "fmt1", "fmt2"} <= set(first) and len(first) < len(rows)

    p = subprocess.run(_cmd(src, out), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    final = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [v["candidate_id"] for v in final] == [r["candidate_id"] for r in rows]
    for v in final:
        if v["candidate_id"] in first:  # kept as written, not verified again
            assert v == first[v["candidate_id"]]
    assert sorted(_verdict_lines(p.stderr)) == sorted(set(r["candidate_id"] for r in rows)
                                                      - set(first))
    progress = [x for x in map(parse_progress, p.stderr.splitlines()) if x]
    assert progress[0]["resumed"] == len(first) and progress[-1]["done"] == len(rows)
    assert sum(progress[-1]["statuses"].values()) == len(rows)
    assert [v["status"] for v in final[:3]] == ["format_error"] * 3
    assert all(v["status"] in ("correct_fast", "correct_slow") for v in final[3:])
    stdout = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert stdout == final

    changed = _batch_rows(" changed")[:1] + rows[1:]  # fmt0's response differs now
    src.write_text("".join(json.dumps(r) + "\n" for r in changed))
    p = subprocess.run(_cmd(src, out), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    assert _verdict_lines(p.stderr) == ["fmt0"]
    again = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [v["candidate_id"] for v in again] == [r["candidate_id"] for r in rows]
    assert again[1:] == final[1:]


def test_parquet_out_streams_jsonl_beside_and_says_when_pyarrow_is_missing(
        tmp_path: Path) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.parquet"
    src.write_text(json.dumps({"candidate_id": "f", "task_source": RELU_TASK,
                               "response": "prose only"}) + "\n")
    blocked = ("import sys; sys.modules['pyarrow'] = None; from verifier.__main__ import main; "
               "sys.exit(main())")
    p = subprocess.run([sys.executable, "-c", blocked, "--batch", str(src), "--out", str(out),
                        "--backend", "cpu", "--cache-dir", str(CACHE)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert not out.exists() and "pyarrow" in p.stderr
    beside = tmp_path / "out.parquet.jsonl"
    assert json.loads(beside.read_text())["status"] == "format_error"

    import pyarrow.parquet as pq

    p = subprocess.run(_cmd(src, out), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "1 verdicts kept" in p.stderr  # resumed from the JSONL beside it
    assert pq.read_table(out).to_pylist()[0]["status"] == "format_error"


def test_profile_says_where_the_batch_time_went(tmp_path: Path) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows = _batch_rows()[:3]  # format errors: decided before any build
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = subprocess.run([*_cmd(src, out), "--profile"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    table = profile_text(p.stderr)
    assert table.splitlines()[0].split()[:3] == ["phase", "n", "sum"]
    assert any(ln.startswith("front ") for ln in table.splitlines()), table
    per = [json.loads(ln) for ln in Path(f"{out}.timings.jsonl").read_text().splitlines()]
    assert sorted(t["candidate_id"] for t in per) == sorted(r["candidate_id"] for r in rows)
    quiet = subprocess.run(_cmd(src, tmp_path / "again.jsonl"), cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert quiet.returncode == 0 and profile_text(quiet.stderr) == ""
