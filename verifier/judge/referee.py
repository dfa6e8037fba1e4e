"""The trusted referee of a GPU worker: the judge on the worker's GPU, in a process that never
runs candidate code.

It owns every number of a GPU run. `trials` / `trials_publish` / `trials_seal` /
`trials_check` / `trials_release`: the trials' judge (`verifier.judge.trial_judge`): the task's
(and its variants') reference, its memory admission (`verifier.judge.admission`: a task that
cannot fit is answered `does_not_fit`), every trial's inputs drawn from the parent's seed into
an arena of device memory whose descriptor goes to the parent over a socket (SCM_RIGHTS) and on
to the worker (a paced job's: each published at its trial's "p", its slot sealed at its "q",
`verifier.judge.trial_pace`), and after the run the worker's output slots and the inputs
compared on the device, answered with a few figures. `prepare` / `fill` /
`check` / `release`: the timed windows' judge (`verifier.judge.window_judge`) on a second arena,
fresh inputs written before each window, the window's output slot and inputs checked after it.
`baseline`: the reference's eager (and torch.compile) timings, by the judge's window method;
`sizes`: one input set's and one output's bytes (one call of the reference, nothing timed).
`peaks`: the device's peaks for the physics floor (`verifier.judge.floor`), measured once and cached.
Only task code runs here; `decide.DEVICE` is the GPU.

    python -m verifier.judge.referee BACKEND [FD-SOCKET]
    stdin:  {"op": ..., "args": {...}} per line
    stdout: {"ok": true, ...} or {"error": str} per line

Parent side: `Referee(env, backend)` (pinned with the same CUDA_VISIBLE_DEVICES as its
worker), started on first use and again after a failure; `RemoteJudge` and `RemoteTrials`, the
window and trial judges as the verifier process sees them.
"""

from __future__ import annotations

import gc
import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from verifier.judge.construct import DEVICE

_PKG_ROOT = str(Path(__file__).resolve().parents[2])
START_S = 300.0  # import torch, a CUDA context
CALL_S = 600.0  # references of one run (trials, variants, timing windows)


class Referee:
    """Parent side: one referee process per GPU worker slot."""

    def __init__(self, env: dict[str, str], backend: str) -> None:
        self.env, self.backend = env, backend
        self.proc: subprocess.Popen | None = None
        self.buf = b""
        self.spans: Any = None  # a job's `verifier.run.spans.Spans`: each op's seconds in it

    def _start(self) -> None:
        from verifier.isolation.sandbox import scrubbed_env

        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "verifier.judge.referee", self.backend, str(theirs.fileno())],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=scrubbed_env({"PYTHONPATH": _PKG_ROOT, **self.env}),
                start_new_session=True, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self.fds = mine  # the referee sends its arena's descriptor here (SCM_RIGHTS)
        self.buf = b""

    def request(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """One operation's reply (RuntimeError when the referee fails or reports an error)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            began = time.monotonic()
            line = json.dumps({"op": op, "args": args}) + "\n"
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
            reply = self._read(START_S + CALL_S)
            if self.spans is not None:  # the benchmarks' profile (and the op's own parts)
                for name, s in [(op, time.monotonic() - began),
                                *((f"{op} {k}", v) for k, v in reply.get("parts", {}).items())]:
                    self.spans[f"referee {name}"] = self.spans.get(f"referee {name}", 0.0) + s
        except (OSError, ValueError) as exc:
            self.close()
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc
        if "error" in reply:
            raise RuntimeError(str(reply["error"])[:500])
        return reply

    def prepare(self, args: dict[str, Any], op: str = "prepare") -> tuple[dict[str, Any], int]:
        """A window judge ("prepare") or a trial judge ("trials") for one job on the referee's
        GPU: (its reply, the arena's descriptor, which the caller closes once the worker has
        it; -1 when the reply says the task does not fit, or is built only on the host)."""
        reply = self.request(op, args)
        if reply.get("does_not_fit") or reply.get("host_only"):
            return reply, -1
        self.fds.settimeout(30.0)
        try:
            _, fds, _, _ = socket.recv_fds(self.fds, 1, 1)
        except OSError as exc:
            self.close()
            raise RuntimeError(f"the referee's arena descriptor: {exc}") from exc
        if not fds:
            raise RuntimeError("the referee sent no arena descriptor")
        return reply, fds[0]

    def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise OSError(f"no answer within {timeout_s:.0f} s")
            if select.select([fd], [], [], min(left, 1.0))[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise OSError(f"the referee exited (code {self.proc.wait()})")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None:
            from verifier.isolation.sandbox import stop_process

            stop_process(self.proc, 10.0)
            self.proc = None
            self.fds.close()


class RemoteJudge:
    """The referee's window judge seen from the verifier process (`verifier.judge.clock`)."""

    def __init__(self, referee: Referee, reply: dict[str, Any]) -> None:
        self.referee = referee
        self.sets, self.copy_s = int(reply["sets"]), float(reply["copy_s"])
        self.out_bytes, self.spec = int(reply["out_bytes"]), reply["spec"]

    def fill(self, n: int) -> None:
        self.referee.request("fill", {"n": n})

    def check(self, n: int, deep: bool = False) -> str:
        return str(self.referee.request("check", {"n": n, "deep": deep}).get("why", ""))

    def release(self) -> None:
        self.referee.request("release", {})


class RemoteTrials:
    """The referee's trial judge (`verifier.judge.trial_judge`) seen from the verifier process."""

    def __init__(self, referee: Referee, reply: dict[str, Any]) -> None:
        self.referee, self.spec = referee, reply["spec"]
        self.admission = reply["admission"]
        self.stepped = bool(reply.get("stepped"))  # paced trials (`verifier.judge.trial_pace`)

    def publish(self, t: int) -> None:
        self.referee.request("trials_publish", {"t": t})

    def seal(self, t: int) -> None:
        self.referee.request("trials_seal", {"t": t})

    def check(self, report: Any, checked: Any) -> tuple[bool, str, dict[str, float]]:
        reply = self.referee.request("trials_check", {"report": report, "checked": checked})
        return bool(reply.get("ok")), str(reply.get("why", "")), dict(reply.get("stats") or {})

    def close(self) -> None:
        self.referee.request("trials_release", {})


_JUDGE: dict[str, Any] = {}  # the window judge of the job in flight (one at a time)


def _answer(msg: dict[str, Any], fds: socket.socket | None = None) -> dict[str, Any]:
    op, args = msg["op"], msg.get("args") or {}
    if op == "prepare":
        return _prepare(args, fds)
    if op == "fill":
        _JUDGE["judge"].fill(int(args.get("n", 1)))
        return {"ok": True}
    if op == "check":
        why = _JUDGE["judge"].check(int(args["n"]), bool(args.get("deep")))
        return {"ok": True, "why": why, "parts": _JUDGE["judge"].parts}
    if op == "release":
        _release()
        return {"ok": True}
    if op == "trials":
        return _prepare_trials(args, fds)
    if op == "trials_check":
        ok, why, stats = _TRIALS["judge"].check(args.get("report"), args.get("checked"))
        return {"ok": ok, "why": why, "stats": stats}
    if op in ("trials_publish", "trials_seal"):  # a stepped trial's "p" and "q"
        getattr(_TRIALS["judge"], op.removeprefix("trials_"))(int(args["t"]))
        return {"ok": True}
    if op == "trials_release":
        _release_trials()
        return {"ok": True}
    if op == "baseline":
        return baseline(args)
    if op == "sizes":
        return sizes(args)
    if op == "peaks":
        from verifier.judge.floor import device_peaks

        return {"ok": True, "peaks": device_peaks(_device(), Path(args["cache_dir"]))}
    return {"error": f"unknown op {op!r}"}


def _device() -> str:
    import verifier.judge.decide as decide

    return decide.DEVICE


def _empty_cache() -> None:
    """Hand the allocator's cached blocks back to the device: the referee outlives its jobs, and
    a GB-sized task's freed blocks (sets, clones, reference outputs) cached here were device
    memory the next job's worker and arenas could not have (an H100 ran out beside 65 GiB
    of it, the windows' judge asking 6 GiB)."""
    import torch

    if _device().startswith("cuda"):
        torch.cuda.empty_cache()


def _release() -> None:
    judge = _JUDGE.pop("judge", None)
    if judge is not None:
        judge.close()
        _empty_cache()


def _prepare(args: dict[str, Any], fds: socket.socket | None) -> dict[str, Any]:
    """A new window judge (the last one released): its arena's descriptor over `fds`."""

    from verifier.judge.window_judge import WindowJudge

    _release()
    budget = _budget(int(args.get("budget_bytes") or 8 << 30))
    judge = _JUDGE["judge"] = WindowJudge(args["task_source"], int(args["seed"]),
                                          tuple(args["tol"]), budget,
                                          construct=str(args.get("construct") or DEVICE))
    if fds is None:
        raise RuntimeError("no socket for the arena's descriptor")
    socket.send_fds(fds, [b"a"], [judge.arena.fd])
    return {"ok": True, "sets": judge.sets, "copy_s": judge.copy_s, "out_bytes": judge.out_bytes,
            "spec": judge.spec}


_TRIALS: dict[str, Any] = {}  # the trial judge of the job in flight


def _release_trials() -> None:
    judge = _TRIALS.pop("judge", None)
    if judge is not None:
        judge.close()
        _empty_cache()


def _prepare_trials(args: dict[str, Any], fds: socket.socket | None) -> dict[str, Any]:
    """A new trial judge (the last one released) and its arena's descriptor over `fds`; or
    {"does_not_fit": why} when the task's run cannot fit this device (`verifier.judge.admission`),
    {"host_only": why} when its reference cannot be built under the device context
    (`verifier.judge.construct`: the parent runs the job again the host's way)."""
    import torch

    from verifier.judge.construct import HostOnly
    from verifier.judge.trial_judge import DoesNotFit, TrialJudge

    _release_trials()
    if fds is None:
        raise RuntimeError("no socket for the arena's descriptor")
    try:
        judge = TrialJudge(args, int(args.get("cpu_free") or 1 << 34),
                           int(args.get("window_max") or 8 << 30))
    except DoesNotFit as exc:
        return {"ok": False, "does_not_fit": str(exc)}
    except HostOnly as exc:
        return {"ok": False, "host_only": f"the task's Model(...) {exc}"}
    except (RuntimeError, OSError) as exc:  # the reference or the arena (cuMemCreate) does not
        if "out of memory" not in str(exc).lower():  # fit beside the worker: the task's size
            raise
        free = torch.cuda.mem_get_info()[0] if _device().startswith("cuda") else 0
        return {"ok": False, "does_not_fit": "the task's reference does not fit the device "
                f"beside its worker ({free / (1 << 30):.2f} GiB free): {exc}"[:500]}
    _TRIALS["judge"] = judge
    socket.send_fds(fds, [b"t"], [judge.arena.fd])
    return {"ok": True, "spec": judge.spec, "admission": vars(judge.admission),
            "footprint": vars(judge.footprint), "stepped": judge.stepped}


def _budget(asked: int) -> int:
    """The window judge's arena budget on this device: what was asked, at most a quarter of
    the free memory."""
    import torch

    free, _ = torch.cuda.mem_get_info() if _device().startswith("cuda") else (1 << 34, 0)
    return min(asked, free // 4)


def _reference(args: dict[str, Any]) -> tuple[Any, Any]:
    """The task's reference module (timings and sizes only: its weights need not match
    anyone's) and its input draw by index."""
    from verifier.judge import decide
    from verifier.judge.construct import HOST, HostOnly

    try:
        model, get_inputs = decide.reference(args["task_source"], int(args["seed"]))
    except HostOnly:
        model, get_inputs = decide.reference(args["task_source"], int(args["seed"]), HOST)
    return model, lambda k: decide.make_inputs(get_inputs, k)


def baseline(args: dict[str, Any]) -> dict[str, Any]:
    """The reference's baselines timed here, in a process that never runs candidate code."""
    from verifier.backends import get_backend
    from verifier.judge.timed_calls import time_reference

    model, make_inputs = _reference(args)
    backend = get_backend(args["backend"])
    figures = time_reference(model, make_inputs, backend.synchronize,
                             bool(args.get("torch_compile")) and backend.torch_compile_supported(),
                             _budget(int(args.get("budget_bytes") or 8 << 30)))
    del model
    _empty_cache()
    return {"ok": True, "figures": figures}


def sizes(args: dict[str, Any]) -> dict[str, Any]:
    """One input set's and one output's bytes of the task's reference, nothing timed."""
    from verifier.judge.timed_calls import reference_sizes

    model, make_inputs = _reference(args)
    got = reference_sizes(model, make_inputs)
    del model
    _empty_cache()
    return {"ok": True, "sizes": got}


def main(argv: list[str]) -> int:
    import torch

    import verifier.judge.decide as decide
    from verifier.backends import get_backend

    backend = get_backend(argv[0] if argv else "cuda")
    decide.DEVICE = backend.device()
    fds = socket.socket(fileno=int(argv[1])) if len(argv) > 1 else None
    out = sys.stdout
    sys.stdout = sys.stderr  # task code that prints cannot break the protocol
    torch.set_grad_enabled(False)
    # torch's own objects never die: a job's collection (`decide.keep_only`, once a job) scans
    gc.collect()  # only what came after them (~50 ms a job with torch's objects scanned)
    gc.freeze()
    for line in sys.stdin:
        try:
            reply = _answer(json.loads(line), fds)
        except Exception as exc:  # a reference that fails here is reported, not judged
            reply = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        out.write(json.dumps(reply) + "\n")
        out.flush()
        if decide.DEVICE != "cpu":  # the worker shares this GPU: give its memory back
            getattr(torch, torch.device(decide.DEVICE).type).empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
