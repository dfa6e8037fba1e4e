"""Batch mode's files: candidate rows in, verdicts streamed out as decided, resume, progress.

Every verdict is appended to the JSONL log (`--out`, or `<out>.jsonl` beside a Parquet `--out`)
the moment it is final, flushed and fsync'd, so a killed batch loses only the verdicts in flight.
Beside the log, `<log>.keys` holds one line per verdict line: its candidate_id, the hash of what
was verified (task source + response + variants) and the digest of the verdict line it vouches
for. A re-run with the same `--out` keeps a verdict only when its key line and its verdict line
both landed and the candidate is unchanged; everything else is verified again. Torch + stdlib.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from verifier.protocol import VerdictData, VerifyOptions, VerifyRequest
from verifier.run.batch_stats import profile_table


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Candidate rows of a .jsonl or .parquet batch file (Parquet needs pyarrow)."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise SystemExit(f"{path}: Parquet batches need pyarrow (pip install pyarrow), "
                             "or pass a .jsonl file") from None
        return pq.read_table(path).to_pylist()
    rows = []
    try:
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except ValueError as exc:
                        raise SystemExit(f"{path}:{n}: not JSON ({exc})") from None
    except OSError as exc:
        raise SystemExit(f"{path}: cannot read the batch ({exc.strerror})") from None
    return rows


def to_requests(rows: list[dict[str, Any]], source: Path) -> list[VerifyRequest]:
    """One VerifyRequest per row; a row without task_source or response names itself."""
    out = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):  # a JSON line that is an array, a string, a number
            raise SystemExit(f"{source} row {i}: expected a JSON object, got "
                             f"{type(r).__name__}")
        if not r.get("task_source") or not (r.get("response") or r.get("code")):
            raise SystemExit(f"{source} row {i}: needs task_source and response (or code)")
        texts = (r["task_source"], r.get("response") or r["code"], r.get("backend") or "auto")
        if not all(isinstance(t, str) for t in texts):
            raise SystemExit(f"{source} row {i}: task_source, response (or code) and backend "
                             "must be strings")
        variants = r.get("variants")
        if isinstance(variants, str):
            try:
                variants = json.loads(variants)
            except ValueError as exc:
                raise SystemExit(f"{source} row {i}: variants is not JSON ({exc})") from None
        out.append(VerifyRequest(candidate_id=str(r.get("candidate_id", i)),
                                 task_id=str(r.get("task_id", "")),
                                 task_source=r["task_source"],
                                 response=r.get("response") or r["code"],
                                 backend=r.get("backend") or "auto", variants=variants,
                                 flops=_number(r.get("flops"), source, i, "flops")))
    return out


def _number(value: Any, source: Path, row: int, name: str) -> float:
    """A row's optional non-negative number (0 when absent); a bad one names the row."""
    if value is None or value == "":
        return 0.0
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SystemExit(f"{source} row {row}: {name} is not a number ({value!r})") from None
    if not number >= 0 or number == float("inf"):
        raise SystemExit(f"{source} row {row}: {name} must be a finite number >= 0 ({value!r})")
    return number


def request_hash(req: VerifyRequest) -> str:
    """What a verdict depends on from its row: a changed task or response is verified again."""
    h = hashlib.sha256()
    for part in (req.task_source, req.response, json.dumps(req.variants, sort_keys=True)):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:24]


def _key(req: VerifyRequest) -> tuple[str, str]:
    return req.candidate_id, request_hash(req)


def _digest(line: bytes) -> str:
    return hashlib.sha256(line.rstrip(b"\n")).hexdigest()[:24]


def _complete_lines(path: Path) -> list[bytes]:
    """The whole lines of a file; a torn last line (killed mid-write) is left out."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return [ln for ln in data.split(b"\n")[:-1] if ln.strip()]


def _replace(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(ln + "\n" for ln in lines)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class VerdictLog:
    """The JSONL verdict log of one `--out` and its key file; appends are durable at return."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.log = out.with_name(out.name + ".jsonl") if out.suffix == ".parquet" else out
        self.keys = self.log.with_name(self.log.name + ".keys")
        self.lock = threading.Lock()
        self._fh: tuple[Any, Any] | None = None

    def resume(self, requests: list[VerifyRequest]) -> tuple[dict[tuple[str, str], dict], int]:
        """Verdicts already decided for these requests, and how many stale ones were dropped.

        The log and key file are rewritten to hold exactly the kept verdicts (one per key), so
        appends that follow never sit after a torn line or a verdict of a changed candidate.
        """
        wanted = {_key(r) for r in requests}
        lines = {_digest(ln): ln for ln in _complete_lines(self.log)}
        done: dict[tuple[str, str], dict] = {}
        for n, raw in enumerate(_complete_lines(self.keys), 1):
            try:
                k = json.loads(raw)
                key, digest = (str(k["candidate_id"]), str(k["request_hash"])), k["verdict"]
            except (ValueError, KeyError, TypeError) as exc:
                raise SystemExit(f"{self.keys}:{n}: not a key line ({exc}); remove it and "
                                 f"{self.log}, or pass another --out") from None
            if key in wanted and digest in lines:
                try:
                    done[key] = json.loads(lines[digest])
                except ValueError as exc:
                    raise SystemExit(f"{self.log}: verdict of {key[0]} is not JSON ({exc})") \
                        from None
        stale = len(lines) - len(done)
        if lines or self.keys.exists():
            order = [_key(r) for r in requests]
            kept = [k for k in dict.fromkeys(order) if k in done]
            self._rewrite(kept, done)
        return done, stale

    def _rewrite(self, keys: list[tuple[str, str]], rows: dict[tuple[str, str], dict]) -> None:
        verdict_lines = [json.dumps(rows[k]) for k in keys]
        key_lines = [json.dumps({"candidate_id": k[0], "request_hash": k[1],
                                 "verdict": _digest(v.encode())})
                     for k, v in zip(keys, verdict_lines, strict=True)]
        # keys first: a crash between the two leaves keys whose verdicts are simply not found
        _replace(self.keys, key_lines)
        _replace(self.log, verdict_lines)

    def append(self, req: VerifyRequest, row: dict[str, Any]) -> None:
        """Write one verdict and its key line, each flushed and fsync'd, before returning."""
        line = json.dumps(row)
        key_line = json.dumps({"candidate_id": req.candidate_id,
                               "request_hash": request_hash(req),
                               "verdict": _digest(line.encode())})
        with self.lock:
            if self._fh is None:
                self.log.parent.mkdir(parents=True, exist_ok=True)
                self._fh = (open(self.log, "a", encoding="utf-8"),
                            open(self.keys, "a", encoding="utf-8"))
            for fh, text in zip(self._fh, (line, key_line), strict=True):
                fh.write(text + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def finish(self, requests: list[VerifyRequest], rows: dict[tuple[str, str], dict]) -> str:
        """Rewrite the log in request order and write the Parquet `--out`; returns a note."""
        self.close()
        order = list(dict.fromkeys(_key(r) for r in requests))
        self._rewrite(order, rows)
        if self.out == self.log:
            return ""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            return (f"{self.out}: not written: Parquet needs pyarrow, which does not import "
                    f"here; the verdicts are in {self.log} (JSONL)")
        table = []
        for k in [_key(r) for r in requests]:
            row = dict(rows[k])
            row["findings"] = json.dumps(row["findings"])
            table.append(row)
        tmp = self.out.with_name(self.out.name + ".tmp")
        pq.write_table(pa.Table.from_pylist(table), tmp)
        os.replace(tmp, self.out)
        return ""

    def close(self) -> None:
        with self.lock:
            for fh in self._fh or ():
                fh.close()
            self._fh = None


PROGRESS_RE = re.compile(
    r"^\[verifier\] done (?P<done>\d+)/(?P<total>\d+) \| resumed (?P<resumed>\d+) \| "
    r"rate (?P<rate>[\d.]+)/min \| eta (?P<eta>\S+) \| statuses (?P<statuses>.*)$")


def parse_progress(line: str) -> dict[str, Any] | None:
    """A progress line as numbers (None for any other line): for tests and benchmarks."""
    m = PROGRESS_RE.match(line.strip())
    if not m:
        return None
    statuses = dict(p.split("=") for p in m["statuses"].split() if p != "-")
    return {"done": int(m["done"]), "total": int(m["total"]), "resumed": int(m["resumed"]),
            "rate_per_min": float(m["rate"]), "eta": m["eta"],
            "statuses": {k: int(v) for k, v in statuses.items()}}


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (
        f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


class BatchProgress:
    """Progress lines on stderr: at most one per `interval_s` (plus one per verdict if verbose)."""

    def __init__(self, total: int, resumed: list[str], stream: TextIO = sys.stderr,
                 interval_s: float = 5.0, verbose: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.resumed, self.stream = total, len(resumed), stream
        self.interval_s, self.verbose, self.clock = interval_s, verbose, clock
        self.statuses = Counter(resumed)
        self.new = self.shown = 0
        self.t0 = self.last = clock()
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def line(self) -> str:
        done = self.resumed + self.new
        minutes = max(self.clock() - self.t0, 1e-9) / 60
        rate = self.new / minutes
        left = self.total - done
        eta = "0s" if left <= 0 else (_duration(left / rate * 60) if self.new else "?")
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.statuses.items())) or "-"
        return (f"[verifier] done {done}/{self.total} | resumed {self.resumed} | "
                f"rate {rate:.1f}/min | eta {eta} | statuses {counts}")

    def _emit(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def verdict(self, v: VerdictData) -> None:
        """Count one newly decided verdict; print if the interval has passed."""
        with self.lock:
            self.new += 1
            self.statuses[v.status] += 1
            if self.verbose:
                self._emit(f"[verifier] verdict {v.candidate_id}: {v.status} (stage {v.stage}, "
                           f"{v.wall_s:.1f}s)")
            if self.clock() - self.last >= self.interval_s:
                self.last, self.shown = self.clock(), self.new
                self._emit(self.line())

    def start(self) -> None:
        """First line now; then a heartbeat line every interval while nothing else prints."""
        self._emit(self.line())

        def tick() -> None:  # a quiet batch (long compiles) still says it lives, sparingly
            while not self._stop.wait(self.interval_s):
                with self.lock:
                    since = self.clock() - self.last
                    if since >= self.interval_s and (self.new != self.shown or since >= 30):
                        self.last, self.shown = self.clock(), self.new
                        self._emit(self.line())

        self._ticker = threading.Thread(target=tick, daemon=True)
        self._ticker.start()

    def close(self) -> None:
        """Stop the heartbeat and print the final line."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self.lock:
            self._emit(self.line())


PROFILE_START, PROFILE_END = "[verifier] profile:", "[verifier] end of profile"


def profile_text(stderr: str) -> str:
    """The profile a `--profile` batch printed on stderr ("" when none)."""
    head, sep, rest = stderr.partition(PROFILE_START + "\n")
    return rest.partition("\n" + PROFILE_END)[0] if sep else ""


def run_batch(batch: Path, out: Path | None, options: VerifyOptions, progress: str = "normal",
              interval_s: float = 5.0, profile: bool = False) -> int:
    """Batch mode: verify the rows of `batch`, streaming verdicts to `out`; resume from it;
    `profile`: where the wall time went (`verifier.run.batch_stats`), on stderr at the end, and
    each candidate's (`<out>.timings.jsonl`)."""
    from verifier.api import verify_batch

    requests = to_requests(read_rows(batch), batch)
    log = VerdictLog(out) if out else None
    done: dict[tuple[str, str], dict] = {}
    if log is not None:
        done, stale = log.resume(requests)
        if done or stale:
            print(f"[verifier] resuming from {log.log}: {len(done)} verdicts kept, {stale} of "
                  "changed or absent candidates dropped", file=sys.stderr)
        if out.suffix == ".parquet" and importlib.util.find_spec("pyarrow") is None:
            print(f"[verifier] {out}: pyarrow does not import here, so no Parquet at the end; "
                  f"the verdicts stream to {log.log}", file=sys.stderr)
    pending = [r for r in requests if _key(r) not in done]
    report = BatchProgress(len(requests), [v["status"] for k, v in done.items()],
                           interval_s=interval_s, verbose=progress == "verbose",
                           stream=sys.stderr if progress != "quiet" else io.StringIO())
    by_id: dict[str, VerifyRequest] = {}
    for r in pending:  # the verdict names its candidate_id: one id, one content
        if by_id.setdefault(r.candidate_id, r) is not r and _key(by_id[r.candidate_id]) != _key(r):
            raise SystemExit(f"{batch}: candidate_id {r.candidate_id!r} appears twice with "
                             "different task or response")

    def decided(v: VerdictData) -> None:
        if log is not None:
            log.append(by_id[v.candidate_id], v.to_dict())
        report.verdict(v)

    report.start()
    stats: dict[str, Any] = {}
    timings: dict[str, dict[str, Any]] | None = {} if profile and out else None
    try:
        verdicts = verify_batch(pending, options, progress=decided, stats=stats,
                                timings=timings) if pending else []
    finally:
        report.close()
        if profile and stats:
            print(f"{PROFILE_START}\n{profile_table(stats)}\n{PROFILE_END}", file=sys.stderr)
        if timings and out:  # each candidate's spans and phases, beside the verdicts
            Path(f"{out}.timings.jsonl").write_text("".join(
                json.dumps({"candidate_id": k, **v}, default=str) + "\n"
                for k, v in timings.items()), "utf-8")
        if log is not None:
            log.close()
    rows = dict(done)
    for req, v in zip(pending, verdicts, strict=True):
        rows[_key(req)] = v.to_dict()
    if log is not None:
        note = log.finish(requests, rows)
        if note:
            print(f"[verifier] {note}", file=sys.stderr)
    for r in requests:
        print(json.dumps(rows[_key(r)]))
    return 0
