"""Red-team suite (issue 22) against a GPU backend: every attack, its verdict, whether it held.

    python -m benchmarks.redteam_gpu --backend cuda --out benchmarks/results/redteam_cuda.md

Runs tests/verifier/redteam_cases.py's attacks (each a correct ReLU trying one escape, with a
CUDA kernel on cuda) through a separate verifier process, twice: with the static checks on (the
verifier as shipped) and off (the runtime defences alone), and checks from outside that nothing
happened: files, a loopback listener, surviving processes, the build cache, honest candidates
before, after and in a later run. Needs only torch + stdlib. Writes a markdown table to --out.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent.parent / "tests" / "verifier"


def _load(name: str):  # the test helpers by path: tests/ is not a package
    sys.path.insert(0, str(_HERE))
    spec = importlib.util.spec_from_file_location(name, _HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu", "musa"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--static", choices=["both", "on", "off"], default="both")
    a = ap.parse_args(argv)
    cases, obs = _load("redteam_cases"), _load("redteam_observer")
    modes = {"both": [True, False], "on": [True], "off": [False]}[a.static]
    lines = [f"# Red-team suite, backend {a.backend}", "",
             f"host {platform.node()}, python {platform.python_version()}", ""]
    for static in modes:
        ctx = obs.make_context(Path(tempfile.mkdtemp(prefix="ks-redteam-")) / "rt", a.backend)
        ctx["static"] = static
        t0 = time.monotonic()
        r = obs.run_suite(ctx)
        held_all = 0
        rows = []
        for name, _ in cases.attacks(ctx):
            held, why = obs.judge(name, r, ctx)
            note = " (payload in the CPU body: inert on cuda)" if (
                a.backend == "cuda" and name in cases.CPU_BODY_ONLY) else ""
            held_all += held
            v = r["verdicts"].get(name, {})
            rows.append(f"| {name} | {v.get('status', '-')} | {'held' if held else 'GOT THROUGH'}"
                        f" | {why.replace('|', '/')[:160]}{note} |")
        honest_ok, honest_why = obs.honest_held(r)
        lines += [f"## static checks {'on' if static else 'off'}", "",
                  f"{held_all}/{len(rows)} attacks held; honest candidates "
                  f"{'unchanged' if honest_ok else 'CHANGED: ' + honest_why}; "
                  f"attack batch {r['wall']:.0f} s, suite {time.monotonic() - t0:.0f} s, "
                  f"driver exit {r['rc']}", "",
                  "| attack | status | result | detail |", "| --- | --- | --- | --- |", *rows, ""]
        print(f"static {'on' if static else 'off'}: {held_all}/{len(rows)} held", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
