"""Red-team suite (issue 22) against a GPU backend: every attack, its verdict, whether it held.

    python -m benchmarks.redteam_gpu --backend cuda --static off \
        --out benchmarks/results/redteam_cuda.md
    python -m benchmarks.redteam_gpu --backend cuda --round6 \
        --out benchmarks/results/redteam_round6_cuda.md
    python -m benchmarks.redteam_gpu --backend cuda --round7 \
        --out benchmarks/results/redteam_round7_cuda.md
    python -m benchmarks.redteam_gpu --backend cuda --round10 \
        --out benchmarks/results/redteam_round10_cuda.md

Runs tests/verifier/redteam_cases.py's attacks (each a correct ReLU trying one escape, with a
CUDA kernel on cuda) through a separate verifier process (`--transport direct`: a batch driver;
`http`: the reward server on loopback), with the static checks on (the verifier as shipped)
and/or off (the runtime defences alone), and checks from outside that nothing happened: files,
a loopback listener, surviving processes, the build cache, honest candidates before, after and
in a later run. Needs only torch + stdlib.

Progress: one line per verdict on stdout, and the --out file is rewritten after every verdict
(the verdicts so far) and after every mode (the judged table). A candidate whose run shows no
progress for --case-limit seconds is named as hung: the Python stacks of the verifier process
and its GPU worker go to the log named in the report (faulthandler, SIGUSR1), the verifier is
killed and the remaining candidates run in a fresh one. Past --wall-limit seconds in all, the
cases in flight are HUNG and the rest NOT_RUN, and the table is written with what there is.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent.parent / "tests" / "verifier"


def _load(name: str):  # the test helpers by path: tests/ is not a package
    if str(_HERE) not in sys.path:
        sys.path.insert(0, str(_HERE))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu", "musa"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--static", choices=["both", "on", "off"], default="both")
    ap.add_argument("--transport", choices=["direct", "http"], default="direct")
    ap.add_argument("--only", default="", help="comma-separated attack names (default: all)")
    ap.add_argument("--round6", action="store_true",
                    help="only round 6's window attacks (skipped calls, batched windows), "
                         "static checks off, against an honest kernel on two task sizes")
    ap.add_argument("--round7", action="store_true",
                    help="only round 7's persistent-worker attacks (a torch mode left on the "
                         "stack, a default device set in __init__), static checks off")
    ap.add_argument("--round10", action="store_true",
                    help="only round 10's attacks on the persistent worker's settle (code a "
                         "job leaves to run in the next), each before an honest job")
    ap.add_argument("--persistent", action="store_true",
                    help="cpu: run candidates in the persistent worker (the cuda path's code)")
    ap.add_argument("--case-limit", type=float, default=240.0,
                    help="seconds without progress before a case is called hung")
    ap.add_argument("--wall-limit", type=float, default=3600.0,
                    help="seconds for the whole benchmark; then the table is written as is")
    a = ap.parse_args(argv)
    if a.round6:
        return _round6(a.backend, a.out)
    if a.round7:
        return _round7(a.backend, a.out, a.persistent)
    if a.round10:
        return _round10(a.backend, a.out, a.persistent)
    start = time.monotonic()
    # last resort: if this process itself blocks, its stacks are printed before the limit
    faulthandler.dump_traceback_later(a.wall_limit + 60, exit=True)
    cases, obs = _load("redteam_cases"), _load("redteam_observer")
    only = {n for n in a.only.split(",") if n} or None
    known = {n for n, _ in cases.attacks({k: "" for k in ("victim", "out", "cache", "workspace",
                                                            "token", "tmp_probe", "secret_file")}
                                         | {"port": 0})}
    if only and only - known:
        ap.error(f"--only names no attack: {sorted(only - known)}")
    modes = {"both": [True, False], "on": [True], "off": [False]}[a.static]
    head = [f"# Red-team suite, backend {a.backend}, transport {a.transport}", "",
            f"host {platform.node()}, python {platform.python_version()}, command: "
            f"python -m benchmarks.redteam_gpu {' '.join(argv or sys.argv[1:])}", ""]
    done: list[str] = []
    a.out.parent.mkdir(parents=True, exist_ok=True)

    def write(extra: list[str]) -> None:
        a.out.write_text("\n".join(head + done + extra) + "\n")

    for static in modes:
        label = f"static checks {'on' if static else 'off'}"
        ctx = obs.make_context(Path(tempfile.mkdtemp(prefix="ks-redteam-")) / "rt", a.backend)
        ctx.update(static=static, case_limit_s=a.case_limit, deadline=start + a.wall_limit,
                   persistent=a.persistent)
        seen: list[str] = []
        t0 = time.monotonic()

        def on_verdict(v: dict, label: str = label, seen: list[str] = seen, t0: float = t0
                       ) -> None:
            line = (f"| {v['candidate_id']} | {v.get('status')} | "
                    f"{str(v.get('error', ''))[:120].replace('|', '/').replace(chr(10), ' ')} |")
            seen.append(line)
            print(f"[redteam {label}] {len(seen)}: {v['candidate_id']} -> {v.get('status')} "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
            write([f"## {label}: verdicts so far (not judged yet)", "",
                   "| candidate | status | error |", "| --- | --- | --- |", *seen, ""])

        r = obs.run_suite(ctx, only=only, transport=a.transport, on_verdict=on_verdict)
        held_all = 0
        rows = []
        for name, _ in cases.attacks(ctx):
            if only and name not in only:
                continue
            held, why = obs.judge(name, r, ctx)
            held_all += held
            v = r["verdicts"].get(name, {})
            rows.append(f"| {name} | {v.get('status', '-')} | {v.get('runtime_us')} | "
                        f"{v.get('eager_us')} | {'held' if held else 'GOT THROUGH'}"
                        f" | {why.replace('|', '/').replace(chr(10), ' ')[:160]} |")
        honest = [f"{h} {v.get('status')} at {v.get('runtime_us')} us (eager {v.get('eager_us')})"
                  for h, v in r["verdicts"].items() if h.startswith("honest")]
        honest_ok, honest_why = obs.honest_held(r)
        bounds = sorted({ln.strip() for log in Path(ctx["base"]).glob("verifier-*.log")
                         for ln in log.read_text(errors="replace").splitlines()
                         if "host memory bound:" in ln})  # which bound the GPU workers got
        hangs = [f"- {h.replace(chr(10), ' ')[:400]}" for h in r["hangs"]]
        done += [f"## {label}", "",
                 f"{held_all}/{len(rows)} attacks held; honest candidates "
                 f"{'unchanged' if honest_ok else 'CHANGED: ' + honest_why}; "
                 f"attack batch {r['wall']:.0f} s, suite {time.monotonic() - t0:.0f} s, "
                 f"driver exit {r['rc']}", "", f"honest runs: {'; '.join(honest)}", "",
                 *[f"- {b}" for b in bounds], "", *(["hangs:", *hangs, ""] if hangs else []),
                 "| attack | status | runtime us | eager us | result | detail |",
                 "| --- | --- | --- | --- | --- | --- |", *rows, ""]
        write([])
        print(f"{label}: {held_all}/{len(rows)} held, {len(r['hangs'])} hangs", flush=True)
    faulthandler.cancel_dump_traceback_later()
    print(f"wrote {a.out}")
    return 0


def _round6(backend: str, out: Path) -> int:
    """Round 6's window attacks (tests/verifier/redteam_round6_cases.py) beside an honest ReLU,
    static checks off, on a small and a large ReLU: each attack's verdict and speedup against
    the honest one's. skip: held when not correct, or no faster than honest (the judge checks
    every call of a window faster than any before it). batch: the window's sets in one launch;
    held when its speedup is under 1.5x the honest one's (open on GPUs: see the test's xfail)."""
    import verifier.api as api
    import verifier.stages as stages
    from verifier.protocol import VerifyOptions, VerifyRequest

    cases, r6 = _load("redteam_cases"), _load("redteam_round6_cases")
    from verifier_cases import relu_task

    stages.check_python = lambda *a, **k: []  # the run-time defences on their own
    stages.check_cpp = lambda *a, **k: []
    rows = [("honest", cases.honest("r6"))] + r6.window_attacks(cases.candidate)
    lines = [f"# Red-team round 6 window attacks, backend {backend}", "",
             f"host {platform.node()}, command: python -m benchmarks.redteam_gpu --backend "
             f"{backend} --round6 --out {out}", ""]
    cache = Path(tempfile.mkdtemp(prefix="ks-r6-"))
    for rows_n, cols in ((16, 1024), (64, 16384)):
        task = relu_task(rows_n, cols)
        reqs = [VerifyRequest(name, "relu", task, cases.for_backend(code, backend), backend)
                for name, code in rows]
        got = {v.candidate_id: v for v in api.verify_batch(
            reqs, VerifyOptions(backend=backend, build_cache_dir=str(cache / "builds"),
                                baseline_cache_dir=str(cache / "baselines")))}
        base = got["honest"].speedup or 0.0
        lines += [f"## relu {rows_n}x{cols}", "", f"honest: {got['honest'].status}, speedup "
                  f"{base}, runtime {got['honest'].runtime_us} us", "",
                  "| attack | status | speedup | vs honest | result | error |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for name, _ in rows[1:]:
            v = got[name]
            ratio = (v.speedup or 0.0) / base if base else float("nan")
            limit = 1.1 if name.startswith("skip") else 1.5
            held = not v.status.startswith("correct") or ratio <= limit
            lines.append(f"| {name} | {v.status} | {v.speedup} | {ratio:.2f}x | "
                         f"{'held' if held else 'GOT THROUGH'} | "
                         f"{(v.error or '')[:100].replace('|', '/')} |")
        lines.append("")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _runtime_only(backend: str, persistent: bool) -> None:
    """The run-time defences on their own (static checks off); cpu `persistent`: the GPU's
    worker loop on this host's cpu."""
    import verifier.stages as stages

    stages.check_python = lambda *a, **k: []
    stages.check_cpp = lambda *a, **k: []
    if backend == "cpu" and persistent:
        from verifier.backends.cpu import CpuBackend

        CpuBackend.persistent_worker = True


def _verify_rows(rows: list[tuple[str, str]], backend: str, task: str, cache: Path,
                 **options: Any) -> dict[str, Any]:
    """Each (name, candidate code) of `rows` as a ReLU candidate of `task`, in one batch on one
    GPU (one worker: what one job leaves, the next meets), builds and baselines in `cache`; the
    verdicts by name."""
    import verifier.api as api
    from verifier.protocol import VerifyOptions, VerifyRequest

    cases = _load("redteam_cases")
    reqs = [VerifyRequest(name, "relu", task, cases.for_backend(code, backend), backend)
            for name, code in rows]
    got = {v.candidate_id: v for v in api.verify_batch(reqs, VerifyOptions(
        backend=backend, gpus=1, workers=1, build_cache_dir=str(cache / "builds"),
        baseline_cache_dir=str(cache / "baselines"), **options))}
    return got


def _table(title: str, flag: str, backend: str, out: Path, persistent: bool) -> list[str]:
    """A round's table head: its title, the host and the command that made it."""
    return [f"# {title}, backend {backend}", "",
            f"host {platform.node()}, command: python -m benchmarks.redteam_gpu --backend "
            f"{backend} {flag}{' --persistent' if persistent else ''} --out {out}", "",
            "| row | status | findings | result | error |", "| --- | --- | --- | --- | --- |"]


def _round7(backend: str, out: Path, persistent: bool = False) -> int:
    """Round 7's attacks on what a job leaves in a persistent GPU worker (tests/verifier/
    redteam_round7_cases.py), static checks off, one GPU so every job shares a worker: a
    correct ReLU that leaves a torch-function mode adding 1 to every later job's tensors
    (held: it is a cheat and the honest job after it is correct), and one whose __init__ sets
    the default device to the GPU (built the KernelBench way; held: the honest job after it is
    correct and its worker was replaced). cpu: `--persistent` runs the GPU's worker loop."""
    cases, r7 = _load("redteam_cases"), _load("redteam_round7_cases")
    from verifier_cases import relu_task

    _runtime_only(backend, persistent)
    shared = backend == "cuda" or persistent  # one worker for every job: what one leaves
    device = "cuda" if backend == "cuda" else backend
    rows = [("mode_left_behind", cases.candidate(r7.MODE_EXTRA, name="r7_ext", prelude=False)),
            ("honest_after_mode", cases.candidate(name="r7_ext", prelude=False)),
            ("host_forcing", cases.candidate(name="r7_ext", prelude=False,
                                             init=f'torch.set_default_device("{device}")')),
            ("honest_after_host", cases.candidate(name="r7_ext", prelude=False))]
    got = _verify_rows(rows, backend, relu_task(16, 1024), Path(tempfile.mkdtemp(prefix="ks-r7-")))
    rules = {n: [f["rule"] for f in got[n].findings] for n, _ in rows}
    held = {"mode_left_behind": got["mode_left_behind"].status == "cheat" or not shared,
            "honest_after_mode": got["honest_after_mode"].status.startswith("correct"),
            "host_forcing": "host_construction" in rules["host_forcing"],
            "honest_after_host": got["honest_after_host"].status.startswith("correct")}
    lines = _table("Red-team round 7 persistent-worker attacks", "--round7", backend, out,
                   persistent)
    for name, _ in rows:
        v = got[name]
        lines.append(f"| {name} | {v.status} | {', '.join(rules[name])} | "
                     f"{'held' if held[name] else 'GOT THROUGH'} | "
                     f"{(v.error or '')[:100].replace('|', '/')} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _round10(backend: str, out: Path, persistent: bool = False) -> int:
    """Round 10's attacks (tests/verifier/redteam_round10_cases.py), static checks off, one GPU
    so every job shares a worker: each a correct ReLU in its own kernel that leaves code to run
    in the next job (which rebinds torch.relu there), then an honest ReLU; and one that rebinds
    `torch.Tensor.__mul__` (or the process's settings), then a job whose error says what
    `torch.ones(2) * 2` is (or the settings). Held: the honest job after each is correct, the
    asker sees torch's and the process's defaults, and the attacker is a cheat or its worker
    was replaced. "blind" (its kernel in the trials, torch's in the timed calls, the worker's
    trace of them blinded) is held only as a cheat: on a GPU the worker's trace and profile are
    the only fallback checks. cpu:
    `--persistent` runs the GPU's worker loop."""
    cases, r10 = _load("redteam_cases"), _load("redteam_round10_cases")
    from verifier_cases import relu_task

    _runtime_only(backend, persistent)
    rows = []
    for name in r10.ARMS:
        rows += [(name, cases.candidate(r10.extra(name), name="r10_ext", prelude=False)),
                 (f"honest_after_{name}", cases.candidate(name="r10_ext", prelude=False))]
    rows += [("dunder", cases.candidate(r10.DUNDER_EXTRA, name="r10_ext", prelude=False)),
             ("ask_after_dunder", cases.candidate(name="r10_ext", prelude=False,
                                                  init=r10.ASK_MUL)),
             ("settings", cases.candidate(r10.SETTINGS_EXTRA, name="r10_ext", prelude=False)),
             ("ask_after_settings", cases.candidate(name="r10_ext", prelude=False,
                                                    init=r10.ASK_SETTINGS))]
    for name in ("path", "spec"):
        rows += [(name, cases.candidate(getattr(r10, f"{name.upper()}_EXTRA"), name="r10_ext",
                                        prelude=False)),
                 (f"ask_after_{name}", cases.candidate(name="r10_ext", prelude=False,
                                                       init=r10.ASK_MODULE))]
    rows.append(("blind", cases.candidate(r10.BLIND_EXTRA, forward=r10.BLIND_FORWARD,
                                          name="r10_ext", prelude=False)))
    rows += [(f"forge_{name}", cases.candidate(r10.FORGE_EXTRA, forward=fwd, name="r10_ext",
                                               prelude=False))
             for name, fwd in (("phases", r10.PHASES_FORWARD), ("findings", r10.FINDINGS_FORWARD),
                               ("bulk", r10.BULK_FORWARD))]  # held: the batch ends, small
    for name in ("umask", "stream", "encoder", "decoder", "hidden_mode"):
        rows += [(name, cases.candidate(getattr(r10, f"{name.upper()}_EXTRA"), name="r10_ext",
                                        prelude=False)),
                 (f"honest_after_{name}", cases.candidate(name="r10_ext", prelude=False))]
    cache = Path(tempfile.mkdtemp(prefix="ks-r10-"))
    got = _verify_rows(rows, backend, relu_task(16, 1024), cache)
    lines = _table("Red-team round 10 persistent-worker attacks", "--round10", backend, out,
                   persistent)
    for name, _ in rows:
        v = got[name]
        rules = [f["rule"] for f in v.findings]
        held = (v.status.startswith("correct") if name.startswith("honest") else
                "mul=[2.0, 2.0]" in (v.error or "") if name == "ask_after_dunder" else
                "rec=1000 nofile=" in (v.error or "") and "mask=[]" in (v.error or "")
                if name == "ask_after_settings" else _blind_held(v, got) if name == "blind" else
                "file=" in (v.error or "") and "/tmp/w/" not in (v.error or "")
                if name in ("ask_after_path", "ask_after_spec") else
                len(str(v.to_dict())) < 1 << 20 if name.startswith("forge_") else
                v.status == "cheat" or "worker_replaced" in rules)
        lines.append(f"| {name} | {v.status} | {', '.join(sorted(set(rules)))} | "
                     f"{'held' if held else 'GOT THROUGH'} | "
                     f"{(v.error or '')[:100].replace('|', '/')} |")
    lines += _round10_share(backend, cases, r10, relu_task, cache)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _blind_held(v: Any, got: dict[str, Any]) -> bool:
    """"blind" held: a cheat, or its timed calls gained at most the judge's bound over the
    same kernel's honest runs (`verifier.judge.trial_pace.RATIO`: a run whose windows are faster
    than that past its traced trials is a cheat; one within it gains no more)."""
    from verifier.judge.trial_pace import RATIO

    honest = sorted(g.runtime_us for n, g in got.items() if n.startswith("honest_after")
                    and g.runtime_us)
    return v.status == "cheat" or bool(honest and v.runtime_us and
                                       honest[len(honest) // 2] <= RATIO * v.runtime_us)


def _round10_share(backend: str, cases: Any, r10: Any, relu_task: Any, cache: Path
                   ) -> list[str]:
    """The own-kernel share under --fallback partial: the same forward (its kernel, then
    torch.relu) with and without writing own_share = 1.0 into the worker's result during its
    timed calls. Held when the forged run's share is the measured one (not 1.0)."""
    import json

    rows = [("share_measured", cases.candidate(r10.SHARE_EXTRA, name="r10_ext", prelude=False,
                                               forward=r10.SHARE_HONEST_FORWARD)),
            ("share_forged", cases.candidate(r10.SHARE_EXTRA, name="r10_ext", prelude=False,
                                             forward=r10.SHARE_FORWARD))]
    got = _verify_rows(rows, backend, relu_task(16, 1024), cache, fallback="partial")
    share = {n: json.loads(got[n].reward_components or "{}").get("own_share") for n, _ in rows}
    forged, measured = share["share_forged"], share["share_measured"]
    held = forged is None or forged < 0.99 or (measured is not None and measured >= 0.99)
    return ["", "Own-kernel share under --fallback partial (None: not measured on this backend)",
            "", "| row | status | own_share | reward | result |", "| --- | --- | --- | --- | --- |"
            ] + [f"| {n} | {got[n].status} | {share[n]} | {got[n].reward} | "
                 f"{'held' if held or n == 'share_measured' else 'GOT THROUGH'} |"
                 for n, _ in rows]


if __name__ == "__main__":
    sys.exit(main())
