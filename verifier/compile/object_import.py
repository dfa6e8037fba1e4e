"""The load check's parent side: a built object imported in a sandboxed child
(`verifier.compile.loadcheck`), and its failure written down by whose words it is in.

Until the child writes its byte on the parent's pipe (`verifier.isolation.started`: just before
the object is loaded) nothing of the candidate's has run, and a failure is the interpreter's or
the sandbox's: its words are the environment's to `verifier.compile.build_cause`. After it,
the object's static initializers share the process, and what the child writes is theirs to
write: a static initializer that prints "OSError: [Errno 28] No space left on device" and exits
must not make its own failure the host's (never cached, the host blamed). Its words are kept
after `OBJECT_SAID`, which build_cause reads as the spec's own; only the sandbox's description
of how the child ended (a signal the host sends, a timeout) and the parent's own clock name
the host (tests/verifier/test_redteam_round11.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from verifier.backends import candidate_tool
from verifier.compile.build_cause import IMPORT_FAILED, OBJECT_SAID
from verifier.compile.build_records import BuildContext
from verifier.compile.loadcheck import MAX_IMPORT_S
from verifier.isolation.sandbox import SandboxLimits, SandboxResult

# the signals the host ends a process with (the OOM killer, the cpu limit, a full tmpfs's
# mapping): a crash of the candidate's own (SIGSEGV, SIGABRT, ...) is its own
HOST_SIGNALS = ("SIGKILL", "SIGXCPU", "SIGBUS")
SLOW_IMPORT = re.compile(r"its import took \d+ s")  # the child's claim (`loadcheck.main`)


def check_import(ctx: BuildContext, so: Path, module: str) -> tuple[bool, str]:
    """Import the object in a sandbox: (ok, the failure's log lines)."""
    job = json.dumps({"module": module, "path": so.name})
    with candidate_tool() as cpus:  # its static initializers are the candidate's code
        res = ctx.launcher.run_module("verifier.compile.loadcheck", limits=SandboxLimits(
            timeout_s=120, memory_mb=ctx.load_memory_mb, cpus=cpus),
            input_files={so.name: so.read_bytes(), "loadcheck.json": job})
    if res.payload and res.payload.get("ok"):
        return True, ""
    return False, import_failure(res)


def import_failure(res: SandboxResult) -> str:
    """The log lines of a failed load check, each in the words of who said it."""
    if not res.started:  # the interpreter, torch or the sandbox: the environment's words
        return IMPORT_FAILED + (_last_error(res.stderr) or res.describe_failure())
    if res.timed_out or res.signal_name in HOST_SIGNALS:
        return IMPORT_FAILED + res.describe_failure()
    lines = [OBJECT_SAID + (_last_error(res.stderr) or res.describe_failure())]
    if SLOW_IMPORT.search(res.stderr) and res.wall_s >= MAX_IMPORT_S:  # a loaded host's doing
        lines.append(f"{IMPORT_FAILED}its import took {res.wall_s:.0f} s by the verifier's clock")
    return "\n".join(lines)


def _last_error(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""
