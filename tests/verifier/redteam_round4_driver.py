"""Runs rows through `verifier.api.verify_batch` in a fresh process (an attack that kills its
verifier must not kill the test): `python redteam_round4_driver.py SPEC.json`.

SPEC: {"task", "out", "rows": [{"id", "code"}], "options": VerifyOptions fields}. Verdicts
stream to `out` as JSON lines; the static checks stay on (the default options) unless
`"static": false`."""

from __future__ import annotations

import json
import sys


def main(path: str) -> None:
    spec = json.loads(open(path, encoding="utf-8").read())
    import verifier.api as api
    from verifier.protocol import VerifyOptions, VerifyRequest

    if not spec.get("static", True):  # the runtime defences on their own
        api.check_python = lambda *a, **k: []
        api.check_cpp = lambda *a, **k: []
    opts = VerifyOptions(**spec["options"])
    reqs = [VerifyRequest(r["id"], "relu", spec["task"], r["code"], "cpu") for r in spec["rows"]]
    with open(spec["out"], "w", encoding="utf-8") as fh:
        def put(v: object) -> None:
            fh.write(json.dumps(v.to_dict()) + "\n")  # type: ignore[attr-defined]
            fh.flush()
        api.verify_batch(reqs, opts, progress=put)


if __name__ == "__main__":
    main(sys.argv[1])
