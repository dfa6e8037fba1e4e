"""Runs rows through `verifier.api.verify_batch` in a fresh process (an attack that kills its
verifier must not kill the test): `python redteam_driver.py SPEC.json`; `run_rows` is the
tests' side of it (the judge's and round 4's red-team suites share it).

SPEC: {"task", "out", "rows": [{"id", "code"}], "options": VerifyOptions fields}. Verdicts
stream to `out` as JSON lines; the static checks stay on (the default options) unless
`"static": false`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def main(path: str) -> None:
    spec = json.loads(open(path, encoding="utf-8").read())
    import verifier.api as api
    import verifier.stages as stages
    from verifier.protocol import VerifyOptions, VerifyRequest

    if not spec.get("static", True):  # the runtime defences on their own
        stages.check_python = lambda *a, **k: []
        stages.check_cpp = lambda *a, **k: []
    opts = VerifyOptions(**spec["options"])
    reqs = [VerifyRequest(r["id"], "relu", spec["task"], r["code"], "cpu") for r in spec["rows"]]
    with open(spec["out"], "w", encoding="utf-8") as fh:
        def put(v: object) -> None:
            fh.write(json.dumps(v.to_dict()) + "\n")  # type: ignore[attr-defined]
            fh.flush()
        api.verify_batch(reqs, opts, progress=put)


def run_rows(base: Path, name: str, task: str, rows: list[tuple[str, str]],
             options: dict[str, Any], static: bool = True) -> tuple[dict[str, dict], int]:
    """Verify `rows` of `task` in a fresh verifier process: (verdicts by id, its exit status);
    its spec, verdicts and stderr stay in `base` under `name`."""
    out = base / f"{name}.jsonl"
    spec = {"task": task, "out": str(out), "static": static,
            "rows": [{"id": i, "code": c} for i, c in rows], "options": options}
    (base / f"{name}.json").write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, str(Path(__file__)), str(base / f"{name}.json")],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=str(base),
                          capture_output=True, text=True, timeout=1500)
    (base / f"{name}.stderr").write_text(proc.stderr)
    verdicts = {}
    if out.exists():
        for line in out.read_text().splitlines():
            v = json.loads(line)
            verdicts[v["candidate_id"]] = v
    return verdicts, proc.returncode


if __name__ == "__main__":
    main(sys.argv[1])
