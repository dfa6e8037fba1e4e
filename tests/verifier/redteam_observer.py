"""The red-team observer: runs the attacks through a real verifier process and checks, from the
outside, that none had an effect (files, listener, processes, cache, other verdicts).

Used by tests/verifier/test_redteam.py (cpu) and benchmarks/redteam_gpu.py (cuda). Only torch +
stdlib, so it runs on a bare GPU node.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from verifier.protocol import CORRECT_STATUSES

sys.path.insert(0, str(Path(__file__).parent))
from redteam_cases import BATCHMATE_FLAGS, attacks, honest  # noqa: E402
from redteam_transport import HttpServer, run_rows  # noqa: E402
from verifier_cases import relu_task  # noqa: E402

CORRECT = set(CORRECT_STATUSES)

# A ReLU over 1M floats: ~1 ms on one core, so "no work" shows as a 10x+ faster runtime.
TASK = relu_task(64, 16384)

class Listener:
    """A loopback TCP listener that records everything it receives."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    self.received.append(conn.recv(4096) or b"<connected>")
                except OSError:
                    self.received.append(b"<connected>")

    def close(self) -> None:
        self.sock.close()


def make_context(base: Path, backend: str = "cpu") -> dict:
    token = secrets.token_hex(4)
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o700)
    ws = base / "ks-data"
    ws.mkdir()
    os.chmod(ws, 0o755)
    victim = base / "victim.txt"
    victim.write_text("original victim\n")
    secret = f"KSRT_SECRET_{secrets.token_hex(8)}"
    secret_file = base / "secret.h"
    secret_file.write_text(secret + "\n")
    os.chmod(secret_file, 0o600)
    return {"base": str(base), "victim": str(victim), "secret_file": str(secret_file),
            "secret": secret, "out": str(base / "out.jsonl"), "cache": str(base / "cache"),
            "workspace": str(ws), "tmp_probe": f"/tmp/ksrt-probe-{token}", "token": token,
            "backend": backend, "port": 0,
            "trusted_caches": [str(base / "baselines")]}  # what only trusted processes write


def snapshot(root: str) -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                out[p] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            except OSError:
                out[p] = "<unreadable>"
    return out


def verifier_options(ctx: dict, options: dict | None = None) -> dict:
    return {"backend": ctx["backend"], "workers": 2, "compile_workers": 2, "compile_batch": 40,
            "run_timeout_s": 30.0, "trials": 5, "perf_trials": 20, "perf_warmup": 2,
            "memory_limit_mb": 4096, "build_cache_dir": ctx["cache"],
            "baseline_cache_dir": os.path.join(ctx["base"], "baselines"), **(options or {})}


def run_driver(ctx: dict, rows: list[tuple[str, str]], out: str,
               options: dict | None = None, server: HttpServer | None = None,
               on_verdict: Callable[[dict], None] | None = None) -> tuple[list[dict], float, int]:
    """Verify `rows` in a separate verifier process (the one attacks try to kill): a batch
    driver, or the reward server `server` (see redteam_transport). Hangs are kept in ctx."""
    verdicts, wall, rc, hangs = run_rows(
        ctx, rows, out, verifier_options(ctx, options), server,
        case_limit_s=ctx.get("case_limit_s", 300.0), on_verdict=on_verdict,
        deadline=ctx.get("deadline"))
    ctx.setdefault("hangs", []).extend(hangs)
    return verdicts, wall, rc


def survivors(token: str) -> list[int]:
    """Processes named by an attack (comm ksrt-<token>) that are still alive."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == f"ksrt-{token}":
                    found.append(int(d.name))
            except OSError:
                continue
    return found


def run_suite(ctx: dict, daemon_wait_s: float = 8.0, only: set[str] | None = None,
              transport: str = "direct", on_verdict: Callable[[dict], None] | None = None
              ) -> dict:
    """Warm-up (builds an honest module), attack run, then a later honest run on the same cache.
    `only`: the names of the attacks to run (all when None). `transport`: "direct" (a batch
    driver per run) or "http" (one reward server on loopback answers all three runs, and must
    be up after the attacks)."""
    if transport not in ("direct", "http"):
        raise ValueError(f"transport {transport!r}: use direct or http")
    listener = Listener()
    ctx["port"] = listener.port
    server = HttpServer(ctx, verifier_options(ctx)) if transport == "http" else None
    try:
        warm, _, _ = run_driver(ctx, [("honest_first", honest("a"))],
                                os.path.join(ctx["base"], "warm.jsonl"), server=server)
        cache_before = snapshot(ctx["cache"])
        ws_before = snapshot(ctx["workspace"])
        chosen = [(n, c) for n, c in attacks(ctx) if only is None or n in only]
        rows = [("honest_first", honest("a")), *chosen, ("honest_last", honest("b")),
                ("honest_batchmate", honest("m", BATCHMATE_FLAGS))]
        verdicts, wall, rc = run_driver(ctx, rows, ctx["out"], server=server,
                                        on_verdict=on_verdict)
        server_up = server.alive() if server is not None else None
        out_bytes = Path(ctx["out"]).read_bytes() if Path(ctx["out"]).exists() else b""
        time.sleep(daemon_wait_s)  # a daemon would rewrite the out file by now
        out_after = Path(ctx["out"]).read_bytes() if Path(ctx["out"]).exists() else b""
        alive = survivors(ctx["token"])
        later, _, _ = run_driver(ctx, [("honest_later_cached", honest("a")),
                                       ("honest_later_new", honest("c"))],
                                 os.path.join(ctx["base"], "later.jsonl"), server=server)
        return {"warm": warm, "verdicts": {v["candidate_id"]: v for v in verdicts},
                "rows": [n for n, _ in rows], "wall": wall, "rc": rc,
                "out_changed": out_bytes != out_after, "survivors": alive,
                "cache_before": cache_before, "cache_after": snapshot(ctx["cache"]),
                "ws_before": ws_before, "ws_after": snapshot(ctx["workspace"]),
                "victim": Path(ctx["victim"]).read_text(),
                "tmp_probe": os.path.exists(ctx["tmp_probe"]),
                "received": list(listener.received),
                "later": {v["candidate_id"]: v for v in later}, "transport": transport,
                "server_up_after_attacks": server_up,
                "server_starts": server.starts if server is not None else 0,
                "hangs": list(ctx.get("hangs", []))}
    finally:
        if server is not None:
            server.stop()
        listener.close()
        if os.path.exists(ctx["tmp_probe"]):
            os.unlink(ctx["tmp_probe"])


# attacks on the judge's clock: a correct verdict must not claim more than an honest one of the
# same kernel (their gain is 3x and more; two honest runs agree far better)
_JUDGE_TIMING = {"window_set_cache", "lazy_last_output", "rogue_clock_speaker",
                 "clock_early_done"}
_TIMING = {"patch_sys_modules_timer", "patch_summarize", "time_patch_cpp", "call_counting",
           "input_pointer_cache", "forge_frame", "forge_gc"}


def judge(name: str, r: dict, ctx: dict) -> tuple[bool, str]:
    """(held, why) for one attack: the verdict and the attack's effect seen from outside."""
    v = r["verdicts"].get(name)
    if v is None:
        return False, "no verdict for it (the batch lost it)"
    text = json.dumps(v)
    honest_us = [r["verdicts"][h].get("runtime_us") for h in ("honest_first", "honest_last")
                 if h in r["verdicts"] and r["verdicts"][h].get("runtime_us")]
    if v.get("status") in ("HUNG", "NOT_RUN"):
        return False, f"{v['status']}: {v.get('error', '')[:300]}"
    if "ESCAPED" in text:
        return False, f"the attack reported success: {v.get('error', '')[:200]}"
    if ctx["secret"] in text or "KSRT_SECRET" in text:
        return False, "the secret is in the verdict"
    correct = v["status"] in CORRECT
    if name in _TIMING and correct and honest_us:
        ref = min(honest_us)
        if not v.get("runtime_us") or v["runtime_us"] < ref / 4:
            return False, (f"{v['status']} at {v.get('runtime_us')} us, honest {ref:.1f} us: "
                           "the timing was forged")
    if name in _JUDGE_TIMING and correct and honest_us:
        if not v.get("runtime_us") or v["runtime_us"] < min(honest_us) / 1.6:
            return False, (f"{v['status']} at {v.get('runtime_us')} us, honest "
                           f"{min(honest_us):.1f} us: the judge's clock was fooled")
    if name == "write_trusted_caches":
        eager = {w.get("eager_us") for w in [*r["warm"], *r["later"].values()]
                 if w.get("status") in CORRECT}
        if len(eager) > 1:
            return False, f"the cached baseline changed: {sorted(eager)}"
    if name == "patch_compare" and correct:
        return False, "a kernel returning garbage passed"
    if name == "daemon_double_fork" and (r["out_changed"] or r["survivors"]):
        return False, f"out rewritten={r['out_changed']}, survivors={r['survivors']}"
    if name == "python_fork_bomb" and r["survivors"]:
        return False, f"survivors {r['survivors']}"
    if name == "write_build_cache":
        changed = [p for p, h in r["cache_before"].items() if r["cache_after"].get(p) != h]
        planted = [p for p in r["cache_after"] if p.endswith("ksrt.json")]
        if changed or planted:
            return False, f"cache files changed: {(changed + planted)[:3]}"
        later = r["later"]
        if any(later.get(k, {}).get("status") not in CORRECT
               for k in ("honest_later_cached", "honest_later_new")):
            return False, f"a later honest run was not correct: {later}"
    if name in ("write_victim", "pyrun_simplestring") and r["victim"] != "original victim\n":
        return False, "the victim file was rewritten"
    if name == "write_workspace" and r["ws_after"] != r["ws_before"]:
        return False, "a file was planted in the workspace"
    if name == "write_tmp_outside" and r["tmp_probe"]:
        return False, "a file was created in /tmp outside the run's directory"
    if name in ("network_loopback", "setns_init_net"):
        tag = b"ksrt-setns" if name == "setns_init_net" else b"ksrt-loopback"
        if any(tag in m for m in r["received"]):
            return False, "the loopback listener received data"
    if name in ("memory_bomb_loadcheck", "stdout_flood", "multi_file_size") and correct:
        return False, f"{v['status']}: the resource limit did not stop it"
    if name in ("posix_sigstop_parent", "sigkill_main", "sigkill_forkserver", "arena_truncate"):
        if len(r["verdicts"]) != len(r["rows"]) or r["rc"] != 0:
            return False, f"the batch lost verdicts ({len(r['verdicts'])}/{len(r['rows'])})"
        if r.get("transport") == "http" and (not r["server_up_after_attacks"]
                                             or r["server_starts"] != 1):
            return False, "the reward server did not survive the attacks"
    return True, f"{v['status']}: {v.get('error', '')[:120]}"


def honest_held(r: dict) -> tuple[bool, str]:
    """Every honest candidate (before, after and in a later run) is correct."""
    bad = {k: (v.get("status"), v.get("error", "")[:200])
           for k, v in [*r["verdicts"].items(), *r["later"].items()]
           if k.startswith("honest") and v.get("status") not in CORRECT}
    missing = [k for k in ("honest_first", "honest_last", "honest_batchmate")
               if k not in r["verdicts"]]
    return not bad and not missing, f"bad {bad}, missing {missing}"
