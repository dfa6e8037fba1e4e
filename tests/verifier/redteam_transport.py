"""How the red-team observer hands candidates to a verifier: `direct` (a batch driver process
calling `verify_batch`) or `http` (a reward server, `verifier.reward.server.serve` as
`python -m verifier serve` runs it, on loopback, one POST /verify per batch).

Either way the verifier runs in a separate process group whose stderr goes to a log, and the
observer watches it: the verifier process prints `KSRT-START <id>` when a candidate's run
starts and `KSRT-VERDICT <json>` when its verdict is final. When nothing happens for
`case_limit_s` (after the builds) the observer names the candidates in flight, dumps the
Python stacks of the verifier and its descendants (faulthandler on SIGUSR1, registered in the
verifier process and the GPU worker), kills the process group, and gives the cases in flight a
`HUNG` verdict; `run_rows` then goes on with the rows not yet run in a fresh verifier.
Only torch + stdlib (benchmarks/redteam_gpu.py runs it on a bare GPU node).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Shared by both verifier processes: static checks off on request, start/verdict lines, stacks.
_PRELUDE = '''
import faulthandler, json, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)
spec = json.loads(open(sys.argv[1]).read())
if not spec["static"]:  # the runtime defences must hold on their own
    import verifier.stages as stages
    stages.check_python = lambda *a, **k: []
    stages.check_cpp = lambda *a, **k: []
if spec.get("persistent"):  # cpu through the GPU path's persistent worker (its defences)
    from verifier.backends.cpu import CpuBackend
    CpuBackend.persistent_worker = True
import verifier.run.gpu_runner as gpu_runner
import verifier.run.runners as runners
def _traced(cls):
    real = cls.run
    def run(self, item, job, *rest):
        cid = getattr(getattr(item, "req", None), "candidate_id", None)
        if cid is not None:  # not the baseline prefetch's own runs
            print("KSRT-START " + cid, file=sys.stderr, flush=True)
        return real(self, item, job, *rest)
    cls.run = run
_traced(runners.SandboxRunner)
_traced(gpu_runner.GpuRunner)
def progress(v):
    print("KSRT-VERDICT " + json.dumps(v.to_dict()), file=sys.stderr, flush=True)
from verifier.protocol import VerifyOptions, VerifyRequest
opts = VerifyOptions(**spec["options"])
'''

DRIVER = _PRELUDE + '''
from verifier.api import verify_batch
reqs = [VerifyRequest(r["id"], "relu", spec["task"], r["code"], spec["backend"])
        for r in spec["rows"]]
with open(spec["out"], "w") as fh:
    def both(v):
        progress(v)
        fh.write(json.dumps(v.to_dict()) + "\\n")
        fh.flush()
    verify_batch(reqs, opts, progress=both)
'''

SERVER = _PRELUDE + '''
import verifier.api as api
from verifier.reward.server import ServiceLimits, serve
real_verify_batch = api.verify_batch
api.verify_batch = lambda reqs, o: real_verify_batch(reqs, o, progress=progress)
serve("127.0.0.1", 0, opts, ServiceLimits(max_concurrency=2, timeout_s=spec["request_s"]))
'''


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


class VerifierProcess:
    """A driver or server process in its own process group, its stderr logged and watched."""

    def __init__(self, script: str, spec: dict, base: Path, tag: str, env: dict[str, str]):
        spec_path = base / f"spec-{tag}.json"
        spec_path.write_text(json.dumps(spec))
        self.log_path = base / f"verifier-{tag}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 (lives with the process)
        self.proc = subprocess.Popen([sys.executable, "-c", script, str(spec_path)], env=env,
                                     cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.offset = 0
        self.started: list[str] = []
        self.verdicts: dict[str, dict] = {}
        self.last_event = time.monotonic()

    def poll_log(self, on_verdict: Callable[[dict], None] | None = None) -> None:
        """Read new KSRT lines of the log."""
        with open(self.log_path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        cut = data.rfind(b"\n") + 1
        self.offset += cut
        for raw in data[:cut].splitlines():
            line = raw.decode("utf-8", "replace")
            if line.startswith("KSRT-START "):
                self.started.append(line.split(" ", 1)[1])
                self.last_event = time.monotonic()
            elif line.startswith("KSRT-VERDICT "):
                with contextlib.suppress(ValueError):
                    v = json.loads(line.split(" ", 1)[1])
                    self.verdicts[v["candidate_id"]] = v
                    self.last_event = time.monotonic()
                    if on_verdict:
                        on_verdict(v)

    def in_flight(self) -> list[str]:
        return [c for c in dict.fromkeys(self.started) if c not in self.verdicts]

    def stalled(self, case_limit_s: float, build_limit_s: float) -> bool:
        limit = case_limit_s if self.started else build_limit_s
        return time.monotonic() - self.last_event > limit

    def dump_and_kill(self, why: str) -> str:
        """Stacks of the verifier and its descendants into the log, then SIGKILL them all."""
        pids = _descendants(self.proc.pid)
        states = {p: _state(p) for p in pids}
        for p in pids:  # a stopped process (SIGSTOP by an attack) dumps only once continued
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGCONT)
                os.kill(p, signal.SIGUSR1)
        time.sleep(3.0)
        self.kill()
        note = (f"{why}; in flight {self.in_flight()}; process states {states}; "
                f"stacks in {self.log_path}")
        sys.stderr.write(f"[redteam] HUNG: {note}\n")
        sys.stderr.write(self.log_path.read_bytes()[-6000:].decode("utf-8", "replace") + "\n")
        return note

    def kill(self) -> None:
        for p in _descendants(self.proc.pid):  # new sessions too (the GPU worker's)
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


def _spec(ctx: dict, rows: list[tuple[str, str]], out: str, opts: dict) -> dict:
    from redteam_cases import for_backend
    from redteam_observer import TASK

    return {"task": TASK, "backend": ctx["backend"], "out": out, "options": opts,
            "static": ctx.get("static", False), "request_s": 6000,
            "persistent": ctx.get("persistent", False),
            "rows": [{"id": n, "code": for_backend(c, ctx["backend"])} for n, c in rows]}


def _env(ctx: dict) -> dict[str, str]:
    return {**os.environ, "KS_SECRET": ctx["secret"], "PYTHONPATH": str(ROOT)}


class HttpServer:
    """`verifier.reward.server.serve` on loopback, with the suite's verifier options."""

    def __init__(self, ctx: dict, opts: dict) -> None:
        self.ctx, self.opts, self.starts = ctx, opts, 0
        self.vp: VerifierProcess | None = None
        self.url = ""

    def start(self) -> None:
        self.starts += 1
        spec = _spec(self.ctx, [], "", self.opts)
        self.vp = VerifierProcess(SERVER, spec, Path(self.ctx["base"]), f"server{self.starts}",
                                  _env(self.ctx))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and self.vp.proc.poll() is None:
            text = self.vp.log_path.read_text(errors="replace")
            if "reward service on " in text:
                self.url = text.split("reward service on ", 1)[1].split()[0]
                return
            time.sleep(0.2)
        raise RuntimeError(f"the reward server did not start: {self.vp.log_path.read_text()}")

    def alive(self) -> bool:
        if self.vp is None or self.vp.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=30) as resp:
                return json.loads(resp.read()).get("status") == "ok"
        except (OSError, ValueError):
            return False

    def post(self, rows: list[tuple[str, str]], result: dict) -> None:
        """POST /verify in a thread: result gets "verdicts" or "error"."""
        from redteam_cases import for_backend
        from redteam_observer import TASK

        body = json.dumps({"items": [{"task_source": TASK, "response": for_backend(c, self.ctx[
            "backend"]), "candidate_id": n, "task_id": "relu", "backend": self.ctx["backend"]}
            for n, c in rows], "timeout_s": 6000}).encode()
        req = urllib.request.Request(self.url + "/verify", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=7000) as resp:
                result["verdicts"] = json.loads(resp.read())["verdicts"]
        except (OSError, ValueError) as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, urllib.error.HTTPError):
                result["error"] += " " + exc.read().decode("utf-8", "replace")[:500]

    def stop(self) -> int | None:
        if self.vp is None:
            return None
        rc = self.vp.proc.poll()
        self.vp.kill()
        self.vp = None
        return rc


def run_rows(ctx: dict, rows: list[tuple[str, str]], out: str, opts: dict,
             server: HttpServer | None = None, case_limit_s: float = 300.0,
             build_limit_s: float = 1800.0, on_verdict: Callable[[dict], None] | None = None,
             deadline: float | None = None) -> tuple[list[dict], float, int, list[str]]:
    """Verify `rows` (direct when `server` is None); (verdicts, wall s, rc, hang notes).
    rc is the driver's exit status (http: 0 when every request answered 200 and the server
    stayed up, else 1). Verdicts are written to `out` as JSON lines. Past `deadline` (a
    time.monotonic() value) the cases in flight are HUNG and the rest NOT_RUN."""
    import threading

    t0 = time.monotonic()
    verdicts: dict[str, dict] = {}
    hangs: list[str] = []
    rc = 0
    todo = list(rows)
    round_no = 0
    while todo:
        round_no += 1
        tag = f"{Path(out).stem}-{round_no}"
        result: dict = {}
        if server is None:
            vp = VerifierProcess(DRIVER, _spec(ctx, todo, out + f".{round_no}", opts),
                                 Path(ctx["base"]), tag, _env(ctx))
            waiter = None
        else:
            if server.vp is None or server.vp.proc.poll() is not None:
                server.start()
            vp = server.vp
            vp.started, vp.verdicts, vp.last_event = [], {}, time.monotonic()
            waiter = threading.Thread(target=server.post, args=(todo, result), daemon=True)
            waiter.start()
        while (waiter.is_alive() if waiter else vp.proc.poll() is None):
            vp.poll_log(on_verdict)
            if vp.stalled(case_limit_s, build_limit_s) or (deadline and time.monotonic() > deadline):
                break
            time.sleep(0.5)
        vp.poll_log(on_verdict)
        done = (not waiter.is_alive()) if waiter else vp.proc.poll() is not None
        if done:
            if waiter is None:
                rc = rc or vp.proc.returncode
                vp.log.close()
                if vp.proc.returncode != 0:
                    sys.stderr.write(vp.log_path.read_bytes()[-3000:].decode("utf-8", "replace"))
                got = vp.verdicts
            else:
                got = {v["candidate_id"]: v for v in result.get("verdicts", [])}
                if "error" in result or not server.alive():
                    rc = 1
                    hangs.append(f"request failed: {result.get('error', 'server down')}")
                    got = {**vp.verdicts, **got}
            verdicts.update(got)
            todo = []
            continue
        past = deadline is not None and time.monotonic() > deadline
        note = vp.dump_and_kill("the wall limit was reached" if past
                                else f"no progress for {case_limit_s:.0f} s")
        hangs.append(note)
        rc = rc or 124
        if server is not None:
            server.vp = None
        verdicts.update(vp.verdicts)
        # a hang before any run started (builds, collect): every row left is lost with it
        lost = vp.in_flight() if vp.started else [n for n, _ in todo if n not in vp.verdicts]
        for cid in lost:
            verdicts[cid] = {"candidate_id": cid, "status": "HUNG", "error": note}
        todo = [(n, c) for n, c in todo if n not in verdicts]
        if past:
            for n, _ in todo:
                verdicts[n] = {"candidate_id": n, "status": "NOT_RUN", "error": note}
            todo = []
    ordered = [verdicts[n] for n, _ in rows if n in verdicts]
    with open(out, "w") as fh:
        fh.writelines(json.dumps(v) + "\n" for v in ordered)
    return ordered, time.monotonic() - t0, rc, hangs
