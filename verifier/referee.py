"""The trusted referee of a GPU worker: reference outputs on the worker's GPU, in a process that
never runs candidate code.

A GPU worker draws each trial's inputs on the GPU from a seed the parent chose fresh
(`input_seed`), so the parent's cpu cannot regenerate them (another random stream); this
process can. It runs `verifier.decide`'s and `verifier.clock`'s own checks with
`decide.DEVICE` set to the GPU: the task's reference on the same inputs, judged against the raw
outputs the worker sent the parent (`verifier.gpu_worker`: a sealed memfd the parent holds,
mapped here copy-on-write by its /proc path, `verifier.shared_outputs`). Only task code and the
checked layout reader run here.

    python -m verifier.referee BACKEND
    stdin:  {"op": "run" | "clock", "outputs": PATH, "layout": {...}, "args": {...}, "job": N}
            per line
    stdout: {"ok": bool, "why": str} or {"error": str} per line

Parent side: `Referee(env, backend)` (pinned with the same CUDA_VISIBLE_DEVICES as its
worker), started on first use and again after a failure.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_PKG_ROOT = str(Path(__file__).resolve().parent.parent)
START_S = 300.0  # import torch, a CUDA context
CALL_S = 600.0  # references of one run (trials, variants, timing windows)


class Referee:
    """Parent side: one referee process per GPU worker slot."""

    def __init__(self, env: dict[str, str], backend: str) -> None:
        self.env, self.backend = env, backend
        self.proc: subprocess.Popen | None = None
        self.buf = b""

    def _start(self) -> None:
        from verifier.sandbox import scrubbed_env

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "verifier.referee", self.backend], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=scrubbed_env({"PYTHONPATH": _PKG_ROOT, **self.env}), start_new_session=True)
        self.buf = b""

    def __call__(self, op: str, args: dict[str, Any], outputs: str, layout: Any = None,
                 job: str = "") -> tuple[bool, str]:
        """(ok, why not) for `op` on the outputs at `outputs` (a sealed memfd's /proc path,
        "" for none; `layout` as the worker described it) of the parent's job number `job`
        (the referee maps them once per job); RuntimeError when the referee fails."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps({"op": op, "outputs": outputs, "layout": layout,
                                               "args": args, "job": job}) + "\n").encode())
            self.proc.stdin.flush()
            reply = self._read(START_S + CALL_S)
        except (OSError, ValueError) as exc:
            self.close()
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc
        if "error" in reply:
            raise RuntimeError(str(reply["error"])[:500])
        return bool(reply.get("ok")), str(reply.get("why", ""))

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
            from verifier.sandbox import stop_process

            stop_process(self.proc, 10.0)
            self.proc = None


_LAST: dict[str, Any] = {}  # the outputs last mapped: one mapping serves a run's two ops


def _outputs(path: str, layout: Any, job: str) -> Any:
    """The raw outputs at `path`, mapped once per job (a run asks "run" then "clock" of the
    same outputs; the parent numbers its jobs); None when there are none or the layout does
    not fit them."""
    from verifier.shared_outputs import read_mapped

    ident = (path, job) if job else None
    if ident is None or _LAST.get("ident") != ident:
        _LAST.clear()  # drop the old outputs before the new ones map
        try:
            data = read_mapped(path, layout) if path else None
        except (OSError, ValueError):  # gone, or a layout that does not fit: no outputs
            data = None
        _LAST.update(ident=ident, data=data)
    return _LAST["data"]


def _answer(msg: dict[str, Any]) -> dict[str, Any]:
    from verifier.clock import check_outputs
    from verifier.decide import check_run

    data = _outputs(str(msg.get("outputs") or ""), msg.get("layout"), str(msg.get("job") or ""))
    raw, clocked = (data if isinstance(data, list) and len(data) == 2 else (None, None))
    raw, clocked = (x if isinstance(x, list) else None for x in (raw, clocked))
    args = msg["args"]
    args["tol"] = tuple(args["tol"])
    if msg["op"] == "run":
        ok, why = check_run(outputs=raw, **args)
    elif msg["op"] == "clock":
        ok, why = check_outputs(outputs=clocked, **args)
    else:
        return {"error": f"unknown op {msg['op']!r}"}
    return {"ok": ok, "why": why}


def main(argv: list[str]) -> int:
    import torch

    import verifier.decide as decide
    from verifier.backends import get_backend

    backend = get_backend(argv[0] if argv else "cuda")
    decide.DEVICE = backend.device()
    out = sys.stdout
    sys.stdout = sys.stderr  # task code that prints cannot break the protocol
    torch.set_grad_enabled(False)
    for line in sys.stdin:
        try:
            reply = _answer(json.loads(line))
        except Exception as exc:  # a reference that fails here is reported, not judged
            reply = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        out.write(json.dumps(reply) + "\n")
        out.flush()
        if decide.DEVICE != "cpu":  # the worker shares this GPU: give its memory back
            getattr(torch, torch.device(decide.DEVICE).type).empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
